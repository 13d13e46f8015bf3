"""Steering reads: a task's commands and what became of them."""

from __future__ import annotations

from steering_app.application import reason_shown
from steering_app.models import SteeringCommand
from tasks_app.models import STEERING_OUTCOME_EVENTS, Task, TaskEvent
from tasks_app.redaction import redact_json


def steering_history(*, task: Task) -> list[dict]:
    """The task's commands, newest first, each with what became of it (from the events that record it)."""
    outcomes = {event.data["commandId"]: event for event in TaskEvent.objects.filter(
        task_id=task.id, type__in=STEERING_OUTCOME_EVENTS).order_by("seq")}
    history = []
    for command in SteeringCommand.objects.filter(task_id=task.id).order_by("-new_version"):
        outcome = outcomes.get(str(command.id))
        history.append({
            "commandId": str(command.id), "type": command.type, "payload": redact_json(command.payload),
            "status": "pending" if outcome is None else outcome.type.removeprefix("steering."),
            "requestedBy": command.requested_by, "reason": reason_shown(command.reason),
            "expectedVersion": command.expected_version, "oldVersion": command.old_version,
            "newVersion": command.new_version, "createdAt": command.created_at,
            "appliedAt": outcome.at if outcome is not None and outcome.type == "steering.applied" else None,
            "rejection": outcome.data.get("why") if outcome is not None and outcome.type == "steering.rejected"
            else None,
        })
    return history


def steering_changes_since(*, task: Task, version: int) -> list[dict]:
    """The commands accepted after someone read the task at ``version``, oldest first: each one moved the task's
    stateVersion on by one, so they are exactly what changed since (what a stale form is told when it is refused)."""
    return [{"type": command.type, "requestedBy": command.requested_by, "createdAt": command.created_at,
             "newVersion": command.new_version}
            for command in SteeringCommand.objects.filter(task_id=task.id, new_version__gt=version)
            .order_by("new_version")]
