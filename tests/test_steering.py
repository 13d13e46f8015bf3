"""Steering: commands queued with a version check, applied at safe points, recorded in the task's event chain."""

import threading
import uuid

import pytest
from django.db import connection

from steering_app import services
from steering_app.errors import VersionConflict
from steering_app.models import SteeringCommand
from tasks_app.engine import reaper
from tasks_app.engine import slice as engine
from tasks_app.models import Task, TaskEvent
from tasks_app.selectors import task_events_verify
from tests import workflows
from tests.engine_support import drive, executions, expire_lease
from tests.support.concurrency import at_once
from tests.support.tasks import steer

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("external_root")]


def outcomes(task_id) -> list[tuple[str, str]]:
    return [(event.type, event.data["type"]) for event in TaskEvent.objects.filter(
        task_id=task_id, type__startswith="steering.").order_by("seq")]


def _set_priority(task, priority: int) -> str:
    try:
        services.steering_submit(task=task, command_type="set_priority", payload={"priority": priority},
                                 expected_version=task.state_version, requested_by="user:test")
        return "accepted"
    except VersionConflict:
        return "conflict"


def test_it_accepts_exactly_one_of_two_commands_sent_with_the_same_version_at_once(new_task):
    for _ in range(15):
        task = new_task(steps=1)

        answers = at_once(*[lambda task=task: _set_priority(task, 5)] * 2)

        assert sorted(answers) == ["accepted", "conflict"]
        assert SteeringCommand.objects.filter(task=task).count() == 1
        assert Task.objects.get(id=task.id).state_version == task.state_version + 1


def test_it_answers_a_stale_version_with_409_and_the_current_snapshot(api, new_task):
    task = new_task(steps=1)
    assert steer(api, task.id, "set_priority", payload={"priority": 7}).status_code == 202

    stale = steer(api, task.id, "set_priority", version=task.state_version, payload={"priority": 2})

    assert stale.status_code == 409 and stale["Content-Type"] == "application/problem+json"
    body = stale.json()
    assert body["currentVersion"] == body["snapshot"]["stateVersion"] == task.state_version + 1
    assert body["snapshot"]["priority"] == 7  # applied at once: no worker holds a queued task


@pytest.mark.parametrize("type_, body, why", [
    ("resume", {}, "Only a paused task can be resumed"),
    ("set_priority", {"payload": {"priority": 12}}, "set_priority takes"),
    ("pause", {"payload": {"now": True}}, "takes no payload"),
    ("adjust_goal", {}, "adjust_goal takes"),
    ("provide_input", {"payload": {"waitId": "00000000-0000-0000-0000-000000000000", "value": 1}},
     "waits for nothing"),
    ("approve", {"payload": {}}, "needs the waitId"),
])
def test_it_refuses_a_command_that_does_not_apply_with_422_saying_why(api, new_task, type_, body, why):
    task = new_task(steps=1)

    refused = steer(api, task.id, type_, **body)

    assert refused.status_code == 422 and why in refused.json()["detail"]
    assert not SteeringCommand.objects.filter(task=task).exists()
    assert Task.objects.get(id=task.id).state_version == task.state_version


def test_it_answers_the_same_command_id_with_the_first_answer(api, new_task):
    task = new_task(steps=1)
    command_id = str(uuid.uuid4())

    first = steer(api, task.id, "set_priority", payload={"priority": 3}, commandId=command_id)
    again = steer(api, task.id, "set_priority", version=task.state_version, payload={"priority": 3},
                  commandId=command_id)

    assert first.status_code == again.status_code == 202
    assert again.json() == {**first.json(), "status": "replayed"}
    assert SteeringCommand.objects.filter(task=task).count() == 1


def test_it_pauses_a_running_task_at_the_next_safe_point_and_resumes_it_without_losing_or_repeating_a_step(
        api, new_task):
    workflows.GATES["p"], workflows.REACHED["p"] = threading.Event(), threading.Event()
    name = uuid.uuid4().hex
    workflows.SCRIPTS[name] = {1: [{"do": "block", "gate": "p"}]}
    task = new_task("scripted", script=name, steps=4)
    thread = threading.Thread(target=lambda: (engine.run_step(task.id, owner="w1"), connection.close()))
    thread.start()
    assert workflows.REACHED["p"].wait(10)  # step 2 is running

    accepted = steer(api, task.id, "pause", reason="look at the draft first")
    pausing = api.get(f"/runtime/tasks/{task.id}").json()
    workflows.GATES["p"].set()
    thread.join(10)
    paused = Task.objects.get(id=task.id)

    assert accepted.status_code == 202 and pausing["internalStatus"] == "pausing"
    assert (paused.status, paused.steps_completed, paused.lease_owner) == ("paused", 2, None)  # step 2 committed

    resumed = steer(api, task.id, "resume")
    assert resumed.status_code == 202 and Task.objects.get(id=task.id).status == "working"
    assert drive(task.id) == ["completed"]

    done = Task.objects.get(id=task.id)
    assert done.status == "completed" and done.steps_completed == 4
    assert outcomes(task.id) == [("steering.applied", "pause"), ("steering.applied", "resume")]
    history = api.get(f"/runtime/tasks/{task.id}/steering").json()["commands"]
    assert [(c["type"], c["status"], c["reason"]) for c in history] == [
        ("resume", "applied", ""), ("pause", "applied", "look at the draft first")]
    assert history[1]["appliedAt"] and history[1]["requestedBy"] == f"token:{api.raw_token[:12]}"
    assert task_events_verify(task_id=task.id) is None
    workflows.SCRIPTS.pop(name, None)


def test_it_applies_a_command_accepted_before_a_worker_died_exactly_once_after_recovery(api, new_task):
    task = new_task(steps=3)
    # A worker holds the task (it claimed, ran a step) and dies before its next safe point.
    engine.run_step(task.id, owner="doomed", max_steps=1)
    assert Task.objects.get(id=task.id).steps_completed == 1
    Task.objects.filter(id=task.id).update(lease_owner="doomed", lease_expires_at="2100-01-01T00:00:00Z",
                                           status="working")
    assert steer(api, task.id, "set_priority", payload={"priority": 8}).status_code == 202
    assert Task.objects.get(id=task.id).priority != 8  # held by a worker: applied at its next safe point

    expire_lease(task.id)
    reaper.reaper_sweep()
    assert drive(task.id) == ["completed"]

    task = Task.objects.get(id=task.id)
    assert task.priority == 8 and task.steering_cursor == task.state_version
    assert outcomes(task.id) == [("steering.applied", "set_priority")]
    assert executions(task.id) == {1: 1, 2: 1, 3: 1}


def test_it_cancels_a_running_task_at_its_next_safe_point_keeping_the_reason(api, new_task):
    task = new_task(steps=3)
    engine.run_step(task.id, owner="w", max_steps=1)
    Task.objects.filter(id=task.id).update(lease_owner="w", lease_expires_at="2100-01-01T00:00:00Z",
                                           status="working")

    assert steer(api, task.id, "cancel", reason="wrong customer").status_code == 202
    assert Task.objects.get(id=task.id).status == "cancelling"
    expire_lease(task.id)
    reaper.reaper_sweep()
    drive(task.id)

    task = Task.objects.get(id=task.id)
    assert task.status == "cancelled" and task.steps_completed == 1
    cancelled = TaskEvent.objects.get(task=task, type="steering.applied")
    assert cancelled.data["reason"] == "wrong customer"


def test_it_reads_no_command_at_a_safe_point_when_none_was_submitted(new_task):
    from django.test.utils import CaptureQueriesContext

    task = new_task(steps=5)
    with CaptureQueriesContext(connection) as queries:
        assert drive(task.id) == ["completed"]

    assert not [q for q in queries.captured_queries if "steering_app_steeringcommand" in q["sql"]]


# -- with real `celery worker` processes --------------------------------------------------------------------------
def _wait(task_id, predicate, seconds=30):
    from tests.worker_support import wait_until

    return wait_until(task_id, predicate, seconds)


@pytest.mark.slow
def test_it_pauses_and_resumes_on_a_real_worker_repeating_and_losing_no_step_or_effect(api, new_task, workers):
    from tests.engine_support import effects

    workers("steady", env={"PGAPPNAME": "steady-worker"})
    task = new_task(steps=8, sleep_ms=150)
    _wait(task.id, lambda t: t.steps_completed >= 2)

    assert steer(api, task.id, "pause", reason="check").status_code == 202
    paused = _wait(task.id, lambda t: t.status == "paused")
    assert paused.lease_owner is None and paused.steps_completed < 8
    with connection.cursor() as cursor:  # a paused task costs nothing: no worker sends a statement for it
        cursor.execute("SELECT statement_timestamp()")
        quiet_since = cursor.fetchone()[0]
        import time

        time.sleep(3)
        cursor.execute("SELECT count(*), max(query_start) FROM pg_stat_activity WHERE application_name = %s "
                       "AND datname = current_database()",
                       ["steady-worker"])
        backends, last_statement = cursor.fetchone()
    assert backends >= 1 and last_statement < quiet_since
    assert Task.objects.get(id=task.id).steps_completed == paused.steps_completed

    assert steer(api, task.id, "resume").status_code == 202
    assert Task.objects.get(id=task.id).status_message == "Resumed: waiting for a worker"
    running_again = _wait(task.id, lambda t: t.steps_completed >= paused.steps_completed + 1)
    done = _wait(task.id, lambda t: t.status == "completed")

    # A worker has it again: its message no longer says it waits for one.
    assert running_again.status_message == "" or running_again.status == "completed"
    assert done.steps_completed == 8
    assert executions(task.id) == {seq: 1 for seq in range(1, 9)}
    assert effects(task.id) == {f"{task.id}:{seq}:record": 1 for seq in range(1, 9)}
    assert outcomes(task.id) == [("steering.applied", "pause"), ("steering.applied", "resume")]


@pytest.mark.slow
def test_it_applies_a_pause_accepted_before_its_worker_was_sigkilled_exactly_once(api, new_task, workers):
    from config.celery import app

    doomed = workers("doomed", pool="solo")
    task = new_task(steps=6, sleep_ms=400)
    _wait(task.id, lambda t: t.steps_completed >= 1)

    assert steer(api, task.id, "pause", reason="stop before the next one").status_code == 202
    doomed.stop()  # SIGKILL, mid-step: the pause is queued and not yet applied
    assert Task.objects.get(id=task.id).status == "pausing"
    workers("rescuer")
    expire_lease(task.id)
    app.send_task("runtime.reap", priority=0)

    paused = _wait(task.id, lambda t: t.status == "paused")
    assert outcomes(paused.id) == [("steering.applied", "pause")]
    assert paused.lease_owner is None and task_events_verify(task_id=task.id) is None


def test_it_queues_one_cancel_when_two_cancels_race_on_a_running_task(new_task):
    task = new_task(steps=2)
    Task.objects.filter(id=task.id).update(status="working", lease_owner="w1", lease_epoch=1)

    answers = at_once(*[lambda: services.steering_cancel(task=Task.objects.get(id=task.id), reason="either",
                                                         requested_by="user:test").status] * 2)

    assert answers == ["cancelling", "cancelling"]
    assert SteeringCommand.objects.filter(task=task).count() == 1
    assert TaskEvent.objects.filter(task=task, type="status", data__status="cancelling").count() == 1


def test_it_steers_a_task_from_its_admin_page_and_shows_a_stale_version_as_a_message(new_task, admin_client):
    task = new_task(steps=2)
    page = admin_client.get(f"/admin/tasks_app/task/{task.id}/change/").content.decode()
    assert f"/admin/tasks_app/task/{task.id}/steer/" in page

    sent = admin_client.post(f"/admin/tasks_app/task/{task.id}/steer/", {
        "type": "set_priority", "priority": 9, "reason": "customer escalation",
        "expected_version": task.state_version}, follow=True)
    stale = admin_client.post(f"/admin/tasks_app/task/{task.id}/steer/", {
        "type": "set_priority", "priority": 1, "reason": "late", "expected_version": task.state_version},
        follow=True)

    assert sent.status_code == stale.status_code == 200
    assert "Command set_priority accepted" in sent.content.decode()
    assert "Not done: the task changed since you looked at it" in stale.content.decode()
    assert "set priority by user:admin" in stale.content.decode()
    assert Task.objects.get(id=task.id).priority == 9
    assert "customer escalation" in admin_client.get(f"/admin/tasks_app/task/{task.id}/change/").content.decode()


def test_it_lets_only_accounts_with_the_steering_permission_steer_from_the_admin(new_task, client):
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Permission

    reader = get_user_model().objects.create_user("reader", is_staff=True)
    reader.user_permissions.add(Permission.objects.get(codename="view_task"))
    client.force_login(reader)
    task = new_task(steps=1)

    answer = client.post(f"/admin/tasks_app/task/{task.id}/steer/", {
        "type": "set_priority", "priority": 9, "reason": "x", "expected_version": task.state_version})

    assert answer.status_code == 403
    assert not SteeringCommand.objects.filter(task=task).exists()
    page = answer.content.decode()  # a page for a person, in the admin's frame, saying why
    assert "Your account may read tasks but not steer them." in page and 'id="site-name"' in page


@pytest.mark.slow
def test_it_lets_a_running_effect_return_and_records_it_once_when_cancelled_during_it(api, new_task, workers):
    from checkpoints_app.models import SideEffect
    from tests.engine_support import effects

    workers("steady")
    task = new_task(steps=3, effect_answer_ms=1500)  # each step's effect lands, then answers 1.5 s later
    _wait(task.id, lambda t: effects(t.id))  # step 1's effect has landed; its answer is on its way

    assert steer(api, task.id, "cancel", reason="wrong account").status_code == 202
    assert Task.objects.get(id=task.id).status == "cancelling"
    cancelled = _wait(task.id, lambda t: t.status == "cancelled")

    assert cancelled.steps_completed == 1  # step 1 finished and committed; step 2 never started
    assert effects(task.id) == {f"{task.id}:1:record": 1}
    assert SideEffect.objects.get(task=task, step_seq=1).status == "succeeded"
    applied = TaskEvent.objects.get(task=task, type="steering.applied")
    assert (applied.data["type"], applied.data["reason"]) == ("cancel", "wrong account")
    assert task_events_verify(task_id=task.id) is None


def test_it_pauses_a_task_waiting_for_input_at_once(api, new_task):
    task = new_task(steps=1)
    Task.objects.filter(id=task.id).update(status="input_required")

    assert steer(api, task.id, "pause", reason="later").status_code == 202

    assert Task.objects.get(id=task.id).status == "paused"
    assert outcomes(task.id) == [("steering.applied", "pause")]


def _allow_kill(user):
    from django.contrib.auth.models import Permission

    user.user_permissions.add(Permission.objects.get(codename="kill_task"))


def test_it_lets_only_operators_with_the_kill_permission_kill_and_only_with_a_reason(api, new_task):
    task = new_task(steps=1)

    forbidden = steer(api, task.id, "kill", reason="runaway")
    _allow_kill(api.user)
    no_reason = steer(api, task.id, "kill")
    killed = steer(api, task.id, "kill", reason="runaway")

    assert forbidden.status_code == 403 and "kill permission" in forbidden.json()["detail"]
    assert no_reason.status_code == 422 and "needs a reason" in no_reason.json()["detail"]
    assert killed.status_code == 202 and Task.objects.get(id=task.id).status == "cancelled"  # queued: at once


@pytest.mark.slow
def test_it_kills_a_task_during_a_long_effect_within_seconds_reconciling_the_effect(api, new_task, workers):
    import time

    from checkpoints_app.models import SideEffect
    from tests.engine_support import effects

    workers("pair", concurrency=2)
    _allow_kill(api.user)
    task = new_task(steps=3, effect_answer_ms=60_000)  # the effect lands, and its answer would take a minute
    _wait(task.id, lambda t: effects(t.id))

    killed_at = time.monotonic()
    assert steer(api, task.id, "kill", reason="runaway spend").status_code == 202
    cancelled = _wait(task.id, lambda t: t.status == "cancelled", seconds=20)

    assert time.monotonic() - killed_at < 10  # not the minute the effect would have taken
    assert cancelled.steps_completed == 0
    # Shown as killed, by whom and why, wherever its status shows (not as any other "Cancelled").
    assert Task.objects.get(id=task.id).status_message.startswith("Killed by token:") and \
        "runaway spend" in Task.objects.get(id=task.id).status_message
    assert effects(task.id) == {f"{task.id}:1:record": 1}  # reconciled, not called again
    assert SideEffect.objects.get(task=task, step_seq=1).status == "succeeded"
    applied = TaskEvent.objects.get(task=task, type="steering.applied")
    assert (applied.data["type"], applied.data["reason"]) == ("kill", "runaway spend")
    assert task_events_verify(task_id=task.id) is None


def test_it_pauses_and_cancels_several_tasks_from_the_admin_list_with_a_reason(new_task, admin_client):
    queued = new_task(steps=1)
    finished = new_task(steps=1)
    Task.objects.filter(id=finished.id).update(status="completed")
    selected = {"_selected_action": [str(queued.id), str(finished.id)], "action": "cancel_tasks"}

    asked = admin_client.post("/admin/tasks_app/task/", selected)
    done = admin_client.post("/admin/tasks_app/task/", {**selected, "reason": "duplicate batch"}, follow=True)

    assert asked.status_code == 200 and "why?" in asked.content.decode()  # the reason comes first
    assert Task.objects.get(id=queued.id).status == "cancelled"
    assert "Cancel sent to 1 task(s)" in done.content.decode()  # (the admin capitalises messages)
    assert "a finished task takes no more commands" in done.content.decode()
    assert TaskEvent.objects.get(task=queued, type="steering.applied").data["reason"] == "duplicate batch"


def test_it_queues_one_command_when_the_same_command_id_is_sent_twice_at_once(new_task):
    for _ in range(10):
        task = new_task(steps=1)

        answers = at_once(*[lambda task=task, command_id=uuid.uuid4(): services.steering_submit(
            task=task, command_type="set_priority", payload={"priority": 4}, expected_version=task.state_version,
            requested_by="user:test", command_id=command_id).replayed] * 2)

        assert sorted(answers) == [False, True]  # one accepted, one answered with it
        assert SteeringCommand.objects.filter(task=task).count() == 1
