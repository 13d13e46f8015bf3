"""What a step function gets: durable state, progress, logs, artifacts and effects through the ledger.

Everything a step does is buffered here and written by the engine in the step's one commit statement, except
an effect's ``started`` record, which must be committed before the effect is called (that is the point), and
an artifact's file, which is written under a fresh name that only the commit makes part of the task's state.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import copy
import json
import re
import threading
import uuid
from collections.abc import Callable
from decimal import Decimal
from typing import Any

from django.core.files.base import ContentFile
from django.core.files.storage import default_storage
from django.db import IntegrityError, connection, transaction

from checkpoints_app.fencing import Fence, LeaseLost
from checkpoints_app.ledger import EffectBegin, EffectOutcome, execute_once
from config.canonical import NotJson, canonical_json_strict, nul_paths, storable
from tasks_app import events
from tasks_app.db import sql
from tasks_app.db.prepared import json_value, prepared_fetchone
from tasks_app.engine import faults, waits
from tasks_app.engine.decisions import StepTimeLimitExceeded
from tasks_app.redaction import redact
from tasks_app.registry import ToolTimeout

_MUTABLE = (dict, list)
# One spend() call at most this much; a task's total is stored with 20 digits, 4 after the point.
MAX_SPEND = Decimal(10) ** 12
_MISSING = object()


class DurableState:
    """The task's durable variables (JSON values). Changes are recorded as a per-step delta.

    Assigning (``state["k"] = v``) and deleting are tracked directly. A dict or list that was read may be
    changed in place; its canonical JSON is compared at commit, so such edits are kept too — at a cost
    proportional to the values the step touched, never to the whole state.
    """

    def __init__(self, variables: dict[str, Any]):
        self._vars = variables
        self._set: set[str] = set()
        self._unset: set[str] = set()
        self._read_mutable: dict[str, str] = {}
        # Undo log of the keys this step touched (their values before it), so a failed attempt can be rolled
        # back without copying the whole state at every step.
        self._originals: dict[str, Any] = {}

    def _remember(self, key: str) -> None:
        if key not in self._originals:
            self._originals[key] = copy.deepcopy(self._vars[key]) if key in self._vars else _MISSING

    def __getitem__(self, key: str) -> Any:
        value = self._vars[key]
        if isinstance(value, _MUTABLE) and key not in self._set and key not in self._read_mutable:
            self._remember(key)
            self._read_mutable[key] = canonical_json_strict(value)
        return value

    def get(self, key: str, default: Any = None) -> Any:
        return self[key] if key in self._vars else default

    def __setitem__(self, key: str, value: Any) -> None:
        if not isinstance(key, str):
            raise TypeError(f"state keys are strings, not {type(key).__name__}")
        json_check_quick(value, f"state.{key}")  # fail now, in the step; the commit checks the whole delta strictly
        self._remember(key)
        self._vars[key] = value
        self._set.add(key)
        self._unset.discard(key)

    def __delitem__(self, key: str) -> None:
        self._remember(key)
        del self._vars[key]
        self._unset.add(key)
        self._set.discard(key)
        self._read_mutable.pop(key, None)

    def setdefault(self, key: str, default: Any) -> Any:
        if key not in self._vars:
            self[key] = default
        return self[key]

    def __contains__(self, key: str) -> bool:
        return key in self._vars

    def keys(self):
        return self._vars.keys()

    def delta(self) -> dict[str, Any]:
        """{"set": {k: v}, "unset": [k]} for this step. Values changed in place since they were read count too;
        a value that is not JSON raises NotJson naming it. Tracking goes on until commit() or discard_changes()."""
        changed = set(self._set)
        for key, before in self._read_mutable.items():
            if key in self._vars and canonical_json_strict(self._vars[key], f"state.{key}") != before:
                changed.add(key)
        delta: dict[str, Any] = {}
        if changed:
            delta["set"] = {key: self._vars[key] for key in sorted(changed)}
        if self._unset:
            delta["unset"] = sorted(self._unset)
        return delta

    def commit(self) -> None:
        """The step's changes are durable: start tracking the next step."""
        self._set, self._unset, self._read_mutable, self._originals = set(), set(), {}, {}

    def discard_changes(self) -> None:
        """A failed attempt's changes must not leak into the retry (or the next slice): put back what it touched."""
        for key, original in self._originals.items():
            if original is _MISSING:
                self._vars.pop(key, None)
            else:
                self._vars[key] = original
        self.commit()


def json_check_quick(value: Any, path: str) -> None:
    """The cheap half of canonical_json_strict, on assignment: types JSON cannot carry at all (Decimal, datetime,
    set, NaN …) fail in the step that assigns them; what dumps converts silently is caught at commit."""
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        canonical_json_strict(value, path)  # raises NotJson naming the place
        raise


def state_apply_delta(variables: dict[str, Any], delta: dict[str, Any]) -> None:
    variables.update(delta.get("set", {}))
    for key in delta.get("unset", []):
        variables.pop(key, None)


_ARTIFACT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,120}$")


class FencedEffects:
    """The ledger's storage for one lease (checkpoints_app.ledger.EffectStore), fenced on it."""

    def __init__(self, fence: Fence, step_seq: int):
        self.fence = fence
        self.step_seq = step_seq

    def begin(self, *, key: str, name: str) -> EffectBegin:
        params = {**self.fence.params(), "key": key, "step_seq": self.step_seq, "name": name}
        try:
            # Inside a transaction (tests, an operator's tool) the failed INSERT must not abort the caller's work.
            with transaction.atomic() if connection.in_atomic_block else contextlib.nullcontext():
                row = prepared_fetchone(sql.EFFECT_BEGIN, params)
        except IntegrityError:  # the key exists: a retried or recovered step
            row = prepared_fetchone(sql.EFFECT_BEGIN_AGAIN, params)
        if row is None:
            raise LeaseLost(f"lease lost before effect {key}")
        inserted, status, result = row
        return EffectBegin(inserted=inserted, status=status, result=json_value(result))

    def mark(self, *, key: str, status: str, result: Any = None, error: Any = None, restart: bool = False) -> None:
        effects_mark(self.fence, key=key, status=status, result=result, error=error, restart=restart)


def effect_key(task_id, step_seq: int, name: str) -> str:
    """An effect's idempotency key. Never includes the attempt number: a retried or recovered step must find the
    same key."""
    return f"{task_id}:{step_seq}:{name}"


def effect_key_step_seq(key: str) -> int:
    """The step an effect key belongs to (its ledger row is found by task, step and key)."""
    return int(key.split(":", 2)[1])


def effects_mark(fence: Fence, *, key: str, status: str, result: Any = None, error: Any = None,
                 restart: bool = False) -> None:
    """Record an effect's outcome outside a step commit (a failed call, a reconciliation), fenced on the lease."""
    if isinstance(error, dict) and "message" in error:
        error = {**error, "message": redact(str(error["message"]))[:500]}
    if result is not None:  # from a reconcile hook or a late call: the same rule as a call's own result
        result = _recordable(result)
    with connection.cursor() as cursor:
        cursor.execute(sql.EFFECT_MARK, {
            **fence.params(), "key": key, "step_seq": effect_key_step_seq(key), "status": str(status),
            "restart": int(restart),
            "result": None if result is None else canonical_json_strict(result, f"effect {key}"),
            "error": None if error is None else canonical_json_strict(error, "error"),
        })
        if cursor.fetchone() is None:
            raise LeaseLost(f"lease lost while recording effect {key}")


# Effect calls that timed out and are still running in this process, by key: the retry waits for the answer
# before asking anyone to reconcile, instead of racing a second call against the first.
_timed_out_calls: dict[str, concurrent.futures.Future] = {}
_timed_out_lock = threading.Lock()


def outcome_of_timed_out_call(key: str, wait_seconds: float) -> EffectOutcome | None:
    with _timed_out_lock:
        future = _timed_out_calls.get(key)
    if future is None:
        return None
    try:
        result = future.result(timeout=wait_seconds)
    except concurrent.futures.TimeoutError:
        return None  # still running: nobody here can tell yet
    except Exception:
        outcome = EffectOutcome.not_applied()  # it raised: like a failed call, it may be tried again
    else:
        outcome = EffectOutcome.was_applied(_recordable(result))
    with _timed_out_lock:
        _timed_out_calls.pop(key, None)
    return outcome


class StepContext:
    """Handed to each step function as ``ctx``."""

    def __init__(self, *, fence: Fence, step_seq: int, step_index: int, step_name: str, attempt: int,
                 goal: Any, input: dict, state: DurableState, artifact_refs: dict[str, str],
                 reconcile_effect: Callable[[str, str], EffectOutcome | None] | None = None,
                 answers: dict | None = None, approval_policy: dict | None = None,
                 require_approval: tuple[str, ...] = (), plan_version: int = 1):
        self.task_id = fence.task_id
        self.step_seq = step_seq
        self.step_index = step_index
        self.step_name = step_name
        self.attempt = attempt
        self.goal = goal
        self.input = input
        self.state = state
        self._fence = fence
        self._committed_artifacts = artifact_refs  # read-only here: only the commit adds to them
        self._workflow_reconcile = reconcile_effect
        self.events: list[events.Event] = []
        self.progress_value: tuple[float, str | None] | None = None
        # Effects called in this attempt: {"key", "step_seq", "name", "result", "recorded"}.
        self.effect_outcomes: list[dict] = []
        self.effect_keys: set[str] = set()  # every effect key this attempt touched (called, reused, reconciled)
        self.new_artifacts: dict[str, str] = {}
        self.force_checkpoint = False
        self.cost = Decimal(0)
        self.closed = False  # set when the attempt is abandoned: a late call from it can start nothing
        self.plan_version = plan_version
        self._answers = answers or {}
        self._answers_by_name: dict[str, dict] | None = None
        self._approval_policy = approval_policy
        self._require_approval = require_approval
        self.wait_request: dict | None = None  # ctx.wait_for_input(): entered once this step commits
        self.suspended: dict | None = None  # the approval this attempt stopped at (even if the step swallowed it)

    # -- reporting ---------------------------------------------------------------------------------------------
    def progress(self, fraction: float, phase: str | None = None) -> None:
        """Report progress (0…1) and optionally the phase; written with the step's commit."""
        if not 0 <= fraction <= 1:
            raise ValueError("progress fraction must be between 0 and 1")
        self.progress_value = (float(fraction), storable(str(phase))[:200] if phase else None)

    def log(self, message: str) -> None:
        """A line for the task's event stream. Redacted: tokens, keys, e-mail addresses are masked."""
        text = storable(redact(str(message)))[:2000]
        self.events.append(events.log_event(step=self.step_name, message=text))

    def spend(self, amount: float | Decimal | str) -> None:
        """Count spending (model tokens, API credits) against the task's cost budget (budget.maxCost).

        Committed with the step (or with the task's failure: failed attempts count too); once the total reaches
        the budget the task fails at its next safe point."""
        amount = Decimal(str(amount))
        if not amount.is_finite() or amount < 0 or amount >= MAX_SPEND:
            raise ValueError(f"spend() takes a finite amount from 0 to under {MAX_SPEND:,}")
        self.cost += amount

    def checkpoint(self) -> None:
        """Ask for a full checkpoint right after this step (as @step(costly=True) does)."""
        self.force_checkpoint = True

    # -- artifacts -----------------------------------------------------------------------------------------------
    @property
    def artifacts(self) -> dict[str, str]:
        """Name → storage reference of the task's artifacts as this step sees them (committed + its own)."""
        return {**self._committed_artifacts, **self.new_artifacts}

    def artifact(self, name: str, content: str | bytes) -> str:
        """Store a file through Django's storage API; the task keeps only its reference (returned).

        Every write gets a fresh name (lease epoch, step, attempt and a random part) and no file is ever
        overwritten or deleted here: the reference becomes part of the task's state only through the step's
        fenced commit. So a zombie, a failed attempt or a crash mid-write cannot change or remove a file that
        committed state points to (what is committed is immutable).
        """
        self._check_open()
        if not _ARTIFACT_NAME.match(name):
            raise ValueError("artifact names are 1–121 letters, digits, '.', '_' or '-'")
        data = content.encode() if isinstance(content, str) else content
        path = (f"tasks/{self.task_id}/{self._fence.epoch}/"
                f"{self.step_seq}.{self.attempt}.{uuid.uuid4().hex[:12]}-{name}")
        stored = default_storage.save(path, ContentFile(data))
        self.new_artifacts[name] = stored
        self.events.append(events.artifact_event(name=name, ref=stored, size=len(data)))
        return stored

    # -- waits ---------------------------------------------------------------------------------------------------
    def wait_for_input(self, name: str, schema: dict, prompt: str) -> None:
        """Ask a person for input. The task waits (input_required, no lease, no worker) once this step commits;
        the steps after it read the answer as ``ctx.answers[name]``. Waiting at the step boundary means the code
        of this step never runs again for the answer: what it did, effects included, is committed before the
        question is asked. ``schema`` (JSON Schema) is checked against the answer before it is accepted (a bad
        one is refused and the task still waits); ``prompt`` is shown to people, redacted. One wait per step."""
        self._check_open()
        if self.wait_request is not None:
            raise ValueError(f"step {self.step_name!r} already asked for input ({self.wait_request['name']!r}); one "
                             f"wait per step — ask the next question in the next step")
        self.wait_request = waits.input_wait(task_id=self.task_id, step_seq=self.step_seq,
                                             plan_version=self.plan_version, name=name, schema=schema, prompt=prompt)

    def wait_for_inputs(self, name: str, parts: dict, prompt: str) -> None:
        """Ask several questions at once (``parts`` = {part: {"schema": JSON Schema, "prompt": text}}), each answered
        on its own (provide_input with its ``part``) or all together; the task waits until every part is answered,
        then ``ctx.answers[name]`` is {part: value}. Otherwise as wait_for_input."""
        self._check_open()
        if self.wait_request is not None:
            raise ValueError(f"step {self.step_name!r} already asked for input ({self.wait_request['name']!r}); one "
                             f"wait per step — ask the next question in the next step")
        self.wait_request = waits.parts_wait(task_id=self.task_id, step_seq=self.step_seq,
                                             plan_version=self.plan_version, name=name, prompt=prompt, parts=parts)

    @property
    def answers(self) -> dict[str, Any]:
        """The answers given to this task's input waits, by wait name (the latest per name): the value only."""
        return {name: answer.get("value") for name, answer in self._by_name().items()}

    def answer(self, name: str) -> dict | None:
        """The whole answer to the wait ``name``: {"value", "files": {name: storage ref}, "credentials": {field:
        secret name}, "by"}, or None if it was not answered."""
        return self._by_name().get(name)

    def _by_name(self) -> dict[str, dict]:
        if self._answers_by_name is None:
            self._answers_by_name = waits.answers_by_name(self._answers)
        return self._answers_by_name

    def _approval_gate(self, name: str, key: str, arguments: Any, flag: bool) -> None:
        """Stop before an effect that needs approval and has none; refuse one that was rejected."""
        if not waits.needs_approval(name, configured=self._require_approval, policy=self._approval_policy,
                                    flag=flag):
            return
        wait_id = waits.approval_wait_id(self.task_id, plan_version=self.plan_version, effect_key=key)
        decision = self._answers.get(wait_id)
        if decision is None or "decision" not in decision:
            self.suspended = waits.approval_wait(task_id=self.task_id, step_seq=self.step_seq,
                                                 plan_version=self.plan_version, effect_name=name, effect_key=key,
                                                 arguments=arguments)
            raise waits.ApprovalRequired(self.suspended)
        if decision["decision"] != "approved":
            raise waits.EffectRejected(name, decision.get("reason", ""))

    # -- effects -------------------------------------------------------------------------------------------------
    def effect_key(self, name: str) -> str:
        return effect_key(self.task_id, self.step_seq, name)

    def effect(self, name: str, fn: Callable[[str], Any], *, reconcile: Callable[[str], EffectOutcome] | None = None,
               timeout: float | None = None, approval: bool = False, arguments: Any = None) -> Any:
        """Run ``fn(idempotency_key)`` at most once for this step; return its (recorded) result.

        Approval: when ``approval`` is true, or ``name`` is in the configuration's ``require_approval`` or the
        task's ``approvalPolicy.before``, the effect waits for a person first. The attempt stops before the call
        (effects it already called are recorded and never called again), the task waits for approve / reject,
        and after an approval the step runs again and this call goes through. A rejection raises EffectRejected
        here. ``arguments`` is what the approver is shown (redacted); the call itself still uses ``fn``.

        If an earlier run started the effect and its outcome is unknown (the worker died, or the call timed
        out), ``reconcile(key)`` — or else the workflow's ``reconcile_effect`` — is asked whether it landed:
        EffectOutcome.was_applied(result) or .not_applied(). Nobody able to tell → the task is dead-lettered
        (effect_outcome_unknown) rather than calling the effect blindly again.
        ``timeout``: raise ToolTimeout if fn has not returned after that many seconds. The call keeps running
        in its thread and may still land, so its outcome is recorded as unknown and the retry reconciles it.
        """
        self._check_open()
        key = self.effect_key(name)
        if key in self.effect_keys:
            # The same name twice in one step would be the same key twice: the second call could not be told
            # apart from a retry of the first. Name each effect of a step differently.
            raise ValueError(f"effect {name!r} was already used in step {self.step_name!r}; names must be unique "
                             f"within a step")
        self.effect_keys.add(key)
        self._approval_gate(name, key, arguments, approval)

        def call(k: str) -> Any:
            faults.point("before_effect_call", effect=name, step_seq=self.step_seq)  # `started` is committed
            return _call_with_timeout(fn, k, timeout)

        run = execute_once(
            FencedEffects(self._fence, self.step_seq), key=key, name=name, call=call,
            reconcile=lambda k: self._reconcile(name, k, reconcile, timeout),
            unknown_on=(ToolTimeout, StepTimeLimitExceeded),
        )
        if not run.called:
            self.events.append(events.effect_event(name=name, key=key, status="recorded"))
            return run.result
        result = _recordable(run.result)
        faults.point("after_effect_before_commit", step_seq=self.step_seq)
        # No event of its own: the step's progress event names the effects that succeeded in it (one event per
        # step, not one per effect too); an effect recorded outside a commit still gets its own event.
        self.effect_outcomes.append({"key": key, "step_seq": self.step_seq, "name": name, "result": result,
                                     "recorded": False})
        return result

    def _reconcile(self, name: str, key: str, hook, timeout: float | None) -> EffectOutcome | None:
        outcome = outcome_of_timed_out_call(key, wait_seconds=timeout or 0)
        if outcome is None and hook is not None:
            outcome = hook(key)
        if outcome is None and self._workflow_reconcile is not None:
            outcome = self._workflow_reconcile(name, key)
        if outcome is not None:
            self.events.append(events.effect_event(name=name, key=key, status="reconciled_applied" if outcome.applied
                                                   else "reconciled_not_applied"))
        return outcome

    def record_effect_outcomes(self) -> None:
        """Effects that returned in an attempt that will not commit (it failed, or the task stops here) did
        happen: record them now, so a retry reuses their results and nothing is left `started`."""
        for outcome in self.effect_outcomes:
            if not outcome["recorded"]:
                effects_mark(self._fence, key=outcome["key"], status="succeeded", result=outcome["result"])
                outcome["recorded"] = True

    def unrecorded_effects(self) -> list[dict]:
        return [{"key": o["key"], "step_seq": o["step_seq"], "name": o["name"], "result": o["result"]}
                for o in self.effect_outcomes if not o["recorded"]]

    def close(self) -> None:
        self.closed = True

    def _check_open(self) -> None:
        if self.closed:
            raise RuntimeError("this step attempt was abandoned (time limit); it can start nothing more")


def _recordable(result: Any) -> Any:
    """The effect happened; what it returned must be storable, or the record of it would fail. Never mark such an
    effect failed (that would invite a second call): keep a marker, or the text with NUL characters replaced
    (PostgreSQL cannot store NUL). The step gets the same value now as a re-run would get from the ledger."""
    try:
        text = canonical_json_strict(result, allow_nul=True)
    except NotJson:
        return {"unrecordable_result": type(result).__name__}
    return json.loads(text.replace("\\u0000", "\ufffd")) if nul_paths(result) else result


def _call_with_timeout(fn: Callable[[str], Any], key: str, timeout: float | None) -> Any:
    if timeout is None:
        return fn(key)
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="effect")
    future = pool.submit(fn, key)
    try:
        return future.result(timeout=timeout)
    except concurrent.futures.TimeoutError:
        with _timed_out_lock:
            _timed_out_calls[key] = future
        raise ToolTimeout(f"effect call did not return within {timeout} s; its outcome is unknown") from None
    finally:
        pool.shutdown(wait=False)
