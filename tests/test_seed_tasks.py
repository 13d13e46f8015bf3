"""bench/seed_tasks.py (rows from bench/seeding.py): many finished demo_steps tasks written with COPY, as the engine
leaves them."""

import hashlib
import io
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from django.conf import settings as django_settings
from django.utils import timezone

from bench import seed_tasks as seed_script
from bench import seeding
from steering_app.models import SteeringCommand
from steering_app.services import steering_cancel
from tasks_app.audit.retention import purge_allowed
from tasks_app.models import TERMINAL_STATUSES, Step, Task, TaskEvent, Tenant
from tasks_app.selectors import task_events_verify, task_list
from tasks_app.services import task_create
from tests.engine_support import configure, drive
from tests.worker_support import test_database_url as database_url

ROOT = Path(__file__).resolve().parent.parent


def _seed(**options) -> str:
    out = io.StringIO()
    seed_script.seed_tasks(out=out, **options)
    return out.getvalue()


def test_it_seeds_finished_tasks_whose_chains_verify_and_the_tenant_lists(api, tenant):
    output = _seed(count=50, steps_per_task=3, tenant=tenant.slug, batch=20, seed=7)

    tasks = list(Task.objects.filter(tenant=tenant))
    assert len(tasks) == 50
    assert TaskEvent.objects.filter(task__tenant=tenant).count() == sum(t.event_seq for t in tasks)
    assert "wrote 50 tasks" in output and f"{Step.objects.filter(task__tenant=tenant).count()} steps" in output
    assert {t.status for t in tasks} <= TERMINAL_STATUSES
    assert all(t.lease_owner is None and t.lease_expires_at is None and t.completed_at for t in tasks)
    completed = [t for t in tasks if t.status == "completed"]
    assert len(completed) >= 40
    for task in completed:
        assert (task.progress, task.result, task.plan_length, task.next_step_index, task.steps_completed,
                task.event_seq, task.hint_at) == (1.0, {"steps": 3}, 3, 3, 3, 7, None)
        assert Step.objects.filter(task=task, status="committed").count() == 3
    # Spread over the last 30 days, oldest to newest: what pagination and the retention index see.
    created = sorted(t.created_at for t in tasks)
    assert timezone.now() - timedelta(days=30) < created[0] < created[-1] - timedelta(days=20)

    assert [t.id for t in tasks if task_events_verify(task_id=t.id) is not None] == []
    steps = Step.objects.filter(task__tenant=tenant, status="committed")
    assert steps.count() >= 3 * len(completed)
    assert all(s.delta_sha256 == hashlib.sha256(s.state_delta.encode()).hexdigest() for s in steps)

    listed, url = [], "/runtime/tasks?limit=20"
    while url:
        page = api.get(url).json()
        listed += [(item["taskId"], item["status"]) for item in page["results"]]
        url = page["next"]
    assert sorted(listed) == sorted((str(t.id), t.status) for t in tasks)
    assert task_list(tenant=tenant, status="working").count() == 0


def test_it_says_where_a_tampered_seeded_event_breaks_the_chain(db, tenant):
    _seed(count=3, tenant=tenant.slug, seed=1)
    task = Task.objects.filter(tenant=tenant, status="completed").first()
    with purge_allowed():  # UPDATE is refused by a trigger, DELETE outside a purge too; removing one breaks it
        TaskEvent.objects.filter(task=task, seq=3).delete()

    assert task_events_verify(task_id=task.id) == 3


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("external_root")
def test_it_writes_what_the_engine_writes_for_completed_failed_and_cancelled_tasks(tenant, settings, monkeypatch):
    # One progress event per step, as seeded tasks have (steps slower than progress_event_seconds).
    configure(settings, step_retry={"backoff_seconds": 0.01, "max_attempts": 3}, progress_event_seconds=0)
    monkeypatch.setattr(seeding, "SLEEP_MS_CHOICES", (0,))  # input {"steps": 3}, like the engine's tasks below
    real = {
        "completed": task_create(tenant=tenant, owner=None, workflow="demo_steps", input={"steps": 3}).task,
        "failed": task_create(tenant=tenant, owner=None, workflow="demo_steps", input={"steps": 3, "fail_step": 1})
        .task,
        "cancelled": task_create(tenant=tenant, owner=None, workflow="demo_steps", input={"steps": 3}).task,
    }
    assert drive(real["completed"].id) == ["completed"]
    assert drive(real["failed"].id) == ["failed"]
    steering_cancel(task=real["cancelled"], requested_by=seeding.CANCELLED_BY)
    monkeypatch.setattr(seeding, "FAILED_SHARE", 0.5)
    monkeypatch.setattr(seeding, "CANCELLED_SHARE", 0.25)
    _seed(count=60, steps_per_task=3, tenant="bench", seed=3, batch=20, workers=2)  # 3 batches, 2 connections

    seeded = Task.objects.filter(tenant__slug="bench")
    for status, engine_task in real.items():
        candidates = seeded.filter(status=status)
        if status == "failed":
            candidates = candidates.filter(input__fail_step=1)
        twin = candidates.first()
        assert twin is not None, status
        assert _task_shape(twin) == _task_shape(Task.objects.get(id=engine_task.id)), status
        assert _events_shape(twin) == _events_shape(engine_task), status
        assert _steps_shape(twin) == _steps_shape(engine_task), status
        assert _commands_shape(twin) == _commands_shape(engine_task), status
        assert task_events_verify(task_id=twin.id) is None


def test_it_refuses_a_count_below_one_and_event_counts_no_task_has(db):
    for options, message in [
        ({"count": 0}, "--count must be at least 1"),
        ({"count": -5}, "--count must be at least 1"),
        ({"count": 5, "events_per_task": 4}, "Use 5 or more"),
        ({"count": 5, "steps_per_task": 2, "events_per_task": 7}, "make it 6"),
        ({"count": 5, "steps_per_task": 11}, "at most 10 steps"),
        ({"count": 5, "batch": 0}, "--batch must be at least 1"),
    ]:
        with pytest.raises(seeding.SeedError, match=message):
            _seed(**options)
    assert Task.objects.count() == 0 and not Tenant.objects.filter(slug="bench").exists()


def _script(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "DATABASE_URL": database_url(), "REDIS_URL": django_settings.REDIS_URL,
           "SECRET_KEY": django_settings.SECRET_KEY, "DJANGO_SETTINGS_MODULE": "config.settings"}
    return subprocess.run([sys.executable, "bench/seed_tasks.py", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)


@pytest.mark.django_db(transaction=True)
def test_the_script_seeds_the_database_it_is_given(tenant):
    done = _script("--count", "3", "--tenant", tenant.slug, "--seed", "5")

    assert done.returncode == 0, done.stderr
    assert f"seeding 3 tasks of tenant {tenant.slug!r}" in done.stdout and "wrote 3 tasks" in done.stdout
    assert Task.objects.filter(tenant=tenant).count() == 3
    # Its --help names the default before Django is set up, so it keeps its own copy of seeding's.
    assert seed_script.DEFAULT_EVENTS_PER_TASK == seeding.DEFAULT_EVENTS_PER_TASK


@pytest.mark.django_db(transaction=True)
def test_the_script_refuses_a_bad_option_as_argparse_does(tenant):
    done = _script("--count", "0", "--tenant", tenant.slug)

    assert done.returncode == 2
    assert "error: --count must be at least 1, not 0." in done.stderr and done.stdout == ""
    assert Task.objects.filter(tenant=tenant).count() == 0


def _task_shape(task: Task) -> dict:
    values = Task.objects.filter(id=task.id).values().get()
    for volatile in ("id", "tenant_id", "event_head_hash", "created_at", "updated_at", "completed_at", "hint_at"):
        values.pop(volatile)
    if values["error"]:  # the traceback and timing of each attempt are the run's own
        values["error"]["attempts"] = [(a["attempt"], a["type"], a["message"]) for a in values["error"]["attempts"]]
    # A task's times are in order, and no finished task is left with a hint pending.
    assert task.created_at <= task.completed_at == task.updated_at
    values["hint_pending"] = task.hint_at is not None
    return values


def _events_shape(task: Task) -> list:
    events = TaskEvent.objects.filter(task_id=task.id).order_by("seq")
    assert [e.at for e in events] == sorted(e.at for e in events)
    commands = {str(c): "COMMAND" for c in SteeringCommand.objects.filter(task_id=task.id).values_list("id", flat=True)}
    return [(e.seq, e.type, {**e.data, "key": e.data["key"].replace(str(task.id), "ID")} if e.type == "effect"
             else {**e.data, "commandId": commands[e.data["commandId"]]} if e.type.startswith("steering.")
             else e.data) for e in events]


def _commands_shape(task: Task) -> list:
    return list(SteeringCommand.objects.filter(task_id=task.id).order_by("new_version").values_list(
        "type", "payload", "expected_version", "old_version", "new_version", "requested_by", "reason"))


def _steps_shape(task: Task) -> list:
    return list(Step.objects.filter(task_id=task.id).order_by("seq").values_list(
        "seq", "plan_version", "step_index", "name", "status", "attempt", "lease_epoch", "state_delta", "delta_sha256",
        "output"))
