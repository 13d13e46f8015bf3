"""Submitting steering commands: one compare-and-set on the task's state_version, the command queued durably.

What a command does happens at the task's next safe point, written by its worker together with the step it
follows (steering_app.application.steering_safe_point). Only when no worker holds the task and the command can take
effect without one (resume a paused task; answer a waiting one; change a queued task's priority or budget) is it
applied here, in the submission's transaction (steering_app.application.apply_now). The checks a command must pass
are in steering_app.validation; the problems it can be answered with, in steering_app.errors.
"""

from __future__ import annotations

import base64
import uuid
from dataclasses import dataclass
from typing import Any

from django.core.files.base import ContentFile
from django.core.files.storage import default_storage
from django.db import IntegrityError, transaction
from django.db.models.functions import Now

from steering_app.application import CREATED_AT_VERSION, apply_now
from steering_app.errors import CommandRefused, KillNotAllowed, VersionConflict
from steering_app.models import CommandType, SteeringCommand
from steering_app.validation import ANSWER_KEYS, check_answer, refuse_for_status, steering_payload_validate
from tasks_app.db.dispatch import task_dispatch
from tasks_app.errors import InvalidTransition
from tasks_app.events import chain_events, events_insert
from tasks_app.ids import uuid7
from tasks_app.models import Task, TaskStatus

KILL_PERMISSION = "steering_app.kill_task"

# The cancel shorthand (steering_cancel): a cancel already asked for is answered with the task as it is, and a
# finished task's 409 says why it is too late.
CANCEL_REQUESTED = frozenset({TaskStatus.CANCELLING, TaskStatus.CANCELLED})
CANCEL_TOO_LATE = {
    TaskStatus.COMPLETED: "The task already completed; a finished task cannot be cancelled.",
    TaskStatus.FAILED: "The task already failed; a finished task cannot be cancelled.",
    TaskStatus.DEAD_LETTERED: "The task is dead-lettered: an operator retries or abandons it; it cannot be "
                              "cancelled.",
}


# What set_budget decides on at submission (application.apply_now's usage): the budgets and what the task used.
_USAGE = ("steps_completed", "cost_spent", "tokens_spent", "budget_steps", "budget_cost", "budget_tokens")


@dataclass(frozen=True)
class Submitted:
    command: SteeringCommand
    state_version: int
    replayed: bool  # the same commandId again: the first answer, nothing new queued


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
    payload = steering_payload_validate(command_type, payload, task=task)
    if command_type == CommandType.PROVIDE_INPUT and payload.get("files"):
        # Stored before the transaction (no lock held across storage I/O), each under a fresh name: a submission
        # refused below leaves an unreferenced file, never a changed one. The command keeps the references.
        payload = {**payload, "files": _input_files_store(task, payload["files"])}
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


def _input_files_store(task: Task, files: list[dict]) -> list[dict]:
    stored = []
    for item in files:
        data = base64.b64decode(item["contentBase64"], validate=True)
        ref = default_storage.save(f"tasks/{task.id}/input/{uuid.uuid4().hex[:12]}-{item['name']}", ContentFile(data))
        stored.append({"name": item["name"], "artifact": f"input.{item['name']}", "ref": ref, "bytes": len(data),
                       "contentType": str(item.get("contentType", ""))[:100]})
    return stored


def _submit(*, task: Task, command_type: str, payload: dict, expected_version: int | None, reason: str,
            requested_by: str, command_id: uuid.UUID | None) -> Submitted:
    with transaction.atomic():
        # Lock first: the version, the status and the event chain's head must not move between this read and
        # the guarded UPDATE below (two submissions at once: the second waits here, then sees the new version).
        row = Task.objects.select_for_update(no_key=True).values(
            "status", "state_version", "steering_cursor", "lease_owner", "event_seq", "event_head_hash", "wait",
            "answers", "priority", *_USAGE).get(id=task.id)
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
        refuse_for_status(command_type, status)
        command = SteeringCommand(id=command_id or uuid7(), task_id=task.id, type=command_type,
                                  payload=payload, expected_version=expected_version,
                                  old_version=row["state_version"], new_version=row["state_version"] + 1,
                                  requested_by=requested_by, reason=reason)
        if command_type in ANSWER_KEYS:
            check_answer(command, status, row["wait"], row["answers"] or {})
        updates, events, applied = apply_now(command, status, leased=row["lease_owner"] is not None,
                                              wait=row["wait"], answers=row["answers"] or {},
                                              usage={name: row[name] for name in _USAGE})
        if applied and row["state_version"] <= max(row["steering_cursor"], CREATED_AT_VERSION):
            # Decided, and nothing before it is pending: the cursor moves past it. With commands still pending
            # (e.g. an adjust_goal for a paused task's worker), it stays; the worker's safe point skips the
            # decided ones (their outcome events say so) and moves it.
            updates["steering_cursor"] = command.new_version
        chained, seq, head = chain_events(task.id, events, seq=row["event_seq"], head=row["event_head_hash"])
        rows = Task.objects.filter(id=task.id, state_version=row["state_version"], status=row["status"]).update(
            state_version=command.new_version, event_seq=seq, event_head_hash=head, updated_at=Now(), **updates)
        if rows != 1:  # cannot happen under the lock; a guarded UPDATE still says so rather than assume
            raise InvalidTransition("The task changed during the submission; send it again.")
        command.save(force_insert=True)
        events_insert(chained, tenant_id=task.tenant_id)
        if updates.get("hint_at") is not None:  # resumed, answered, budget raised or killed: a worker must come
            priority = updates.get("priority", row["priority"])
            transaction.on_commit(lambda: task_dispatch(task.id, priority=priority))
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
