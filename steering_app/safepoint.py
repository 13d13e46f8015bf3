"""Steering at safe points: the engine calls this between steps; pending commands are applied in order.

The engine passes the task's state_version as its last commit or claim returned it, and the steering cursor
(the newest version already decided, from the task row or checkpoint). Equal: nothing was submitted since, and
this costs no query — a worker learns of a command from its commit, never by polling. Otherwise the commands
after the cursor are read (one indexed query) and folded into one decision the engine writes fenced, with the
step it follows: the task change, a `steering.applied` or `steering.rejected` event per command and the new
cursor. A stop (pause, cancel) ends the fold: commands after it wait for the next slice.
"""

from __future__ import annotations

from steering_app.models import CommandType, SteeringCommand
from steering_app.services import applied_event, rejected_event
from tasks_app.safepoints import SafePoint, SafePointDecision

# A task is created at state_version 1 with its cursor at 0: its first command moves it to 2.
_CREATED_AT_VERSION = 1


def steering_safe_point(point: SafePoint) -> SafePointDecision | None:
    if point.state_version <= max(point.steering_cursor, _CREATED_AT_VERSION):
        return None  # nothing submitted since the last decision: no query
    commands = SteeringCommand.objects.filter(task_id=point.task_id, new_version__gt=point.steering_cursor,
                                              new_version__lte=point.state_version).order_by("new_version")
    decision = SafePointDecision()
    for command in commands:
        decision.steering_cursor = command.new_version
        if command.type == CommandType.PAUSE:
            decision.events.append(applied_event(command))
            decision.stop = "paused"
            break
        if command.type == CommandType.CANCEL:
            decision.events.append(applied_event(command))
            decision.stop = "cancelled"
            break
        if command.type == CommandType.SET_PRIORITY:
            decision.priority = command.payload["priority"]
            decision.events.append(applied_event(command))
        else:  # e.g. a resume that raced a worker's claim of a task that was not paused after all
            decision.events.append(rejected_event(command, f"`{command.type}` does not apply to a running task."))
    return decision if decision.steering_cursor is not None else None
