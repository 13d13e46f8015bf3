"""Budgets (docs/steering.md "Budgets"): steps, cost and model tokens counted with each step; at a spent budget the
task fails (BudgetExhausted) or waits in input_required for an operator to raise it with set_budget, per policy —
the workflow's on_budget_exhausted, or the task's own budget.onExhausted.

Run by the engine in this process (tests/engine_support.drive), the agent against the scripted model (a real HTTP
process), and once on a real `celery worker`."""

from __future__ import annotations

from decimal import Decimal

import pytest

from steering_app import services as steering
from steering_app.models import SteeringCommand
from tasks_app.engine import slice as engine
from tasks_app.engine.lease import lease_claim
from tasks_app.models import Task, TaskEvent
from tasks_app.selectors import task_events_verify
from tasks_app.services import task_create
from tests.engine_support import configure, drive, executions
from tests.scripted_model_support import unique_key
from tests.support.tasks import create, events_of, snapshot, steer

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("external_root")]


def test_it_counts_tokens_beside_cost_and_refuses_a_count_that_is_not_a_whole_number(step_context):
    ctx = step_context()

    ctx.spend("0.25")  # as before: cost only
    ctx.spend(0.5, tokens=1200)
    for tokens in (-1, 2.5, True, 10**12):
        with pytest.raises(ValueError, match="tokens"):
            ctx.spend(0, tokens=tokens)

    assert (ctx.cost, ctx.tokens) == (Decimal("0.75"), 1200)


# -- the steps budget, on a task that waits ---------------------------------------------------------------------------
def test_it_waits_at_a_spent_steps_budget_and_goes_on_once_an_operator_raises_it(api):
    created = create(api, input={"steps": 5}, budget={"maxSteps": 2, "onExhausted": "wait"})
    task_id = created["taskId"]
    assert created["budget"] == {"maxSteps": 2, "maxCost": None, "maxTokens": None, "onExhausted": "wait"}

    assert drive(task_id)[-1] == "input_required"

    shown = snapshot(api, task_id)
    wait = shown["wait"]
    assert (shown["status"], shown["stepsCompleted"], wait["kind"], wait["name"]) == ("input_required", 2, "budget",
                                                                                      "budget")
    assert "used 2 of its 2 steps" in wait["prompt"] and "maxSteps" in wait["prompt"] and "set_budget" in wait["prompt"]
    assert wait["budget"]["exhausted"] == ["steps"] and wait["budget"]["limits"]["maxSteps"] == 2
    assert shown["statusMessage"].startswith("Waiting for a budget: Budget spent")
    waiting = Task.objects.get(id=task_id)
    assert (waiting.lease_owner, waiting.hint_at) == (None, None)  # nobody polls a waiting task

    # An answer is not how a budget wait ends: it is raised.
    refused = steer(api, task_id, "provide_input", payload={"waitId": wait["waitId"], "value": "go on"})
    assert refused.status_code == 422 and "set_budget" in refused.json()["detail"]

    raised = steer(api, task_id, "set_budget", payload={"maxSteps": 5}, reason="approved by finance")
    assert raised.status_code == 202
    going = Task.objects.get(id=task_id)
    assert (going.status, going.wait, going.budget_steps) == ("working", None, 5)
    assert going.hint_at is not None  # the worker hint went out with the raise

    assert drive(task_id)[-1] == "completed"
    assert executions(task_id) == {1: 1, 2: 1, 3: 1, 4: 1, 5: 1}  # nothing ran twice
    applied = events_of(task_id, "steering.applied")
    assert applied[-1]["type"] == "set_budget" and applied[-1]["budget"] == {"maxSteps": 5}
    assert applied[-1]["waitId"] == wait["waitId"] and applied[-1]["reason"] == "approved by finance"
    assert task_events_verify(task_id=task_id) is None


def test_it_keeps_waiting_when_a_raise_is_not_enough_saying_where_it_stands(api):
    task_id = create(api, input={"steps": 4, "cost_per_step": 0.5},
                     budget={"maxSteps": 2, "maxCost": 1, "onExhausted": "wait"})["taskId"]
    drive(task_id)
    first = snapshot(api, task_id)["wait"]
    assert first["budget"]["exhausted"] == ["steps", "cost"]

    assert steer(api, task_id, "set_budget", payload={"maxSteps": None}).status_code == 202  # the cost is still spent

    shown = snapshot(api, task_id)
    assert shown["status"] == "input_required" and shown["budget"]["maxSteps"] is None
    assert shown["wait"]["waitId"] == first["waitId"] and shown["wait"]["budget"]["exhausted"] == ["cost"]
    assert "cost budget 1.0000" in shown["wait"]["prompt"] and "maxCost" in shown["wait"]["prompt"]
    assert Task.objects.get(id=task_id).hint_at is None

    assert steer(api, task_id, "set_budget", payload={"maxCost": "2.5"}).status_code == 202
    assert drive(task_id)[-1] == "completed"
    done = snapshot(api, task_id)
    assert (done["costSpent"], done["budget"]["maxCost"], done["stepsCompleted"]) == ("2.0000", "2.5000", 4)


def test_it_keeps_a_task_paused_in_its_budget_wait_paused_when_raised_and_resume_continues_it(api):
    task_id = create(api, input={"steps": 3}, budget={"maxSteps": 1, "onExhausted": "wait"})["taskId"]
    drive(task_id)
    assert steer(api, task_id, "pause", reason="look first").status_code == 202

    assert steer(api, task_id, "set_budget", payload={"maxSteps": 3}).status_code == 202

    paused = Task.objects.get(id=task_id)
    assert (paused.status, paused.wait, paused.budget_steps, paused.hint_at) == ("paused", None, 3, None)
    assert steer(api, task_id, "resume").status_code == 202
    assert Task.objects.get(id=task_id).status == "working"
    assert drive(task_id)[-1] == "completed"


def test_it_fails_at_a_spent_budget_when_its_policy_is_fail_as_the_default_for_workflows(api):
    task_id = create(api, input={"steps": 5}, budget={"maxSteps": 2})["taskId"]
    assert snapshot(api, task_id)["budget"]["onExhausted"] == "fail"  # demo_steps keeps the default

    drive(task_id)

    failed = Task.objects.get(id=task_id)
    assert (failed.status, failed.error["type"], failed.steps_completed) == ("failed", "BudgetExhausted", 2)
    assert "used 2 of its 2 steps" in failed.error["message"] and failed.wait is None


def test_it_waits_at_the_next_safe_point_when_a_running_tasks_budget_is_lowered_below_what_it_used(api):
    task_id = create(api, input={"steps": 6}, budget={"onExhausted": "wait"})["taskId"]
    assert drive(task_id, calls=1, until_done=False, max_steps=3) == ["released"]  # between slices, still working

    # Left for its worker (the task is working): applied at the next safe point, before the next step.
    assert steer(api, task_id, "set_budget", payload={"maxSteps": 1}).status_code == 202
    assert Task.objects.get(id=task_id).budget_steps is None

    assert drive(task_id)[-1] == "input_required"
    waiting = Task.objects.get(id=task_id)
    assert (waiting.steps_completed, waiting.budget_steps, waiting.wait["kind"]) == (3, 1, "budget")
    types = [event.type for event in TaskEvent.objects.filter(task_id=task_id).order_by("seq")]
    assert types.index("steering.applied") < types.index("input_required")

    assert steer(api, task_id, "set_budget", payload={"maxSteps": None}).status_code == 202
    assert drive(task_id)[-1] == "completed"
    assert executions(task_id) == {seq: 1 for seq in range(1, 7)}


def test_it_applies_a_set_budget_that_came_in_while_its_worker_was_entering_the_budget_wait(tenant):
    """The race sql.ENTER_WAIT names: the command finds the task leased (so it is left for the worker's next safe
    point), while the worker, past that safe point, enters the budget wait. The entry is guarded on the version the
    worker decided up to: it fails, the worker applies the raise and goes on — the task never waits."""
    task = task_create(tenant=tenant, owner=None, workflow="demo_steps", input={"steps": 4}, budget_steps=2,
                       budget_on_exhausted="wait").task
    assert drive(task.id, calls=1, until_done=False, max_steps=2) == ["released"]
    claim = lease_claim(task_id=task.id, owner="racer")  # the worker took it: what it knows is this version

    steering.steering_submit(task=task, command_type="set_budget", payload={"maxSteps": 4},
                             expected_version=claim.state_version, requested_by="user:ops")
    assert Task.objects.get(id=task.id).budget_steps == 2  # left for the worker

    assert engine.Slice(claim).run() == "completed"
    assert events_of(task.id, "input_required") == []
    assert [e["type"] for e in events_of(task.id, "steering.applied")] == ["set_budget"]
    assert Task.objects.get(id=task.id).budget_steps == 4


# -- set_budget: what it takes -------------------------------------------------------------------------------------
@pytest.mark.parametrize(("payload", "field"), [
    ({}, "payload"),
    ({"maxSteps": 0}, "payload.maxSteps"),
    ({"maxSteps": 2.5}, "payload.maxSteps"),
    ({"maxTokens": -1}, "payload.maxTokens"),
    ({"maxTokens": True}, "payload.maxTokens"),
    ({"maxCost": "a lot"}, "payload.maxCost"),
    ({"maxCost": -1}, "payload.maxCost"),
    ({"maxCost": 0.00001}, "payload.maxCost"),
    ({"maxCost": 10**9}, "payload.maxCost"),
    ({"maxTokens": 10, "maxTime": 3}, "payload.maxTime"),
])
def test_it_refuses_a_bad_set_budget_payload_with_422_naming_the_field(api, payload, field):
    task_id = create(api, input={"steps": 1})["taskId"]

    refused = steer(api, task_id, "set_budget", payload=payload)

    assert refused.status_code == 422 and refused["Content-Type"] == "application/problem+json"
    assert [error["field"] for error in refused.json()["errors"]] == [field]
    assert not SteeringCommand.objects.filter(task_id=task_id).exists()


def test_it_answers_a_set_budget_with_a_stale_version_with_409_and_the_current_snapshot(api):
    task_id = create(api, input={"steps": 1})["taskId"]
    seen = snapshot(api, task_id)["stateVersion"]
    assert steer(api, task_id, "set_budget", version=seen, payload={"maxTokens": 100}).status_code == 202

    stale = steer(api, task_id, "set_budget", version=seen, payload={"maxTokens": 5})

    assert stale.status_code == 409 and stale["Content-Type"] == "application/problem+json"
    body = stale.json()
    assert body["currentVersion"] == seen + 1 and body["snapshot"]["budget"]["maxTokens"] == 100
    assert Task.objects.get(id=task_id).budget_tokens == 100


@pytest.mark.parametrize(("budget", "field"), [
    ({"maxTokens": -1}, "budget.maxTokens"),
    ({"maxTokens": "many"}, "budget.maxTokens"),
    ({"onExhausted": "later"}, "budget.onExhausted"),
])
def test_it_refuses_a_bad_token_budget_or_policy_at_create_naming_the_field(api, budget, field):
    refused = api.post("/runtime/tasks", {"workflow": "demo_steps", "input": {"steps": 1}, "budget": budget},
                       format="json")

    assert refused.status_code == 400 and refused["Content-Type"] == "application/problem+json"
    assert field in [error["field"] for error in refused.json()["errors"]]
    assert not Task.objects.exists()


def test_it_refuses_a_bad_token_budget_or_policy_in_the_service_too(tenant):
    from config.base.problems import Problem

    with pytest.raises(Problem) as refused:
        task_create(tenant=tenant, owner=None, workflow="demo_steps", input={"steps": 1}, budget_tokens=-5,
                    budget_on_exhausted="sometimes")
    assert [error["field"] for error in refused.value.errors] == ["budget.maxTokens", "budget.onExhausted"]
    assert not Task.objects.exists()


def test_it_asks_an_mcp_client_nothing_about_a_budget_wait(api):
    from mcp_bridge import elicitation, mapping

    task_id = create(api, input={"steps": 2}, budget={"maxSteps": 1, "onExhausted": "wait"})["taskId"]
    drive(task_id)
    task = Task.objects.get(id=task_id)

    assert task.wait["kind"] == "budget"
    assert mapping.input_requests(task.wait) == {} and elicitation.question_for(task.wait) is None
    assert mapping.answer_commands(task.wait, {task.wait["waitId"]: {"action": "accept", "content": {}}}) == []


# -- the agent: cost and tokens from each model call ------------------------------------------------------------------
def two_turns(model, label: str) -> str:
    """A conversation of two model calls: a tool call the agent cannot make (it says so to the model; no tool server
    needed), then an answer. Turn 1 costs 0.0024 and 1,050 tokens; turn 2, 0.00316 and 1,520 tokens (2 and 8 per
    million tokens in and out)."""
    key = unique_key(label)
    model.script(key, [{"tool_calls": [{"name": "shop__upsert", "arguments": {"key": "colour"}}],
                        "usage": {"prompt_tokens": 1000, "completion_tokens": 50}},
                       {"content": "Done.", "usage": {"prompt_tokens": 1500, "completion_tokens": 20}}])
    return key


def test_it_stops_an_agent_at_its_token_budget_and_goes_on_once_raised_without_asking_the_model_again(api, model):
    key = two_turns(model, "tokens")
    task_id = create(api, "agent", input={"goal": f"Set the colour ({key})"}, budget={"maxTokens": 1000})["taskId"]
    assert snapshot(api, task_id)["budget"]["onExhausted"] == "wait"  # the agent's: agent.on_budget

    assert drive(task_id)[-1] == "input_required"

    shown = snapshot(api, task_id)
    assert (shown["tokensSpent"], shown["costSpent"], shown["stepsCompleted"]) == (1050, "0.0024", 1)
    assert shown["wait"]["kind"] == "budget" and shown["wait"]["budget"]["exhausted"] == ["tokens"]
    assert "1,050 of its 1,000 tokens" in shown["wait"]["prompt"] and "maxTokens" in shown["wait"]["prompt"]
    assert model.turn_counts(key) == {0: 1}

    assert steer(api, task_id, "set_budget", payload={"maxTokens": 5000}).status_code == 202
    assert drive(task_id)[-1] == "completed"

    done = Task.objects.get(id=task_id)
    assert done.result["answer"] == "Done." and done.tokens_spent == 2570 and str(done.cost_spent) == "0.0056"
    assert model.turn_counts(key) == {0: 1, 1: 1}  # the committed turn was not asked again
    assert [e["tokensIn"] + e["tokensOut"] for e in events_of(task_id, "llm.message")] == [1050, 1520]
    assert task_events_verify(task_id=task_id) is None


def test_it_stops_an_agent_at_its_cost_budget_and_goes_on_once_raised(api, model):
    key = two_turns(model, "cost")
    task_id = create(api, "agent", input={"goal": f"Set the colour ({key})"}, budget={"maxCost": "0.002"})["taskId"]

    assert drive(task_id)[-1] == "input_required"
    wait = snapshot(api, task_id)["wait"]
    assert wait["budget"]["exhausted"] == ["cost"] and "spent 0.0024 of its cost budget 0.0020" in wait["prompt"]

    assert steer(api, task_id, "set_budget", payload={"maxCost": 1}).status_code == 202
    assert drive(task_id)[-1] == "completed"
    assert model.turn_counts(key) == {0: 1, 1: 1}
    assert Task.objects.get(id=task_id).budget_cost == Decimal("1")


def test_it_fails_an_agent_at_its_token_budget_when_the_deployment_says_fail(api, model, settings):
    configure(settings, agent={"on_budget": "fail"})
    key = two_turns(model, "fail")
    task_id = create(api, "agent", input={"goal": f"Set the colour ({key})"}, budget={"maxTokens": 1000})["taskId"]

    drive(task_id)

    failed = Task.objects.get(id=task_id)
    assert (failed.status, failed.error["type"], failed.tokens_spent) == ("failed", "BudgetExhausted", 1050)
    assert model.turn_counts(key) == {0: 1}


def test_it_lets_a_task_choose_to_fail_over_its_workflows_wait(api, model):
    key = two_turns(model, "override")
    task_id = create(api, "agent", input={"goal": f"Set the colour ({key})"},
                     budget={"maxTokens": 1000, "onExhausted": "fail"})["taskId"]

    drive(task_id)

    assert Task.objects.get(id=task_id).error["type"] == "BudgetExhausted"


# -- the console ------------------------------------------------------------------------------------------------------
def test_it_shows_the_budget_wait_with_its_figures_and_raises_the_budget_from_the_console(api, admin_client):
    task_id = create(api, input={"steps": 3, "cost_per_step": 0.25},
                     budget={"maxSteps": 1, "onExhausted": "wait"})["taskId"]
    drive(task_id)

    page = admin_client.get(f"/admin/tasks_app/task/{task_id}/change/").content.decode()
    assert 'id="console-budget"' in page and "Raise the budget" in page
    assert f"/admin/tasks_app/task/{task_id}/steer/budget/" in page
    assert "0.2500 spent (no cost budget); 0 tokens used (no token budget)" in page  # tokens next to cost
    assert admin_client.get(f"/admin/tasks_app/task/{task_id}/steer/wait/")["Location"].endswith("/steer/budget/")

    budget_page = admin_client.get(f"/admin/tasks_app/task/{task_id}/steer/budget/").content.decode()
    assert 'id="budget-figures"' in budget_page and "<strong>spent</strong>" in budget_page
    version = Task.objects.get(id=task_id).state_version
    unchanged = admin_client.post(f"/admin/tasks_app/task/{task_id}/steer/budget/", {
        "max_steps": "1", "reason": "nothing", "expected_version": version})
    assert "Nothing to send" in unchanged.content.decode()

    sent = admin_client.post(f"/admin/tasks_app/task/{task_id}/steer/budget/", {
        "max_steps": "3", "max_tokens": "", "reason": "one more go", "expected_version": version})

    assert sent.status_code == 302
    command = SteeringCommand.objects.get(task_id=task_id)
    assert (command.type, command.payload, command.reason) == ("set_budget", {"maxSteps": 3}, "one more go")
    assert Task.objects.get(id=task_id).status == "working"
    assert drive(task_id)[-1] == "completed"


# -- a real worker ----------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_it_waits_for_a_budget_on_a_real_worker_and_goes_on_once_raised(api, workers):
    from tests.worker_support import wait_until

    workers("budget")
    task_id = create(api, input={"steps": 4}, budget={"maxSteps": 2, "onExhausted": "wait"})["taskId"]

    waiting = wait_until(task_id, lambda t: t.status == "input_required")
    assert (waiting.steps_completed, waiting.wait["kind"], waiting.lease_owner) == (2, "budget", None)

    assert steer(api, task_id, "set_budget", payload={"maxSteps": 4}).status_code == 202

    wait_until(task_id, lambda t: t.status == "completed")
    assert executions(task_id) == {1: 1, 2: 1, 3: 1, 4: 1}
