"""Running one step: its attempts, retries with backoff, time limit, and what it produced (ARCHITECTURE §4.5).

``step_execute`` returns a StepOutcome ready for the fenced commit, or raises a durable decision (TaskFails,
DeadLetter). Infrastructure errors (LeaseLost, a lost database connection, an injected crash) pass through:
they are not the step's failure, and the slice loop handles them without burning the step's attempts.
Every way out of an attempt that will not commit first records the effects that returned in it.
"""

from __future__ import annotations

import json
import signal
import threading
import time
import traceback
from contextlib import contextmanager
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db import InterfaceError, OperationalError

from checkpoints_app.fencing import Fence, LeaseLost
from checkpoints_app.ledger import EffectOutcomeUnknown
from config.base.canonical import NotJson, canonical_json_strict, storable
from tasks_app.db.prepared import connection_close_quietly
from tasks_app.engine import faults
from tasks_app.engine.context import StepContext
from tasks_app.engine.decisions import EntersWait, Parks, StepTimeLimitExceeded, TaskFails
from tasks_app.engine.effects import effects_unknown, workflow_reconciler
from tasks_app.engine.lease import Heartbeat
from tasks_app.engine.restore import delta_sha256
from tasks_app.engine.state import DurableState
from tasks_app.engine.waits import ApprovalRequired, EffectRejected, ExternalWait
from tasks_app.events import Event
from tasks_app.redaction import redact
from tasks_app.registry import ToolTimeout, Workflow

OUTPUT_MAX_BYTES = 4 * 1024
INFRASTRUCTURE_ERRORS = (LeaseLost, faults.InjectedFault, OperationalError, InterfaceError)


@dataclass
class StepOutcome:
    """One executed step, ready to commit."""

    seq: int
    index: int
    name: str
    attempt: int
    output_json: str
    delta_json: str
    delta_sha256: str
    artifacts: dict[str, str]
    effects_count: int
    events: list[Event]
    progress: tuple[float, str | None] | None
    effects: list[dict]  # effects called in the committing attempt: their outcome is written with the commit
    costly: bool
    cost: Decimal  # spent by every attempt of this step
    tokens: int  # model tokens used by every attempt of this step
    started_at: float
    touched_effect_keys: set[str] = field(default_factory=set)
    # Effects a failed attempt of this step started that the committing attempt did not touch (it took another
    # path): they may have been left unknown, so they are resolved before the commit.
    abandoned_effect_keys: set[str] = field(default_factory=set)
    wait: dict | None = None  # ctx.wait_for_input(): the task waits once this step commits
    ends_plan: bool = False  # ctx.end_plan(): the plan ends with this step


@contextmanager
def time_limit(seconds: float):
    """Interrupt the step with StepTimeLimitExceeded after ``seconds`` — on the main thread (Celery's prefork
    children run tasks there). Elsewhere only the heartbeat enforces the limit: it stops renewing the lease."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum, frame):
        raise StepTimeLimitExceeded(f"the step ran longer than its time limit of {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def step_execute(*, workflow: Workflow, fence: Fence, heartbeat: Heartbeat, goal: Any, input: dict,
                 variables: dict, artifact_refs: dict, seq: int, index: int, name: str,
                 on_context=lambda ctx: None, answers: dict | None = None, approval_policy: dict | None = None,
                 plan_version: int = 1) -> StepOutcome:
    cfg = settings.RUNTIME
    options = workflow.steps[name]
    function = getattr(workflow, name)
    retry = cfg.step_retry
    max_attempts = options["max_attempts"] or retry.max_attempts
    limit = options.get("timeout") or cfg.step_timeout_seconds
    durable = DurableState(variables)
    attempts: list[dict] = []
    spent = Decimal(0)
    tokens = 0  # (counted with ``spent`` everywhere: what every attempt used is kept, committed or not)
    touched_by_failed_attempts: set[str] = set()
    started_at = time.time()
    attempt = 0

    reconcile_effect = workflow_reconciler(workflow, input)

    while True:
        attempt += 1
        ctx = StepContext(fence=fence, step_seq=seq, step_index=index, step_name=name, attempt=attempt, goal=goal,
                          input=input, state=durable, artifact_refs=artifact_refs,
                          reconcile_effect=reconcile_effect, answers=answers, approval_policy=approval_policy,
                          require_approval=cfg.require_approval, plan_version=plan_version, time_limit=limit)
        on_context(ctx)
        began = time.monotonic()
        heartbeat.step_started(limit)
        try:
            with time_limit(limit):
                output = function(ctx)
            if ctx.suspended is not None:  # the step caught ApprovalRequired: it still may not go past the gate
                raise ApprovalRequired(ctx.suspended)
            break
        except ApprovalRequired as gate:
            # Stop before the effect: what this attempt called is recorded (never called again), its state
            # changes are dropped, and the step runs again from its start once the effect is approved.
            spent, tokens = spent + ctx.cost, tokens + ctx.tokens
            _attempt_ends(ctx, durable)
            raise EntersWait(gate.wait, cost=spent, tokens=tokens) from None
        except ExternalWait as waiting:
            # Waiting for something outside: the effects it called are recorded (a downstream task's handle among
            # them), nothing else of the attempt is kept, and the task is handed back later (slice._park).
            spent, tokens = spent + ctx.cost, tokens + ctx.tokens
            _attempt_ends(ctx, durable)
            raise Parks(seconds=waiting.seconds, message=waiting.message, cost=spent, tokens=tokens) from None
        except EffectRejected as rejected:
            # A person said no: deterministic, so no retry. The step could have caught it; it did not.
            spent, tokens = spent + ctx.cost, tokens + ctx.tokens
            _attempt_ends(ctx, durable)
            raise TaskFails({"type": "EffectRejected", "message": error_message(rejected), "step": name,
                             "stepIndex": index, "attempt": attempt}, failed_step=True, cost=spent,
                            tokens=tokens) from None
        except EffectOutcomeUnknown as unknown:
            spent, tokens = spent + ctx.cost, tokens + ctx.tokens
            _attempt_ends(ctx, durable)
            question = ctx.outcome_question(unknown.keys)  # a person says whether it happened (ask=True)…
            if question is not None:
                raise EntersWait(question, cost=spent, tokens=tokens) from None
            raise effects_unknown(unknown.keys, cost=spent, tokens=tokens) from None  # …or the task is dead-lettered
        except INFRASTRUCTURE_ERRORS:
            raise
        except (Exception, StepTimeLimitExceeded) as error:  # the step's own failure: record, back off, retry or fail
            if getattr(error, "retryable", True) is False:
                # Deterministic (a tool the policy denies, say): a second attempt would be refused the same way.
                # The error may carry events that say what happened (tool.denied); they are written with the failure.
                spent, tokens = spent + ctx.cost, tokens + ctx.tokens
                _attempt_ends(ctx, durable)
                failure = {"type": type(error).__name__, "message": error_message(error), "step": name,
                           "stepIndex": index, "attempt": attempt}
                if getattr(error, "reason", None):
                    failure["reason"] = error.reason
                if getattr(error, "effect_key", None):
                    failure["effectKey"] = error.effect_key  # (an abandoned effect: see slice._fail)
                raise TaskFails(failure, failed_step=True, cost=spent, tokens=tokens,
                                events=getattr(error, "events", ())) from None
            spent, tokens = spent + ctx.cost, tokens + ctx.tokens
            touched_by_failed_attempts |= ctx.effect_keys
            timed_out = isinstance(error, StepTimeLimitExceeded)
            if timed_out:
                ctx.close()
                connection_close_quietly()  # the interrupt may have landed inside a database call: start clean
            _attempt_ends(ctx, durable)
            attempts.append({"attempt": attempt, "type": type(error).__name__,
                             "message": error_message(error),
                             "duration_ms": round((time.monotonic() - began) * 1000),
                             "traceback": storable(redact("".join(traceback.format_exception(error)[-3:])))[-1500:]})
            limit_attempts = retry.tool_timeout_attempts if isinstance(error, ToolTimeout) else max_attempts
            if attempt >= limit_attempts:
                failure = {"type": type(error).__name__, "message": error_message(error), "step": name,
                           "stepIndex": index, "attempt": attempt, "attempts": attempts}
                if getattr(error, "reason", None):  # a typed reason (tool_unavailable…) for clients to act on
                    failure["reason"] = error.reason
                raise TaskFails(failure, failed_step=True, cost=spent, tokens=tokens) from None
            time.sleep(min(retry.backoff_max_seconds, retry.backoff_seconds * 2 ** (attempt - 1)))
        finally:
            heartbeat.step_finished()
    spent, tokens = spent + ctx.cost, tokens + ctx.tokens
    outcome = _outcome(ctx, durable, output, seq=seq, index=index, name=name, attempt=attempt,
                       costly=options["costly"], cost=spent, tokens=tokens, started_at=started_at)
    outcome.abandoned_effect_keys = touched_by_failed_attempts - ctx.effect_keys
    return outcome


def error_message(error: BaseException) -> str:
    """What an exception says, fit for an error record: redacted, storable, never empty."""
    return storable(redact(str(error)))[:500] or f"{type(error).__name__} (raised without a message)"


def _attempt_ends(ctx: StepContext, durable: DurableState) -> None:
    ctx.record_effect_outcomes()
    durable.discard_changes()


def _outcome(ctx: StepContext, durable: DurableState, output: Any, *, seq, index, name, attempt, costly, cost,
             tokens, started_at) -> StepOutcome:
    def invalid(kind: str, message: str) -> TaskFails:
        # Deterministic: retrying would produce the same value. The effects that returned did happen.
        _attempt_ends(ctx, durable)
        return TaskFails({"type": kind, "step": name, "stepIndex": index, "attempt": attempt, "message": message},
                         failed_step=True, cost=cost, tokens=tokens)

    try:
        delta = durable.delta()
        if ctx.new_artifacts:
            delta["artifacts"] = ctx.new_artifacts
        if ctx.effect_outcomes:
            delta["effects"] = len(ctx.effect_outcomes)
        if ctx.wait_request is not None:
            delta["wait"] = ctx.wait_request
        # The whole delta, once: a value assigned earlier in the step may have been changed in place since.
        delta_json = canonical_json_strict(delta, "state")
        output_json = canonical_json_strict(output, "output")
    except NotJson as bad:
        where = bad.path.replace("state.set.", "state.", 1)
        raise invalid("InvalidState", f"step {name!r} produced a value JSON cannot keep at {where}: {bad.reason}. "
                                      f"Store plain JSON values (convert decimals, dates and ids to strings)") from None
    if len(output_json) > OUTPUT_MAX_BYTES:
        output_json = json.dumps({"truncated": True, "bytes": len(output_json)})
    max_bytes = settings.RUNTIME.checkpoint.max_bytes
    if len(delta_json.encode()) > max_bytes:
        raise invalid("StateTooLarge", f"step {name!r} changed {len(delta_json.encode())} bytes of state, over the "
                                       f"{max_bytes}-byte cap (checkpoint.max_bytes); store big values with "
                                       f"ctx.artifact() and keep only the reference in state")
    return StepOutcome(
        seq=seq, index=index, name=name, attempt=attempt, output_json=output_json, delta_json=delta_json,
        delta_sha256=delta_sha256(delta_json), artifacts=dict(ctx.new_artifacts),
        effects_count=len(ctx.effect_outcomes), events=list(ctx.events), progress=ctx.progress_value,
        effects=ctx.unrecorded_effects(), costly=costly or ctx.force_checkpoint, cost=cost, tokens=tokens,
        started_at=started_at,
        touched_effect_keys=set(ctx.effect_keys), wait=ctx.wait_request, ends_plan=ctx.plan_ends,
    )
