"""Waits: a step asks for input, an effect waits for approval; answered through steering, resumed without replay."""

import base64

import pytest
from django.db import connection

from checkpoints_app.models import Checkpoint
from steering_app.models import SteeringCommand
from tasks_app.models import Step, Task, TaskEvent
from tasks_app.selectors import task_events_verify
from tests.engine_support import configure, drive, effects, executions

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("external_root")]


def create(api, workflow="demo_steps", **body):
    response = api.post("/runtime/tasks", {"workflow": workflow, **body}, format="json")
    assert response.status_code == 201, response.json()
    return Task.objects.get(id=response.json()["taskId"])


def snapshot(api, task):
    return api.get(f"/runtime/tasks/{task.id}").json()


def steer(api, task, type_, **body):
    version = snapshot(api, task)["stateVersion"]
    return api.post(f"/runtime/tasks/{task.id}/steering", {"type": type_, "expectedVersion": version, **body},
                    format="json")


def answer(api, task, value, **extra):
    wait = snapshot(api, task)["wait"]
    return steer(api, task, "provide_input", payload={"waitId": wait["waitId"], "value": value, **extra})


def test_it_waits_for_input_after_the_step_that_asked_and_never_runs_that_step_again(api):
    task = create(api, input={"steps": 4, "ask_at": 1})

    drive(task.id)

    waiting = snapshot(api, task)
    assert waiting["status"] == "input_required" and waiting["wait"]["kind"] == "input"
    assert waiting["wait"]["schema"]["required"] == ["note"] and "step 2" in waiting["wait"]["prompt"]
    row = Task.objects.get(id=task.id)
    assert (row.lease_owner, row.hint_at) == (None, None)  # no worker holds it and none is asked to come
    assert executions(task.id) == {1: 1, 2: 1}

    refused = answer(api, task, {"note": ""})
    assert refused.status_code == 422 and refused.json()["errors"][0]["field"] == "payload.value.note"
    assert Task.objects.get(id=task.id).status == "input_required" and Task.objects.get(id=task.id).answers is None

    assert answer(api, task, {"note": "looks good"}).status_code == 202
    assert Task.objects.get(id=task.id).status == "working"
    drive(task.id)

    done = Task.objects.get(id=task.id)
    assert done.status == "completed" and done.result == {"steps": 4, "note": "looks good"}
    assert executions(task.id) == {1: 1, 2: 1, 3: 1, 4: 1}  # the step that asked did not run again
    assert effects(task.id) == {f"{task.id}:{seq}:record": 1 for seq in (1, 2, 3, 4)}
    assert task_events_verify(task_id=task.id) is None


def test_it_stops_before_an_effect_that_needs_approval_and_calls_it_once_approved(api):
    task = create(api, input={"steps": 3, "approve_at": 1})

    drive(task.id)

    wait = snapshot(api, task)["wait"]
    assert wait["kind"] == "approval" and wait["effect"]["key"] == f"{task.id}:2:record"
    assert wait["effect"]["arguments"] == {"step": 1, "count": 2}
    assert effects(task.id) == {f"{task.id}:1:record": 1}  # not called before the approval
    assert steer(api, task, "approve", payload={"waitId": wait["waitId"]}, reason="ok").status_code == 202
    drive(task.id)

    assert Task.objects.get(id=task.id).status == "completed"
    assert effects(task.id) == {f"{task.id}:{seq}:record": 1 for seq in (1, 2, 3)}
