"""One decision for an effect of unknown outcome, whichever path meets it (issue 38, conventions §12).

The table: for each recovery rule — read-only, idempotent, a server that honours the key, the workflow's reconcile
hook (the call landed / was never sent), none (a tool call: a person is asked on the task; a plain effect: a dead
letter) — and each way an outcome becomes unknown — its worker died mid-call (the row still `started`), the call
timed out, the connection dropped after sending — the same task is run down both paths:

  (a) the step runs again and meets the effect (StepContext._decide, through the ledger's execute_once);
  (b) the step runs again and takes another path, so the task goes past the effect its dead worker left open
      (OpenEffects.resolve before the step commits past it).

Both must reach the same decision (tasks_app.engine.effects.decide), and the rule's: a rule that repeats → not
applied (a: called again once with the same key, as the downstream server's own call log shows; b: left failed,
resolved by "rule"); the hook → its answer; none → no question while the call can still land (the task parks),
then "did this happen?" (tool calls) or a dead letter (a plain effect) — and the person's answer, once given,
decides alike too. Beside the table: the late answer of a call that timed out in this very process comes first on
both paths; a dead letter's retry refuses an answer before the call's deadline; the row keeps the arguments redacted
and bounded.

Every call is real: the example MCP tool server as a process (examples/tool_server.py), PostgreSQL, the engine
in-process. The first attempt's call is sent and lands; its worker then "dies" at a fault point before its step
commits (the row stays `started`: worker_died). A call that timed out or was dropped after sending is recorded as
the ledger records one (execute_once's unknown mark, with its typed `why`, through the fenced store) by that worker
before it died — the outcome then is unknown for another reason, decided by the same rule.
"""


from __future__ import annotations

import json
import sys
import uuid
from dataclasses import dataclass

import pytest

from agents_app.models import ToolServer
from checkpoints_app.fencing import Fence
from checkpoints_app.ledger import EffectOutcome
from checkpoints_app.models import Recovery, SideEffect
from steering_app.services import steering_cancel, steering_submit
from tasks_app.engine import dead_letters, faults, reaper
from tasks_app.engine import slice as engine
from tasks_app.engine.effects import FencedEffects
from tasks_app.models import Task
from tasks_app.registry import Workflow, register, step
from tasks_app.services import task_create
from tests import workflows
from tests.engine_support import configure, deadlines_pass, drive, expire_lease, hints_queued
from tests.tool_server_support import running_tool_server

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("external_root")]

# What each task's step does, by input["run"]: {"acts": [action, …], "server": the tool server (its own call log)}.
# Read at execution time, so a test can send the re-run down another path (an LLM choosing another tool).
RUNS: dict[str, dict] = {}


@register
class UnknownOutcomeTable(Workflow):
    """Test workflow: one step acting out RUNS[input["run"]]["acts"]; no reconcile hook."""

    name = "unknown_outcome_table"
    description = "Test workflow: one step calls a tool or makes an effect, as the test says (issue 38's table)."
    input_schema = {"type": "object", "properties": {"run": {"type": "string"}}, "required": ["run"]}

    def plan(self, goal, input, state):
        return ["act"]

    @step(max_attempts=2)
    def act(self, ctx):
        for action in RUNS[ctx.input["run"]]["acts"]:
            if action.get("attempts") and ctx.attempt not in action["attempts"]:
                continue
            if action["do"] == "tool":
                ctx.state[action["tool"]] = ctx.tool(action["server"], action["tool"], action["arguments"])
            elif action["do"] == "effect":
                ctx.state[action["name"]] = ctx.effect(
                    action["name"], lambda key, act=action: workflows.send(key, answer_after=act.get("answer_after", 0)),
                    timeout=action["timeout"], arguments=action.get("arguments"),
                    reconcile=workflows.landed if action.get("reconcile") else None)
            else:  # "other": the re-run chose another path and no longer makes the call
                ctx.state["other"] = True

    def result(self, state):
        return state


@register
class UnknownOutcomeTableReconciled(UnknownOutcomeTable):
    """The same, with a reconcile hook that asks the downstream server's own call log whether the call landed."""

    name = "unknown_outcome_table_reconciled"

    def reconcile_effect(self, *, name, key, input):
        applied = RUNS[input["run"]]["server"].calls(event="applied", idempotency_key_meta=key)
        if not applied:
            return EffectOutcome.not_applied()
        found = applied[0]["result"]
        return EffectOutcome.was_applied({"content": [{"type": "text", "text": json.dumps(found)}],
                                          "structuredContent": found, "isError": False})


@pytest.fixture(scope="module")
def shared_server(tmp_path_factory):
    """One example tool server for the module (each task's calls are told apart by their keys)."""
    with running_tool_server(tmp_path_factory.mktemp("tools")) as server:
        yield server


@pytest.fixture
def run_of():
    made = []

    def make(acts, server=None) -> str:
        name = uuid.uuid4().hex
        RUNS[name] = {"acts": acts, "server": server}
        made.append(name)
        return name

    yield make
    for name in made:
        RUNS.pop(name, None)


@dataclass(frozen=True)
class Rule:
    """A row of the table: the task's workflow and its step's action; the rule and `asks` its ledger row must carry
    (recorded by the real start); the decision both paths must reach; whether the first call was sent (and landed)
    before its worker died, or the worker died after the row was committed but before sending."""

    workflow: str
    action: dict
    recovery: str
    asks: bool
    expected: str
    sent: bool = True


TOOL_TIMEOUT = 5  # the server row's timeout_seconds: the call's deadline is ~25 s after it was sent
TABLE = "unknown_outcome_table"
APPEND = {"do": "tool", "server": "shop", "tool": "append", "arguments": {"text": "t"}}
RULES = {
    "read_only": Rule(TABLE, {"do": "tool", "server": "shop", "tool": "lookup", "arguments": {"key": "k"}},
                      Recovery.REPEAT, True, "not_applied_by_rule"),
    "idempotent": Rule(TABLE, {"do": "tool", "server": "shop", "tool": "upsert", "arguments": {"key": "k", "value": "v"}},
                       Recovery.REPEAT_WITH_KEY, True, "not_applied_by_rule"),
    # (the example server's append does not dedup; the rule follows what the server row declares)
    "key_honoured": Rule(TABLE, {**APPEND, "server": "dedup"}, Recovery.REPEAT_WITH_KEY, True, "not_applied_by_rule"),
    "reconcile_hook": Rule(f"{TABLE}_reconciled", APPEND, Recovery.RECONCILE, True, "reconciled_applied"),
    "reconcile_hook_not_sent": Rule(f"{TABLE}_reconciled", APPEND, Recovery.RECONCILE, True, "reconciled_not_applied",
                                    sent=False),
    # The caller's own hook (ctx.effect(reconcile=…), no workflow hook): recorded by name on the row, so the slice
    # going past the effect asks the same hook its step would.
    "per_call_hook": Rule(TABLE, {"do": "effect", "name": "charge", "timeout": 60, "reconcile": True},
                          Recovery.RECONCILE, False, "reconciled_applied"),
    "none_tool": Rule(TABLE, APPEND, Recovery.PERSON, True, "waits_then_asks"),
    "none_effect": Rule(TABLE, {"do": "effect", "name": "charge", "timeout": 60}, Recovery.PERSON, False,
                        "waits_then_dead_letter"),
}
WHYS = ["worker_died", "timed_out", "dropped_after_send"]
STOPPED = ("completed", "failed", "cancelled", "dead_lettered", "input_required", "paused")


def engine_task(tenant, workflow: str, run: str):
    return task_create(tenant=tenant, owner=None, workflow=workflow, input={"run": run}).task.id


def effect_key_of(task, action) -> str:
    if action["do"] == "tool":
        return f"{task.id}:1:{action['server']}.{action['tool']}:1"
    return f"{task.id}:1:{action['name']}"


def calls_of(run: dict, action: dict, key: str) -> int:
    """How many times the call was sent with its key: the server's log (a tool), the effects log (a plain effect)."""
    if action["do"] == "tool":
        return len(run["server"].calls(event="received", idempotency_key_meta=key))
    return workflows.effect_calls(key.split(":", 1)[0])[key]


def worker_dies_mid_call(task, key: str, why: str, *, sent: bool) -> None:
    """The first attempt commits the row and sends the call (it lands), then its worker dies before the step commits
    (``sent`` False: dies before sending): the row stays `started`. For timed_out / dropped_after_send the worker had
    recorded the outcome unknown first, as execute_once does for a ToolTimeout (its typed why), through the fenced
    store, under its own lease."""
    point = "after_effect_before_commit" if sent else "before_effect_call"
    with faults.armed(f"{point}:raise@step_seq=1"), pytest.raises(faults.InjectedFault):
        engine.run_step(task.id, owner="crashing")
    if why != "worker_died":
        held = Task.objects.get(id=task.id)
        FencedEffects(Fence(task.id, held.lease_owner, held.lease_epoch), 1).mark(
            key=key, status="unknown", error={"type": "ToolTimeout", "message": f"the call's outcome is unknown ({why})",
                                              "why": why})
    expire_lease(task.id)
    reaper.reaper_sweep()


def decision_of(task, run: dict, action: dict, key: str, path: str) -> tuple:
    """Drive the recovered task and name what was decided for the effect, from what the path shows: (a) the step met
    it again — called again or not, the step's result; (b) gone past — how the ledger row was resolved, and by whom."""
    calls_before = calls_of(run, action, key)
    outcomes = drive(task.id, calls=1, until_done=False)
    task.refresh_from_db()
    if outcomes == ["parked"]:  # nobody is asked while the call can still land
        assert task.wait is None and calls_of(run, action, key) == calls_before, (task.wait, path)
        assert "may still land" in task.status_message, task.status_message
        deadlines_pass(task.id)
        last = drive(task.id)[-1]
        task.refresh_from_db()
        row = SideEffect.objects.get(task_id=task.id, key=key)
        assert calls_of(run, action, key) == calls_before and row.status == "unknown", path  # never called blindly
        if last == "input_required" and task.wait["name"] == "effect_outcome" and task.wait["effect"]["key"] == key:
            return "waits_then_asks", task.wait["effect"]["unknownWhy"]
        if last == "dead_lettered" and task.error["reason"] == "effect_outcome_unknown" and key in task.error["message"]:
            return "waits_then_dead_letter", row.unknown_why
        return f"parked_then_{last}", task.status_message
    if task.status not in STOPPED:
        outcomes += drive(task.id)
    task.refresh_from_db()
    row = SideEffect.objects.get(task_id=task.id, key=key)
    called = calls_of(run, action, key) - calls_before
    if outcomes[-1] != "completed":
        return outcomes[-1], task.error
    return settled(task, run, action, key, path, row=row, called=called)


def settled(task, run: dict, action: dict, key: str, path: str, *, row: SideEffect, called: int) -> tuple:
    """What a completed task shows was decided for the effect."""
    if path == "a" and called == 1 and row.status == "succeeded" and row.error is None:
        if action.get("tool") == "upsert":  # the server's own dedup answered the second call with the first result
            assert len(run["server"].calls(event="replayed", idempotency_key_meta=key)) == 1
        return "not_applied", None  # called again, with the same key (the server's log is by key); who said so: b
    if path == "b" and called == 0 and row.status == "failed" and row.error["resolution"] == "not_applied":
        return "not_applied", row.error["resolvedBy"]
    if called == 0 and row.status == "succeeded" and row.error == {"resolution": "applied", "resolvedBy": "reconcile"}:
        if action["do"] == "tool":
            landed = run["server"].calls(event="applied", idempotency_key_meta=key)[0]["result"]
            assert row.result["structuredContent"] == landed  # the hook's answer, as the row keeps it
        if path == "a":  # the step got the hook's answer as the call's result
            assert task.result[action.get("tool", action.get("name"))] == row.result
        return "reconciled_applied", None
    return "completed_otherwise", (path, called, row.status, row.error)


def same_decision(decided: dict) -> str:
    """The decision both paths reached (the step's path says "not_applied" by calling again; the row gone past says
    who decided: the rule or the hook), named as the table names it."""
    a, b = decided["a"], decided["b"]
    if a == ("not_applied", None) and b[0] == "not_applied":
        return {"rule": "not_applied_by_rule", "reconcile": "reconciled_not_applied"}.get(b[1], f"not_applied_by_{b[1]}")
    assert a == b, decided
    return a[0]


@pytest.mark.parametrize("why", WHYS)
@pytest.mark.parametrize("rule", list(RULES))
def test_it_decides_an_unknown_outcome_alike_when_the_step_meets_it_again_or_goes_past_it(
        tenant, shared_server, run_of, settings, rule, why):
    configure(settings, step_retry={"backoff_seconds": 0})
    row_of = RULES[rule]
    action = row_of.action
    ToolServer.objects.create(tenant=tenant, name="shop", url=shared_server.url, timeout_seconds=TOOL_TIMEOUT)
    ToolServer.objects.create(tenant=tenant, name="dedup", url=shared_server.url, timeout_seconds=TOOL_TIMEOUT,
                              honours_idempotency_key=True)
    decided, tasks = {}, {}
    for path in ("a", "b"):
        run = run_of([action], shared_server)
        task = Task.objects.get(id=engine_task(tenant, row_of.workflow, run))
        key = effect_key_of(task, action)
        worker_dies_mid_call(task, key, why, sent=row_of.sent)
        row = SideEffect.objects.get(task_id=task.id, key=key)
        # The rule travels with the row, recorded by the real start, with what a person would be shown.
        assert (row.recovery, row.asks, row.status) == (row_of.recovery, row_of.asks,
                                                        "started" if why == "worker_died" else "unknown")
        assert row.deadline is not None and calls_of(RUNS[run], action, key) == int(row_of.sent)
        if action["do"] == "tool":
            assert row.about["server"] == action["server"] and row.about["tool"] == action["tool"]
        if path == "b":  # the re-run takes another path: the effect is left open and gone past
            RUNS[run]["acts"] = [{"do": "other"}]
        decided[path] = decision_of(task, RUNS[run], action, key, path)
        tasks[path] = (task, run, key)

    assert same_decision(decided) == row_of.expected, decided
    if row_of.expected != "waits_then_asks":
        return
    assert decided["a"][1] == why  # the question says why, the same on both paths

    # A person's answer, given on the task, decides it alike too: not applied → (a) called again with its key,
    # (b) gone past, left failed by the person's word.
    answered = {}
    for path, (task, run, key) in tasks.items():
        task.refresh_from_db()
        steering_submit(task=task, command_type="provide_input",
                        payload={"waitId": task.wait["waitId"], "value": {"outcome": "not_applied"}},
                        expected_version=task.state_version, requested_by="user:ops", reason="checked the server")
        calls_before = calls_of(RUNS[run], action, key)
        assert drive(task.id)[-1] == "completed"
        row = SideEffect.objects.get(task_id=task.id, key=key)
        answered[path] = settled(Task.objects.get(id=task.id), RUNS[run], action, key, path, row=row,
                                 called=calls_of(RUNS[run], action, key) - calls_before)
    assert answered == {"a": ("not_applied", None), "b": ("not_applied", "person")}, answered


@pytest.mark.parametrize("path", ["a", "b"])
def test_it_takes_the_late_answer_of_a_call_that_timed_out_in_this_process_before_any_rule(tenant, run_of, settings,
                                                                                           path):
    """First in the order: the call timed out in this very process and has answered since — what it answered
    decides, whichever path meets it, before the rule (none here: a person) is even read, and nobody is asked."""
    configure(settings, step_retry={"backoff_seconds": 0})
    # It lands at once and answers after 0.7 s; the step gives up after 0.5 s. The retry (attempt 2) waits for it: as
    # long as its timeout (a: the step meets it again) or TIMED_OUT_CALL_WAIT_SECONDS (b: gone past).
    action = {"do": "effect", "name": "charge", "timeout": 0.5, "answer_after": 0.7}
    run = run_of([{**action, "attempts": [1]} if path == "b" else action])
    task = Task.objects.get(id=engine_task(tenant, TABLE, run))
    key = effect_key_of(task, action)

    assert drive(task.id) == ["completed"]

    row = SideEffect.objects.get(task_id=task.id, key=key)
    assert (row.recovery, row.unknown_why) == (Recovery.PERSON, "timed_out")  # (kept: why it was unknown)
    assert workflows.effect_calls(task.id) == {key: 1}
    assert row.status == "succeeded" and row.result == {"sent": key}
    assert row.error == {"resolution": "applied", "resolvedBy": "call"}
    if path == "a":
        assert Task.objects.get(id=task.id).result["charge"] == {"sent": key}


def test_it_refuses_an_operators_answer_before_the_calls_deadline_and_takes_it_after(tenant, run_of, settings):
    """A stop cannot wait for a deadline: a task cancelled with an effect its dead worker left open is dead-lettered
    at once. The operator's answer is refused while the call can still land (naming the key and until when, on the
    database's clock), and taken once the deadline has passed."""
    action = {"do": "effect", "name": "charge", "timeout": 60}
    run = run_of([action])
    task = Task.objects.get(id=engine_task(tenant, "unknown_outcome_table", run))
    key = effect_key_of(task, action)
    with faults.armed("after_effect_before_commit:raise@step_seq=1"), pytest.raises(faults.InjectedFault):
        engine.run_step(task.id, owner="crashing")
    steering_cancel(task=Task.objects.get(id=task.id), reason="not needed any more", requested_by="user:ops")
    expire_lease(task.id)
    reaper.reaper_sweep()

    assert drive(task.id) == ["dead_lettered"]  # not parked: a stop does not wait for the deadline
    task.refresh_from_db()
    row = SideEffect.objects.get(task_id=task.id, key=key)
    assert task.error["reason"] == "effect_outcome_unknown" and key in task.error["message"]
    assert row.status == "unknown" and row.deadline is not None

    answer = {key: dead_letters.EffectAnswer(applied=False)}
    with pytest.raises(dead_letters.DeadLetterError) as refused:
        dead_letters.dead_letter_retry(task_id=task.id, answers=answer, requested_by="user:ops", reason="no charge")
    assert f"{key} until {row.deadline.isoformat()}" in str(refused.value) and "may still land" in str(refused.value)
    assert Task.objects.get(id=task.id).status == "dead_lettered"
    assert SideEffect.objects.get(task_id=task.id, key=key).status == "unknown"  # nothing decided

    deadlines_pass(task.id)
    retried = dead_letters.dead_letter_retry(task_id=task.id, answers=answer, requested_by="user:ops",
                                             reason="no charge")

    assert retried.status == "recovering"
    row = SideEffect.objects.get(task_id=task.id, key=key)
    assert row.status == "failed" and row.error == {"resolution": "not_applied", "resolvedBy": "user:ops"}
    assert workflows.effect_calls(task.id) == {key: 1}  # nothing called again by the answer itself


def test_it_keeps_an_effects_arguments_redacted_and_bounded_on_its_ledger_row(tenant, shared_server, run_of):
    secret = f"sk-live-{uuid.uuid4().hex}"
    ToolServer.objects.create(tenant=tenant, name="shop", url=shared_server.url, timeout_seconds=TOOL_TIMEOUT)
    acts = [{"do": "tool", "server": "shop", "tool": "append",
             "arguments": {"text": f"auth with Bearer {secret}", "api_key": secret}},
            {"do": "effect", "name": "notify", "timeout": 5,
             "arguments": {"token": secret, "note": f"Authorization: Bearer {secret}"}},
            {"do": "effect", "name": "upload", "timeout": 5, "arguments": {"blob": "x" * 50_000}}]
    task = Task.objects.get(id=engine_task(tenant, "unknown_outcome_table", run_of(acts, shared_server)))

    assert drive(task.id)[-1] == "completed"

    rows = {row.name: row for row in SideEffect.objects.filter(task_id=task.id)}
    assert set(rows) == {"shop.append:1", "notify", "upload"}
    tool = rows["shop.append:1"].about
    assert (tool["server"], tool["tool"]) == ("shop", "append") and tool["timeoutSeconds"] > TOOL_TIMEOUT
    assert tool["annotations"]["idempotentHint"] is False and tool["arguments"]["server"] == "shop"
    assert tool["arguments"]["arguments"]["api_key"] == "[redacted]"
    assert rows["notify"].about["arguments"]["token"] == "[redacted]"
    for row in rows.values():  # never the credential, wherever it was in the arguments
        assert secret not in json.dumps(row.about), row.about
    upload = rows["upload"].about["arguments"]
    assert set(upload) == {"omitted"} and "characters" in upload["omitted"]  # bounded: a note of the size
    assert len(json.dumps(rows["upload"].about)) < 1000
    # (the call itself still got the real arguments: only what a person is shown is redacted)
    sent = shared_server.calls(event="received", idempotency_key_meta=f"{task.id}:1:shop.append:1")
    assert sent and sent[0]["arguments"]["api_key"] == secret


def test_it_records_a_per_call_hook_by_name_and_refuses_one_nobody_else_could_find():
    """A per-call reconcile hook is recorded on the effect's row by its name, so the slice going past the effect (in
    another process, after its worker died) asks the same hook; a lambda or a closure exists only in the step that
    made it, so it is refused where it is given, saying what to do instead. A name is looked up only in modules
    already loaded: a row cannot make the runtime import anything."""
    from tasks_app.engine.effects import reconcile_hook, reconcile_hook_name

    assert reconcile_hook_name(workflows.landed) == "tests.workflows:landed"
    assert reconcile_hook("tests.workflows:landed") is workflows.landed

    def closure(key):
        return None

    for hook in (lambda key: None, closure):
        with pytest.raises(ValueError, match="module-level function"):
            reconcile_hook_name(hook)
    assert reconcile_hook("json.tool:main") is None  # (json.tool is not loaded here: never imported for a row)
    assert "json.tool" not in sys.modules


def test_it_sends_a_worker_at_once_to_cancel_a_task_parked_until_a_calls_deadline(tenant, run_of, settings):
    """A task parked without a worker (here: until its call's deadline, ~65 s away) is hinted again only when that
    wait ends. A cancel must not wait for it: the command sends a worker now, which stops the task at its first
    safe point — a dead letter, since a stop cannot wait for the deadline. (Found from outside: a parked task sat
    `cancelling` for the rest of its wait.)"""
    action = {"do": "effect", "name": "charge", "timeout": 60}
    task = Task.objects.get(id=engine_task(tenant, "unknown_outcome_table", run_of([action])))
    with faults.armed("after_effect_before_commit:raise@step_seq=1"), pytest.raises(faults.InjectedFault):
        engine.run_step(task.id, owner="crashing")
    expire_lease(task.id)
    reaper.reaper_sweep()
    assert drive(task.id, calls=1, until_done=False) == ["parked"]
    hints = hints_queued(task.id)

    steering_cancel(task=Task.objects.get(id=task.id), reason="not needed any more", requested_by="user:ops")

    assert hints_queued(task.id) == hints + 1  # a worker is sent now, not when the park ends
    assert Task.objects.get(id=task.id).status == "cancelling"
    assert drive(task.id) == ["dead_lettered"]
