"""Property: no exception leaves a slice without a durable decision (ARCHITECTURE §4, "rules that hold on every path").

Hypothesis generates scripts for the test-only workflow in tests/slice_workflow.py — steps that raise at any
point, put odd values (Decimal, datetime, UUID, set, NaN, bytes, …) in state or output, overflow the state
cap, call effects that fail or succeed before the step fails, spend, report bad progress, write artifacts —
and drives each task in-process with ``engine.run_step`` until it stops being runnable. Then, from PostgreSQL and
from the log the steps and effects append outside it:

- nothing escaped run_step, and no call returned with the lease still held;
- the task ended ``completed``, ``failed`` with an error message, or ``dead_lettered`` with a reason (or
  ``cancelled`` when the script cancelled it) — never still runnable;
- every committed step ran to its end in exactly one attempt, the one committed, and never started again;
- no effect happened twice or was called again after it happened, and none that happened is recorded ``failed``;
- every ledger row of a finished task is ``succeeded`` or ``failed``; a dead-lettered task names its open ones;
- the task's event hash chain verifies.

An exception escaping run_step is re-raised as a SliceEscape subclass named after where it got out, so each escape
site is its own failure. A failing run lists each distinct violation it met (escape site or broken invariant) with
its shrunk case as ``case = {…}``; Hypothesis stops looking soon after the first, so for the whole list run
bench/slice_survey.py (`python3.11 deploy/dev.py bench --slice-survey`), which drives these cases without stopping.
Knobs (environment):

    SLICE_EXAMPLES=3000     more generated runs (default 150)
    FUZZ_RANDOM=1           a random seed instead of the fixed, reproducible one
    SLICE_FOCUS=StepFailed  minimise only violations whose kind contains this text (others count as passing)
    SLICE_CASE='{…}'        test_replay_one_case re-runs one printed case, no Hypothesis
"""

from __future__ import annotations

import dataclasses
import json
import os
import traceback
from decimal import Decimal
from pathlib import Path

import pytest
from django.conf import settings as django_settings
from django.test import override_settings
from hypothesis import HealthCheck, Phase, currently_in_test_context, given, note, reject
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from checkpoints_app.models import SideEffect
from steering_app.services import steering_cancel
from tasks_app.engine import slice as engine
from tasks_app.models import RUNNABLE_STATUSES, Step, Task
from tasks_app.registry import registry
from tasks_app.selectors import task_events_verify
from tasks_app.services import task_create
from tests import slice_workflow as wf

EXAMPLES = int(os.environ.get("SLICE_EXAMPLES", "150"))
MAX_CALLS = 50  # run_step calls per task; a script has at most 5 steps, so 50 is "forever"
MAX_BYTES = 4096

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(max(300, 2 * EXAMPLES))]


@pytest.fixture(autouse=True)
def prop_workflow():
    """Registered for these tests only, so the API schema and fuzz tests elsewhere never see it."""
    cls = wf.workflow_register()
    yield cls
    if registry._workflows.get(wf.NAME) is cls:
        del registry._workflows[wf.NAME]


# -- strategies --------------------------------------------------------------------------------------------------------
# Swarm testing: each example first picks which odd value kinds (0–3) and which op types it uses, and builds its
# whole script from those, so some scripts are full of odd values and failing ops, and others are plain enough to
# get deep (many committed steps, state near the cap, a cancel, Workflow.result()). Everything shrinks towards
# the first choices listed.
OP_TYPES = ["set", "effect", "raise", "mutate", "artifact", "spend", "progress", "log", "checkpoint", "del"]
state_keys = st.sampled_from(["a", "step", "b", "result"])  # "step": a key per step (s1, s2, …): state grows


def op_strategy(name: str, values: st.SearchStrategy, results: st.SearchStrategy) -> st.SearchStrategy:
    if name == "set":
        return st.tuples(st.just("set"), state_keys, values)
    if name == "effect":
        return st.tuples(st.just("effect"), st.sampled_from(["send", "notify"]),
                         st.fixed_dictionaries({"reconcile": st.booleans(), "raises": st.sampled_from([0, 1, 99]),
                                                "result": results,
                                                "timeout": st.sampled_from([None, "in_time", "late"])}))
    if name == "raise":
        return st.tuples(st.just("raise"), st.sampled_from(list(wf.EXCEPTIONS)), st.sampled_from(wf.MESSAGES),
                         st.sampled_from([1, 99]))  # the first attempt only, or always
    if name == "mutate":
        return st.tuples(st.just("mutate"), state_keys, values)
    if name == "artifact":
        return st.tuples(st.just("artifact"), st.sampled_from(["report.md", "data.bin", "bad name!"]),
                         st.sampled_from(["str", "bytes", "empty", "big"]))
    if name == "spend":
        return st.tuples(st.just("spend"), st.sampled_from(["0.5", "0.0001", "0", "-1", "1e9", "Infinity", "NaN"]))
    if name == "progress":
        return st.tuples(st.just("progress"), st.sampled_from([0.5, 0, 1, 1.5, -0.1, "nan", "inf"]),
                         st.sampled_from([None, "phase", "nul", "long"]))
    if name == "log":
        return st.tuples(st.just("log"), st.sampled_from(["plain", "nul", "secret", "long", "object"]))
    if name == "checkpoint":
        return st.tuples(st.just("checkpoint"))
    if name == "del":
        return st.tuples(st.just("del"), state_keys)  # KeyError unless set before
    raise AssertionError(name)


@st.composite
def cases(draw) -> dict:
    odd = draw(st.lists(st.sampled_from(wf.ODD_KINDS), max_size=3, unique=True))
    normal = st.sampled_from(wf.NORMAL_KINDS)
    values = st.one_of(normal, normal, normal, st.sampled_from(odd)) if odd else normal  # one value in 4 is odd
    results = st.one_of(normal, st.sampled_from(odd)) if odd else normal  # effect results: one in 2
    enabled = draw(st.lists(st.sampled_from(OP_TYPES), max_size=len(OP_TYPES), unique=True))
    ops = st.one_of([op_strategy(name, values, results) for name in enabled]).map(list) if enabled else st.nothing()
    step = st.fixed_dictionaries({
        "costly": st.integers(0, 3).map(lambda n: n == 3),  # one step in four forces a checkpoint
        "ops": st.lists(ops, max_size=6) if enabled else st.just([]),
        "output": values,
    })
    return {
        "script": draw(st.lists(step, max_size=5)),
        "result": draw(st.sampled_from(["default", "raise", *wf.VALUE_KINDS])),
        "every_steps": draw(st.sampled_from([10, 1, 2])),  # checkpoint policy: rarely, every step, every other
        "cancel_after": draw(st.none() | st.integers(min_value=1, max_value=4)),  # after that many run_step calls
        "budget_cost": draw(st.sampled_from([None, "1"])),
        "ballast": draw(st.sampled_from([0, 2000])),  # bytes of state each step adds: 2 steps fill a checkpoint
    }


# -- driving -----------------------------------------------------------------------------------------------------------
class SliceEscape(AssertionError):
    """An exception escaped engine.run_step. Subclassed per escape site so Hypothesis reports each separately."""


_ESCAPE_KINDS: dict[str, type[SliceEscape]] = {}


def _escape_site(error: BaseException) -> str:
    """Where the exception got out of the runtime: its type (and SQLSTATE) and the innermost runtime line it
    passed through (tasks_app/, checkpoints_app/), e.g. "TypeError at slice.py:<line> (_commit)"."""
    frames = [f for f in traceback.extract_tb(error.__traceback__)
              if "/tasks_app/" in f.filename or "/checkpoints_app/" in f.filename]
    where = f"{Path(frames[-1].filename).name}:{frames[-1].lineno} ({frames[-1].name})" if frames else "?"
    sqlstate = getattr(error.__cause__, "sqlstate", None)
    return f"{type(error).__name__}{f'[{sqlstate}]' if sqlstate else ''} at {where}"


def run_step_once(task_id) -> str:
    try:
        return engine.run_step(task_id, owner="prop")
    except Exception as error:  # noqa: BLE001 — reported below as the property's failure, never swallowed
        escaped = error
    # Raised outside the except block and without chaining, so Hypothesis tells failures apart by escape site
    # alone (not by whichever step exception the engine was handling); the original's traceback tail is quoted.
    site = _escape_site(escaped)
    kind = _ESCAPE_KINDS.setdefault(site, type(f"SliceEscape<{site}>", (SliceEscape,), {}))
    tail = "".join(traceback.format_exception(escaped, limit=-6))[-4000:]
    raise kind(f"{type(escaped).__name__} escaped engine.run_step ({site}): {str(escaped)[:300]}\n{tail}")


def drive_to_end(task_id, *, cancel_after: int | None) -> tuple[list[str], bool]:
    outcomes: list[str] = []
    cancelled = False
    for call in range(1, MAX_CALLS + 1):
        outcomes.append(run_step_once(task_id))
        row = Task.objects.values("status", "lease_owner").get(id=task_id)
        assert row["lease_owner"] is None, (
            f"run_step returned with the lease still held: {outcomes[-1]!r}, lease {row['lease_owner']!r}, "
            f"task {row['status']}, outcomes {outcomes}")
        if cancel_after == call and row["status"] in ("queued", "working"):
            steering_cancel(task=Task.objects.get(id=task_id), reason="scripted cancel", requested_by="user:script")
            cancelled = True
            row = Task.objects.values("status", "lease_owner").get(id=task_id)
        if row["status"] not in RUNNABLE_STATUSES:
            break
    return outcomes, cancelled


# -- the invariants (each message is "<what broke>: <details>"; the part before the colon names the violation) ------
def assert_durable_decision(task: Task, outcomes: list[str], cancelled: bool) -> None:
    allowed = {"completed", "failed", "dead_lettered"} | ({"cancelled"} if cancelled else set())
    assert task.status in allowed, f"task not finished after the drive: {task.status!r}, run_step calls {outcomes}"
    assert task.lease_owner is None, f"lease still held after the drive: {task.lease_owner!r}"
    error = task.error if isinstance(task.error, dict) else {}
    if task.status == "failed":
        assert isinstance(error.get("message"), str), f"task failed without an error message: {task.error}"
        assert error["message"].strip(), f"task failed without a message: {task.error}"
    if task.status == "dead_lettered":
        assert error.get("reason"), f"task dead-lettered without a reason: {task.error}"


def assert_committed_steps_ran_once(task: Task, lines: list[list[str]], script_length: int) -> None:
    committed = dict(Step.objects.filter(task_id=task.id, status="committed").values_list("seq", "attempt"))
    for seq, attempt in committed.items():
        events = [(line[0], int(line[2])) for line in lines if line[0] in ("start", "ok") and int(line[1]) == seq]
        oks = [a for kind, a in events if kind == "ok"]
        assert len(oks) == 1, f"a committed step did not return exactly once: step {seq}, {events}"
        assert oks == [attempt], (f"a step committed another attempt than the one that returned: step {seq}, "
                                  f"attempt {attempt} committed, {events}")
        after = events[events.index(("ok", attempt)) + 1:]
        assert not after, f"a committed step ran again after its successful attempt: step {seq}, {events}"
    if task.status == "completed":
        assert sorted(committed) == list(range(1, script_length + 1)), \
            f"task completed without committing every step: {sorted(committed)} of {script_length}"


def assert_effects_once(task: Task, lines: list[list[str]]) -> None:
    history: dict[str, list[str]] = {}  # per idempotency key: call / done / raise, in order
    for line in lines:
        if line[0] in ("call", "done", "raise"):
            history.setdefault(line[1], []).append(line[0])
    ledger = {row["key"]: row for row in SideEffect.objects.filter(task_id=task.id).values("key", "status", "error")}
    for key, seen in history.items():
        assert seen.count("done") <= 1, f"an effect happened more than once: {key} {seen}"
        if "done" in seen:
            again = seen[seen.index("done"):]
            assert "call" not in again, f"an effect was called again after it happened: {key} {seen}"
            assert key in ledger, f"an effect happened but the ledger has no row for it: {key}"
            assert ledger[key]["status"] != "failed", f"an effect happened but the ledger says failed: {ledger[key]}"
    open_rows = sorted(key for key, row in ledger.items() if row["status"] not in ("succeeded", "failed"))
    if task.status == "dead_lettered":
        message = (task.error or {}).get("message", "")
        unnamed = [key for key in open_rows if key not in message]
        assert not unnamed, f"task dead-lettered without naming its open effects: {unnamed}, message {message!r}"
    else:
        statuses = {key: ledger[key]["status"] for key in open_rows}
        assert not open_rows, f"task finished with effects still open in the ledger: {task.status}, {statuses}"


def failure_kind(error: BaseException) -> str:
    """A short name for a violation: the escape site, or an invariant's message up to its details."""
    if isinstance(error, SliceEscape):
        return f"escaped: {_escape_site_of(error)}"
    first = str(error).splitlines()[0] if str(error) else ""
    return f"{type(error).__name__}: {first.split(':')[0][:120]}"


def _escape_site_of(error: SliceEscape) -> str:
    return type(error).__name__.removeprefix("SliceEscape<").removesuffix(">")


def runtime_config(base, *, every_steps: int):
    """One step per slice, fast retries, a 4 KiB state cap. (A context manager per example: assigning to the
    `settings` fixture in every example would stack one more override per example.)"""
    return dataclasses.replace(
        base, slice_seconds=0, max_concurrent_tasks=1_000_000,  # escaped runs keep leases: never defer a claim
        step_retry=dataclasses.replace(base.step_retry, backoff_seconds=0, max_attempts=2),
        checkpoint=dataclasses.replace(base.checkpoint, max_bytes=MAX_BYTES, every_steps=every_steps))


def run_case(case: dict, tenant) -> Task:
    """Create a fresh task for the case, drive it to the end, check every invariant; return the task."""
    if currently_in_test_context():
        # Printed with a failure (the schemathesis pytest plugin blanks Hypothesis' own argument repr).
        note(f"case = {json.dumps(case)}")
    budget = Decimal(case["budget_cost"]) if case["budget_cost"] else None
    task = task_create(tenant=tenant, owner=None, workflow=wf.NAME, budget_cost=budget,
                       input={"script": case["script"], "result": case["result"], "ballast": case["ballast"]}).task
    with override_settings(RUNTIME=runtime_config(django_settings.RUNTIME, every_steps=case["every_steps"])):
        outcomes, cancelled = drive_to_end(task.id, cancel_after=case["cancel_after"])

    task.refresh_from_db()
    lines = wf.log_lines(task.id)
    assert_durable_decision(task, outcomes, cancelled)
    assert_committed_steps_ran_once(task, lines, len(case["script"]))
    assert_effects_once(task, lines)
    assert task_events_verify(task_id=task.id) is None, "the task's event chain does not verify"
    return task


# -- the tests ---------------------------------------------------------------------------------------------------------
HEALTH_CHECKS_OFF = [HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.filter_too_much]
FOCUS = os.environ.get("SLICE_FOCUS")  # e.g. "StepFailed": shrink only failures whose kind contains this


@hypothesis_settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=os.environ.get("FUZZ_RANDOM") != "1",
    database=None,  # writes nothing into the working tree; a failure prints its case and a reproduce blob
    print_blob=True,
    # No `explain` phase: on a failing engine it re-runs every minimal example hundreds of times (minutes).
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink],
    suppress_health_check=HEALTH_CHECKS_OFF,
)
@given(case=cases())
def test_no_exception_leaves_a_slice_without_a_durable_decision(case, tenant, settings, external_root):
    try:
        run_case(case, tenant)
    except Exception as error:
        if FOCUS and FOCUS not in failure_kind(error):
            reject()  # another kind of violation: not the one being minimised
        raise


@pytest.mark.skipif(not os.environ.get("SLICE_CASE"), reason="set SLICE_CASE to a case printed by a failure")
def test_replay_one_case(tenant, settings, external_root):
    """Re-run one printed case without Hypothesis: SLICE_CASE='{"script": [...], ...}' pytest -k replay."""
    case = {"result": "default", "every_steps": 10, "cancel_after": None, "budget_cost": None, "ballast": 0,
            **json.loads(os.environ["SLICE_CASE"])}
    run_case(case, tenant)
