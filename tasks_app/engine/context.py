"""What a step function gets (``ctx``): durable state, progress, logs, artifacts, waits, and effects through the
ledger (their fenced writes and timed-out calls: tasks_app.engine.effects; the state: tasks_app.engine.state).

Everything a step does is buffered here and written by the engine in the step's one commit statement, except
an effect's ``started`` record, which must be committed before the effect is called (that is the point), and
an artifact's file, which is written under a fresh name that only the commit makes part of the task's state.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable
from decimal import Decimal
from typing import Any

from django.core.files.base import ContentFile
from django.core.files.storage import default_storage

from checkpoints_app.fencing import Fence
from checkpoints_app.ledger import EffectOutcome, execute_once
from checkpoints_app.models import Recovery
from config.base.canonical import storable
from config.base.json_input import bounded_copy
from tasks_app import events
from tasks_app.engine import faults, waits
from tasks_app.engine.decisions import StepTimeLimitExceeded
from tasks_app.engine.effects import (
    Decision,
    FencedEffects,
    decide,
    effect_call,
    effect_key,
    effect_recovery,
    effect_result_recordable,
    reconcile_hook_name,
    effects_mark,
    outcome_question,
)
from tasks_app.engine.state import DurableState
from tasks_app.observability import tracing
from tasks_app.redaction import redact
from tasks_app.registry import ToolTimeout, tool_executor

# One spend() call at most this much; a task's total is stored with 20 digits, 4 after the point.
MAX_SPEND = Decimal(10) ** 12
# …and at most this many tokens (a task's total is a bigint).
MAX_SPEND_TOKENS = 10**12


_ARTIFACT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,120}$")


class StepContext:
    """Handed to each step function as ``ctx``."""

    def __init__(self, *, fence: Fence, step_seq: int, step_index: int, step_name: str, attempt: int,
                 goal: Any, input: dict, state: DurableState, artifact_refs: dict[str, str],
                 reconcile_effect: Callable[[str, str], EffectOutcome | None] | None = None,
                 answers: dict | None = None, approval_policy: dict | None = None,
                 require_approval: tuple[str, ...] = (), plan_version: int = 1, time_limit: float | None = None):
        self.task_id = fence.task_id
        self.time_limit = time_limit  # the step attempt's, in seconds: what bounds an effect called without a timeout
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
        self.plan_ends = False  # ctx.end_plan(): this step is the plan's last
        self.cost = Decimal(0)
        self.tokens = 0  # model tokens (in + out) this attempt used: ctx.spend(amount, tokens=n)
        self.closed = False  # set when the attempt is abandoned: a late call from it can start nothing
        self.plan_version = plan_version
        self._answers = answers or {}
        self._answers_by_name: dict[str, dict] | None = None
        self._approval_policy = approval_policy
        self._require_approval = require_approval
        self.wait_request: dict | None = None  # ctx.wait_for_input(): entered once this step commits
        self.suspended: dict | None = None  # the approval this attempt stopped at (even if the step swallowed it)
        self.undecided: dict[str, Decision] = {}  # key → what decide() found: only a person can tell, past its deadline
        self.tool_calls: dict[str, int] = {}  # "server.tool" → calls made in this step (the n of each call's key)
        self.gateway_cache: dict[str, Any] = {}  # what the tool gateway read once for this attempt (task, servers)

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

    def spend(self, amount: float | Decimal | str, *, tokens: int = 0) -> None:
        """Count spending (API credits, a model call's price) against the task's cost budget (budget.maxCost), and
        ``tokens`` (a model call's tokens in + out) against its token budget (budget.maxTokens).

        Committed with the step (or with the task's failure: failed attempts count too); once a total reaches its
        budget the task fails, or waits for an operator to raise the budget (its policy: budget.onExhausted, else
        the workflow's on_budget_exhausted), at its next safe point."""
        amount = Decimal(str(amount))
        if not amount.is_finite() or amount < 0 or amount >= MAX_SPEND:
            raise ValueError(f"spend() takes a finite amount from 0 to under {MAX_SPEND:,}")
        if not isinstance(tokens, int) or isinstance(tokens, bool) or not 0 <= tokens < MAX_SPEND_TOKENS:
            raise ValueError(f"spend() takes tokens as a whole number from 0 to under {MAX_SPEND_TOKENS:,}")
        self.cost += amount
        self.tokens += tokens

    def end_plan(self) -> None:
        """Make this step the plan's last: once it commits the task completes, and the steps the plan still held are
        not run. For a workflow whose length is found as it runs — an agent's loop ends when its model answers
        without a tool call — plan the most steps it may take, and end the plan here. Committed with the step (the
        task's plan_length, in the same fenced write), so a crash after the commit never runs a step past it."""
        self._check_open()
        self.plan_ends = True

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

    def answer_for(self, wait_id: str) -> dict | None:
        """The whole answer to the wait with this id (see answer()), or None."""
        return self._answers.get(wait_id)

    def answer(self, name: str) -> dict | None:
        """The whole answer to the wait ``name``: {"value", "files": {name: storage ref}, "credentials": {field:
        secret name}, "by"}, or None if it was not answered."""
        return self._by_name().get(name)

    def _by_name(self) -> dict[str, dict]:
        if self._answers_by_name is None:
            self._answers_by_name = waits.answers_by_name(self._answers)
        return self._answers_by_name

    def _approval_gate(self, name: str, key: str, arguments: Any, flag: bool, repeat_safe: bool = False) -> None:
        """Stop before an effect that needs approval and has none; refuse one that was rejected."""
        repeat = not repeat_safe and waits.is_fork_repeat(self._approval_policy, step_seq=self.step_seq, name=name)
        if not waits.needs_approval(name, configured=self._require_approval, policy=self._approval_policy,
                                    flag=flag or repeat):
            return
        wait_id = waits.approval_wait_id(self.task_id, plan_version=self.plan_version, effect_key=key)
        decision = self._answers.get(wait_id)
        if decision is None or "decision" not in decision:
            self.suspended = waits.approval_wait(task_id=self.task_id, step_seq=self.step_seq,
                                                 plan_version=self.plan_version, effect_name=name, effect_key=key,
                                                 arguments=arguments, repeat=repeat)
            raise waits.ApprovalRequired(self.suspended)
        if decision["decision"] != "approved":
            raise waits.EffectRejected(name, decision.get("reason", ""))

    # -- effects -------------------------------------------------------------------------------------------------
    def effect_key(self, name: str) -> str:
        return effect_key(self.task_id, self.step_seq, name)

    def effect(self, name: str, fn: Callable[[str], Any], *, reconcile: Callable[[str], EffectOutcome] | None = None,
               timeout: float | None = None, approval: bool = False, arguments: Any = None,
               ask: bool = False, recovery: str | None = None, about: dict | None = None) -> Any:
        """Run ``fn(idempotency_key)`` at most once for this step; return its (recorded) result.

        Approval: when ``approval`` is true, or ``name`` is in the configuration's ``require_approval`` or the
        task's ``approvalPolicy.before``, the effect waits for a person first. The attempt stops before the call
        (effects it already called are recorded and never called again), the task waits for approve / reject,
        and after an approval the step runs again and this call goes through. A rejection raises EffectRejected
        here. ``arguments`` is what the approver is shown (redacted); the call itself still uses ``fn``.

        The effect's ledger row records, when it starts, how an unknown outcome of it is decided (its recovery
        rule, checkpoints_app.models.Recovery) and what a person deciding is shown: whether its step meets it again
        or the task goes past it after its worker died, tasks_app.engine.effects.decide decides by that rule, in
        one order. ``recovery``: "repeat" (read-only) or "repeat_with_key" (idempotent, or the server honours the
        key) — calling it again cannot duplicate it; else "reconcile" when ``reconcile(key)`` is given (a
        module-level function: recorded by name on the row, so whoever meets the effect again asks it) or the
        workflow defines ``reconcile_effect`` (asked whether it landed: EffectOutcome.was_applied(result) or
        .not_applied()), else "person". Nobody able to tell → a person (``ask``), else the task is dead-lettered
        (effect_outcome_unknown) rather than calling the effect blindly again.
        ``timeout``: raise ToolTimeout if fn has not returned after that many seconds. The call keeps running
        in its thread and may still land, so its outcome is recorded as unknown and the retry reconciles it.
        ``ask``: when nobody can tell whether it landed, the task waits for a person to say so (input_required,
        "did this happen?": applied with its result / not applied / abandon) instead of being dead-lettered — but
        not before the call's deadline (its start + ``timeout``, else the step's time limit, + the configured margin,
        on the database's clock): until then the step waits without a worker (tasks_app.engine.effects).
        In a fork (tasks_app.forks), an effect its original already made at this step waits for a person's approval
        before it runs again, unless its ``recovery`` says running it again is harmless.
        ``about``: what the "did this happen?" question shows besides the arguments — {"server", "tool",
        "annotations", "timeoutSeconds"} for a tool call — kept on the ledger row with the redacted ``arguments``.
        """
        self._check_open()
        key = self.effect_key(name)
        if key in self.effect_keys:
            # The same name twice in one step would be the same key twice: the second call could not be told
            # apart from a retry of the first. Name each effect of a step differently.
            raise ValueError(f"effect {name!r} was already used in step {self.step_name!r}; names must be unique "
                             f"within a step")
        self.effect_keys.add(key)
        rule = effect_recovery(declared=recovery,
                               reconcile=reconcile is not None or self._workflow_reconcile is not None)
        self._approval_gate(name, key, arguments, approval,
                            repeat_safe=rule in (Recovery.REPEAT, Recovery.REPEAT_WITH_KEY))
        about = effect_about(arguments, about, reconcile=reconcile_hook_name(reconcile) if reconcile else None)

        def call(k: str) -> Any:
            faults.point("before_effect_call", effect=name, step_seq=self.step_seq)  # `started` is committed
            return effect_call(fn, k, timeout)

        with tracing.effect_span(name, key):
            run = execute_once(
                # The call's deadline is recorded with its start: the timeout it is sent with, else the step's limit;
                # its rule and what a person would be shown, too.
                FencedEffects(self._fence, self.step_seq, timeout=timeout if timeout is not None else self.time_limit,
                              recovery=rule, asks=ask, about=about),
                key=key, name=name, call=call,
                reconcile=lambda k: self._decide(name, k, timeout,
                                                 unrecorded={"recovery": rule, "asks": ask, "about": about}),
                unknown_on=(ToolTimeout, StepTimeLimitExceeded),
            )
            tracing.effect_outcome(called=run.called)
        if not run.called:
            self.events.append(events.effect_event(name=name, key=key, status="recorded"))
            return run.result
        result = effect_result_recordable(run.result)
        faults.point("after_effect_before_commit", step_seq=self.step_seq)
        # No event of its own: the step's progress event names the effects that succeeded in it (one event per
        # step, not one per effect too); an effect recorded outside a commit still gets its own event.
        self.effect_outcomes.append({"key": key, "step_seq": self.step_seq, "name": name, "result": result,
                                     "recorded": False})
        return result

    # -- tools ---------------------------------------------------------------------------------------------------
    def tool(self, server: str, tool: str, arguments: dict | None = None, *,
             reconcile: Callable[[str], EffectOutcome] | None = None, approval: bool = False) -> dict:
        """Call ``tool`` on the tenant's downstream MCP server ``server``, at most once for this call's key
        (``<task>:<step>:<server>.<tool>:<n>``, n counting this step's calls of that tool), through the policy
        gateway (agents_app.gateway; docs/tools.md): policy and host checked at the moment of the call, arguments
        checked against the tool's inputSchema, a ledger row committed before the request, an unknown outcome
        decided by the tool's annotations, ``reconcile`` or a person — never a blind second call. Returns the
        CallToolResult as JSON; a tool's own error is a result with ``isError: true``, not an exception.
        ``approval``: wait for a person's approval before the call (the policy may require one anyway)."""
        self._check_open()
        name = f"{server}.{tool}"
        self.tool_calls[name] = self.tool_calls.get(name, 0) + 1
        return tool_executor()(self, server=server, tool=tool, arguments=arguments or {},
                               number=self.tool_calls[name], reconcile=reconcile, approval=approval)

    def _decide(self, name: str, key: str, timeout: float | None, *, unrecorded: dict) -> EffectOutcome | None:
        """An effect this step meets again with its outcome unknown: the one decision (effects.decide). None: only a
        person can tell (its question is kept for outcome_question); ExternalWait while its call may still land."""
        decision = decide(self.task_id, {"key": key, "name": name, "step_seq": self.step_seq},
                          reconcile=self._workflow_reconcile,
                          answers=self._answers, call_wait_seconds=timeout or 0, unrecorded=unrecorded)
        if decision.outcome is None:
            self.undecided[key] = decision
            return None
        self.events.append(events.effect_event(name=name, key=key, status="reconciled_applied"
                                               if decision.outcome.applied else "reconciled_not_applied"))
        return decision.outcome

    def outcome_question(self, keys: list[str]) -> dict | None:
        """The "did this happen?" wait for the first of these unknown effects, if every one of them asks a person on
        the task (ctx.effect(ask=True)); None: they are dead-lettered."""
        decisions = [self.undecided.get(key) for key in keys]
        if not decisions or any(decision is None or not decision.asks for decision in decisions):
            return None
        return outcome_question(self.task_id, decisions[0], step_seq=self.step_seq, plan_version=self.plan_version)

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


def effect_about(arguments: Any, about: dict | None, *, reconcile: str | None = None) -> dict | None:
    """What the ledger row keeps for a person who may be asked whether the effect happened: the arguments redacted
    and bounded (a large argument is kept as a note of its size), and ``about``'s server, tool, annotations and
    timeout. Never a credential: arguments pass the redaction first. None: nothing to keep (the hot path of an effect
    with no arguments writes no JSON)."""
    kept = {"arguments": redacted_bounded(arguments)} if arguments is not None else {}
    for part in ("server", "tool", "annotations", "timeoutSeconds"):
        if about and about.get(part) is not None:
            kept[part] = about[part]
    if reconcile is not None:
        kept["reconcile"] = reconcile  # the caller's hook, by name (effects.reconcile_hook_name)
    return kept or None


ABOUT_ARGUMENTS_CHARS = 8000  # arguments kept on a ledger row for a person at most this long, else a note of their size


def redacted_bounded(arguments: Any) -> Any:
    """Arguments as a ledger row keeps them for a person: secrets masked, every string (and key) storable, nested at
    most 16 deep, at most ABOUT_ARGUMENTS_CHARS of JSON — else {"omitted": "<n> characters"}."""
    if arguments is None:
        return None
    shown = waits.redacted(bounded_copy(arguments, text=storable, depth=16))  # (16 deep: json.dumps cannot recurse)
    try:
        text = json.dumps(shown, default=str, ensure_ascii=False, allow_nan=False)
    except ValueError:  # NaN or an infinity: not JSON
        text = None
    if text is None or len(text) > ABOUT_ARGUMENTS_CHARS:
        return {"omitted": f"{len(text) if text else 0} characters, too large (or not JSON) to keep for a person"}
    return json.loads(text)

