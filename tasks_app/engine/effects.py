"""Effects, the engine's side of the ledger (ARCHITECTURE §5): the fenced effect writes, the calls that timed out
and may still land, resolving effects a lease left open, and the one dead letter for an effect nobody can answer for.

The ledger's rules (execute once, what each status means) are checkpoints_app.ledger's; its storage is the store's
fenced statements (tasks_app.db.store). What is here is what the engine adds: keys, the timed-out call registry of
this process, reconciliation before a step commits past an open effect or the task stops, and the record of effects
that returned in an attempt that will not commit.
"""

from __future__ import annotations

import concurrent.futures
import functools
import json
import logging
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from django.conf import settings
from checkpoints_app.fencing import Fence, LeaseLost
from checkpoints_app.ledger import EffectBegin, EffectOutcome, resolution
from checkpoints_app.models import Recovery, UnknownWhy
from config.base.canonical import NotJson, canonical_json_strict, nul_paths
from tasks_app.db import store
from tasks_app.engine.decisions import DeadLetter
from tasks_app.engine.waits import (
    EffectAbandoned,
    ExternalWait,
    QuestionRequired,
    effect_outcome_answer,
    effect_outcome_wait,
)
from tasks_app.events import Event, effect_event
from tasks_app.observability import metrics, tracing
from tasks_app.redaction import redact
from tasks_app.registry import ToolTimeout, Workflow

if TYPE_CHECKING:
    from tasks_app.engine.context import StepContext

logger = logging.getLogger(__name__)

# Before a terminal decision, how long to wait for a timed-out effect call still running in this process.
TIMED_OUT_CALL_WAIT_SECONDS = 2.0


def effect_key(task_id, step_seq: int, name: str) -> str:
    """An effect's idempotency key. Never includes the attempt number: a retried or recovered step must find the
    same key."""
    return f"{task_id}:{step_seq}:{name}"


def effect_key_step_seq(key: str) -> int:
    """The step an effect key belongs to (its ledger row is found by task, step and key)."""
    return int(key.split(":", 2)[1])


def effect_result_recordable(result: Any) -> Any:
    """The effect happened; what it returned must be storable, or the record of it would fail. Never mark such an
    effect failed (that would invite a second call): keep a marker, or the text with NUL characters replaced
    (PostgreSQL cannot store NUL). The step gets the same value now as a re-run would get from the ledger."""
    try:
        text = canonical_json_strict(result, allow_nul=True)
    except NotJson:
        return {"unrecordable_result": type(result).__name__}
    return json.loads(text.replace("\\u0000", "\ufffd")) if nul_paths(result) else result


# -- the fenced effect writes --------------------------------------------------------------------------------------
class FencedEffects:
    """The ledger's storage for one lease (checkpoints_app.ledger.EffectStore), fenced on it."""

    def __init__(self, fence: Fence, step_seq: int, *, timeout: float | None = None, recovery: str | None = None,
                 asks: bool = False, about: dict | None = None):
        self.fence = fence
        self.step_seq = step_seq
        self.lands_within = lands_within(timeout)  # (the deadline each start of the call records)
        # The rule the row carries (decide() reads it back), written with the row's first start only.
        self.recovery, self.asks = recovery, asks
        self.about = None if about is None else json.dumps(about, ensure_ascii=False, separators=(",", ":"))
        self.unknown: set[str] = set()  # keys already unknown when begun: recording them unknown again is no news

    def begin(self, *, key: str, name: str) -> EffectBegin:
        begun = store.effect_begin(self.fence, store.EffectStart(key=key, step_seq=self.step_seq, name=name,
                                                                 lands_within=self.lands_within,
                                                                 recovery=self.recovery, asks=self.asks,
                                                                 about=self.about))
        if begun is None:
            raise LeaseLost(f"lease lost before effect {key}")
        if str(begun.status) == "unknown":
            self.unknown.add(key)
        return begun

    def mark(self, *, key: str, status: str, result: Any = None, error: Any = None, restart: bool = False) -> None:
        effects_mark(self.fence, key=key, status=status, result=result, error=error, restart=restart,
                     lands_within=self.lands_within, why=unknown_why(error) if str(status) == "unknown" else None)
        if str(status) == "unknown" and key not in self.unknown:
            metrics.effect_unknown()


def lands_within(timeout: float | None) -> float | None:
    """Seconds after its start a call sent with ``timeout`` can no longer land: the timeout plus the configured
    margin (effects.unknown_outcome_margin_seconds, for the clocks and queues between). None: no bound known."""
    if timeout is None:
        return None
    return float(timeout) + settings.RUNTIME.effects.unknown_outcome_margin_seconds


def unknown_why(error: Any) -> str | None:
    """Why a call's outcome became unknown, as the error it was recorded with carries it, typed (execute_once's
    unknown_on: the exception's ``why``, checkpoints_app.models.UnknownWhy). None: no error (the row was `started`:
    EFFECT_MARK derives worker_died). An error without one counts as dropped after sending, which waits for the
    deadline — the safe side."""
    if not isinstance(error, dict):
        return None
    why = error.get("why")
    return why if why in UnknownWhy.values else UnknownWhy.DROPPED_AFTER_SEND.value


def effects_mark(fence: Fence, *, key: str, status: str, result: Any = None, error: Any = None,
                 restart: bool = False, lands_within: float | None = None, why: str | None = None) -> None:
    """Record an effect's outcome outside a step commit (a failed call, a reconciliation), fenced on the lease;
    LeaseLost if the lease is not ours. ``lands_within``: with ``restart``, the seconds the call may take again;
    ``why``: with status unknown, why (else derived)."""
    if isinstance(error, dict) and "message" in error:
        error = {**error, "message": redact(str(error["message"]))[:500]}
    if result is not None:  # from a reconcile hook or a late call: the same rule as a call's own result
        result = effect_result_recordable(result)
    marked = store.effect_mark(fence, store.EffectMark(
        key=key, step_seq=effect_key_step_seq(key), status=str(status), restart=int(restart),
        result=None if result is None else canonical_json_strict(result, f"effect {key}"),
        error=None if error is None else canonical_json_strict(error, "error"),
        lands_within=lands_within, why=why,
    ))
    if not marked:
        raise LeaseLost(f"lease lost while recording effect {key}")


def effects_record_returned(fence: Fence, *, ctx: StepContext | None, committing: list[dict]) -> None:
    """Effects that returned but whose step will not commit (now): record them, so nothing is left started —
    those of the attempt in flight (``ctx``) and those of the step whose commit did not happen (``committing``)."""
    if ctx is not None:
        ctx.record_effect_outcomes()
    for effect in committing:
        effects_mark(fence, key=effect["key"], status="succeeded", result=effect["result"])


# -- calls that timed out ------------------------------------------------------------------------------------------
# Effect calls that timed out and are still running in this process, by key: the retry (or the resolution before a
# terminal decision) waits for the answer before asking anyone to reconcile, instead of racing a second call against
# the first.
_timed_out_calls: dict[str, concurrent.futures.Future] = {}
_timed_out_lock = threading.Lock()


def effect_call(fn: Callable[[str], Any], key: str, timeout: float | None) -> Any:
    """``fn(key)``, or ToolTimeout after ``timeout`` seconds. A call that times out keeps running in its thread and
    may still land: it is remembered here, so outcome_of_timed_out_call can tell what it did."""
    if timeout is None:
        return fn(key)
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="effect")
    future = pool.submit(tracing.carry_context(fn), key)  # (the thread's spans stay under the effect's)
    try:
        return future.result(timeout=timeout)
    except concurrent.futures.TimeoutError:
        with _timed_out_lock:
            _timed_out_calls[key] = future
        raise ToolTimeout(f"effect call did not return within {timeout} s; its outcome is unknown") from None
    finally:
        pool.shutdown(wait=False)


def outcome_of_timed_out_call(key: str, wait_seconds: float) -> EffectOutcome | None:
    """What a call of this process that timed out did, once it has answered (waiting up to ``wait_seconds``). None:
    no such call, or it is still running (nobody here can tell yet)."""
    with _timed_out_lock:
        future = _timed_out_calls.get(key)
    if future is None:
        return None
    try:
        result = future.result(timeout=wait_seconds)
    except concurrent.futures.TimeoutError:
        return None  # still running: nobody here can tell yet
    except Exception:
        outcome = EffectOutcome.not_applied(by="call")  # it raised: like a failed call, it may be tried again
    else:
        outcome = EffectOutcome.was_applied(effect_result_recordable(result), by="call")
    with _timed_out_lock:
        _timed_out_calls.pop(key, None)
    return outcome


# -- effects of unknown outcome: the one decision ------------------------------------------------------------------
@dataclass(frozen=True)
class Decision:
    """What decide() found for an effect of unknown outcome: ``outcome`` (what it did, and who said so: its
    ``by``), or None — only a person can tell, and the call can no longer land: ``question`` is the effect as they
    are shown it (waits.effect_outcome_wait's ``effect`` facts) and ``asks`` where they are asked (on the task, or
    through the dead letters)."""

    key: str
    name: str
    outcome: EffectOutcome | None
    asks: bool = False
    question: dict | None = None
    arguments: Any = None
    about: dict | None = None


def decide(task_id, effect: dict, *, reconcile: Callable[[str, str], EffectOutcome | None] | None, answers: dict,
           call_wait_seconds: float, unrecorded: dict | None = None) -> Decision:
    """THE decision for an effect whose outcome is unknown (issue 38): its step met it again, or a dead worker left
    it open and the task is going past it (another path, a stop, a failure) — one function, one order, from the rule
    its ledger row carries (checkpoints_app.models.Recovery, recorded when it started):

    1. a call of this process that timed out and has answered since (waiting up to ``call_wait_seconds``);
    2. REPEAT / REPEAT_WITH_KEY (read-only, idempotent, a server that honours the key): not applied — called again
       with its key (met in its step) or left failed (gone past);
    3. RECONCILE: ``reconcile(name, key)``, the workflow's hook (a hook that raises cannot tell either);
    4. a person's answer to "did this happen?" already given (``answers``): applied, not applied, or abandon
       (waits.EffectAbandoned);
    5. a person is needed — but never while the call can still land: until the row's deadline (sent at + the timeout
       it was sent with + effects.unknown_outcome_margin_seconds) has passed on the DATABASE's clock, ExternalWait
       (the step lets go of its worker and runs again after it, when 1–4 are asked again). The race it closes: the
       call was received, its worker was SIGKILLed, the server applies it seconds later — a person asked at once
       checks, sees nothing, answers not_applied, and the call is made twice.
    6. past the deadline (or with none recorded): Decision(outcome=None) with the question's facts.

    ``effect``: {"key", "name", "step_seq"} (the row is read here, afresh). Both paths pass the same ``answers``
    (the task's) and the same ``reconcile``, the workflow's hook — unless the row names the caller's own hook
    (ctx.effect(reconcile=f): f's module and name, recorded when the effect started), which is then asked instead,
    on both paths alike. ``unrecorded``: {"recovery", "asks", "about"} for a row written before rules were recorded
    (null there) — what its step says as it meets it again; gone past, such a row is decided as PERSON, by the dead
    letters."""
    key, name = effect["key"], effect["name"]
    row = store.effect_unknown_facts(task_id, step_seq=effect["step_seq"], key=key) or {}
    if row.get("recovery") is None and unrecorded is not None:
        row = {**row, **unrecorded}
    rule, about = row.get("recovery") or Recovery.PERSON, row.get("about") or {}
    if about.get("reconcile"):  # the caller's own hook, by the name its row recorded: the same on both paths
        named = reconcile_hook(about["reconcile"])
        reconcile = (lambda _name, k: named(k)) if named is not None else None
    decided = functools.partial(Decision, key=key, name=name)
    outcome = outcome_of_timed_out_call(key, wait_seconds=call_wait_seconds)
    if outcome is not None:
        return decided(outcome=outcome)
    if rule in (Recovery.REPEAT, Recovery.REPEAT_WITH_KEY):
        return decided(outcome=EffectOutcome.not_applied(by="rule"))
    if rule == Recovery.RECONCILE and reconcile is not None:
        try:
            outcome = reconcile(name, key)
        except Exception:  # a broken hook cannot tell either
            logger.warning("reconcile_effect raised for %s", key, exc_info=True)
            outcome = None
        if outcome is not None:
            return decided(outcome=outcome)
    answer = effect_outcome_answer(answers, task_id=task_id, effect_key=key)
    if answer is not None and answer["outcome"] == "abandon":
        raise EffectAbandoned(name, key)
    if answer is not None:
        return decided(outcome=EffectOutcome.was_applied(answer.get("result"), by="person")
                       if answer["outcome"] == "applied" else EffectOutcome.not_applied(by="person"))
    left = row.get("seconds_left")
    if left is not None and left > 0:
        raise ExternalWait(left + ExternalWait.MIN_SECONDS,
                           f"Waiting for {name}'s deadline (key {key}): its call may still land for another "
                           f"{left:.0f} s; whether it happened is asked after that")
    why = row.get("why") or (UnknownWhy.WORKER_DIED.value if row.get("status") == "started" else None)
    question = {"sentAt": _iso(row.get("sent_at")), "deadline": _iso(row.get("deadline")), "why": why}
    return decided(outcome=None, asks=bool(row.get("asks")), question=question, arguments=about.get("arguments"),
                   about={part: about.get(part) for part in ("server", "tool", "annotations")})


def outcome_question(task_id, decision: Decision, *, step_seq: int, plan_version: int) -> dict:
    """The "did this happen?" wait for an effect only a person can tell about (decide() found no outcome)."""
    return effect_outcome_wait(task_id=task_id, step_seq=step_seq, plan_version=plan_version,
                               effect_name=decision.name, effect_key=decision.key, arguments=decision.arguments,
                               facts=decision.question, about=decision.about)


def workflow_reconciler(workflow, input: dict) -> Callable[[str, str], EffectOutcome | None] | None:
    """The workflow's reconcile_effect as decide() asks it, (name, key) → outcome; None when the workflow does not
    define one (then its effects' rule is not `reconcile` unless a call gives its own hook)."""
    if type(workflow).reconcile_effect is Workflow.reconcile_effect:
        return None
    return lambda name, key: workflow.reconcile_effect(name=name, key=key, input=input)


def effect_recovery(*, declared: str | None, reconcile: bool) -> str:
    """The rule an effect starts with: what its caller declared (REPEAT / REPEAT_WITH_KEY: the tool gateway, from the
    tool's annotations and its server), else RECONCILE when a hook can ask the remote side, else PERSON."""
    if declared is not None:
        return Recovery(declared).value
    return (Recovery.RECONCILE if reconcile else Recovery.PERSON).value


def reconcile_hook_name(hook: Callable) -> str:
    """The name a per-call reconcile hook is recorded by on its effect's ledger row ("module:qualname"), so that
    whoever meets the effect again — its step, or the slice going past it after its worker died, in another process —
    asks the same hook. Only a function reachable by that name (module-level, or a class's staticmethod) can be: a
    lambda or a closure lives only in the step that made it; ValueError says so."""
    name = f"{getattr(hook, '__module__', '')}:{getattr(hook, '__qualname__', '')}"
    if reconcile_hook(name) is not hook:
        raise ValueError(f"reconcile= takes a module-level function (or a staticmethod), not {hook!r}: it is recorded "
                         f"by name on the effect's ledger row, so that a worker meeting the effect after this one "
                         f"died asks the same hook. Or define reconcile_effect on the workflow.")
    return name


def reconcile_hook(name: str) -> Callable | None:
    """The hook recorded as ``name`` (reconcile_hook_name), from a module already loaded — a workflow's, imported at
    start — never one imported because a row names it. None: not found (then it cannot tell: a person decides)."""
    module_name, _, qualname = name.partition(":")
    target = sys.modules.get(module_name)
    for part in qualname.split(".") if target is not None and qualname else ():
        target = getattr(target, part, None)
    if not callable(target):
        logger.warning("the reconcile hook %s recorded for an effect is not loaded here", name)
        return None
    return target


def _iso(moment) -> str | None:
    return moment.isoformat() if moment is not None else None


def effects_unknown(keys: list[str], *, cost: Decimal = Decimal(0), tokens: int = 0) -> DeadLetter:
    """The one dead letter for effects whose outcome nobody can tell (ARCHITECTURE §5: never a blind retry), whether
    a step's own retry found them (the ledger's EffectOutcomeUnknown) or the slice did before a commit or a stop."""
    return DeadLetter("effect_outcome_unknown",
                      f"effects {', '.join(keys)} were started and their outcome is unknown (a worker died or the "
                      f"call timed out); no reconcile hook could tell whether they happened, so a person must check "
                      f"and resolve them", cost=cost, tokens=tokens)


def effects_to_answer_for(task_id, message: str) -> tuple[str, list[str]]:
    """For a dead letter: the task's open effects, which the operator will have to answer for, and ``message`` naming
    those it does not name yet. Rare (once per dead letter), so read afresh."""
    open_keys = [effect["key"] for effect in store.effects_open(task_id)]
    unnamed = [key for key in open_keys if key not in message]
    if unnamed:
        message += f" (effects of unknown outcome to answer for: {', '.join(unnamed)})"
    return message, open_keys


Reconciler = Callable[[str, str], "EffectOutcome | None"]  # (effect name, key) → what the workflow's hook found


class OpenEffects:
    """One slice's effects that may lack an outcome, and their resolution: every started effect is resolved before
    the task leaves recovery, a step commits past it, or the task stops or ends (ARCHITECTURE §5)."""

    def __init__(self, fence: Fence, left_open: list[dict]):
        self.fence = fence
        self.effects = list(left_open)  # left by a previous lease without an outcome, as the claim returned them
        # Whether any may be open now: then a resolution before a terminal, stopping or committing write reads them
        # afresh (an effect of this slice may have become unknown on an attempt that failed or took another path).
        self.may_exist = bool(left_open)
        self.failing = False  # a failed step may have left an effect unknown on its last attempt: read them all

    def resolve(self, *, keep_seq: int | None, reconcile: Reconciler | None, answers: dict, events: list[Event],
                exclude: set[str] = frozenset(), may_wait: bool = False, plan_version: int = 1) -> None:
        """Decide every open effect (decide(): the one decision, the rule each row carries) — but those of step
        ``keep_seq`` (its re-run meets them itself) and those in ``exclude`` (the step about to commit settled them).
        Each outcome is recorded, fenced, and an event for it appended to ``events``.

        Those only a person can tell about: with ``may_wait`` (a step is about to commit past them, and may run
        again) the task waits — without a worker until the latest deadline among them (ExternalWait), then on the
        person (waits.QuestionRequired: "did this happen?", when every one of them asks on the task); else — and
        always before a stop, a failure or the end, which cannot be put off — DeadLetter (effects_unknown) naming
        them, marked unknown: the dead letter's retry asks the same question, and refuses an answer before a call's
        deadline (tasks_app.engine.dead_letters).

        With keep_seq None (before a terminal or stopping write, or before a step commits past them) the open
        effects are read afresh when any may exist."""
        if keep_seq is None and (self.may_exist or self.failing):
            self.effects = [effect for effect in store.effects_open(self.fence.task_id) if effect["key"] not in exclude]
        unresolved, remaining, latest_wait = [], [], None
        for effect in self.effects:
            if keep_seq is not None and effect["step_seq"] == keep_seq:
                remaining.append(effect)
                continue
            try:
                decision = decide(self.fence.task_id, effect, reconcile=reconcile, answers=answers,
                                  call_wait_seconds=TIMED_OUT_CALL_WAIT_SECONDS)
            except ExternalWait as waiting:  # only a person can tell, and the call may still land
                latest_wait = waiting if latest_wait is None or waiting.seconds > latest_wait.seconds else latest_wait
                unresolved.append((effect, None))
                remaining.append(effect)
                continue
            except EffectAbandoned:  # a person gave the task up over it: it stays unknown (nobody knows)
                if may_wait:
                    raise  # (the step fails over it, as it would had the step met the effect again)
                unresolved.append((effect, None))
                remaining.append(effect)
                continue
            if decision.outcome is None:
                unresolved.append((effect, decision))
                remaining.append(effect)
                continue
            effects_mark(self.fence, key=effect["key"], **resolution(decision.outcome, by=decision.outcome.by))
            events.append(effect_event(name=effect["name"], key=effect["key"],
                                       status="reconciled_applied" if decision.outcome.applied
                                       else "reconciled_not_applied"))
        self.effects = remaining
        if not unresolved:
            return
        for effect, _ in unresolved:
            if effect["status"] != "unknown":
                effects_mark(self.fence, key=effect["key"], status="unknown")
                effect["status"] = "unknown"
                metrics.effect_unknown()
        if may_wait and latest_wait is not None:
            raise latest_wait
        decisions = [decision for _, decision in unresolved]
        if may_wait and all(decision is not None and decision.asks for decision in decisions):
            first = decisions[0]
            raise QuestionRequired(outcome_question(self.fence.task_id, first, step_seq=effect_key_step_seq(first.key),
                                                    plan_version=plan_version))
        raise effects_unknown([effect["key"] for effect, _ in unresolved])
