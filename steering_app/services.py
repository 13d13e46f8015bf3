"""Submitting steering commands: one compare-and-set on the task's state_version, the command queued durably.

What a command does happens at the task's next safe point, written by its worker together with the step it
follows (steering_app.safepoint). Only when no worker holds the task and the command can take effect without one
(resume a paused task; change a waiting task's priority) is it applied here, in the submission's transaction.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models.functions import Now

from config.problems import Problem
from steering_app.models import CommandType, SteeringCommand
from tasks_app.dispatch import task_dispatch
from tasks_app.events import chain_events, status_event, transition_events
from tasks_app.models import STEERING_OUTCOME_EVENTS, TERMINAL_STATUSES, Task, TaskEvent, TaskStatus
from tasks_app.services import CANCEL_REQUESTED, CANCEL_TOO_LATE, InvalidTransition

# What this release applies; the others are accepted by the model and refused here until their waits exist.
SUPPORTED = (CommandType.PAUSE, CommandType.RESUME, CommandType.CANCEL, CommandType.SET_PRIORITY, CommandType.KILL)
KILL_PERMISSION = "steering_app.kill_task"


class VersionConflict(Problem):
    status_code = 409
    slug = "version-conflict"


class CommandRefused(Problem):
    status_code = 422
    slug = "command-refused"


@dataclass(frozen=True)
class Submitted:
    command: SteeringCommand
    state_version: int
    replayed: bool  # the same commandId again: the first answer, nothing new queued


def applied_event(command: SteeringCommand, **extra) -> tuple[str, dict]:
    return "steering.applied", {"commandId": str(command.id), "type": command.type, "version": command.new_version,
                                "requestedBy": command.requested_by, "reason": command.reason, **extra}


def rejected_event(command: SteeringCommand, why: str) -> tuple[str, dict]:
    return "steering.rejected", {"commandId": str(command.id), "type": command.type, "version": command.new_version,
                                 "requestedBy": command.requested_by, "reason": command.reason, "why": why}


def steering_payload_validate(command_type: str, payload: Any) -> dict:
    if command_type not in CommandType.values:
        raise CommandRefused(f"Unknown command type {command_type!r}; use one of {', '.join(CommandType.values)}.",
                             errors=[{"field": "type", "message": "Unknown command type."}])
    if command_type not in SUPPORTED:
        raise CommandRefused(f"`{command_type}` is not available yet; this release applies "
                             f"{', '.join(t.value for t in SUPPORTED)}.",
                             errors=[{"field": "type", "message": "Not available yet."}])
    payload = payload or {}
    if not isinstance(payload, dict):
        raise CommandRefused("The payload must be a JSON object.", errors=[{"field": "payload", "message": "Not an "
                                                                                                          "object."}])
    if command_type == CommandType.SET_PRIORITY:
        priority = payload.get("priority")
        if not isinstance(priority, int) or isinstance(priority, bool) or not 0 <= priority <= 9 or len(payload) != 1:
            raise CommandRefused("set_priority takes {\"priority\": 0…9} and nothing else.",
                                 errors=[{"field": "payload.priority", "message": "An integer from 0 to 9."}])
    elif payload:
        raise CommandRefused(f"`{command_type}` takes no payload; send {{}} or leave it out.",
                             errors=[{"field": "payload", "message": "Must be empty."}])
    return payload


class KillNotAllowed(Problem):
    status_code = 403
    slug = "permission-denied"


def _refuse_for_status(command_type: str, status: TaskStatus) -> None:
    if status in TERMINAL_STATUSES or status == TaskStatus.DEAD_LETTERED:
        raise CommandRefused(f"The task is {status}: a finished task takes no more commands.",
                             currentStatus=status.value)
    if command_type == CommandType.KILL and status == TaskStatus.CANCELLED:
        raise CommandRefused("The task is already cancelled.", currentStatus=status.value)
    if command_type == CommandType.CANCEL and status in (TaskStatus.CANCELLING, TaskStatus.CANCELLED):
        raise CommandRefused(f"The task is already {status}.", currentStatus=status.value)
    if command_type == CommandType.RESUME and status != TaskStatus.PAUSED:
        raise CommandRefused(f"Only a paused task can be resumed; this one is {status}.", currentStatus=status.value)
    if command_type == CommandType.PAUSE and status not in (TaskStatus.QUEUED, TaskStatus.WORKING,
                                                            TaskStatus.RECOVERING, TaskStatus.INPUT_REQUIRED):
        raise CommandRefused(f"The task is {status}: there is nothing to pause.", currentStatus=status.value)


def steering_submit(*, task: Task, command_type: str, payload: Any = None, expected_version: int | None,
                    reason: str = "", requested_by: str, command_id: uuid.UUID | None = None,
                    may_kill: bool = False) -> Submitted:
    """Queue a command if ``expected_version`` is the task's state_version (None: no check, for shorthands).

    ``kill`` needs ``may_kill`` (the caller checked KILL_PERMISSION) and a reason."""
    if command_type == CommandType.KILL:
        if not may_kill:
            raise KillNotAllowed("Killing a task is for operators with the kill permission; `cancel` stops it at "
                                 "its next safe point.")
        if not reason.strip():
            raise CommandRefused("A kill needs a reason: it is kept in the task's audit trail.",
                                 errors=[{"field": "reason", "message": "Required for kill."}])
    if command_id is not None:
        first = SteeringCommand.objects.filter(id=command_id).first()
        if first is not None:
            if first.task_id != task.id:
                raise CommandRefused("This commandId was already used for another task; send a new one.",
                                     errors=[{"field": "commandId", "message": "Already used."}])
            return Submitted(command=first, state_version=first.new_version, replayed=True)
    payload = steering_payload_validate(command_type, payload)
    try:
        return _submit(task=task, command_type=command_type, payload=payload, expected_version=expected_version,
                       reason=reason, requested_by=requested_by, command_id=command_id)
    except IntegrityError:
        # The same commandId for two tasks at once (each under its own task's lock): the other inserted it first;
        # this one's whole transaction, its version bump included, was rolled back.
        first = SteeringCommand.objects.filter(id=command_id).first() if command_id else None
        if first is None:
            raise
        if first.task_id != task.id:  # used at the same instant for another task
            raise CommandRefused("This commandId was already used for another task; send a new one.",
                                 errors=[{"field": "commandId", "message": "Already used."}]) from None
        return Submitted(command=first, state_version=first.new_version, replayed=True)


def _submit(*, task: Task, command_type: str, payload: dict, expected_version: int | None, reason: str,
            requested_by: str, command_id: uuid.UUID | None) -> Submitted:
    with transaction.atomic():
        # Lock first: the version, the status and the event chain's head must not move between this read and
        # the guarded UPDATE below (two submissions at once: the second waits here, then sees the new version).
        row = Task.objects.select_for_update(no_key=True).values(
            "status", "state_version", "lease_owner", "event_seq", "event_head_hash").get(id=task.id)
        # The same commandId sent twice at once: the first committed while this one waited for the lock.
        first = SteeringCommand.objects.filter(id=command_id, task_id=task.id).first() if command_id else None
        if first is not None:
            return Submitted(command=first, state_version=first.new_version, replayed=True)
        if expected_version is not None and row["state_version"] != expected_version:
            raise VersionConflict(
                f"The task is at version {row['state_version']}, not {expected_version}: it changed since you read "
                f"it. Read the snapshot (below), decide again, and send its stateVersion as expectedVersion.",
                currentVersion=row["state_version"])
        status = TaskStatus(row["status"])
        _refuse_for_status(command_type, status)
        command = SteeringCommand(id=command_id or uuid.uuid4(), task_id=task.id, type=command_type,
                                  payload=payload, expected_version=expected_version,
                                  old_version=row["state_version"], new_version=row["state_version"] + 1,
                                  requested_by=requested_by, reason=reason)
        updates, events, applied = _apply_now(command, status, leased=row["lease_owner"] is not None)
        if applied:
            updates["steering_cursor"] = command.new_version  # decided: a worker's safe point will skip it
        chained, seq, head = chain_events(task.id, events, seq=row["event_seq"], head=row["event_head_hash"])
        rows = Task.objects.filter(id=task.id, state_version=row["state_version"], status=row["status"]).update(
            state_version=command.new_version, event_seq=seq, event_head_hash=head, updated_at=Now(), **updates)
        if rows != 1:  # cannot happen under the lock; a guarded UPDATE still says so rather than assume
            raise InvalidTransition("The task changed during the submission; send it again.")
        command.save(force_insert=True)
        TaskEvent.objects.bulk_create(chained)
        if updates.get("hint_at") is not None:  # resumed, or killed: a worker must come for it
            transaction.on_commit(lambda: task_dispatch(task.id, priority=task.priority))
    return Submitted(command=command, state_version=command.new_version, replayed=False)


def steering_cancel(*, task: Task, reason: str = "", requested_by: str) -> Task:
    """POST /runtime/tasks/{id}/cancel: a cancel command without a version check. Asking again while it is
    cancelling or once it is cancelled changes nothing; a finished task is refused (409) saying why."""
    try:
        steering_submit(task=task, command_type=CommandType.CANCEL, expected_version=None, reason=reason,
                        requested_by=requested_by)
    except CommandRefused:
        task.refresh_from_db()
        if task.status in CANCEL_REQUESTED:
            return task
        if task.status in CANCEL_TOO_LATE:
            raise InvalidTransition(CANCEL_TOO_LATE[TaskStatus(task.status)], currentStatus=task.status) from None
        raise
    task.refresh_from_db()
    return task


def _apply_now(command: SteeringCommand, status: TaskStatus, *, leased: bool) -> tuple[dict, list, bool]:
    """What the submission itself writes: (task updates, events, whether the command is decided by it). A command
    a worker must apply (the task is leased, or only its worker can make the move) is left to its next safe point;
    a pause or cancel of a working task shows at once as pausing / cancelling."""
    if command.type == CommandType.RESUME:  # only a paused task, which no worker holds
        message = "Resumed: waiting for a worker"
        return ({"status": TaskStatus.WORKING, "status_message": message, "hint_at": Now()},
                [applied_event(command), status_event(TaskStatus.WORKING, message)], True)
    stepping = status in (TaskStatus.WORKING, TaskStatus.RECOVERING, TaskStatus.PAUSING, TaskStatus.CANCELLING)
    running = leased or stepping
    if command.type == CommandType.KILL and stepping:
        # Without waiting for the running step: its worker is fenced out (clearing the lease owner makes its next
        # write or renewal fail, so it abandons the attempt), and the next claim — any worker — stops the task as
        # cancelling, reconciling the in-flight effect like a crash's first (its outcome is never assumed).
        message = f"Killed by an operator: {command.reason}"[:500]
        return ({"status": TaskStatus.CANCELLING, "status_message": message, "lease_owner": None,
                 "lease_expires_at": None, "hint_at": Now()},
                [applied_event(command), status_event(TaskStatus.CANCELLING, message, reason=command.reason)], True)
    if running and command.type != CommandType.KILL:  # (a kill of a claimed, not yet started task: below)
        if command.type == CommandType.PAUSE and status == TaskStatus.WORKING:
            message = "Pausing at the next safe point"
            return {"status": TaskStatus.PAUSING, "status_message": message}, [status_event(TaskStatus.PAUSING,
                                                                                          message)], False
        if command.type == CommandType.CANCEL and status in (TaskStatus.WORKING, TaskStatus.PAUSING):
            message = "Cancelling at the next safe point"
            return ({"status": TaskStatus.CANCELLING, "status_message": message},
                    [status_event(TaskStatus.CANCELLING, message, reason=command.reason)], False)
        return {}, [], False
    # No worker holds it (queued without a lease, paused, waiting): what needs no worker happens now.
    if command.type == CommandType.SET_PRIORITY:
        return {"priority": command.payload["priority"]}, [applied_event(command)], True
    if command.type in (CommandType.CANCEL, CommandType.KILL):
        # Clearing the lease fences out a worker that claimed a queued task but has not started a step.
        return ({"status": TaskStatus.CANCELLED, "status_message": "Cancelled", "completed_at": Now(),
                 "hint_at": None, "lease_owner": None, "lease_expires_at": None},
                [applied_event(command), *transition_events(TaskStatus.CANCELLED, "Cancelled", reason=command.reason)],
                True)
    if command.type == CommandType.PAUSE and status == TaskStatus.INPUT_REQUIRED:  # no worker would come for it
        return ({"status": TaskStatus.PAUSED, "status_message": "Paused"},
                [applied_event(command), status_event(TaskStatus.PAUSED, "Paused")], True)
    return {}, [], False  # a pause of a queued task: its worker pauses it before the first step


def steering_history(*, task: Task) -> list[dict]:
    """The task's commands, newest first, each with what became of it (from the events that record it)."""
    outcomes = {event.data["commandId"]: event for event in TaskEvent.objects.filter(
        task_id=task.id, type__in=STEERING_OUTCOME_EVENTS).order_by("seq")}
    history = []
    for command in SteeringCommand.objects.filter(task_id=task.id).order_by("-new_version"):
        outcome = outcomes.get(str(command.id))
        history.append({
            "commandId": str(command.id), "type": command.type, "payload": command.payload,
            "status": "pending" if outcome is None else outcome.type.removeprefix("steering."),
            "requestedBy": command.requested_by, "reason": command.reason,
            "expectedVersion": command.expected_version, "oldVersion": command.old_version,
            "newVersion": command.new_version, "createdAt": command.created_at,
            "appliedAt": outcome.at if outcome is not None and outcome.type == "steering.applied" else None,
            "rejection": outcome.data.get("why") if outcome is not None and outcome.type == "steering.rejected"
            else None,
        })
    return history


def requested_by_of(request) -> str:
    token = getattr(request, "auth", None)
    if token is not None and getattr(token, "prefix", ""):
        return f"token:{token.prefix}"
    return f"user:{request.user.username}"

