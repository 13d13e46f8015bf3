"""The reaper's other duties and the operators' dead-letter tools."""

import getpass
import importlib
import io
from datetime import timedelta
from types import SimpleNamespace

import pytest
from django.apps import apps as global_apps
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management import CommandError, call_command
from django.db import connection
from django.utils import timezone

from tasks_app.engine import reaper
from tasks_app.models import Task, TaskEvent
from tasks_app.services import tenant_get_or_create, tenant_membership_ensure
from tests.engine_support import configure, drive, hints_queued, new_task

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("external_root")]


def test_it_resends_a_runnable_task_whose_hint_was_lost(tenant, settings):
    configure(settings, redispatch_after_seconds=60)
    lost = new_task(tenant, steps=2)
    new_task(tenant, steps=2)  # its hint is recent: still on its way
    Task.objects.filter(id=lost.id).update(hint_at=timezone.now() - timedelta(minutes=5))  # move time

    assert reaper.tasks_redispatch_lost() == 1
    assert reaper.tasks_redispatch_lost() == 0  # re-sends are spaced out
    assert Task.objects.get(id=lost.id).hint_at > timezone.now() - timedelta(seconds=30)


def _hints_taken_by_a_dead_worker():
    """Empty the broker's run_step queues, as a worker that took the messages and died would leave them."""
    import redis
    from django.conf import settings

    from tasks_app.db.dispatch import hint_queue_names

    broker = redis.Redis.from_url(settings.REDIS_URL)
    broker.delete(*hint_queue_names())
    broker.close()


def test_it_resends_a_hint_a_dead_worker_took_within_seconds_once_the_queues_are_empty(tenant, settings):
    configure(settings, redispatch_after_seconds=3600)
    taken = new_task(tenant, steps=2)
    _hints_taken_by_a_dead_worker()
    assert reaper.tasks_redispatch_lost() == 0  # just sent: a claim may still follow

    lost_for = timedelta(seconds=reaper.LOST_HINT_GRACE_SECONDS + 1)
    Task.objects.filter(id=taken.id).update(hint_at=timezone.now() - lost_for)  # move time
    assert reaper.tasks_redispatch_lost() == 1
    assert hints_queued(taken.id) == 1


def test_it_waits_for_redispatch_after_seconds_while_hints_are_still_queued(tenant, settings):
    configure(settings, redispatch_after_seconds=3600)
    behind_a_backlog = new_task(tenant, steps=2)  # its hint is queued
    Task.objects.filter(id=behind_a_backlog.id).update(hint_at=timezone.now() - timedelta(minutes=5))

    assert reaper.tasks_redispatch_lost() == 0
    assert hints_queued(behind_a_backlog.id) == 1


def test_it_fails_tasks_past_their_deadline_and_leaves_a_running_one_to_its_worker(tenant):
    from tasks_app.engine import slice as engine

    idle, running = new_task(tenant, steps=2), new_task(tenant, steps=2)
    claim = engine.lease_claim(task_id=running.id, owner="slowpoke")
    Task.objects.update(deadline_at=timezone.now() - timedelta(seconds=1))

    assert reaper.reaper_sweep()["deadline_failed"] == 1  # a worker is never cut off mid-effect

    idle.refresh_from_db()
    assert idle.status == "failed" and idle.error["type"] == "DeadlineExceeded"
    assert engine.Slice(claim).run() == "failed"  # its worker fails it at its first safe point
    running.refresh_from_db()
    assert running.error["type"] == "DeadlineExceeded" and running.lease_owner is None


def test_it_purges_finished_tasks_past_retention_with_their_history(tenant, settings):
    configure(settings, retention_days=30)
    old, recent = new_task(tenant, steps=1), new_task(tenant, steps=1)
    drive(old.id)
    drive(recent.id)
    Task.objects.filter(id=old.id).update(completed_at=timezone.now() - timedelta(days=31))

    from django.core.files.base import ContentFile
    from django.core.files.storage import default_storage

    default_storage.save(f"tasks/{old.id}/1/report.md", ContentFile(b"old"))  # committed or orphaned: both go
    default_storage.save(f"tasks/{recent.id}/1/report.md", ContentFile(b"recent"))

    assert reaper.terminal_tasks_purge() == 1
    assert list(Task.objects.values_list("id", flat=True)) == [recent.id]
    assert not TaskEvent.objects.filter(task_id=old.id).exists()
    assert not default_storage.exists(f"tasks/{old.id}/1/report.md")
    assert default_storage.exists(f"tasks/{recent.id}/1/report.md")


def _dead_letter(tenant):
    task = new_task(tenant, steps=2)
    Task.objects.filter(id=task.id).update(status="dead_lettered", error={"reason": "max_recoveries_exceeded"})
    return task


def test_it_lists_retries_and_abandons_dead_letters_from_the_command_line(tenant):
    retried, abandoned = _dead_letter(tenant), _dead_letter(tenant)
    out = io.StringIO()

    # --as acts as that person, held to the access rule: retrying and abandoning are an operator's, in its tenant.
    importlib.import_module("steering_app.migrations.0007_audit_trail_roles").create_roles(
        global_apps, SimpleNamespace(connection=connection))
    night_ops = get_user_model().objects.create_user("night-ops")
    night_ops.groups.add(Group.objects.get(name="operator"))
    tenant_membership_ensure(user=night_ops, tenant=tenant)

    call_command("dead_letters", "list", stdout=out)
    call_command("dead_letters", "retry", str(retried.id), stdout=out)
    call_command("dead_letters", "abandon", str(abandoned.id), "--as", "night-ops", "--reason", "customer gone",
                 stdout=out)

    assert str(retried.id) in out.getvalue() and "max_recoveries_exceeded" in out.getvalue()
    assert Task.objects.get(id=retried.id).status == "recovering"
    assert drive(retried.id) == ["completed"]
    abandoned.refresh_from_db()
    # The console's actor naming, so the audit's actor filter finds the person's decisions made either way; without
    # --as, the OS login (never an anonymous "manage.py").
    assert abandoned.status == "failed" and abandoned.error["abandonedBy"] == "user:night-ops"
    retried_event = TaskEvent.objects.filter(task_id=retried.id, type="status", data__has_key="requestedBy").get()
    assert retried_event.data["requestedBy"] == f"cli:{getpass.getuser()}"
    with pytest.raises(CommandError, match="not dead_lettered"):
        call_command("dead_letters", "retry", str(abandoned.id))
    with pytest.raises(CommandError, match="no account 'nobody'"):
        call_command("dead_letters", "abandon", str(retried.id), "--as", "nobody")


def test_it_holds_dead_letters_as_a_person_to_their_role_and_tenant(tenant):
    task = _dead_letter(tenant)
    importlib.import_module("steering_app.migrations.0007_audit_trail_roles").create_roles(
        global_apps, SimpleNamespace(connection=connection))
    viewer = get_user_model().objects.create_user("night-viewer")
    viewer.groups.add(Group.objects.get(name="viewer"))
    tenant_membership_ensure(user=viewer, tenant=tenant)
    elsewhere = get_user_model().objects.create_user("night-elsewhere")
    elsewhere.groups.add(Group.objects.get(name="operator"))
    tenant_membership_ensure(user=elsewhere, tenant=tenant_get_or_create(slug="night-other"))

    with pytest.raises(CommandError, match="user:night-viewer may not retry or abandon"):
        call_command("dead_letters", "abandon", str(task.id), "--as", "night-viewer")
    with pytest.raises(CommandError, match=f"no task {task.id}"):  # another tenant's: as an unknown id
        call_command("dead_letters", "retry", str(task.id), "--as", "night-elsewhere")

    assert Task.objects.get(id=task.id).status == "dead_lettered"


def test_it_retries_and_abandons_dead_letters_from_admin(tenant, client, django_user_model):
    retried, abandoned = _dead_letter(tenant), _dead_letter(tenant)
    client.force_login(django_user_model.objects.create_superuser("op", password=None))

    for action, task in (("retry_dead_letters", retried), ("abandon_dead_letters", abandoned)):
        response = client.post("/admin/tasks_app/task/", {"action": action, "_selected_action": [str(task.id)]})
        assert response.status_code == 302

    assert Task.objects.get(id=retried.id).status == "recovering"
    assert Task.objects.get(id=abandoned.id).status == "failed"


def test_it_keeps_a_pending_cancel_through_a_worker_crash(tenant):
    from steering_app.services import steering_cancel
    from tasks_app.engine import slice as engine

    task = new_task(tenant, steps=5)
    engine.lease_claim(task_id=task.id, owner="dies")
    Task.objects.filter(id=task.id).update(status="working")
    steering_cancel(task=Task.objects.get(id=task.id), reason="stop", requested_by="user:op")
    with connection.cursor() as cursor:
        cursor.execute("UPDATE tasks_app_task SET lease_expires_at = now() - interval '1 second' WHERE id = %s",
                       [task.id])

    reaper.reaper_sweep()
    assert Task.objects.get(id=task.id).status == "cancelling"
    assert drive(task.id) == ["cancelled"]
    task.refresh_from_db()
    assert task.status == "cancelled" and task.checkpoint_sequence == 1  # checkpointed on the way out


def test_it_lets_an_operator_resolve_an_unknown_effect_from_admin(tenant, client, django_user_model):
    from checkpoints_app.models import SideEffect

    task = _dead_letter(tenant)
    SideEffect.objects.create(key=f"{task.id}:1:record", task_id=task.id, step_seq=1, name="record",
                              status="unknown", lease_epoch=1)
    client.force_login(django_user_model.objects.create_superuser("op", password=None))

    refused = client.post("/admin/tasks_app/task/", {"action": "retry_dead_letters", "_selected_action": [task.id]},
                          follow=True)
    assert "effects with unknown outcome" in refused.content.decode().lower()
    assert Task.objects.get(id=task.id).status == "dead_lettered"

    page = client.get(f"/admin/tasks_app/task/{task.id}/retry/")
    assert page.status_code == 200 and f"{task.id}:1:record" in page.content.decode()
    unanswered = client.post(f"/admin/tasks_app/task/{task.id}/retry/", {"answer_0": ""})
    assert unanswered.status_code == 200 and Task.objects.get(id=task.id).status == "dead_lettered"

    client.post(f"/admin/tasks_app/task/{task.id}/retry/", {"answer_0": "applied", "result_0": '{"recorded": "ok"}'})
    assert Task.objects.get(id=task.id).status == "recovering"
    effect = SideEffect.objects.get(task_id=task.id)
    assert (effect.status, effect.result) == ("succeeded", {"recorded": "ok"})


def test_it_takes_an_answer_per_effect_from_the_dead_letters_command(tenant):
    from checkpoints_app.models import SideEffect

    task = _dead_letter(tenant)
    for name in ("charge", "email"):
        SideEffect.objects.create(key=f"{task.id}:1:{name}", task_id=task.id, step_seq=1, name=name,
                                  status="unknown", lease_epoch=1)
    out = io.StringIO()
    call_command("dead_letters", "effects", str(task.id), stdout=out)
    assert f"{task.id}:1:charge" in out.getvalue() and f"{task.id}:1:email" in out.getvalue()

    with pytest.raises(CommandError, match="email"):  # every open effect needs its own answer
        call_command("dead_letters", "retry", str(task.id), "--effect", f"{task.id}:1:charge=applied")
    call_command("dead_letters", "retry", str(task.id), "--effect", f'{task.id}:1:charge=applied:{{"id": 7}}',
                 "--effect", f"{task.id}:1:email=not_applied", stdout=out)

    effects = {e.name: (e.status, e.result) for e in SideEffect.objects.filter(task_id=task.id)}
    assert effects == {"charge": ("succeeded", {"id": 7}), "email": ("failed", None)}
    assert Task.objects.get(id=task.id).status == "recovering"
