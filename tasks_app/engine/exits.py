"""The ways a slice ends (engine/slice.py): complete, stop (pause or cancel), fail, dead-letter, wait, park, hand on,
let go, and the way out after a database error.

Each is one guarded, fenced write (the store's FencedWriter or lease statement) whose row count the store checks,
followed by the hints that write calls for. The slice decides which exit and prepares what the write carries (open
effects resolved, a checkpoint row); these write it and let go. What an attempt spent that no commit will carry is
held here, because only an exit writes it.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Callable
from decimal import Decimal

from django.core.files.base import ContentFile
from django.core.files.storage import default_storage
from django.db import InterfaceError, OperationalError

from checkpoints_app.fencing import LeaseLost
from tasks_app.db import store
from tasks_app.db.dispatch import hints_for_waiting, task_dispatch
from tasks_app.db.prepared import connection_close_quietly
from tasks_app.db.store import (
    NO_FAILED_STEP,
    CheckpointRow,
    FailedStepRow,
    FencedWriter,
    SafePointStop,
    StatusMoved,
    TaskCompletion,
    TaskDeadLetter,
    TaskFailure,
    WaitEntry,
)
from tasks_app.engine.decisions import DeadLetter, Parks, TaskFails
from tasks_app.engine.effects import effects_to_answer_for
from tasks_app.engine.lease import Claim
from tasks_app.engine.safepoints import SafePointDecision
from tasks_app.engine.waits import APPROVAL, BUDGET
from tasks_app.events import Event, checkpoint_event, input_required_event, status_event, transition_events
from tasks_app.models import RUNNABLE_STATUSES, TaskStatus
from tasks_app.observability import metrics, tracing

logger = logging.getLogger("tasks_app.engine.slice")  # the slice's log: an exit is how a slice ends

RESULT_INLINE_MAX_BYTES = 64 * 1024
DATABASE_ERRORS = (OperationalError, InterfaceError)


class Exits:
    """The exits of one slice: its claim and fenced writer, with what the slice hands them explicitly.

    ``take_pending_events`` gives the events waiting for the next fenced write (the slice's; taken only once an exit
    is sure to write), ``record_known_effects`` records effects that returned but whose step will not commit."""

    def __init__(self, claim: Claim, writer: FencedWriter, *, lease_seconds: float,
                 take_pending_events: Callable[[], list[Event]], record_known_effects: Callable[[], None]):
        self.claim = claim
        self.fence = claim.fence
        self.writer = writer
        self.lease_seconds = lease_seconds
        self.take_pending_events = take_pending_events
        self.record_known_effects = record_known_effects
        # What an attempt spent that no commit will carry (a step stopped at an approval gate): written with the
        # write that lets the task go — entering the wait, a stop a command asked for first, or a plain release.
        self.unwritten_cost = Decimal(0)
        self.unwritten_tokens = 0

    def add_unwritten(self, cost: Decimal, tokens: int) -> None:
        self.unwritten_cost += cost
        self.unwritten_tokens += tokens

    # -- for good ------------------------------------------------------------------------------------------------
    def complete(self, text: str, *, plan_length: int | None) -> str:
        """Store the result (canonical JSON; a large one as a file, by reference) and let go."""
        result_ref = ""
        if len(text.encode()) > RESULT_INLINE_MAX_BYTES:
            # A fresh name per attempt, never overwritten: a completion whose commit did not land leaves an
            # unreferenced file, never a changed one.
            result_ref = default_storage.save(
                f"tasks/{self.fence.task_id}/{self.fence.epoch}/result.{uuid.uuid4().hex[:12]}.json",
                ContentFile(text.encode()))
            text = json.dumps({"ref": result_ref, "bytes": len(text)})
        written = self.writer.task_complete(TaskCompletion(
            result=text, result_ref=result_ref, plan_length=plan_length,
        ), events=[*self.take_pending_events(), *transition_events(TaskStatus.COMPLETED, "Completed")])
        self.hand_on(own=False, waiting=written.waiting)
        return "completed"

    def stop(self, to: TaskStatus, *, decision: SafePointDecision | None, checkpoint: CheckpointRow) -> str:
        """Pause or cancel at a safe point (its open effects resolved, its checkpoint made): transition, release."""
        message = "Paused" if to == TaskStatus.PAUSED else "Cancelled"
        events = [*self.take_pending_events(), *(decision.events if decision else [])]
        if checkpoint.cp_sequence:
            events.append(checkpoint_event(sequence=checkpoint.cp_sequence, size=checkpoint.cp_size))
        events += transition_events(to, message)
        written = self.writer.safe_point_stop(SafePointStop(
            status=to.value, message=message, steering_cursor=decision.steering_cursor if decision else None,
            cost=self.unwritten_cost, tokens=self.unwritten_tokens, checkpoint=checkpoint), events=events)
        self.unwritten_cost, self.unwritten_tokens = Decimal(0), 0
        self.hand_on(own=False, waiting=written.waiting)
        return to.value

    def fail(self, fails: TaskFails, *, step_seq: int, plan_version: int) -> str:
        """The task fails (its open effects resolved): the error, and the failed step's row if a step failed."""
        error = fails.error
        message = f"Failed: {error['type']}: {error['message']}"[:500]
        public = {key: value for key, value in error.items() if key != "attempts"}
        step = NO_FAILED_STEP
        if fails.failed_step:
            step = FailedStepRow(step_seq=step_seq, step_index=error["stepIndex"],
                                 step_name=error["step"], attempt=error["attempt"], output=json.dumps(public))
        written = self.writer.task_fail(TaskFailure(
            message=message, error=json.dumps(error), cost=fails.cost, tokens=fails.tokens,
            plan_version=plan_version, failed_step=step,
        ), events=[*self.take_pending_events(), *fails.events,
                   *transition_events(TaskStatus.FAILED, message, error=public)])
        self.hand_on(own=False, waiting=written.waiting)
        return "failed"

    def dead_letter(self, dead: DeadLetter) -> str:
        """Park the task for an operator: never a blind re-run (ARCHITECTURE §3, §5)."""
        message, open_keys = effects_to_answer_for(self.fence.task_id, dead.message)
        error = {"type": "DeadLettered", "reason": dead.reason, "message": message, "openEffects": open_keys}
        status_message = f"Dead-lettered ({dead.reason}): {message}"[:500]
        written = self.writer.task_dead_letter(TaskDeadLetter(
            message=status_message, error=json.dumps(error), cost=dead.cost, tokens=dead.tokens,
        ), events=[*self.take_pending_events(),
                   status_event(TaskStatus.DEAD_LETTERED, status_message, reason=dead.reason)])
        logger.warning("task %s dead-lettered: %s", self.fence.task_id, dead.reason)
        metrics.dead_lettered(reason=dead.reason)
        self.hand_on(own=False, waiting=written.waiting)
        return "dead_lettered"

    def dead_letter_safely(self, reason: str, message: str) -> str:
        try:
            try:
                self.record_known_effects()
            except (LeaseLost, *DATABASE_ERRORS):
                raise
            except Exception:  # what failed may be exactly this record: park the task anyway, naming the error
                logger.exception("task %s: could not record effect outcomes", self.fence.task_id)
            return self.dead_letter(DeadLetter(reason, message))
        except LeaseLost:
            return "lease_lost"
        except StatusMoved as moved:
            return self.let_go(moved.status)
        except DATABASE_ERRORS:
            return self.after_database_error()

    # -- for a while ---------------------------------------------------------------------------------------------
    def wait(self, wait: dict, *, checkpoint: CheckpointRow, state_version: int | None = None) -> str:
        """Wait for a person: the checkpoint (if any), the wait record, input_required, the lease released with no
        hint. SteeringArrived if ``state_version`` is given and a command came in since (sql.ENTER_WAIT)."""
        if wait["kind"] == APPROVAL:
            message = f"Waiting for approval of {wait['name']}"
        elif wait["kind"] == BUDGET:
            message = f"Waiting for a budget: {wait['prompt']}"
        else:
            message = f"Waiting for input: {wait['prompt']}"
        message = message[:500]
        tracing.event("wait.entered", wait_kind=wait["kind"], wait_name=wait.get("name"))
        events = self.take_pending_events()
        if checkpoint.cp_sequence:
            events.append(checkpoint_event(sequence=checkpoint.cp_sequence, size=checkpoint.cp_size))
        events += [input_required_event(wait), status_event(TaskStatus.INPUT_REQUIRED, message)]
        written = self.writer.wait_enter(WaitEntry(
            message=message, wait=json.dumps(wait), cost=self.unwritten_cost, tokens=self.unwritten_tokens,
            state_version=state_version, checkpoint=checkpoint), events=events)
        self.unwritten_cost, self.unwritten_tokens = Decimal(0), 0
        self.hand_on(own=False, waiting=written.waiting)
        return TaskStatus.INPUT_REQUIRED.value

    def park(self, parked: Parks) -> str:
        """Let go of the worker and the lease until the outside thing is worth asking about again; the step runs
        again then (its recorded effects are not called again)."""
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

    # -- letting go ----------------------------------------------------------------------------------------------
    def hand_on(self, *, own: bool, waiting: bool) -> None:
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

    def let_go(self, status: str | None) -> str:
        # Someone else changed the status meanwhile (a cancel of a recovering task, an operator). Let go; if it
        # is still runnable (e.g. now `cancelling`), hand it straight to the next claim, which starts from that
        # status, rather than leaving it to the reaper.
        self.record_known_effects()  # a step whose commit the move refused did call its effects
        released = store.lease_release(self.fence, cost=self.unwritten_cost, tokens=self.unwritten_tokens)
        self.unwritten_cost, self.unwritten_tokens = Decimal(0), 0
        if released and released[0] in RUNNABLE_STATUSES:
            task_dispatch(self.fence.task_id, priority=released[1])
        elif released and self.claim.tenant_max_running is not None:
            # Its tenant's slot is free (the race hand_on names), and the fleet's.
            hints_for_waiting(limit=2, releasing_tenant=self.claim.tenant_id)
        logger.info("task %s moved to %s under us; lease released", self.fence.task_id, status)
        return "status_moved"

    def after_database_error(self) -> str:
        """The database went away mid-slice. Once it answers again (within one lease period), record what is
        known (effects that returned), release the lease and send the hint: the next claim reloads the truth,
        whether or not the last commit landed. Only if it stays away does the lease run out for the reaper."""
        connection_close_quietly()
        give_up_at = time.monotonic() + self.lease_seconds
        delay = 0.2
        while True:
            try:
                self.record_known_effects()
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
