"""Fork from step N (tasks_app.forks): a new task that starts again at a step of another — the effects before it
inherited and never repeated, those after it run again only under the fork's own keys and after a person's approval
(unless the tool is read-only or idempotent), the lineage on both tasks' pages. The engine runs in this process on
the real database; the agent's model is the scripted HTTP model, its tools the example MCP server (real processes)."""

from __future__ import annotations

import pytest

from agents_app.models import TenantModel, ToolServer, TranscriptMessage  # noqa: F401
from steering_app.services import steering_submit
from tasks_app.engine import slice as engine
from tasks_app.engine.lease import lease_claim
from tasks_app.models import AdminAction, Task, TaskEvent
from tasks_app.selectors import task_events_verify
from tasks_app.services import task_create
from tests.engine_support import configure, drive, effects, executions
from tests.scripted_model_support import unique_key
from tests.tool_server_support import tool_server  # noqa: F401 — the fixture

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("external_root")]


def fork(api, task, **body):
    return api.post(f"/runtime/tasks/{task.id}/fork", body, format="json")


def approve_open_wait(task_id) -> dict:
    task = Task.objects.get(id=task_id)
    assert task.status == "input_required" and task.wait["kind"] == "approval", (task.status, task.wait)
    steering_submit(task=task, command_type="approve", payload={"waitId": task.wait["waitId"]},
                    expected_version=task.state_version, requested_by="user:ops", reason="run it again")
    return task.wait


def test_it_forks_a_running_task_at_step_7_inheriting_the_effects_before_and_repeating_the_rest_under_new_keys(
        api, tenant, settings, admin_client):
    configure(settings, slice_seconds=60)
    original = task_create(tenant=tenant, owner=None, workflow="demo_steps", input={"steps": 20}).task
    drive(original.id, max_steps=10, calls=1, until_done=False)
    claim = lease_claim(task_id=original.id, owner="worker-a")  # a worker holds it: the fork takes no pause
    assert claim is not None and Task.objects.get(id=original.id).steps_completed == 10

    response = fork(api, original, fromStep=7)

    assert response.status_code == 201, response.json()
    made = response.json()
    forked = Task.objects.get(id=made["taskId"])
    assert made["forkedFrom"] == {"taskId": str(original.id), "fromStep": 7}
    assert made["stepsCompleted"] == 6 and made["status"] == "working" and made["internalStatus"] == "queued"
    assert Task.objects.get(id=original.id).lease_owner == "worker-a"  # untouched by the fork
    assert engine.Slice(claim).run() == "completed"  # the original goes on and finishes under its lease
    forked_event = TaskEvent.objects.get(task_id=forked.id, type="task.forked").data
    assert [(r["step"], r["key"]) for r in forked_event["repeats"]] == [
        (seq, f"{original.id}:{seq}:record") for seq in range(7, 11)]  # what it had made from step 7 when forked
    assert forked_event["inherited"] == {"steps": 6, "effects": 6}
    assert forked.approval_policy == {"repeats": [f"{seq}:record" for seq in range(7, 11)]}

    # Each repeated effect waits for a person; the steps after the original's progress at the fork do not.
    approved = []
    while (outcome := drive(forked.id)[-1]) == "input_required":
        approved.append(approve_open_wait(forked.id))
    assert outcome == "completed"
    assert [wait["effect"]["key"] for wait in approved] == [f"{forked.id}:{seq}:record" for seq in range(7, 11)]
    assert "fork" in approved[0]["prompt"]

    # The outside log: the original's 20 effects once each; the fork's own only from step 7, under its keys.
    log = effects(original.id) + effects(forked.id)
    assert log == {**{f"{original.id}:{seq}:record": 1 for seq in range(1, 21)},
                   **{f"{forked.id}:{seq}:record": 1 for seq in range(7, 21)}}
    # Steps 1–6 never ran in the fork; 7–10 stopped at the gate before their effect, then ran again once approved.
    assert executions(forked.id) == {**{seq: 2 for seq in range(7, 11)}, **{seq: 1 for seq in range(11, 21)}}
    done, first = Task.objects.get(id=forked.id), Task.objects.get(id=original.id)
    assert done.status == "completed" and done.result["steps"] == first.result["steps"] == 20
    assert task_events_verify(task_id=forked.id) is None and task_events_verify(task_id=original.id) is None

    # Lineage both ways: the fork's row and page name the original; the original's page and GET …/forks list the
    # fork; the audit trail records who forked what.
    assert api.get(f"/runtime/tasks/{original.id}/forks").json()["forks"][0]["taskId"] == str(forked.id)
    original_page = admin_client.get(f"/admin/tasks_app/task/{original.id}/change/").content.decode()
    fork_page = admin_client.get(f"/admin/tasks_app/task/{forked.id}/change/").content.decode()
    assert 'id="console-forks"' in original_page and str(forked.id) in original_page
    assert "Forked from" in fork_page and str(original.id) in fork_page and 'id="console-repeats"' in fork_page
    record = AdminAction.objects.get(action="fork", object_id=str(original.id))
    assert str(forked.id) in record.message and record.actor.startswith("token:")


def test_it_refuses_a_fork_it_cannot_make_with_problem_details(api, other_api, tenant):
    original = task_create(tenant=tenant, owner=None, workflow="demo_steps", input={"steps": 3}).task
    drive(original.id)

    for body, field in [({}, "fromStep"), ({"fromStep": 0}, "fromStep"), ({"fromStep": 5}, "fromStep"),
                        ({"fromStep": 1, "fromTurn": 1}, "fromStep"), ({"fromTurn": 1}, "fromTurn"),
                        ({"fromStep": 2, "input": {"steps": "many"}}, "input.steps"),
                        ({"fromStep": 2, "colour": "red"}, "colour")]:
        response = fork(api, original, **body)
        assert response.status_code in (400, 422), (body, response.json())
        problem = response.json()
        assert response["Content-Type"].startswith("application/problem+json")
        assert field in {error["field"] for error in problem.get("errors", [])}, (body, problem)
    assert fork(other_api, original, fromStep=1).status_code == 404  # another tenant's: as unknown
    assert Task.objects.filter(forked_from=original).count() == 0  # nothing half-made


def test_it_forks_from_the_last_step_with_a_new_input_and_replans(api, tenant):
    original = task_create(tenant=tenant, owner=None, workflow="demo_steps", input={"steps": 3, "effect": False}).task
    drive(original.id)

    made = fork(api, original, fromStep=4, input={"steps": 3, "effect": False}).json()

    assert made["stepsCompleted"] == 3 and made["forkedFrom"]["fromStep"] == 4
    assert drive(made["taskId"])[-1] == "completed"  # nothing left to run: it completes with the inherited state
    assert executions(made["taskId"]) == {}


def test_it_forks_an_agent_at_turn_3_with_a_corrected_goal_repeating_only_what_a_person_approves(
        api, tenant, model, tool_server):  # noqa: F811
    ToolServer.objects.create(tenant=tenant, name="shop", url=tool_server.url, timeout_seconds=5)
    key = unique_key("fork")
    model.script(key, [{"tool_calls": [{"name": "shop__append", "arguments": {"text": "one"}}]},
                       {"tool_calls": [{"name": "shop__upsert", "arguments": {"key": "a", "value": "1"}}]},
                       {"tool_calls": [{"name": "shop__append", "arguments": {"text": "three"}}]},
                       {"tool_calls": [{"name": "shop__upsert", "arguments": {"key": "b", "value": "2"}}]},
                       {"content": "Done."}])
    original = task_create(tenant=tenant, owner=None, workflow="agent", input={"goal": f"Fill the shop ({key})"}).task
    assert drive(original.id)[-1] == "completed"

    response = fork(api, original, fromTurn=3, goal="Fill the shop, but with care")

    assert response.status_code == 201, response.json()
    forked = Task.objects.get(id=response.json()["taskId"])
    assert forked.forked_from_step == 5 and forked.steps_completed == 4  # turns 1–2: think, act, think, act
    assert drive(forked.id)[-1] == "input_required"  # turn 3's append: made by the original, not idempotent
    wait = approve_open_wait(forked.id)
    assert wait["effect"]["key"] == f"{forked.id}:6:shop.append:1"
    assert drive(forked.id)[-1] == "completed"  # turn 4's upsert is idempotent: repeated without asking

    # The model: turns 1 and 2 asked once (the fork inherited them), turn 3 on asked again by the fork, whose first
    # request carried the conversation so far and the corrected goal.
    assert model.turn_counts(key) == {0: 1, 1: 1, 2: 2, 3: 2, 4: 2}
    fork_turn_3 = model.requests(key, turn=2)[1]
    said = [message.get("content") or "" for message in fork_turn_3["messages"]]
    assert any("The goal is now: Fill the shop, but with care" in text for text in said)
    assert sum(message["role"] == "assistant" for message in fork_turn_3["messages"]) == 2
    # The outside log: the inherited calls once, the repeated ones under the fork's keys.
    appended = [call["idempotency_key_meta"] for call in tool_server.calls(tool="append", event="applied")]
    upserted = [call["idempotency_key_meta"] for call in tool_server.calls(tool="upsert", event="applied")]
    assert appended == [f"{original.id}:2:shop.append:1", f"{original.id}:6:shop.append:1",
                        f"{forked.id}:6:shop.append:1"]
    assert upserted == [f"{original.id}:4:shop.upsert:1", f"{original.id}:8:shop.upsert:1",
                        f"{forked.id}:8:shop.upsert:1"]
    assert Task.objects.get(id=forked.id).result["answer"] == "Done."
    assert api.get(f"/runtime/tasks/{forked.id}/transcript").status_code == 200
    assert task_events_verify(task_id=forked.id) is None
