import pytest
from django.db import DatabaseError, connection, transaction

from steering_app.models import SteeringCommand
from steering_app.services import steering_cancel
from tasks_app.audit.retention import purge_allowed
from tasks_app.models import Task, TaskEvent
from tasks_app.selectors import task_events_verify
from tests.helpers import create_task


def test_it_cancels_a_queued_task_at_once(api):
    task_id = create_task(api).json()["taskId"]

    response = api.post(f"/runtime/tasks/{task_id}/cancel", {"reason": "changed my mind"}, format="json")

    assert response.status_code == 202
    assert response.json()["status"] == "cancelled" and response.json()["completedAt"]
    events = list(TaskEvent.objects.filter(task_id=task_id).order_by("seq").values_list("type", "data"))
    # A cancel command (the endpoint is its shorthand): recorded as applied, then the transition it made.
    assert [e[0] for e in events] == ["status", "steering.applied", "status", "terminal"]
    assert events[1][1]["type"] == "cancel" and events[1][1]["requestedBy"] == f"token:{api.raw_token[:12]}"
    assert events[1][1]["reason"] == events[2][1]["reason"] == "changed my mind"
    assert task_events_verify(task_id=task_id) is None
    history = api.get(f"/runtime/tasks/{task_id}/steering").json()["commands"]
    assert [(c["type"], c["status"], c["expectedVersion"]) for c in history] == [("cancel", "applied", None)]


def test_it_asks_a_running_task_to_stop_at_its_next_safe_point(api):
    task_id = create_task(api).json()["taskId"]
    Task.objects.filter(id=task_id).update(status="working", lease_owner="w1", lease_epoch=1)

    first = api.post(f"/runtime/tasks/{task_id}/cancel")
    again = api.post(f"/runtime/tasks/{task_id}/cancel")

    assert first.json()["internalStatus"] == "cancelling" and first.json()["status"] == "working"
    assert again.status_code == 202
    assert TaskEvent.objects.filter(task_id=task_id, type="status").count() == 2  # the repeat wrote nothing


def test_it_refuses_to_cancel_a_finished_task_with_409(api):
    task_id = create_task(api).json()["taskId"]
    Task.objects.filter(id=task_id).update(status="completed")

    response = api.post(f"/runtime/tasks/{task_id}/cancel")

    assert response.status_code == 409
    assert response.json()["currentStatus"] == "completed"
    assert Task.objects.get(id=task_id).status == "completed"


def test_it_refuses_to_update_an_event_in_the_database(api):
    task_id = create_task(api).json()["taskId"]

    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        TaskEvent.objects.filter(task_id=task_id).update(data={"status": "completed"})


def test_it_detects_a_tampered_or_removed_event_in_the_chain(api):
    task_id = create_task(api).json()["taskId"]
    api.post(f"/runtime/tasks/{task_id}/cancel")
    assert task_events_verify(task_id=task_id) is None

    # Tamper as someone with raw database access would: lift the trigger, edit, put it back.
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL session_replication_role = replica")  # superuser only: skips triggers
        cursor.execute("UPDATE tasks_app_taskevent SET data = '{\"status\": \"completed\"}' "
                       "WHERE task_id = %s AND seq = 2", [task_id])
        cursor.execute("SET LOCAL session_replication_role = origin")
    assert task_events_verify(task_id=task_id) == 2

    with purge_allowed():
        TaskEvent.objects.filter(task_id=task_id, seq__gte=2).delete()
    assert task_events_verify(task_id=task_id) == 2


def test_it_never_cuts_off_a_running_task_even_when_it_read_a_stale_status(api):
    task_id = create_task(api).json()["taskId"]
    stale = Task.objects.get(id=task_id)  # read while queued …
    Task.objects.filter(id=task_id).update(status="working", lease_owner="w1", lease_epoch=1)  # … then claimed

    task = steering_cancel(task=stale, reason="late", requested_by="user:late")

    assert task.status == "cancelling" and task.lease_owner == "w1"


def test_it_verifies_event_chains_from_the_command_line(api):
    import io

    from django.core.management import CommandError, call_command

    good = create_task(api).json()["taskId"]
    bad = create_task(api, key="b").json()["taskId"]
    out = io.StringIO()
    call_command("verify_events", stdout=out)
    assert "2 task(s) checked, 0 broken" in out.getvalue()

    with purge_allowed():
        TaskEvent.objects.filter(task_id=bad).delete()
    with pytest.raises(CommandError, match="audit trail was altered"):
        call_command("verify_events", stdout=out)
    assert f"{bad}: chain broken at event 1" in out.getvalue() and f"{good}: chain" not in out.getvalue()


def test_it_answers_a_repeated_cancel_of_a_cancelled_task_with_its_snapshot_and_writes_nothing(api):
    task_id = create_task(api).json()["taskId"]
    first = api.post(f"/runtime/tasks/{task_id}/cancel")
    events = TaskEvent.objects.filter(task_id=task_id).count()

    again = api.post(f"/runtime/tasks/{task_id}/cancel", {"reason": "sure?"}, format="json")

    assert first.json()["status"] == "cancelled"
    assert again.status_code == 202 and again.json() == first.json()
    assert TaskEvent.objects.filter(task_id=task_id).count() == events
    assert task_events_verify(task_id=task_id) is None


@pytest.mark.parametrize("status,detail", [
    ("completed", "The task already completed; a finished task cannot be cancelled."),
    ("failed", "The task already failed; a finished task cannot be cancelled."),
    ("dead_lettered", "The task is dead-lettered: an operator retries or abandons it; it cannot be cancelled."),
])
def test_it_says_why_a_finished_task_cannot_be_cancelled(api, status, detail):
    task_id = create_task(api).json()["taskId"]
    Task.objects.filter(id=task_id).update(status=status)

    response = api.post(f"/runtime/tasks/{task_id}/cancel")

    assert response.status_code == 409 and response["Content-Type"] == "application/problem+json"
    assert response.json()["detail"] == detail and response.json()["currentStatus"] == status


def test_it_writes_one_cancel_event_when_two_cancels_race_on_a_running_task(api):
    task_id = create_task(api).json()["taskId"]
    Task.objects.filter(id=task_id).update(status="working", lease_owner="w1", lease_epoch=1)
    # Both requests read the task while it was working, then each runs its guarded UPDATE.
    first_read, second_read = Task.objects.get(id=task_id), Task.objects.get(id=task_id)

    first = steering_cancel(task=first_read, reason="a", requested_by="user:a")
    second = steering_cancel(task=second_read, reason="b", requested_by="user:b")

    assert first.status == second.status == "cancelling"
    assert TaskEvent.objects.filter(task_id=task_id, type="status").count() == 2  # created, then one cancelling
    assert SteeringCommand.objects.filter(task_id=task_id).count() == 1  # the second queued nothing either


def test_it_answers_a_cancel_that_lost_the_race_to_another_cancel_with_the_cancelled_task(api):
    task_id = create_task(api).json()["taskId"]
    first_read, second_read = Task.objects.get(id=task_id), Task.objects.get(id=task_id)  # both saw it queued

    steering_cancel(task=first_read, reason="a", requested_by="user:a")
    second = steering_cancel(task=second_read, reason="b", requested_by="user:b")

    assert second.status == "cancelled"
    # Created, the first cancel applied, cancelled, terminal: nothing more.
    assert list(TaskEvent.objects.filter(task_id=task_id).order_by("seq").values_list("type", flat=True)) == [
        "status", "steering.applied", "status", "terminal"]
