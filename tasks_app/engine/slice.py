"""The durable step engine's slice loop (ARCHITECTURE §4): claim → heartbeat → safe point → load → execute →
commit → chain.

``run_step(task_id)`` is what the Celery task calls. A message is a hint, never truth: a duplicate finds the
lease taken and returns; a lost one is re-sent by the reaper. The worker keeps in memory only the task it
leases. The rooms, for a newcomer (under tasks_app/):

    engine/lease.py            claim, heartbeat (the fencing token)
    engine/restore.py          state = latest good checkpoint + verified step deltas
    engine/steps.py            one step: attempts, retries, time limit → StepOutcome
    engine/context.py, state.py  what a step gets (ctx) and its durable variables
    engine/effects.py          effects through the ledger: fenced records, timed-out calls, resolving open ones
    db/sql.py, db/store.py     the named statements, and the store that runs them (the fenced writes with their
                               event chaining among them): this loop decides, the store talks to PostgreSQL
    events.py                  every event, and the hash chain
    engine/safepoints.py       hooks for upper apps (steering) at safe points
    engine/slice.py            this loop, which only drives them and turns every way out into a durable decision

Per step the engine issues one statement (the fenced commit) plus one per effect (its `started` record);
claim and state load happen once per time slice, and neither grows with the plan's length.
"""

from __future__ import annotations

import copy
import json
import logging
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from types import MappingProxyType

from django.conf import settings
from django.core.files.base import ContentFile
from django.core.files.storage import default_storage
from django.db import InterfaceError, OperationalError

from checkpoints_app.checkpoints import SCHEMA_VERSION, CheckpointTooLarge, checkpoint_document, checkpoint_serialize
from checkpoints_app.fencing import LeaseLost
from checkpoints_app.ledger import EffectOutcome
from config.base.canonical import NotJson, canonical_json_strict
from tasks_app.db import store
from tasks_app.db.dispatch import hints_for_waiting, task_dispatch
from tasks_app.db.prepared import connection_close_quietly
from tasks_app.db.store import (
    NO_CHECKPOINT,
    NO_FAILED_STEP,
    CheckpointRow,
    FailedStepRow,
    FencedWriter,
    PlanAdjustment,
    SafePointApply,
    SafePointStop,
    StatusMoved,
    SteeringArrived,
    StepCommit,
    TaskCompletion,
    TaskDeadLetter,
    TaskFailure,
    WaitEntry,
    Written,
)
from tasks_app.engine import faults
from tasks_app.engine.context import StepContext
from tasks_app.engine.decisions import DeadLetter, EntersWait, Parks, TaskFails
from tasks_app.engine.effects import OpenEffects, effects_record_returned, effects_to_answer_for
from tasks_app.engine.lease import Claim, Heartbeat, current_worker_id, lease_claim
from tasks_app.engine.plans import (
    PLAN_CHUNK_STEPS,
    chunk_names,
    chunk_of,
    chunk_step_name,
    plan_chunks,
    plan_decode,
    plan_encode,
)
from tasks_app.engine.restore import state_restore
from tasks_app.engine.safepoints import SafePoint, SafePointDecision, SafePointKind, safe_point_handlers
from tasks_app.engine.steps import StepOutcome, error_message, step_execute
from tasks_app.engine.waits import (
    APPROVAL,
    BUDGET,
    budget_exhausted_message,
    budget_figures,
    budget_wait,
    budgets_spent,
    is_waiting,
)
from tasks_app.events import (
    Event,
    checkpoint_event,
    input_required_event,
    plan_adjusted_event,
    progress_event,
    snapshot_event,
    status_event,
    transition_events,
)
from tasks_app.models import RUNNABLE_STATUSES, TaskStatus
from tasks_app.observability import metrics, tracing
from tasks_app.registry import BUDGET_WAIT, UnknownWorkflow, Workflow, budget_policy, registry, tool_reconciler

logger = logging.getLogger(__name__)

RESULT_INLINE_MAX_BYTES = 64 * 1024
# Rounds of decisions at one safe point (each re-plan is one); more commands wait for the next safe point.
_SAFE_POINT_ROUNDS = 10
DATABASE_ERRORS = (OperationalError, InterfaceError)
_WAITS = (EntersWait, Parks)  # a step's ways to stop and wait (its trace span records them as waits, not errors)

# Re-exported for callers that think of these as the engine's.
__all__ = ["Claim", "LeaseLost", "Slice", "lease_claim", "run_step"]


class Slice:
    """Runs one leased task for one time slice. Holds the only in-memory copy of its state."""

    def __init__(self, claim: Claim, *, max_steps: int | None = None):
        self.claim = claim
        self.fence = claim.fence
        self.max_steps = max_steps  # tests and benchmarks: end the slice after this many steps
        self.cfg = settings.RUNTIME
        self.writer = FencedWriter(claim.fence, event_seq=claim.event_seq, event_head=claim.event_head_hash,
                                   status=claim.status, tenant_id=claim.tenant_id)
        self.workflow: Workflow | None = None
        self.state = None
        self.plan_length = claim.plan_length
        self.plan_chunk = claim.plan_chunk
        self.plan_chunk_no = chunk_of(claim.next_step_index) if claim.plan_chunk is not None else None
        self.unstored_plan: list[dict] | None = None  # made in this slice; stored with the first commit
        self.open_effects = OpenEffects(claim.fence, claim.open_effects)  # a previous lease left them open
        self.steps_completed = claim.steps_completed
        self.cost_spent = claim.cost_spent
        self.tokens_spent = claim.tokens_spent
        self.state_version = claim.state_version
        self.checkpoint_sequence = claim.checkpoint_sequence or 0
        self.steps_since_checkpoint = 0
        self.checkpoint_clock = time.monotonic() - claim.seconds_since_checkpoint
        self.deadline_passed = claim.deadline_passed
        self.pending_events: list[Event] = []  # written with the next fenced write (e.g. reconciliations)
        # Committed steps that no progress event covers yet: the next due one does, or any other write of this
        # slice (a failure, a stop, completion) first. Only a slice that loses its lease or its database right
        # after a commit leaves steps uncovered (the snapshot has them; each step row's checksum still guards
        # its delta). See progress_event_seconds.
        self.uncovered: list[_Uncovered] = []
        self.progress_event_at = time.monotonic()
        self.current_ctx: StepContext | None = None
        self.committing: StepOutcome | None = None
        # What an attempt spent that no commit will carry (a step stopped at an approval gate): written with the
        # write that lets the task go — entering the wait, a stop a command asked for first, or a plain release.
        self.unwritten_cost = Decimal(0)
        self.unwritten_tokens = 0

    # -- the way in, and every way out -------------------------------------------------------------------------
    def run(self) -> str:
        heartbeat = Heartbeat(self.fence)
        heartbeat.start()
        try:
            try:
                return self._run(heartbeat)
            except StatusMoved as moved:
                return self._let_go(moved.status)  # its own errors are handled below like any other
        except LeaseLost as lost:
            logger.warning("lease lost, stopping without writing: %s", lost)
            return "lease_lost"
        except DATABASE_ERRORS:
            logger.warning("task %s: database error mid-slice", self.fence.task_id, exc_info=True)
            return self._after_database_error()
        except faults.InjectedFault:
            raise  # a simulated crash: the process "dies" here
        except Exception as error:  # a bug in the engine or a hook: still a durable decision, never a crash loop
            logger.exception("task %s: engine error", self.fence.task_id)
            return self._dead_letter_safely("engine_error", f"{type(error).__name__}: {error_message(error)[:300]}")
        finally:
            heartbeat.stop()

    def _run(self, heartbeat: Heartbeat) -> str:
        try:
            self._load()
            if self.claim.deadline_passed:
                raise _deadline_exceeded()
            if self.writer.status in (TaskStatus.QUEUED, TaskStatus.RECOVERING):
                self._start_working()
            self._resolve_open_effects(keep_seq=self.steps_completed + 1)
            return self._loop(heartbeat)
        except DeadLetter as dead:
            return self._dead_letter(dead)
        except TaskFails as fails:
            return self._fail(fails)

    def _loop(self, heartbeat: Heartbeat) -> str:
        slice_started = time.monotonic()
        steps_run = 0
        while True:
            if heartbeat.lost:
                return "lease_lost"
            if (heartbeat.state_version or 0) > self.state_version:  # a command came in during the last step
                self.state_version = heartbeat.state_version
            # The handlers first: a pause or cancel that a command asked for is applied with its record.
            stopped = self._safe_point(SafePointKind.BEFORE_STEP)
            if stopped:
                return stopped
            status = heartbeat.status if heartbeat.status in (TaskStatus.CANCELLING, TaskStatus.PAUSING) \
                else self.writer.status
            if status == TaskStatus.CANCELLING:
                return self._stop(TaskStatus.CANCELLED)
            if status == TaskStatus.PAUSING:
                return self._stop(TaskStatus.PAUSED)
            if heartbeat.deadline_passed or self.deadline_passed:
                raise _deadline_exceeded()
            # A step asked for input and no answer is in: wait here, before the next step (or the completion).
            if is_waiting(self.state.open_wait, self.claim.answers):
                return self._enter_wait(self.state.open_wait)
            if self.state.next_step >= self.plan_length:
                return self._complete()
            spent = self._budgets_spent()
            if spent:  # (after the handlers: a set_budget asked for first is decided on)
                if budget_policy(type(self.workflow), self.claim.budget_on_exhausted) != BUDGET_WAIT:
                    raise TaskFails({"type": "BudgetExhausted",
                                     "message": budget_exhausted_message(spent, self._budget_figures())})
                stopped = self._wait_for_budget()
                if stopped:
                    return stopped
                continue  # raised at that safe point, or a command came in meanwhile: decide again
            try:
                step = self._execute(heartbeat)
            except EntersWait as gate:  # stopped before an effect that needs approval
                return self._enter_wait(gate.wait, cost=gate.cost, tokens=gate.tokens)
            except Parks as parked:  # waits for something outside (a downstream task), without a worker
                return self._park(parked)
            steps_run += 1
            last = step.index + 1 >= self.plan_length or step.ends_plan
            slice_over = (time.monotonic() - slice_started >= self.cfg.slice_seconds
                          or (self.max_steps is not None and steps_run >= self.max_steps))
            release = slice_over and not last and step.wait is None  # a wait is entered now, not handed on
            written, checkpointed = self._commit(step, release=release)
            faults.point("after_commit_before_chain", step_seq=step.seq)
            if release:
                self._hand_on(own=True, waiting=written.waiting)
                return "released"
            stopped = self._safe_point(SafePointKind.AFTER_COMMIT) or (
                checkpointed and self._safe_point(SafePointKind.AFTER_CHECKPOINT))
            if stopped:
                return stopped

    # -- loading -------------------------------------------------------------------------------------------------
    def _load(self) -> None:
        claim = self.claim
        try:
            workflow_cls = registry.get(claim.workflow_name)
        except UnknownWorkflow:
            raise DeadLetter("workflow_missing", f"workflow {claim.workflow_name!r} is not registered in this "
                                                 f"code") from None
        if not workflow_cls.can_resume(claim.workflow_version):
            raise DeadLetter("workflow_version_changed",
                             f"task was started on {workflow_cls.name} version {claim.workflow_version}; this code "
                             f"is version {workflow_cls.version} and does not declare it compatible")
        self.workflow = workflow_cls()
        restored = state_restore(claim)
        self.state = restored.state
        self.steps_since_checkpoint = restored.steps_since_checkpoint
        if self.plan_length is None:
            self._make_plan()
        elif self.plan_length and self.state.next_step < self.plan_length:
            self._check_chunk_steps(self.plan_chunk)

    def _make_plan(self) -> None:
        try:
            names = self.workflow.plan(self.claim.goal, self.claim.input, copy.deepcopy(self.state.variables))
            if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
                raise TypeError(f"plan() must return a list of step names, got {type(names).__name__}")
        except Exception as error:  # the workflow's own bug or missing data: the task fails, visibly
            raise TaskFails({"type": type(error).__name__, "message": error_message(error), "step": "(plan)",
                             "attempt": 1}) from None
        unknown = sorted(set(names) - set(self.workflow.steps))
        if unknown:
            raise TaskFails({"type": "InvalidPlan", "step": "(plan)", "attempt": 1,
                             "message": f"plan() named {unknown[:5]}, which are not @step methods of "
                                        f"{self.workflow.name}"})
        self.unstored_plan = plan_chunks(names)
        self.plan_length = len(names)
        self.plan_chunk, self.plan_chunk_no = (self.unstored_plan[0]["steps"], 0) if names else ([], None)

    def _check_chunk_steps(self, steps: list | None) -> None:
        if steps is None:
            raise DeadLetter("plan_mismatch", f"the task's plan has no stored steps at index {self.state.next_step}")
        missing = sorted(chunk_names(steps) - set(self.workflow.steps))
        if missing:
            raise DeadLetter("plan_mismatch", f"the task's plan has steps {missing} that workflow "
                                              f"{self.workflow.name} {self.workflow.version} no longer defines")

    def _step_name(self, index: int) -> str:
        chunk = chunk_of(index)
        if chunk != self.plan_chunk_no:  # crossing into the next chunk: once per PLAN_CHUNK_STEPS steps
            if self.unstored_plan is not None:
                steps = self.unstored_plan[chunk]["steps"]
            else:
                steps = store.plan_chunk(self.fence.task_id, plan_version=self.state.plan_version, chunk=chunk)
                self._check_chunk_steps(steps)
            self.plan_chunk, self.plan_chunk_no = steps, chunk
        return chunk_step_name(self.plan_chunk, index)

    # -- executing and committing ---------------------------------------------------------------------------------
    def _execute(self, heartbeat: Heartbeat) -> StepOutcome:
        index = self.state.next_step
        name = self._step_name(index)
        with tracing.step_span(name, seq=self.steps_completed + 1, index=index, waits=_WAITS):
            step = step_execute(workflow=self.workflow, fence=self.fence, heartbeat=heartbeat, goal=self.claim.goal,
                                input=self.claim.input, variables=self.state.variables,
                                artifact_refs=self.state.artifact_refs, seq=self.steps_completed + 1, index=index,
                                name=name, on_context=self._remember_context, answers=self.claim.answers,
                                approval_policy=self.claim.approval_policy, plan_version=self.state.plan_version)
            tracing.step_outcome(attempt=step.attempt, effects=step.effects_count, tokens=step.tokens)
        self.current_ctx = None
        self.committing = step
        try:
            # Effects of this step that a previous lease, or a failed attempt, left open and the committing attempt
            # did not touch (it took another path) must be resolved before the step commits past them.
            if self.open_effects.effects or step.abandoned_effect_keys:
                self.open_effects.may_exist = True
                self._resolve_open_effects(keep_seq=None, exclude=step.touched_effect_keys)
        except DeadLetter:
            self._record_known_effects()
            raise
        return step

    def _remember_context(self, ctx: StepContext) -> None:
        self.current_ctx = ctx

    def _commit(self, step: StepOutcome, *, release: bool) -> tuple[Written, bool]:
        state = self.state
        ends_plan = step.ends_plan and step.index + 1 < self.plan_length  # ctx.end_plan(): the plan is cut here
        if ends_plan:
            self.plan_length = step.index + 1  # (written with this commit: plan_length below)
        last = step.index + 1 >= self.plan_length
        progress, phase = step.progress or (None, None)
        if progress is None:
            progress = (step.index + 1) / self.plan_length if self.plan_length else 1.0
        self.uncovered.append(_Uncovered(seq=step.seq, name=step.name, delta_sha256=step.delta_sha256,
                                         effects=[f"{step.seq}:{effect['name']}" for effect in step.effects],
                                         progress=progress, phase=phase))
        progress_due = (release or last
                        or time.monotonic() - self.progress_event_at >= self.cfg.progress_event_seconds)
        events = [*self._take_pending_events(with_progress=False), *step.events,
                  *(self._progress_events() if progress_due else [])]
        # The state after this step, for the checkpoint (the commit below makes it true).
        state.next_step, state.through_seq, state.last_step = step.index + 1, step.seq, step.name
        state.effects_succeeded += step.effects_count
        state.artifact_refs.update(step.artifacts)
        if step.wait is not None:
            state.open_wait = step.wait
        checkpoint = NO_CHECKPOINT
        self.steps_since_checkpoint += 1
        if not last and (step.costly or self._checkpoint_due()):
            try:
                checkpoint = self._checkpoint_row()
            except TaskFails:
                self._record_known_effects()
                raise
            events.append(checkpoint_event(sequence=checkpoint.cp_sequence, size=checkpoint.cp_size))
        prune = checkpoint.cp_sequence - self.cfg.checkpoint.keep if checkpoint.cp_sequence else None
        written = self.writer.step_commit(StepCommit(
            progress=progress, phase=phase, next_index=step.index + 1, step_seq=step.seq, cost=step.cost,
            tokens=step.tokens,
            plan_length=self.plan_length if self.unstored_plan is not None or ends_plan else None,
            plan_chunks=json.dumps(self.unstored_plan or []), release=release,
            plan_version=state.plan_version, step_index=step.index, step_name=step.name, attempt=step.attempt,
            delta=step.delta_json, delta_sha256=step.delta_sha256, output=step.output_json,
            started_at=datetime.fromtimestamp(step.started_at, tz=UTC),
            effect_keys=[effect["key"] for effect in step.effects],
            effect_results=json.dumps({effect["key"]: effect["result"] for effect in step.effects}),
            prune_through=prune if prune and prune > 0 else None, checkpoint=checkpoint,
        ), events=events)
        metrics.step_committed(workflow=self.claim.workflow_name, seconds=time.time() - step.started_at)
        self.committing = None
        self.unstored_plan = None
        self.steps_completed = step.seq
        self.cost_spent += step.cost
        self.tokens_spent += step.tokens
        self.state_version = written.state_version
        self.deadline_passed = written.deadline_passed
        if checkpoint.cp_sequence:
            self.checkpoint_sequence = checkpoint.cp_sequence
            self.steps_since_checkpoint = 0
            self.checkpoint_clock = time.monotonic()
        return written, bool(checkpoint.cp_sequence)

    def _checkpoint_due(self) -> bool:
        policy = self.cfg.checkpoint
        own = self.claim.checkpoint_policy or {}  # the task's checkpointPolicy, checked against the bounds at create
        return (self.steps_since_checkpoint >= own.get("everySteps", policy.every_steps)
                or time.monotonic() - self.checkpoint_clock >= own.get("maxSeconds", policy.max_interval_seconds))

    def _checkpoint_row(self, *, optional: bool = False) -> CheckpointRow:
        sequence = self.checkpoint_sequence + 1
        document = checkpoint_document(task_id=self.fence.task_id, sequence=sequence, state=self.state)
        try:
            payload, checksum = checkpoint_serialize(document, max_bytes=self.cfg.checkpoint.max_bytes)
        except CheckpointTooLarge as too_large:
            if optional:  # pause/cancel: the step deltas still rebuild the state; stopping must not fail
                logger.warning("task %s: stopping without a checkpoint: %s", self.fence.task_id, too_large)
                return NO_CHECKPOINT
            # The workflow keeps too much state: a bug to fix in its code, so the task fails and says how.
            raise TaskFails({"type": "CheckpointTooLarge", "message": str(too_large), "step": self.state.last_step,
                             "attempt": 1}) from None
        return CheckpointRow(cp_sequence=sequence, cp_schema=SCHEMA_VERSION, cp_payload=payload, cp_checksum=checksum,
                             cp_size=len(payload.encode()))

    # -- effects a previous lease left open ----------------------------------------------------------------------
    def _resolve_open_effects(self, *, keep_seq: int | None, exclude: set[str] = frozenset()) -> None:
        """Resolve the effects left open (OpenEffects.resolve), reconciled by the workflow, their events written with
        the next fenced write; DeadLetter naming those nobody can answer for."""
        self.open_effects.resolve(keep_seq=keep_seq, exclude=exclude, reconcile=self._reconcile_effect,
                                  events=self.pending_events)

    def _reconcile_effect(self, name: str, key: str) -> EffectOutcome | None:
        outcome = self.workflow.reconcile_effect(name=name, key=key, input=self.claim.input)
        reconciler = tool_reconciler()  # (a downstream tool call's effect: the gateway may know from its annotations)
        if outcome is None and reconciler is not None:
            outcome = reconciler(task_id=self.fence.task_id, name=name, key=key)
        return outcome

    def _record_known_effects(self) -> None:
        """Effects that returned but whose step will not commit (now): record them, so nothing is left started."""
        effects_record_returned(self.fence, ctx=self.current_ctx,
                                committing=self.committing.effects if self.committing is not None else [])

    def _take_pending_events(self, *, with_progress: bool = True) -> list[Event]:
        """Events waiting for the next fenced write; a write other than a step commit first covers the steps
        committed since the last progress event."""
        events, self.pending_events = self.pending_events, []
        return [*(self._progress_events() if with_progress else []), *events]

    def _progress_events(self) -> list[Event]:
        if not self.uncovered:
            return []
        covered, self.uncovered = self.uncovered, []
        self.progress_event_at = time.monotonic()
        last = covered[-1]
        return [progress_event(progress=last.progress, step=last.name, steps_completed=last.seq,
                               phase=next((c.phase for c in reversed(covered) if c.phase is not None), None),
                               delta_sha256s=[c.delta_sha256 for c in covered],
                               effects=[effect for c in covered for effect in c.effects])]

    # -- safe points ---------------------------------------------------------------------------------------------
    def _safe_point(self, kind: SafePointKind) -> str | None:
        """Let the handlers decide; a status if the task stopped here. A handler may decide in rounds (a re-plan
        ends its round), so they are asked again while the last round decided something."""
        handlers = safe_point_handlers()
        for _ in range(_SAFE_POINT_ROUNDS if handlers else 0):
            point = SafePoint(kind=kind, fence=self.fence, status=self.writer.status,
                              state_version=self.state_version, steering_cursor=self.state.steering_cursor,
                              steps_completed=self.steps_completed, next_step=self.state.next_step,
                              plan_version=self.state.plan_version, variables=MappingProxyType(self.state.variables),
                              goal=self.claim.goal)
            decided = False
            for handler in handlers:
                try:
                    decision = handler(point)
                except (LeaseLost, *DATABASE_ERRORS):
                    raise
                except Exception as error:
                    raise DeadLetter("safe_point_failed",
                                     f"safe-point handler {getattr(handler, '__qualname__', handler)} raised "
                                     f"{type(error).__name__}: {error_message(error)[:300]}") from None
                if decision is not None:
                    tracing.event("steering.applied", kind=kind.value, steering_cursor=decision.steering_cursor,
                                  stop=decision.stop, replan=decision.adjust is not None or None)
                    stopped = self._apply(decision)
                    if stopped:
                        return stopped
                    decided = True
            if not decided:
                return None
        return None

    def _apply(self, decision: SafePointDecision) -> str | None:
        if decision.stop:
            return self._stop(TaskStatus(decision.stop), decision=decision)
        if decision.adjust is not None:
            return self._adjust_plan(decision)
        claim = self.claim
        budget = decision.budget or {}  # set_budget: its changes over the budgets this worker holds
        steps, cost, tokens = (budget.get("maxSteps", claim.budget_steps),
                               budget.get("maxCost", claim.budget_cost), budget.get("maxTokens", claim.budget_tokens))
        cost = Decimal(str(cost)) if cost is not None else None
        written = self.writer.safe_point_apply(SafePointApply(
            steering_cursor=decision.steering_cursor, priority=decision.priority, set_goal=decision.sets_goal,
            goal=json.dumps(decision.goal) if decision.sets_goal else None, status_message=decision.status_message,
            set_budget=decision.budget is not None, budget_steps=steps, budget_cost=cost, budget_tokens=tokens,
        ), events=[*self._take_pending_events(), *decision.events])
        if decision.budget is not None:
            claim.budget_steps, claim.budget_cost, claim.budget_tokens = steps, cost, tokens
        self.state_version = written.state_version
        if decision.steering_cursor is not None:
            self.state.steering_cursor = decision.steering_cursor
        if decision.priority is not None:
            self.claim.priority = decision.priority
        if decision.sets_goal:
            self.claim.goal = decision.goal
        return None

    def _adjust_plan(self, decision: SafePointDecision) -> str | None:
        """adjust_goal: the workflow re-plans the rest from the cursor under the new goal; plan_version + 1, written
        fenced with the command's record. A workflow that cannot re-plan refuses the command, not the task."""
        adjust = decision.adjust
        cursor = self.state.next_step
        first_chunk = chunk_of(cursor)
        prefix, old_rest = self._plan_around(cursor)
        try:
            names = self.workflow.replan(adjust.goal, self.claim.input, copy.deepcopy(self.state.variables),
                                         remaining=list(old_rest))
            if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
                raise TypeError(f"replan() must return a list of step names, got {type(names).__name__}")
            unknown = sorted(set(names) - set(self.workflow.steps))
            if unknown:
                raise ValueError(f"replan() named {unknown[:5]}, which are not @step methods of {self.workflow.name}")
        except Exception as error:  # the workflow's own bug: the command is refused, the task goes on as planned
            refused = SafePointDecision(events=[*decision.events, adjust.refused(
                f"The workflow could not re-plan: {type(error).__name__}: {error_message(error)[:300]}")],
                steering_cursor=decision.steering_cursor, priority=decision.priority)
            return self._apply(refused)
        new_version = self.state.plan_version + 1
        plan_length = cursor + len(names)
        chunks = plan_chunks(prefix + names, first_chunk=first_chunk)
        events = [*self._take_pending_events(), *decision.events,
                  adjust.applied({"planVersion": new_version, "fromStep": cursor}),
                  plan_adjusted_event(old_version=self.state.plan_version, new_version=new_version,
                                      from_step=cursor, old_plan=plan_encode(old_rest), new_plan=plan_encode(names),
                                      command_id=adjust.command_id)]
        written = self.writer.plan_adjust(PlanAdjustment(
            goal=json.dumps(adjust.goal), plan_version=new_version, plan_length=plan_length,
            steering_cursor=decision.steering_cursor, priority=decision.priority, plan_chunks=json.dumps(chunks),
            message=f"Re-planned (plan version {new_version}): {len(names)} steps to go"), events=events)
        self.state_version = written.state_version
        self.state.steering_cursor = decision.steering_cursor
        self.state.plan_version = new_version
        self.plan_length = plan_length
        self.unstored_plan = None
        self.plan_chunk, self.plan_chunk_no = (chunks[0]["steps"], first_chunk) if chunks else ([], first_chunk)
        self.claim.goal = adjust.goal
        if decision.priority is not None:
            self.claim.priority = decision.priority
        return None

    def _plan_around(self, cursor: int) -> tuple[list[str], list[str]]:
        """(the names before ``cursor`` in its chunk, the names from ``cursor`` to the end) of the current plan."""
        first_chunk = chunk_of(cursor)
        if self.unstored_plan is not None:
            rows = [(c["chunk"], c["steps"]) for c in self.unstored_plan if c["chunk"] >= first_chunk]
        else:
            rows = store.plan_chunks_from(self.fence.task_id, plan_version=self.state.plan_version, chunk=first_chunk)
        names = [name for _, steps in rows for name in plan_decode(steps)]
        offset = cursor - first_chunk * PLAN_CHUNK_STEPS
        return names[:offset], names[offset:]

    def _enter_wait(self, wait: dict, *, cost: Decimal = Decimal(0), tokens: int = 0) -> str:
        """Wait for a person: a checkpoint, the wait record, input_required, the lease released with no hint."""
        self.unwritten_cost += cost
        self.unwritten_tokens += tokens
        stopped = self._safe_point(SafePointKind.ENTERING_WAIT)  # a pause or cancel asked for first wins
        if stopped:
            return stopped
        return self._write_wait(wait)

    def _wait_for_budget(self) -> str | None:
        """A budget is spent and the task's policy is to wait: the budget wait, entered like any other — unless a
        command decided at this safe point, or submitted meanwhile, changes that. None: decide again (the loop)."""
        stopped = self._safe_point(SafePointKind.ENTERING_WAIT)  # a pause or cancel asked for first wins
        if stopped:
            return stopped
        spent = self._budgets_spent()
        if not spent:
            return None  # raised at this safe point: the task goes on
        wait = budget_wait(task_id=self.fence.task_id, steps_completed=self.steps_completed,
                           plan_version=self.state.plan_version, spent=spent, figures=self._budget_figures())
        try:
            # Guarded on the steering version decided up to here (sql.ENTER_WAIT names the race).
            return self._write_wait(wait, state_version=self.state_version)
        except SteeringArrived as arrived:
            self.state_version = arrived.state_version
            return None

    def _write_wait(self, wait: dict, *, state_version: int | None = None) -> str:
        # A checkpoint unless the last one is current (a costly step, or the policy, wrote it at this commit).
        checkpoint = self._checkpoint_row(optional=True) if self.steps_since_checkpoint else NO_CHECKPOINT
        if wait["kind"] == APPROVAL:
            message = f"Waiting for approval of {wait['name']}"
        elif wait["kind"] == BUDGET:
            message = f"Waiting for a budget: {wait['prompt']}"
        else:
            message = f"Waiting for input: {wait['prompt']}"
        message = message[:500]
        tracing.event("wait.entered", wait_kind=wait["kind"], wait_name=wait.get("name"))
        events = self._take_pending_events()
        if checkpoint.cp_sequence:
            events.append(checkpoint_event(sequence=checkpoint.cp_sequence, size=checkpoint.cp_size))
        events += [input_required_event(wait), status_event(TaskStatus.INPUT_REQUIRED, message)]
        written = self.writer.wait_enter(WaitEntry(
            message=message, wait=json.dumps(wait), cost=self.unwritten_cost, tokens=self.unwritten_tokens,
            state_version=state_version, checkpoint=checkpoint), events=events)
        self.unwritten_cost, self.unwritten_tokens = Decimal(0), 0
        self._hand_on(own=False, waiting=written.waiting)
        return TaskStatus.INPUT_REQUIRED.value

    def _park(self, parked: Parks) -> str:
        """Let go of the worker and the lease until the outside thing is worth asking about again; the step runs
        again then (its recorded effects are not called again). A pause or cancel asked for first wins."""
        self.unwritten_cost += parked.cost
        self.unwritten_tokens += parked.tokens
        stopped = self._safe_point(SafePointKind.ENTERING_WAIT)
        if stopped:
            return stopped
        released = store.lease_park(self.fence, seconds=parked.seconds, message=parked.message,
                                    cost=self.unwritten_cost, tokens=self.unwritten_tokens)
        self.unwritten_cost, self.unwritten_tokens = Decimal(0), 0
        tracing.event("wait.parked", wait_seconds=parked.seconds)
        if released is None:
            return "lease_lost"  # (fenced: another worker holds it now, and will look at the downstream task)
        task_dispatch(self.fence.task_id, priority=released[1], countdown=parked.seconds)
        # The slot it held is free, and its tenant's room (the two of dispatch.hints_for_waiting's docstring).
        hints_for_waiting(limit=2, releasing_tenant=self.claim.tenant_id)
        return "parked"

    # -- transitions ---------------------------------------------------------------------------------------------
    def _start_working(self) -> None:
        events = transition_events(TaskStatus.WORKING, "Working")
        if self.writer.status == TaskStatus.RECOVERING:
            events.append(snapshot_event(steps_completed=self.steps_completed, next_step=self.state.next_step,
                                         plan_length=self.plan_length, checkpoint=self.checkpoint_sequence or None))
        self.writer.working_start(events=events)

    def _complete(self) -> str:
        """The one completion path: every step committed; store the result and let go."""
        self._resolve_open_effects(keep_seq=None)
        try:
            result = self.workflow.result(copy.deepcopy(self.state.variables))
            text = canonical_json_strict(result, "result")
        except NotJson as bad:
            raise TaskFails({"type": "InvalidResult", "step": "(result)", "attempt": 1,
                             "message": f"result() returned a value JSON cannot keep at {bad.path}: {bad.reason}"}) \
                from None
        except Exception as error:
            raise TaskFails({"type": type(error).__name__, "step": "(result)", "attempt": 1,
                             "message": f"result() raised: {error_message(error)[:480]}"}) from None
        result_ref = ""
        if len(text.encode()) > RESULT_INLINE_MAX_BYTES:
            # A fresh name per attempt, never overwritten: a completion whose commit did not land leaves an
            # unreferenced file, never a changed one.
            result_ref = default_storage.save(
                f"tasks/{self.fence.task_id}/{self.fence.epoch}/result.{uuid.uuid4().hex[:12]}.json",
                ContentFile(text.encode()))
            text = json.dumps({"ref": result_ref, "bytes": len(text)})
        written = self.writer.task_complete(TaskCompletion(
            result=text, result_ref=result_ref,
            plan_length=self.plan_length if self.unstored_plan is not None else None,
        ), events=[*self._take_pending_events(), *transition_events(TaskStatus.COMPLETED, "Completed")])
        self._hand_on(own=False, waiting=written.waiting)
        return "completed"

    def _stop(self, to: TaskStatus, *, decision: SafePointDecision | None = None) -> str:
        """Pause or cancel at a safe point: resolve open effects, checkpoint, transition, release (§6)."""
        self._resolve_open_effects(keep_seq=None)
        checkpoint = self._checkpoint_row(optional=True)
        message = "Paused" if to == TaskStatus.PAUSED else "Cancelled"
        events = [*self._take_pending_events(), *(decision.events if decision else [])]
        if checkpoint.cp_sequence:
            events.append(checkpoint_event(sequence=checkpoint.cp_sequence, size=checkpoint.cp_size))
        events += transition_events(to, message)
        written = self.writer.safe_point_stop(SafePointStop(
            status=to.value, message=message, steering_cursor=decision.steering_cursor if decision else None,
            cost=self.unwritten_cost, tokens=self.unwritten_tokens, checkpoint=checkpoint), events=events)
        self.unwritten_cost, self.unwritten_tokens = Decimal(0), 0
        self._hand_on(own=False, waiting=written.waiting)
        return to.value

    def _fail(self, fails: TaskFails) -> str:
        self.open_effects.failing = True  # a failed step may have left an effect unknown on its last attempt
        # An effect a person abandoned the task over ("did this happen?" → abandon) stays unknown: nobody knows.
        abandoned = {fails.error["effectKey"]} if fails.error.get("reason") == "effect_abandoned" else set()
        try:
            self._resolve_open_effects(keep_seq=None, exclude=abandoned)
        except DeadLetter as dead:
            return self._dead_letter(DeadLetter(dead.reason, f"{dead.message} (the task was failing: "
                                                             f"{fails.error['message'][:200]})", cost=fails.cost,
                                               tokens=fails.tokens))
        error = fails.error
        message = f"Failed: {error['type']}: {error['message']}"[:500]
        public = {key: value for key, value in error.items() if key != "attempts"}
        step = NO_FAILED_STEP
        if fails.failed_step:
            step = FailedStepRow(step_seq=self.steps_completed + 1, step_index=error["stepIndex"],
                                 step_name=error["step"], attempt=error["attempt"], output=json.dumps(public))
        written = self.writer.task_fail(TaskFailure(
            message=message, error=json.dumps(error), cost=fails.cost, tokens=fails.tokens,
            plan_version=self.state.plan_version if self.state else self.claim.plan_version, failed_step=step,
        ), events=[*self._take_pending_events(), *fails.events,
                   *transition_events(TaskStatus.FAILED, message, error=public)])
        self._hand_on(own=False, waiting=written.waiting)
        return "failed"

    def _dead_letter(self, dead: DeadLetter) -> str:
        """Park the task for an operator: never a blind re-run (ARCHITECTURE §3, §5)."""
        message, open_keys = effects_to_answer_for(self.fence.task_id, dead.message)
        error = {"type": "DeadLettered", "reason": dead.reason, "message": message, "openEffects": open_keys}
        status_message = f"Dead-lettered ({dead.reason}): {message}"[:500]
        written = self.writer.task_dead_letter(TaskDeadLetter(
            message=status_message, error=json.dumps(error), cost=dead.cost, tokens=dead.tokens,
        ), events=[*self._take_pending_events(),
                   status_event(TaskStatus.DEAD_LETTERED, status_message, reason=dead.reason)])
        logger.warning("task %s dead-lettered: %s", self.fence.task_id, dead.reason)
        metrics.dead_lettered(reason=dead.reason)
        self._hand_on(own=False, waiting=written.waiting)
        return "dead_lettered"

    def _dead_letter_safely(self, reason: str, message: str) -> str:
        try:
            try:
                self._record_known_effects()
            except (LeaseLost, *DATABASE_ERRORS):
                raise
            except Exception:  # what failed may be exactly this record: park the task anyway, naming the error
                logger.exception("task %s: could not record effect outcomes", self.fence.task_id)
            return self._dead_letter(DeadLetter(reason, message))
        except LeaseLost:
            return "lease_lost"
        except StatusMoved as moved:
            return self._let_go(moved.status)
        except DATABASE_ERRORS:
            return self._after_database_error()

    # -- letting go ----------------------------------------------------------------------------------------------
    def _hand_on(self, *, own: bool, waiting: bool) -> None:
        """After the lease was released: send our task's hint (end of slice) and give the freed slot to a waiting
        task, if any wait (dispatch.hints_for_waiting: tenant by tenant).

        A task whose tenant had a running cap (its max_running_tasks, or the default share) that lets go for good
        hands the slot on even when the write saw nobody waiting. Race: a claim of the tenant's next task, refused
        because this one still ran, may commit its refusal (the task now waits hint-less) after the write's probe
        read; the hand-out waits for that claim's lock and sees it. At the end of a slice (own) our own hint takes the
        slot back instead. Letting go for good frees the fleet slot and the tenant's room: two hand-outs, the first to
        another tenant on a tie (dispatch.hints_for_waiting)."""
        if own:
            task_dispatch(self.fence.task_id, priority=self.claim.priority)
            if waiting:
                hints_for_waiting(limit=1, releasing_tenant=self.claim.tenant_id)
        elif waiting or self.claim.tenant_max_running is not None:
            hints_for_waiting(limit=2, releasing_tenant=self.claim.tenant_id)

    def _let_go(self, status: str | None) -> str:
        # Someone else changed the status meanwhile (a cancel of a recovering task, an operator). Let go; if it
        # is still runnable (e.g. now `cancelling`), hand it straight to the next claim, which starts from that
        # status, rather than leaving it to the reaper.
        self._record_known_effects()  # a step whose commit the move refused did call its effects
        released = store.lease_release(self.fence, cost=self.unwritten_cost, tokens=self.unwritten_tokens)
        self.unwritten_cost, self.unwritten_tokens = Decimal(0), 0
        if released and released[0] in RUNNABLE_STATUSES:
            task_dispatch(self.fence.task_id, priority=released[1])
        elif released and self.claim.tenant_max_running is not None:
            # Its tenant's slot is free (the race _hand_on names), and the fleet's.
            hints_for_waiting(limit=2, releasing_tenant=self.claim.tenant_id)
        logger.info("task %s moved to %s under us; lease released", self.fence.task_id, status)
        return "status_moved"

    def _after_database_error(self) -> str:
        """The database went away mid-slice. Once it answers again (within one lease period), record what is
        known (effects that returned), release the lease and send the hint: the next claim reloads the truth,
        whether or not the last commit landed. Only if it stays away does the lease run out for the reaper."""
        connection_close_quietly()
        give_up_at = time.monotonic() + self.cfg.lease_seconds
        delay = 0.2
        while True:
            try:
                self._record_known_effects()
                released = store.lease_release(self.fence)
                if released is None:  # not ours: reaped, or the commit that failed to answer released it
                    waiting_priority = store.claim_probe(self.fence.task_id)
                    if waiting_priority is not None:  # runnable and unleased: its hint may be ours to send
                        task_dispatch(self.fence.task_id, priority=waiting_priority)
                    return "lease_lost"
                if released[0] in RUNNABLE_STATUSES:
                    task_dispatch(self.fence.task_id, priority=released[1])
                return "database_error"
            except LeaseLost:
                return "lease_lost"
            except DATABASE_ERRORS:
                connection_close_quietly()
                if time.monotonic() + delay > give_up_at:
                    logger.warning("task %s: database still away; its lease will expire", self.fence.task_id)
                    return "database_error"
                time.sleep(delay)
                delay = min(delay * 2, 2.0)

    def _budgets_spent(self) -> list[str]:
        """Which of the task's budgets are used up ("steps", "cost", "tokens"), as this worker knows them: what the
        claim read, with what its commits added and what set_budget changed at its safe points."""
        claim = self.claim
        return budgets_spent(steps=self.steps_completed, cost=self.cost_spent, tokens=self.tokens_spent,
                             max_steps=claim.budget_steps, max_cost=claim.budget_cost, max_tokens=claim.budget_tokens)

    def _budget_figures(self) -> dict:
        claim = self.claim
        return budget_figures(steps=self.steps_completed, cost=self.cost_spent, tokens=self.tokens_spent,
                              max_steps=claim.budget_steps, max_cost=claim.budget_cost, max_tokens=claim.budget_tokens)


@dataclass(frozen=True)
class _Uncovered:
    """A committed step as its progress event will tell it."""

    seq: int
    name: str
    delta_sha256: str
    effects: list[str]
    progress: float
    phase: str | None


def _deadline_exceeded() -> TaskFails:
    return TaskFails({"type": "DeadlineExceeded", "message": "the task's deadline passed"})


def _claim_retrying(task_id, owner: str) -> Claim | None:
    """A claim that meets a database blip (a terminated session) reconnects and tries again, for half a second."""
    # Briefly: a database out of this host's reach only (a partition) must not hold the hint here while a host that
    # can reach it waits. The hint is sent again (tasks_app.tasks.run_step's retry) and this worker's hint gate stops
    # it taking more (tasks_app.engine.failover.HintGate): the other host has it within a second.
    give_up_at = time.monotonic() + 0.5
    delay = 0.2
    while True:
        try:
            return lease_claim(task_id=task_id, owner=owner)
        except DATABASE_ERRORS:
            connection_close_quietly()
            if time.monotonic() + delay > give_up_at:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 2.0)


def run_step(task_id, *, owner: str | None = None, max_steps: int | None = None) -> str:
    """Claim the task and run it for one time slice. Safe to call with duplicate or stale messages.

    Returns what happened; "database_unavailable" asks the caller (the Celery task) to send the hint again later.
    """
    owner = owner or current_worker_id()
    try:
        claim = _claim_retrying(task_id, owner)
        if claim is None:
            # Runnable and unleased, yet not claimed: the fleet is at max_concurrent_tasks, or the task's tenant at
            # its max_running_tasks. The claim consumed the hint; the task waits for a released slot (no message
            # re-sends itself).
            return "deferred" if store.claim_probe(task_id) is not None else "not_claimed"
    except DATABASE_ERRORS:
        logger.warning("task %s: database unavailable for the claim", task_id, exc_info=True)
        connection_close_quietly()
        return "database_unavailable"
    with tracing.slice_span(claim.fence, status=claim.status):  # (tracing off: a shared no-op, no statement)
        outcome = Slice(claim, max_steps=max_steps).run()
        tracing.slice_outcome(outcome)
    return outcome
