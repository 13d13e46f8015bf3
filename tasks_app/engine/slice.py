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
    engine/plan_cursor.py      where the task is in its plan: the chunk of the next step, a plan made or re-made
    engine/exits.py            every way a slice ends (complete, stop, fail, dead-letter, wait, park, let go), each
                               one fenced write
    engine/slice.py            this loop, which only drives them and turns every way out into a durable decision

Per step the engine issues one statement (the fenced commit) plus one per effect (its `started` record);
claim and state load happen once per time slice, and neither grows with the plan's length.
"""

from __future__ import annotations

import copy
import json
import logging
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from types import MappingProxyType

from django.conf import settings

from checkpoints_app.checkpoints import SCHEMA_VERSION, CheckpointTooLarge, checkpoint_document, checkpoint_serialize
from checkpoints_app.fencing import LeaseLost
from config.base.canonical import NotJson, canonical_json_strict
from tasks_app.db import store
from tasks_app.db.prepared import connection_close_quietly
from tasks_app.db.store import (
    NO_CHECKPOINT,
    CheckpointRow,
    FencedWriter,
    PlanAdjustment,
    SafePointApply,
    StatusMoved,
    SteeringArrived,
    StepCommit,
    Written,
)
from tasks_app.engine import faults
from tasks_app.engine.context import StepContext
from tasks_app.engine.decisions import DeadLetter, EntersWait, Parks, TaskFails
from tasks_app.engine.effects import OpenEffects, effects_record_returned, workflow_reconciler
from tasks_app.engine.exits import DATABASE_ERRORS, RESULT_INLINE_MAX_BYTES, Exits
from tasks_app.engine.lease import Claim, Heartbeat, current_worker_id, lease_claim
from tasks_app.engine.plan_cursor import PlanCursor
from tasks_app.engine.plans import chunk_of, plan_chunks, plan_encode
from tasks_app.engine.restore import state_restore
from tasks_app.engine.safepoints import SafePoint, SafePointDecision, SafePointKind, safe_point_handlers
from tasks_app.engine.steps import StepOutcome, error_message, step_execute
from tasks_app.engine.waits import (
    EffectAbandoned,
    ExternalWait,
    QuestionRequired,
    budget_exhausted_message,
    budget_figures,
    budget_wait,
    budgets_spent,
    is_waiting,
)
from tasks_app.events import (
    Event,
    checkpoint_event,
    plan_adjusted_event,
    progress_event,
    snapshot_event,
    transition_events,
)
from tasks_app.models import TaskStatus
from tasks_app.observability import metrics, tracing
from tasks_app.registry import BUDGET_WAIT, UnknownWorkflow, Workflow, budget_policy, registry

logger = logging.getLogger(__name__)

# Rounds of decisions at one safe point (each re-plan is one); more commands wait for the next safe point.
_SAFE_POINT_ROUNDS = 10
_WAITS = (EntersWait, Parks)  # a step's ways to stop and wait (its trace span records them as waits, not errors)

# Re-exported for callers that think of these as the engine's.
__all__ = ["DATABASE_ERRORS", "RESULT_INLINE_MAX_BYTES", "Claim", "LeaseLost", "Slice", "lease_claim", "run_step"]


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
        self.plan = PlanCursor(task_id=claim.fence.task_id, length=claim.plan_length, chunk=claim.plan_chunk,
                               next_index=claim.next_step_index)
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
        self.exits = Exits(claim, self.writer, lease_seconds=self.cfg.lease_seconds,
                           take_pending_events=self._take_pending_events,
                           record_known_effects=self._record_known_effects)

    # -- the way in, and every way out -------------------------------------------------------------------------
    def run(self) -> str:
        heartbeat = Heartbeat(self.fence)
        heartbeat.start()
        try:
            try:
                return self._run(heartbeat)
            except StatusMoved as moved:
                return self.exits.let_go(moved.status)  # its own errors are handled below like any other
        except LeaseLost as lost:
            logger.warning("lease lost, stopping without writing: %s", lost)
            return "lease_lost"
        except DATABASE_ERRORS:
            logger.warning("task %s: database error mid-slice", self.fence.task_id, exc_info=True)
            return self.exits.after_database_error()
        except faults.InjectedFault:
            raise  # a simulated crash: the process "dies" here
        except Exception as error:  # a bug in the engine or a hook: still a durable decision, never a crash loop
            logger.exception("task %s: engine error", self.fence.task_id)
            return self.exits.dead_letter_safely("engine_error",
                                                 f"{type(error).__name__}: {error_message(error)[:300]}")
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
            return self.exits.dead_letter(dead)
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
            if self.state.next_step >= self.plan.length:
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
            last = step.index + 1 >= self.plan.length or step.ends_plan
            slice_over = (time.monotonic() - slice_started >= self.cfg.slice_seconds
                          or (self.max_steps is not None and steps_run >= self.max_steps))
            release = slice_over and not last and step.wait is None  # a wait is entered now, not handed on
            written, checkpointed = self._commit(step, release=release)
            faults.point("after_commit_before_chain", step_seq=step.seq)
            if release:
                self.exits.hand_on(own=True, waiting=written.waiting)
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
        if self.plan.length is None:
            self.plan.make(self.workflow, goal=claim.goal, input=claim.input, variables=self.state.variables)
        elif self.plan.length and self.state.next_step < self.plan.length:
            self.plan.check_steps(self.plan.chunk, self.workflow, next_step=self.state.next_step)

    # -- executing and committing ---------------------------------------------------------------------------------
    def _execute(self, heartbeat: Heartbeat) -> StepOutcome:
        index = self.state.next_step
        name = self.plan.step_name(index, self.workflow, plan_version=self.state.plan_version)
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
                self._resolve_open_effects(keep_seq=None, exclude=step.touched_effect_keys, may_wait=True)
        except DeadLetter:
            self._record_known_effects()
            raise
        except ExternalWait as waiting:  # only a person can tell, and the call may still land: the step runs again
            self._record_known_effects()  # after the deadline (its recorded effects are not called again)
            raise Parks(seconds=waiting.seconds, message=waiting.message, cost=step.cost, tokens=step.tokens) \
                from None
        except QuestionRequired as asked:  # past the deadline: "did this happen?" on the task; the step runs again
            self._record_known_effects()  # once it is answered, and the answer decides the effect
            raise EntersWait(asked.wait, cost=step.cost, tokens=step.tokens) from None
        except EffectAbandoned as abandoned:  # its answer was abandon: the task fails over it (slice._fail keeps it
            self._record_known_effects()  # unknown), as when the step meets the effect again
            raise TaskFails({"type": "EffectAbandoned", "message": error_message(abandoned), "step": step.name,
                             "attempt": step.attempt, "reason": abandoned.reason,
                             "effectKey": abandoned.effect_key}, cost=step.cost, tokens=step.tokens) from None
        return step

    def _remember_context(self, ctx: StepContext) -> None:
        self.current_ctx = ctx

    def _commit(self, step: StepOutcome, *, release: bool) -> tuple[Written, bool]:
        state = self.state
        ends_plan = step.ends_plan and step.index + 1 < self.plan.length  # ctx.end_plan(): the plan is cut here
        if ends_plan:
            self.plan.length = step.index + 1  # (written with this commit: plan_length below)
        last = step.index + 1 >= self.plan.length
        progress, phase = step.progress or (None, None)
        if progress is None:
            progress = (step.index + 1) / self.plan.length if self.plan.length else 1.0
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
            plan_length=self.plan.length if self.plan.unstored is not None or ends_plan else None,
            plan_chunks=json.dumps(self.plan.unstored or []), release=release,
            plan_version=state.plan_version, step_index=step.index, step_name=step.name, attempt=step.attempt,
            delta=step.delta_json, delta_sha256=step.delta_sha256, output=step.output_json,
            started_at=datetime.fromtimestamp(step.started_at, tz=UTC),
            effect_keys=[effect["key"] for effect in step.effects],
            effect_results=json.dumps({effect["key"]: effect["result"] for effect in step.effects}),
            prune_through=prune if prune and prune > 0 else None, checkpoint=checkpoint,
        ), events=events)
        metrics.step_committed(workflow=self.claim.workflow_name, seconds=time.time() - step.started_at)
        self.committing = None
        self.plan.stored()
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
    def _resolve_open_effects(self, *, keep_seq: int | None, exclude: set[str] = frozenset(),
                              may_wait: bool = False) -> None:
        """Decide the effects left open (OpenEffects.resolve: effects.decide, by the rule each row carries), their
        events written with the next fenced write; DeadLetter naming those only a person can tell about — or, with
        ``may_wait`` (a step about to commit past them), ExternalWait until their deadline, then their question."""
        workflow = getattr(self, "workflow", None)  # (None: the task failed to load; no hook to ask)
        reconcile = workflow_reconciler(workflow, self.claim.input) if workflow is not None else None
        self.open_effects.resolve(keep_seq=keep_seq, exclude=exclude, reconcile=reconcile,
                                  answers=self.claim.answers or {}, events=self.pending_events, may_wait=may_wait,
                                  plan_version=self.state.plan_version if self.state else self.claim.plan_version)

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
        prefix, old_rest = self.plan.around(cursor, plan_version=self.state.plan_version)
        try:
            names = PlanCursor.replanned(self.workflow, goal=adjust.goal, input=self.claim.input,
                                         variables=self.state.variables, remaining=old_rest)
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
        self.plan.adjusted(length=plan_length, chunks=chunks, first_chunk=first_chunk)
        self.claim.goal = adjust.goal
        if decision.priority is not None:
            self.claim.priority = decision.priority
        return None

    # -- the ways out (engine/exits.py writes each; here, what must come before it) ------------------------------
    def _enter_wait(self, wait: dict, *, cost: Decimal = Decimal(0), tokens: int = 0) -> str:
        """Wait for a person: a checkpoint, the wait record, input_required, the lease released with no hint."""
        self.exits.add_unwritten(cost, tokens)
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
        return self.exits.wait(wait, checkpoint=checkpoint, state_version=state_version)

    def _park(self, parked: Parks) -> str:
        """Let go of the worker and the lease until the outside thing is worth asking about again; the step runs
        again then (its recorded effects are not called again). A pause or cancel asked for first wins."""
        self.exits.add_unwritten(parked.cost, parked.tokens)
        stopped = self._safe_point(SafePointKind.ENTERING_WAIT)
        if stopped:
            return stopped
        return self.exits.park(parked)

    # -- transitions ---------------------------------------------------------------------------------------------
    def _start_working(self) -> None:
        events = transition_events(TaskStatus.WORKING, "Working")
        if self.writer.status == TaskStatus.RECOVERING:
            events.append(snapshot_event(steps_completed=self.steps_completed, next_step=self.state.next_step,
                                         plan_length=self.plan.length, checkpoint=self.checkpoint_sequence or None))
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
        return self.exits.complete(text, plan_length=self.plan.length if self.plan.unstored is not None else None)

    def _stop(self, to: TaskStatus, *, decision: SafePointDecision | None = None) -> str:
        """Pause or cancel at a safe point: resolve open effects, checkpoint, transition, release (§6)."""
        self._resolve_open_effects(keep_seq=None)
        checkpoint = self._checkpoint_row(optional=True)
        return self.exits.stop(to, decision=decision, checkpoint=checkpoint)

    def _fail(self, fails: TaskFails) -> str:
        self.open_effects.failing = True  # a failed step may have left an effect unknown on its last attempt
        # An effect a person abandoned the task over ("did this happen?" → abandon) stays unknown: nobody knows.
        abandoned = {fails.error["effectKey"]} if fails.error.get("reason") == "effect_abandoned" else set()
        try:
            self._resolve_open_effects(keep_seq=None, exclude=abandoned)
        except DeadLetter as dead:
            return self.exits.dead_letter(DeadLetter(dead.reason, f"{dead.message} (the task was failing: "
                                                                  f"{fails.error['message'][:200]})",
                                                     cost=fails.cost, tokens=fails.tokens))
        return self.exits.fail(fails, step_seq=self.steps_completed + 1,
                               plan_version=self.state.plan_version if self.state else self.claim.plan_version)

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
