"""The audit trail end to end (docs/audit.md): DELETE and UPDATE of the append-only tables refused at the database
outside the retention purge; signed seals of the chains' heads that catch a chain rewritten consistently inside the
database, which the plain chain check cannot; the verification state on the task page; token creation and
revocation recorded with their actor."""

import importlib
import io
import uuid
from types import SimpleNamespace

import psycopg
import pytest
from django.apps import apps as global_apps
from django.core.files.storage import default_storage
from django.core.management import CommandError, call_command
from django.db import DatabaseError, connection, transaction
from django_celery_beat.models import PeriodicTask

from tasks_app.audit import anchors
from tasks_app.audit.retention import purge_allowed
from tasks_app.events import event_hash
from tasks_app.models import AdminAction, AnchorSeal, ApiToken, SealedHead, Task, TaskEvent
from tasks_app.services import api_token_revoke
from tests.engine_support import drive

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("external_root", "audit_storage")]
seal_migration = importlib.import_module("tasks_app.migrations.0029_audit_anchors_and_purge_only_deletes")


@pytest.fixture
def audit_storage(settings, tmp_path):
    """Seals and files of this test only, under a key of its own (generated on first use, as in development)."""
    settings.MEDIA_ROOT = str(tmp_path / "media")
    settings.AUDIT_SIGNING_KEY_FILE = tmp_path / "keys" / "audit_signing_key.pem"
    settings.AUDIT_SIGNING_KEY_GENERATE = True
    return tmp_path


@pytest.fixture
def finished(new_task):
    def make(steps=3) -> Task:
        task = new_task("demo_steps", steps=steps)
        assert drive(task.id)[-1] == "completed"
        return Task.objects.get(id=task.id)

    return make


def refused(sql: str, params) -> BaseException:
    with pytest.raises(DatabaseError) as raised, transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(sql, params)
    return raised.value.__cause__


def rewrite_consistently(task: Task, *, seq: int, message: str) -> None:
    """What someone with table rights can do: triggers off, an event's data changed, every hash from it on recomputed,
    the task's head moved to match, triggers on again. The chain verifies afterwards."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("ALTER TABLE tasks_app_taskevent DISABLE TRIGGER USER")
        head = ""
        for event in TaskEvent.objects.filter(task=task).order_by("seq"):
            data = {**event.data, "message": message} if event.seq == seq else event.data
            digest = event_hash(prev_hash=head, seq=event.seq, type=event.type, data=data)
            TaskEvent.objects.filter(task=task, seq=event.seq).update(data=data, prev_hash=head, hash=digest)
            head = digest
        Task.objects.filter(id=task.id).update(event_head_hash=head)
        cursor.execute("ALTER TABLE tasks_app_taskevent ENABLE TRIGGER USER")


def test_it_refuses_update_and_delete_of_events_and_admin_actions_through_sql(finished):
    task = finished(steps=1)
    AdminAction.objects.create(actor="user:alice", action="change", model="tasks_app.tenant", object_id="1",
                               object_repr="acme")

    update = refused("UPDATE tasks_app_taskevent SET data = '{}' WHERE task_id = %s AND seq = 1", [task.id])
    delete = refused("DELETE FROM tasks_app_taskevent WHERE task_id = %s", [task.id])
    delete_action = refused("DELETE FROM tasks_app_adminaction", [])
    delete_seal_index = refused("DELETE FROM tasks_app_anchorseal", [])

    assert isinstance(update, psycopg.errors.RaiseException) and "append-only" in str(update)
    assert isinstance(delete, psycopg.errors.RaiseException) and "retention purge" in str(delete)
    assert isinstance(delete_action, psycopg.errors.RaiseException)
    assert isinstance(delete_seal_index, psycopg.errors.RaiseException)
    assert TaskEvent.objects.filter(task=task).count() == task.event_seq and AdminAction.objects.exists()


def test_it_allows_delete_inside_the_purges_transaction_only(finished):
    task = finished(steps=1)

    with purge_allowed(), connection.cursor() as cursor:
        cursor.execute("DELETE FROM tasks_app_taskevent WHERE task_id = %s", [task.id])
    assert not TaskEvent.objects.filter(task=task).exists()
    # The setting ended with that transaction: the next DELETE is refused again.
    assert isinstance(refused("DELETE FROM tasks_app_adminaction", []), psycopg.errors.RaiseException)


def test_it_catches_a_consistently_rewritten_chain_with_anchors_naming_the_task(finished):
    intact, rewritten = finished(), finished()
    assert anchors.anchors_seal() == 1
    assert SealedHead.objects.get(task_id=rewritten.id).seq == rewritten.event_seq

    rewrite_consistently(rewritten, seq=1, message="Queued by nobody in particular")

    plain = io.StringIO()
    call_command("verify_events", stdout=plain)  # raises nothing: the rewritten chain is consistent
    assert "0 broken chain(s)" in plain.getvalue()
    out = io.StringIO()
    with pytest.raises(CommandError, match=str(rewritten.id)):
        call_command("verify_events", "--anchors", stdout=out)
    assert f"{rewritten.id}: event {rewritten.event_seq} no longer has the hash seal 1 recorded" in out.getvalue()
    assert str(intact.id) not in out.getvalue()


def test_it_seals_only_chains_that_changed_and_chains_each_seal_to_the_one_before(finished):
    first = finished(steps=1)
    assert anchors.anchors_seal() == 1
    assert anchors.anchors_seal() == 0  # nothing changed since
    second = finished(steps=1)

    assert anchors.anchors_seal() == 1

    seals = anchors.seals_read()
    assert seals.problems == [] and sorted(seals.documents) == [1, 2]
    assert seals.documents[2]["seal"]["previous"] == seals.documents[1]["hash"]
    assert [head[0] for head in seals.documents[2]["seal"]["heads"]] == [str(second.id)]
    assert set(seals.heads) == {str(first.id), str(second.id)}
    call_command("verify_events", "--anchors", stdout=io.StringIO())  # all holds: no error


def test_it_reports_a_deleted_or_altered_seal_file(finished):
    finished(steps=1)
    anchors.anchors_seal()
    finished(steps=1)
    anchors.anchors_seal()
    first, second = AnchorSeal.objects.order_by("sequence")

    default_storage.delete(first.file)
    with default_storage.open(second.file, "rb") as file:
        altered = file.read().replace(b'"version":1', b'"version":2')
    default_storage.delete(second.file)
    default_storage.save(second.file, io.BytesIO(altered))

    out = io.StringIO()
    with pytest.raises(CommandError, match="seal problem"):
        call_command("verify_events", "--anchors", stdout=out)
    assert "seal 1: its file is missing from storage" in out.getvalue()
    assert "seal 2: its file is altered" in out.getvalue()


def test_it_refuses_seals_under_another_key(finished, settings, tmp_path):
    task = finished(steps=1)
    anchors.anchors_seal()
    settings.AUDIT_SIGNING_KEY_FILE = tmp_path / "another.pem"  # the key a verifier holds is not the one that signed

    seals = anchors.seals_read()

    assert seals.problems == ["seal 1: its file is altered (hash or signature does not verify)"]
    assert str(task.id) not in seals.heads


def test_it_keeps_the_signing_key_in_a_private_file_and_prints_only_the_public_key(audit_storage):
    out = io.StringIO()
    call_command("audit_key", "--public", stdout=out)

    key_file = audit_storage / "keys" / "audit_signing_key.pem"
    assert "BEGIN PUBLIC KEY" in out.getvalue() and "PRIVATE" not in out.getvalue()
    assert "PRIVATE KEY" in key_file.read_text() and key_file.stat().st_mode & 0o077 == 0


def test_it_schedules_the_seal_with_beat_and_the_celery_task_seals(finished):
    PeriodicTask.objects.filter(name=seal_migration.SEAL_SCHEDULE).delete()
    seal_migration.schedule_seal(global_apps, SimpleNamespace(connection=connection))
    seal_migration.schedule_seal(global_apps, SimpleNamespace(connection=connection))  # safe to run twice
    finished(steps=1)
    from tasks_app.tasks import audit_seal

    schedule = PeriodicTask.objects.get(name=seal_migration.SEAL_SCHEDULE)
    assert schedule.task == "runtime.audit_seal" and schedule.enabled and schedule.interval.every == 300
    assert audit_seal() == 1 and AnchorSeal.objects.count() == 1


def test_it_shows_the_verification_state_on_the_task_page(finished, admin_client):
    sealed, broken, fresh = finished(steps=1), finished(steps=1), None
    anchors.anchors_seal()
    rewrite_consistently(broken, seq=1, message="forged")
    fresh = finished(steps=1)

    def shown(task) -> str:
        page = admin_client.get(f"/admin/tasks_app/task/{task.id}/change/").content.decode()
        start = page.index('id="console-verification"')
        return " ".join(page[start:page.index("</p>", start)].split())

    assert f"verified ({sealed.event_seq} events); sealed up to seq {sealed.event_seq} (seal 1)" in shown(sealed)
    assert "rewritten after seal 1" in shown(broken)
    assert "not sealed yet" in shown(fresh)
    with purge_allowed():
        TaskEvent.objects.filter(task=fresh, seq=2).delete()
    assert "broken at seq 2" in shown(fresh)


def test_it_records_token_creation_and_revocation_with_their_actor(tenant):
    username = f"ci-{uuid.uuid4().hex[:6]}"
    out = io.StringIO()
    call_command("create_api_token", "--tenant", tenant.slug, "--user", username, "--create", "--name", "ci",
                 "--scopes", "tasks:read", stdout=out)
    token = ApiToken.objects.get(user__username=username)
    api_token_revoke(token=token, revoked_by="user:alice")

    created = AdminAction.objects.get(object_id=str(token.pk), action="add")
    revoked = AdminAction.objects.get(object_id=str(token.pk), action="revoke")
    assert created.actor.startswith("cli:") and "tasks:read" in created.message
    assert revoked.actor == "user:alice"
    raw = out.getvalue().strip()
    assert raw not in created.message + revoked.message and token.token_hash not in created.message


def test_it_shows_the_anchor_on_the_audit_verification_page(finished, admin_client):
    sealed, rewritten = finished(steps=1), finished(steps=1)
    anchors.anchors_seal()
    rewrite_consistently(rewritten, seq=1, message="forged")
    fresh = finished(steps=1)

    page = admin_client.get("/admin/audit/verify/", {"task": [sealed.id, rewritten.id, fresh.id]})

    shown = {str(item["state"].task_id): (item["state"].verified, item["state"].seal_holds)
             for item in page.context["states"]}
    assert shown == {str(sealed.id): (True, True), str(rewritten.id): (True, False), str(fresh.id): (True, None)}
    assert page.content.decode().count("REWRITTEN after seal 1") == 1


def test_it_records_a_tool_policy_change_made_in_the_admin_with_its_actor(tenant, admin_client):
    from agents_app.models import TenantToolPolicy

    added = admin_client.post("/admin/agents_app/tenanttoolpolicy/add/", {
        "tenant": tenant.pk, "deny": '["github.delete_*"]', "allow": "", "require_approval": "[]",
        "allowed_hosts": "", "max_calls_per_task": ""})
    policy = TenantToolPolicy.objects.get(tenant=tenant)
    changed = admin_client.post(f"/admin/agents_app/tenanttoolpolicy/{policy.pk}/change/", {
        "tenant": tenant.pk, "deny": '["github.delete_*", "shell.*"]', "allow": "", "require_approval": "[]",
        "allowed_hosts": "", "max_calls_per_task": "50"})

    assert (added.status_code, changed.status_code) == (302, 302)
    records = list(AdminAction.objects.filter(model="agents_app.tenanttoolpolicy").order_by("at", "id")
                   .values_list("actor", "action", "tenant_id"))
    assert sorted(records) == [("user:admin", "add", tenant.pk), ("user:admin", "change", tenant.pk)]
    assert "shell" not in "".join(AdminAction.objects.values_list("message", flat=True))  # field names, never values
