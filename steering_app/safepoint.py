"""Steering at safe points: the engine calls this between steps; pending commands are applied in order.

The engine passes the task's state_version as its last commit or claim returned it, and the steering cursor
(the newest version already decided, from the task row or checkpoint). Equal: nothing was submitted since, and
this costs no query — a worker learns of a command from its commit, never by polling. Otherwise the commands
after the cursor are read (one indexed query) and folded into one decision the engine writes fenced, with the
step it follows: the task change, a `steering.applied` or `steering.rejected` event per command and the new
cursor. A stop (pause, cancel) ends the fold, and so does a re-plan (adjust_goal): the engine asks again for the
commands after it.

Commands decided at their submission (resume, the answers to a wait, …) while earlier ones were still pending
left the cursor behind them; they already have their outcome event, so they are skipped here, never applied twice.
"""

from __future__ import annotations

from django.db.models import Exists, OuterRef, TextField
from django.db.models.fields.json import KT
from django.db.models.functions import Cast

from steering_app.models import CommandType, SteeringCommand
from steering_app.services import CREATED_AT_VERSION, applied_event, goal_adjusted, rejected_event
from tasks_app.engine.safepoints import PlanAdjustment, SafePoint, SafePointDecision
from tasks_app.models import STEERING_OUTCOME_EVENTS, TaskEvent

_NOT_AT_A_SAFE_POINT = {
    CommandType.RESUME: "`resume` does not apply to a running task.",
    CommandType.PROVIDE_INPUT: "The task is not waiting for input.",
    CommandType.APPROVE: "The task is not waiting for an approval.",
    CommandType.REJECT: "The task is not waiting for an approval.",
}


def steering_safe_point(point: SafePoint) -> SafePointDecision | None:
    if point.state_version <= max(point.steering_cursor, CREATED_AT_VERSION):
        return None  # nothing submitted since the last decision: no query
    decided = (TaskEvent.objects.filter(task_id=OuterRef("task_id"), type__in=STEERING_OUTCOME_EVENTS)
               .annotate(command_id=KT("data__commandId")).filter(command_id=Cast(OuterRef("id"), TextField())))
    commands = (SteeringCommand.objects.filter(task_id=point.task_id, new_version__gt=point.steering_cursor,
                                               new_version__lte=point.state_version)
                .annotate(decided=Exists(decided)).order_by("new_version"))
    decision = SafePointDecision()
    for command in commands:
        decision.steering_cursor = command.new_version
        if command.decided:
            continue
        if command.type == CommandType.PAUSE:
            decision.events.append(applied_event(command))
            decision.stop = "paused"
            break
        if command.type in (CommandType.CANCEL, CommandType.KILL):
            decision.events.append(applied_event(command))
            decision.stop = "cancelled"
            break
        if command.type == CommandType.ADJUST_GOAL:
            decision.adjust = PlanAdjustment(
                goal=goal_adjusted(point.goal, command.payload), command_id=str(command.id),
                applied=lambda extra, command=command: applied_event(command, **extra),
                refused=lambda why, command=command: rejected_event(command, why))
            break
        if command.type == CommandType.SET_PRIORITY:
            decision.priority = command.payload["priority"]
            decision.events.append(applied_event(command))
        else:  # e.g. a resume that raced a worker's claim of a task that was not paused after all
            decision.events.append(rejected_event(command, _NOT_AT_A_SAFE_POINT.get(
                command.type, f"`{command.type}` does not apply to a running task.")))
    return decision if decision.steering_cursor is not None else None
