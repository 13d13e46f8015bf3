"""The per-step tables reference their task without database foreign keys (TASK_CHILD in tasks_app.models): these
tests hold the integrity those keys used to give — no row outlives its task, and none is written for a task that
is gone."""

from django.db import connection
from django.utils import timezone

from tasks_app.audit.retention import purge_allowed
from tasks_app.engine import reaper
from tasks_app.engine import slice as engine
from tasks_app.engine.lease import lease_claim
from tests.engine_support import configure, drive, new_task

CHILD_TABLES = ["tasks_app_step", "tasks_app_taskevent", "tasks_app_planchunk", "checkpoints_app_checkpoint",
                "checkpoints_app_sideeffect"]


def rows_of(task_id) -> dict[str, int]:
    with connection.cursor() as cursor:
        counts = {}
        for table in CHILD_TABLES:
            cursor.execute(f"SELECT count(*) FROM {table} WHERE task_id = %s", [task_id])  # names are constants
            counts[table] = cursor.fetchone()[0]
    return counts


def test_it_has_no_database_foreign_key_on_the_per_step_tables(db):
    with connection.cursor() as cursor:
        cursor.execute("""SELECT conrelid::regclass::text FROM pg_constraint
                           WHERE contype = 'f' AND confrelid = 'tasks_app_task'::regclass""")
        referencing = {row[0] for row in cursor.fetchall()}
    assert referencing.isdisjoint(CHILD_TABLES)


def test_it_purges_every_row_of_a_task_with_the_task(tenant, settings):
    configure(settings, retention_days=30, checkpoint={"every_steps": 2})
    old, kept = new_task(tenant, steps=5), new_task(tenant, steps=5)
    drive(old.id)
    drive(kept.id)
    assert all(rows_of(old.id).values())  # every table has rows to lose
    type(old).objects.filter(id=old.id).update(completed_at=timezone.now() - timezone.timedelta(days=31))

    assert reaper.terminal_tasks_purge() == 1

    assert not any(rows_of(old.id).values())
    assert all(rows_of(kept.id).values())


def test_it_writes_nothing_for_a_task_deleted_while_a_worker_runs_it(tenant):
    task = new_task(tenant, steps=3)
    claim = lease_claim(task_id=task.id, owner="test-worker")
    assert claim is not None
    with purge_allowed():  # (as an operator's deliberate purge would)
        type(task).objects.filter(id=task.id).delete()

    outcome = engine.Slice(claim).run()

    assert outcome in ("lease_lost", "status_moved")
    assert not any(rows_of(task.id).values())
