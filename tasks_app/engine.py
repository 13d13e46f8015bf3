"""The durable step engine (ARCHITECTURE §4): claim → heartbeat → safe point → load → execute → commit → chain.

``run_step(task_id)`` is what the Celery task calls. A message is a hint, never truth: a duplicate finds the
lease taken and returns; a lost one is re-sent by the reaper. The worker keeps in memory only the task it
leases; every write is fenced on (lease_owner, lease_epoch), so a worker whose lease was reaped can write
nothing. Per step the engine issues one statement (the fenced commit) plus one per effect (its `started`
record); claim and state load happen once per time slice.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import socket
import threading
import time
import traceback
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from decimal import Decimal
from functools import lru_cache
from typing import Any

from django.conf import settings
from django.core.files.base import ContentFile
from django.core.files.storage import default_storage
from django.db import InterfaceError, OperationalError, connection

from checkpoints_app.checkpoints import (
    SCHEMA_VERSION,
    CheckpointCorrupt,
    CheckpointState,
    CheckpointTooLarge,
    checkpoint_document,
    checkpoint_serialize,
    checkpoint_state,
    checkpoint_verify,
)
from checkpoints_app.fencing import Fence, LeaseLost
from checkpoints_app.ledger import EffectOutcomeUnknown, effect_mark
from config.canonical import canonical_json, nul_paths
from tasks_app import faults, sql
from tasks_app.context import DurableState, StepContext, state_apply_delta
from tasks_app.dispatch import task_dispatch
from tasks_app.models import RUNNABLE_STATUSES, TaskStatus, sources_of
from tasks_app.redaction import redact
from tasks_app.registry import (
    ToolTimeout,
    UnknownWorkflow,
    Workflow,
    plan_encode,
    plan_length,
    plan_step_name,
    registry,
)
from tasks_app.services import chain_events, status_event

logger = logging.getLogger(__name__)

RESULT_INLINE_MAX_BYTES = 64 * 1024
OUTPUT_MAX_BYTES = 4 * 1024


def worker_identity() -> str:
    """Unique per process: the same host and pid after a restart still gets a new lease epoch anyway."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


_WORKER_ID: str | None = None
_WORKER_PID: int | None = None


def current_worker_id() -> str:
    global _WORKER_ID, _WORKER_PID
    if _WORKER_PID != os.getpid():  # prefork children inherit the parent's module state
        _WORKER_ID, _WORKER_PID = worker_identity(), os.getpid()
    return _WORKER_ID


def _json_load(value):
    return json.loads(value) if isinstance(value, str) else value


@dataclass
class Claim:
    fence: Fence
    status: str
    workflow_name: str
    workflow_version: str
    input: dict
    goal: Any
    plan: list | None
    plan_version: int
    next_step_index: int
    steps_completed: int
    event_seq: int
    event_head_hash: str
    checkpoint_sequence: int | None
    budget_steps: int | None
    budget_cost: Decimal | None
    cost_spent: Decimal
    priority: int
    deadline_passed: bool
    seconds_since_checkpoint: float


def lease_claim(*, task_id, owner: str) -> Claim | None:
    cfg = settings.RUNTIME
    with connection.cursor() as cursor:
        cursor.execute(sql.CLAIM, {"task_id": task_id, "owner": owner, "ttl": cfg.lease_seconds,
                                   "runnable": sql.RUNNABLE, "max_concurrent": cfg.max_concurrent_tasks})
        row = cursor.fetchone()
    if row is None:
        return None
    (epoch, status, wf_name, wf_version, input_, goal, plan, plan_version, next_index, steps_completed, event_seq,
     head, cp_seq, budget_steps, budget_cost, cost_spent, priority, deadline_passed, since_cp) = row
    return Claim(
        fence=Fence(task_id=task_id, owner=owner, epoch=epoch), status=status, workflow_name=wf_name,
        workflow_version=wf_version, input=_json_load(input_), goal=_json_load(goal), plan=_json_load(plan),
        plan_version=plan_version, next_step_index=next_index, steps_completed=steps_completed, event_seq=event_seq,
        event_head_hash=head, checkpoint_sequence=cp_seq, budget_steps=budget_steps,
        budget_cost=budget_cost, cost_spent=cost_spent, priority=priority,
        deadline_passed=deadline_passed, seconds_since_checkpoint=float(since_cp),
    )


class DeadLetter(Exception):
    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason
        self.message = message


class StepFailed(Exception):
    def __init__(self, error: dict):
        super().__init__(error["message"])
        self.error = error


class Heartbeat(threading.Thread):
    """Renews the lease every heartbeat_seconds while a slice runs, on its own database connection."""

    def __init__(self, fence: Fence):
        super().__init__(daemon=True, name=f"heartbeat-{fence.task_id}")
        self.fence = fence
        self.stopping = threading.Event()
        self.lost = False
        self.status: str | None = None

    def run(self) -> None:
        cfg = settings.RUNTIME
        try:
            while not self.stopping.wait(cfg.heartbeat_seconds):
                faults.point("during_lease_renewal", task_id=self.fence.task_id)
                try:
                    with connection.cursor() as cursor:
                        cursor.execute(sql.RENEW, {**self.fence.params(), "ttl": cfg.lease_seconds})
                        row = cursor.fetchone()
                except Exception:  # a database blip: the next beat retries; the commit fence decides anyway
                    logger.warning("lease renewal failed for task %s", self.fence.task_id, exc_info=True)
                    continue
                if row is None:
                    self.lost = True
                    return
                self.status = row[0]
        finally:
            connection.close()

    def stop(self) -> None:
        self.stopping.set()
        self.join(timeout=5)


class TaskRunner:
    """Runs one leased task for one time slice. Holds the only in-memory copy of its state."""

    def __init__(self, claim: Claim, *, max_steps: int | None = None):
        self.claim = claim
        self.max_steps = max_steps  # tests and benchmarks: end the slice after this many steps
        self.fence = claim.fence
        self.cfg = settings.RUNTIME
        self.event_seq = claim.event_seq
        self.event_head = claim.event_head_hash
        self.status = claim.status
        self.state = CheckpointState(plan_version=claim.plan_version, next_step=claim.next_step_index)
        self.plan = claim.plan
        self.plan_is_new = False
        self.checkpoint_sequence = claim.checkpoint_sequence or 0
        self.steps_since_checkpoint = 0
        self.checkpoint_clock = time.monotonic() - claim.seconds_since_checkpoint
        self.workflow: Workflow | None = None

    # -- the fenced write everything goes through ------------------------------------------------------------
    def write(self, *, events: list[tuple[str, dict]], set_clause: str, params: dict, sources: list[str] | None = None,
              step: dict | None = None, checkpoint: dict | None = None, effects: list[dict] | None = None) -> str:
        """One statement; retried only when another writer (web steering) appended events meanwhile."""
        prune_through = None
        if checkpoint:
            prune_through = checkpoint["cp_sequence"] - self.cfg.checkpoint.keep
        statement = _fenced_sql(set_clause, sources is not None, step is not None, checkpoint is not None,
                                prune_through is not None and prune_through > 0, bool(effects))
        for _ in range(10):
            rows, new_seq, new_head = chain_events(self.fence.task_id, events, seq=self.event_seq, head=self.event_head)
            values = {
                **self.fence.params(), **params, "expected_seq": self.event_seq, "new_seq": new_seq,
                "new_head": new_head, "sources": sources,
                "events": json.dumps([{"seq": r.seq, "type": r.type, "data": r.data, "prev_hash": r.prev_hash,
                                       "hash": r.hash} for r in rows]),
                "effects": json.dumps(effects or []), "prune_through": prune_through,
                **(step or {}), **(checkpoint or {}),
            }
            with connection.cursor() as cursor:
                cursor.execute(statement, values)
                row = cursor.fetchone()
                if row is not None:
                    self.event_seq, self.event_head, self.status = new_seq, new_head, row[0]
                    return self.status
                cursor.execute(sql.HEAD, {"task_id": self.fence.task_id})
                owner, epoch, event_seq, head, status = cursor.fetchone()
            if owner != self.fence.owner or epoch != self.fence.epoch:
                raise LeaseLost(f"task {self.fence.task_id}: lease now {owner}/{epoch}")
            if sources is not None and status not in sources:
                raise _StatusMoved(status)
            # Someone (steering, cancel) appended events: chain ours after theirs and try again.
            self.event_seq, self.event_head, self.status = event_seq, head, status
        raise LeaseLost(f"task {self.fence.task_id}: could not commit after 10 attempts")

    # -- the slice ---------------------------------------------------------------------------------------------
    def run(self) -> str:
        heartbeat = Heartbeat(self.fence)
        heartbeat.start()
        try:
            return self._run(heartbeat)
        except LeaseLost as lost:
            logger.warning("lease lost, stopping without writing: %s", lost)
            return "lease_lost"
        except _StatusMoved as moved:
            # Someone else changed the status meanwhile (a cancel of a recovering task, an operator). Let go;
            # if it is still runnable (e.g. now `cancelling`), hand it straight to the next claim, which starts
            # from that status, rather than leaving it to the reaper's lost-message sweep minutes later.
            self.release()
            if moved.status in RUNNABLE_STATUSES:
                task_dispatch(self.fence.task_id, priority=self.claim.priority)
            logger.info("task %s moved to %s under us; lease released", self.fence.task_id, moved.status)
            return "status_moved"
        finally:
            heartbeat.stop()

    def _run(self, heartbeat: Heartbeat) -> str:
        if self.claim.deadline_passed:
            return self.finish_failed({"type": "DeadlineExceeded", "message": "the task's deadline passed"})
        try:
            self.load()
        except DeadLetter as dead:
            return self.dead_letter(dead.reason, dead.message)
        except StepFailed as failed:
            return self.finish_failed(failed.error)
        if self.status in (TaskStatus.QUEUED, TaskStatus.RECOVERING):
            recovered = self.status == TaskStatus.RECOVERING
            self.write(events=[status_event(TaskStatus.WORKING, "Working")]
                       + ([("task.snapshot", self.snapshot_event())] if recovered else []),
                       set_clause="status = 'working', status_message = ''", params={},
                       sources=sources_of(TaskStatus.WORKING))
        slice_started = time.monotonic()
        steps_run = 0
        while True:
            if heartbeat.lost:
                return "lease_lost"
            current = heartbeat.status if heartbeat.status in (TaskStatus.CANCELLING, TaskStatus.PAUSING) else self.status
            if current == TaskStatus.CANCELLING:
                return self.stop_at_safe_point(TaskStatus.CANCELLED)
            if current == TaskStatus.PAUSING:
                return self.stop_at_safe_point(TaskStatus.PAUSED)
            if self.state.next_step >= plan_length(self.plan):
                return self.complete()
            exhausted = self.budget_exhausted()
            if exhausted:
                return self.finish_failed({"type": "BudgetExhausted", "message": exhausted})
            try:
                outcome = self.execute_step()
            except DeadLetter as dead:
                return self.dead_letter(dead.reason, dead.message)
            except StepFailed as failed:
                return self.finish_failed(failed.error, failed_step=True)
            steps_run += 1
            slice_over = (time.monotonic() - slice_started >= self.cfg.slice_seconds
                          or (self.max_steps is not None and steps_run >= self.max_steps))
            try:
                result = self.commit_step(outcome, release=slice_over)
            except StepFailed as failed:
                return self.finish_failed(failed.error)
            if result in ("completed", "released"):
                faults.point("after_commit_before_chain", step_seq=outcome["seq"])
                if result == "released":
                    task_dispatch(self.fence.task_id, priority=self.claim.priority)
                return result

    def budget_exhausted(self) -> str | None:
        claim = self.claim
        if claim.budget_steps is not None and claim.steps_completed >= claim.budget_steps:
            return f"the task used its budget of {claim.budget_steps} steps"
        if claim.budget_cost is not None and claim.cost_spent >= claim.budget_cost:
            return f"the task spent {claim.cost_spent} of its cost budget {claim.budget_cost}"
        return None

    def release(self) -> None:
        with connection.cursor() as cursor:
            cursor.execute(sql.RELEASE, self.fence.params())

    # -- loading -------------------------------------------------------------------------------------------------
    def load(self) -> None:
        try:
            workflow_cls = registry.get(self.claim.workflow_name)
        except UnknownWorkflow:
            raise DeadLetter("workflow_missing", f"workflow {self.claim.workflow_name!r} is not registered "
                                                 f"in this code") from None
        if not workflow_cls.can_resume(self.claim.workflow_version):
            raise DeadLetter("workflow_version_changed",
                             f"task was started on {workflow_cls.name} version {self.claim.workflow_version}; this "
                             f"code is version {workflow_cls.version} and does not declare it compatible")
        self.workflow = workflow_cls()
        if self.claim.steps_completed or self.claim.checkpoint_sequence:
            self._load_state()
        if self.plan is None:
            try:
                names = self.workflow.plan(self.claim.goal, self.claim.input, copy.deepcopy(self.state.variables))
                if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
                    raise TypeError(f"plan() must return a list of step names, got {type(names).__name__}")
            except Exception as error:  # the workflow's own bug or missing data: the task fails, visibly
                raise StepFailed({"type": type(error).__name__, "message": redact(str(error))[:500],
                                  "step": "(plan)", "attempt": 1}) from None
            self.plan = plan_encode(names)
            self.plan_is_new = True
        missing = sorted({name for name, _ in self.plan} - set(workflow_cls.steps))
        if missing:
            raise DeadLetter("plan_mismatch", f"the task's plan has steps {missing} that workflow "
                                              f"{workflow_cls.name} {workflow_cls.version} no longer defines")

    def _load_state(self) -> None:
        with connection.cursor() as cursor:
            after = 0
            if self.claim.checkpoint_sequence:
                cursor.execute(sql.LATEST_CHECKPOINT, {"task_id": self.fence.task_id})
                row = cursor.fetchone()
                if row is not None:
                    sequence, schema_version, payload, checksum = row
                    try:
                        self.state = checkpoint_state(checkpoint_verify(payload=payload, checksum=checksum,
                                                                        schema_version=schema_version))
                    except CheckpointCorrupt as corrupt:
                        raise DeadLetter("checkpoint_corrupt", f"checkpoint {sequence}: {corrupt}") from None
                    after = self.state.through_seq
            cursor.execute(sql.DELTAS_AFTER, {"task_id": self.fence.task_id, "after": after})
            deltas = cursor.fetchall()
        last = None
        for seq, plan_version, step_index, name, delta in deltas:
            delta = _json_load(delta)
            state_apply_delta(self.state.variables, delta)
            self.state.artifact_refs.update(delta.get("artifacts", {}))
            self.state.effects_succeeded += delta.get("effects", 0)
            self.state.through_seq, self.state.last_step = seq, name
            last = (plan_version, step_index, name)
        self.steps_since_checkpoint = len(deltas)
        # The cursor, the history and the plan must tell the same story; if not, stop rather than guess.
        if self.state.through_seq != self.claim.steps_completed:
            raise DeadLetter("checkpoint_corrupt", f"state rebuilt through step {self.state.through_seq} but the "
                                                   f"task has {self.claim.steps_completed} committed steps")
        self.state.next_step = self.claim.next_step_index
        self.state.plan_version = self.claim.plan_version
        if last and last[0] == self.claim.plan_version and self.plan is not None:
            try:
                planned = plan_step_name(self.plan, last[1])
            except IndexError:
                planned = None
            if planned != last[2]:
                raise DeadLetter("plan_mismatch", f"step {last[1]} ran as {last[2]!r} but the plan now says "
                                                  f"{planned!r}")

    # -- executing -----------------------------------------------------------------------------------------------
    def execute_step(self) -> dict:
        index = self.state.next_step
        name = plan_step_name(self.plan, index)
        options = self.workflow.steps[name]
        function = getattr(self.workflow, name)
        retry = self.cfg.step_retry
        max_attempts = options["max_attempts"] or retry.max_attempts
        seq = self.claim.steps_completed + 1
        durable = DurableState(self.state.variables)
        attempts: list[dict] = []
        started_at = time.time()
        attempt = 0
        while True:
            attempt += 1
            ctx = StepContext(fence=self.fence, task_id=self.fence.task_id, step_seq=seq, step_index=index,
                              step_name=name, attempt=attempt, goal=self.claim.goal, input=self.claim.input,
                              state=durable, artifact_refs=self.state.artifact_refs)
            began = time.monotonic()
            try:
                output = function(ctx)
                break
            except EffectOutcomeUnknown as unknown:
                raise DeadLetter("effect_outcome_unknown",
                                 f"effect {unknown.key} was started by a worker that died and its outcome is "
                                 f"unknown; it has no reconcile hook, so a person must check and resolve it") from None
            except (LeaseLost, faults.InjectedFault, OperationalError, InterfaceError):
                # Not the step's failure: the lease is gone, a crash is simulated, or the database is away.
                # Stop without writing; the lease expires and recovery resumes the step (retrying here would
                # burn the step's attempts on an outage and fail a healthy task).
                raise
            except Exception as error:  # the step's own failure: record, back off, retry or fail the task
                self._record_completed_effects(ctx)
                durable.discard_changes()
                attempts.append({"attempt": attempt, "type": type(error).__name__,
                                 "message": redact(str(error))[:500], "duration_ms": round((time.monotonic() - began) * 1000),
                                 "traceback": redact("".join(traceback.format_exception(error)[-3:]))[-1500:]})
                limit = retry.tool_timeout_attempts if isinstance(error, ToolTimeout) else max_attempts
                if attempt >= limit:
                    raise StepFailed({"type": type(error).__name__, "message": redact(str(error))[:500],
                                      "step": name, "stepIndex": index, "attempt": attempt,
                                      "attempts": attempts}) from None
                time.sleep(min(retry.backoff_max_seconds, retry.backoff_seconds * 2 ** (attempt - 1)))
        output_json = canonical_json(output)
        if len(output_json) > OUTPUT_MAX_BYTES:
            output = {"truncated": True, "bytes": len(output_json)}
        delta = durable.delta()
        nul_fields = nul_paths(delta.get("set", {}), "state") + nul_paths(output, "output") + [
            path for e in ctx.effect_outcomes for path in nul_paths(e["result"], f"effect {e['key']}")]
        if nul_fields:
            # PostgreSQL cannot store NUL in jsonb: fail the step with the places, not the commit with a DataError.
            raise StepFailed({"type": "InvalidState", "step": name, "stepIndex": index, "attempt": attempt,
                              "message": f"step {name!r} produced text with a NUL character (\\u0000) at "
                                         f"{', '.join(nul_fields[:5])}; remove it before storing"})
        delta_bytes = len(canonical_json(delta).encode())
        if delta_bytes > self.cfg.checkpoint.max_bytes:
            raise StepFailed({"type": "StateTooLarge", "step": name, "stepIndex": index, "attempt": attempt,
                              "message": f"step {name!r} changed {delta_bytes} bytes of state, over the "
                                         f"{self.cfg.checkpoint.max_bytes}-byte cap (checkpoint.max_bytes); store "
                                         f"big values with ctx.artifact() and keep only the reference in state"})
        if ctx.new_artifacts:
            delta["artifacts"] = ctx.new_artifacts
        fresh_effects = [e for e in ctx.effect_outcomes if not e.get("already_recorded")]
        if ctx.effect_outcomes:
            delta["effects"] = len(ctx.effect_outcomes)
        return {"seq": seq, "index": index, "name": name, "attempt": attempt, "output": output, "delta": delta,
                "ctx": ctx, "effects": fresh_effects, "costly": options["costly"] or ctx.force_checkpoint,
                "started_at": started_at}

    def _record_completed_effects(self, ctx: StepContext) -> None:
        # Effects that returned before the step raised did happen: record them so the retry reuses them.
        for outcome in ctx.effect_outcomes:
            if not outcome.get("already_recorded"):
                effect_mark(self.fence, key=outcome["key"], status="succeeded", result=outcome["result"])
                outcome["already_recorded"] = True

    # -- committing ------------------------------------------------------------------------------------------
    def commit_step(self, outcome: dict, *, release: bool) -> str:
        ctx: StepContext = outcome["ctx"]
        self.state.next_step = outcome["index"] + 1
        self.state.through_seq = outcome["seq"]
        self.state.last_step = outcome["name"]
        self.state.effects_succeeded += outcome["delta"].get("effects", 0)
        self.claim.steps_completed = outcome["seq"]
        self.steps_since_checkpoint += 1
        total = plan_length(self.plan)
        finished = self.state.next_step >= total
        progress, phase = ctx.progress_value or (None, None)
        if progress is None:
            progress = self.state.next_step / total if total else 1.0
        events = list(ctx.events)
        events.append(("progress", {"progress": progress, "phase": phase, "step": outcome["name"],
                                    "stepsCompleted": outcome["seq"]}))
        set_parts = ["progress = %(progress)s", "next_step_index = %(next_index)s",
                     "steps_completed = %(steps_completed)s"]
        params = {"progress": progress, "next_index": self.state.next_step, "steps_completed": outcome["seq"]}
        if ctx.cost:
            set_parts.append("cost_spent = cost_spent + %(cost)s")
            params["cost"] = ctx.cost
            self.claim.cost_spent += ctx.cost
        if phase is not None:
            set_parts.append("phase = %(phase)s")
            params["phase"] = phase
        if self.plan_is_new:
            set_parts.append("plan = %(plan)s::jsonb")
            params["plan"] = json.dumps(self.plan)
            self.plan_is_new = False
        checkpoint = None
        if not finished and (outcome["costly"] or self.checkpoint_due()):
            checkpoint = self.checkpoint_params()
            events.append(("checkpoint", {"sequence": checkpoint["cp_sequence"], "bytes": checkpoint["cp_size"]}))
            set_parts += ["checkpoint_sequence = %(cp_sequence)s", "checkpoint_at = now()"]
        if finished:
            set_parts += self._completion_sets(params, events)
        if release or finished:
            set_parts.append("lease_owner = NULL, lease_expires_at = NULL")
        else:
            set_parts.append("lease_expires_at = now() + %(ttl)s * interval '1 second'")
            params["ttl"] = self.cfg.lease_seconds
        step = {"step_seq": outcome["seq"], "plan_version": self.state.plan_version, "step_index": outcome["index"],
                "step_name": outcome["name"], "step_status": "committed", "attempt": outcome["attempt"],
                "delta": json.dumps(outcome["delta"]), "output": json.dumps(outcome["output"]),
                "started_at": _timestamp(outcome["started_at"])}
        self.write(events=events, set_clause=", ".join(set_parts), params=params, step=step, checkpoint=checkpoint,
                   effects=outcome["effects"])
        if checkpoint:
            self.steps_since_checkpoint = 0
            self.checkpoint_clock = time.monotonic()
        if finished:
            return "completed"
        return "released" if release else "continue"

    def checkpoint_due(self) -> bool:
        policy = self.cfg.checkpoint
        return (self.steps_since_checkpoint >= policy.every_steps
                or time.monotonic() - self.checkpoint_clock >= policy.max_interval_seconds)

    def checkpoint_params(self) -> dict:
        self.checkpoint_sequence += 1
        document = checkpoint_document(task_id=self.fence.task_id, sequence=self.checkpoint_sequence, state=self.state)
        try:
            payload, checksum = checkpoint_serialize(document, max_bytes=self.cfg.checkpoint.max_bytes)
        except CheckpointTooLarge as too_large:
            # The workflow keeps too much state: a bug to fix in its code, so the task fails and says how.
            self.checkpoint_sequence -= 1
            raise StepFailed({"type": "CheckpointTooLarge", "message": str(too_large),
                              "step": self.state.last_step, "attempt": 1}) from None
        return {"cp_sequence": self.checkpoint_sequence, "cp_schema": SCHEMA_VERSION, "cp_payload": payload,
                "cp_checksum": checksum, "cp_size": len(payload.encode())}

    def _completion_sets(self, params: dict, events: list) -> list[str]:
        result = self.workflow.result(self.state.variables)
        text = canonical_json(result)
        sets = ["status = 'completed'", "status_message = 'Completed'", "completed_at = now()"]
        if len(text.encode()) > RESULT_INLINE_MAX_BYTES:
            path = f"tasks/{self.fence.task_id}/{self.fence.epoch}/result.json"  # per lease, as artifacts
            if default_storage.exists(path):  # left by a completion whose commit did not land: replace it
                default_storage.delete(path)
            ref = default_storage.save(path, ContentFile(text.encode()))
            params["result_ref"] = ref
            sets.append("result_ref = %(result_ref)s")
            result = {"ref": ref, "bytes": len(text)}
        params["result"] = json.dumps(result)
        sets.append("result = %(result)s::jsonb")
        events += [status_event(TaskStatus.COMPLETED, "Completed"), ("terminal", {"status": "completed"})]
        return sets

    def complete(self) -> str:
        params: dict = {}
        events: list = []
        sets = self._completion_sets(params, events) + ["progress = 1"]
        if self.plan_is_new:
            sets.append("plan = %(plan)s::jsonb")
            params["plan"] = json.dumps(self.plan)
        sets.append("lease_owner = NULL, lease_expires_at = NULL")
        self.write(events=events, set_clause=", ".join(sets), params=params, sources=sources_of(TaskStatus.COMPLETED))
        return "completed"

    def stop_at_safe_point(self, to: TaskStatus) -> str:
        """Pause or cancel at a step boundary: checkpoint, transition, release (ARCHITECTURE §6)."""
        checkpoint = self.checkpoint_params()
        message = "Paused" if to == TaskStatus.PAUSED else "Cancelled"
        events = [("checkpoint", {"sequence": checkpoint["cp_sequence"], "bytes": checkpoint["cp_size"]}),
                  status_event(to, message)]
        sets = [f"status = '{to.value}'", "status_message = %(message)s", "lease_owner = NULL",
                "lease_expires_at = NULL", "checkpoint_sequence = %(cp_sequence)s", "checkpoint_at = now()"]
        if to == TaskStatus.CANCELLED:
            events.append(("terminal", {"status": "cancelled"}))
            sets.append("completed_at = now()")
        try:
            self.write(events=events, set_clause=", ".join(sets), params={"message": message},
                       sources=sources_of(to), checkpoint=checkpoint)
        except _StatusMoved:
            return "status_moved"
        return to.value

    def finish_failed(self, error: dict, *, failed_step: bool = False) -> str:
        sets = ["status = 'failed'", "status_message = %(message)s", "error = %(error)s::jsonb", "completed_at = now()",
                "lease_owner = NULL", "lease_expires_at = NULL"]
        message = f"Failed: {error['type']}: {error['message']}"[:500]
        events = [status_event(TaskStatus.FAILED, message, error=_public_error(error)),
                  ("terminal", {"status": "failed"})]
        step = None
        if failed_step:
            step = {"step_seq": self.claim.steps_completed + 1, "plan_version": self.state.plan_version,
                    "step_index": error["stepIndex"], "step_name": error["step"], "step_status": "failed",
                    "attempt": error["attempt"], "delta": "{}", "output": json.dumps(_public_error(error)),
                    "started_at": None}
        self.write(events=events, set_clause=", ".join(sets), params={"message": message, "error": json.dumps(error)},
                   sources=sources_of(TaskStatus.FAILED), step=step)
        return "failed"

    def dead_letter(self, reason: str, message: str) -> str:
        """Park the task for an operator: never a blind re-run (ARCHITECTURE §3, §5)."""
        error = {"type": "DeadLettered", "reason": reason, "message": message}
        status_message = f"Dead-lettered ({reason}): {message}"[:500]
        self.write(events=[status_event(TaskStatus.DEAD_LETTERED, status_message, reason=reason)],
                   set_clause="status = 'dead_lettered', status_message = %(message)s, error = %(error)s::jsonb, "
                              "lease_owner = NULL, lease_expires_at = NULL",
                   params={"message": status_message, "error": json.dumps(error)},
                   sources=sources_of(TaskStatus.DEAD_LETTERED))
        logger.warning("task %s dead-lettered: %s", self.fence.task_id, reason)
        return "dead_lettered"

    def snapshot_event(self) -> dict:
        return {"stepsCompleted": self.claim.steps_completed, "nextStep": self.state.next_step,
                "planLength": plan_length(self.plan), "checkpoint": self.checkpoint_sequence or None}


class _StatusMoved(Exception):
    """A status-guarded write found the task in another status (e.g. cancelled from the web meanwhile)."""

    def __init__(self, status: str):
        super().__init__(status)
        self.status = status


@lru_cache(maxsize=64)
def _fenced_sql(set_clause, status_guard, step, checkpoint, prune, effects) -> str:
    return sql.fenced_write(set_clause=set_clause, status_guard=status_guard, step=step, checkpoint=checkpoint,
                            prune=prune, effects=effects)


def _timestamp(epoch_seconds: float) -> datetime:
    return datetime.fromtimestamp(epoch_seconds, tz=timezone.utc)


def _public_error(error: dict) -> dict:
    return {key: value for key, value in error.items() if key != "attempts"}


def run_step(task_id, *, owner: str | None = None, max_steps: int | None = None) -> str:
    """Claim the task and run it for one time slice. Safe to call with duplicate or stale messages."""
    owner = owner or current_worker_id()
    claim = lease_claim(task_id=task_id, owner=owner)
    if claim is None:
        with connection.cursor() as cursor:
            cursor.execute(sql.CLAIM_PROBE, {"task_id": task_id, "runnable": sql.RUNNABLE})
            row = cursor.fetchone()
        if row and row[0]:
            # Runnable and unleased, yet not claimed: the fleet is at max_concurrent_tasks. Try again shortly.
            task_dispatch(task_id, priority=row[1], countdown=1.0)
            return "deferred"
        return "not_claimed"
    return TaskRunner(claim, max_steps=max_steps).run()
