"""Applying steering commands: what a command changes and the events that record its outcome.

Two places apply them, with the same outcome events (applied_event / rejected_event):
- at submission (apply_now), inside the submission's transaction, when no worker holds the task and the command
  can take effect without one (steering_app.services._submit writes what it returns);
- at the task's safe points (steering_safe_point), the handler the engine calls between steps
  (tasks_app.engine.safepoints; registered in SteeringConfig.ready()).

At a safe point, the pending commands are applied in order. The engine passes the task's state_version as its
last commit or claim returned it, and the steering cursor (the newest version already decided, from the task row
or checkpoint). Equal: nothing was submitted since, and this costs no query — a worker learns of a command from
its commit, never by polling. Otherwise the commands after the cursor are read (one indexed query) and folded into
one decision the engine writes fenced, with the step it follows: the task change, a `steering.applied` or
`steering.rejected` event per command and the new cursor. A stop (pause, cancel) ends the fold, and so does a
re-plan (adjust_goal): the engine asks again for the commands after it.

Commands decided at their submission (resume, the answers to a wait, …) while earlier ones were still pending
left the cursor behind them; they already have their outcome event, so they are skipped here, never applied twice.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from django.db.models import Exists, OuterRef, TextField
from django.db.models.fields.json import KT
from django.db.models.functions import Cast, Now

from steering_app.models import CommandType, SteeringCommand
from steering_app.validation import ANSWER_KEYS
from tasks_app.engine import waits
from tasks_app.engine.safepoints import PlanAdjustment, SafePoint, SafePointDecision
from tasks_app.events import artifact_event, input_required_event, status_event, transition_events
from tasks_app.models import KILLED_PREFIX, STEERING_OUTCOME_EVENTS, TaskEvent, TaskStatus
from tasks_app.redaction import redact
from tasks_app.registry import goal_parameters

# A task is created at state_version 1 with its steering cursor at 0: its first command moves it to 2.
CREATED_AT_VERSION = 1


def reason_shown(reason: str) -> str:
    """A command's reason as events and the task's messages carry it: redacted (the command row keeps it whole,
    for the audit views, which redact it again when they show it)."""
    return redact(reason)


def applied_event(command: SteeringCommand, **extra) -> tuple[str, dict]:
    return "steering.applied", {"commandId": str(command.id), "type": command.type, "version": command.new_version,
                                "requestedBy": command.requested_by, "reason": reason_shown(command.reason), **extra}


def rejected_event(command: SteeringCommand, why: str) -> tuple[str, dict]:
    return "steering.rejected", {"commandId": str(command.id), "type": command.type, "version": command.new_version,
                                 "requestedBy": command.requested_by, "reason": reason_shown(command.reason),
                                 "why": why}


def killed_message(command: SteeringCommand) -> str:
    """A kill's status message, kept when the task ends cancelled (db/sql.py STOP_AT_SAFE_POINT keeps any message
    that starts with KILLED_PREFIX), so a killed task shows who killed it and why."""
    return f"{KILLED_PREFIX}{command.requested_by}: {reason_shown(command.reason)}"[:500]


def goal_adjusted(goal: Any, payload: dict) -> Any:
    """The goal after an adjust_goal: ``goal`` replaced, and/or ``parameters`` merged over the current ones."""
    new = payload["goal"] if "goal" in payload else goal
    if "parameters" not in payload:
        return new
    adjusted = dict(new) if isinstance(new, dict) else ({} if new is None else {"text": new})
    adjusted["parameters"] = {**goal_parameters(new), **payload["parameters"]}
    return adjusted


# ---------------------------------------------------------------------------------------------------------------
# At submission
# ---------------------------------------------------------------------------------------------------------------
def apply_now(command: SteeringCommand, status: TaskStatus, *, leased: bool, wait: dict | None,
              answers: dict, usage: dict | None = None) -> tuple[dict, list, bool]:
    """What the submission itself writes: (task updates, events, whether the command is decided by it). A command
    a worker must apply (the task is leased, or only its worker can make the move) is left to its next safe point;
    a pause or cancel of a working task shows at once as pausing / cancelling. ``usage``: the task row's budgets and
    what it used (steps_completed, cost_spent, tokens_spent, budget_steps, budget_cost, budget_tokens)."""
    if command.type == CommandType.RESUME:  # only a paused task, which no worker holds
        if wait is not None:  # paused while waiting: it waits again, for the same answer
            message = f"Resumed: {wait['prompt']}"[:500]
            return ({"status": TaskStatus.INPUT_REQUIRED, "status_message": message},
                    [applied_event(command), status_event(TaskStatus.INPUT_REQUIRED, message)], True)
        message = "Resumed: waiting for a worker"
        return ({"status": TaskStatus.WORKING, "status_message": message, "hint_at": Now()},
                [applied_event(command), status_event(TaskStatus.WORKING, message)], True)
    if command.type in ANSWER_KEYS:  # checked: the task waits (input_required, or paused in a wait), unleased
        return _answer_now(command, status, wait, answers)
    if command.type == CommandType.ADJUST_GOAL:
        if wait is None or leased:
            return {}, [], False  # its worker re-plans at the next safe point (a paused task's, once resumed)
        # The open wait belongs to the old plan: it is superseded (the re-plan decides whether to ask again), and
        # a waiting task goes back to a worker to re-plan.
        updates = {"wait": None, "answers": {**answers, wait["waitId"]: {
            "kind": wait["kind"], "name": wait["name"], "step": wait.get("step"), "superseded": "adjust_goal",
            "commandId": str(command.id)}}}
        if status != TaskStatus.INPUT_REQUIRED:
            return updates, [], False
        message = "Re-planning: the goal was adjusted"
        return ({**updates, "status": TaskStatus.WORKING, "status_message": message, "hint_at": Now()},
                [status_event(TaskStatus.WORKING, message)], False)
    stepping = status in (TaskStatus.WORKING, TaskStatus.RECOVERING, TaskStatus.PAUSING, TaskStatus.CANCELLING)
    running = leased or stepping
    if command.type == CommandType.SET_BUDGET:
        if running:
            # Its worker applies it at the next safe point and decides on the new budgets before the next step. Race:
            # a worker entering the budget wait meanwhile — its entry is guarded on this version (sql.ENTER_WAIT).
            return {}, [], False
        return _budget_now(command, status, wait, usage or {})
    if command.type == CommandType.KILL and stepping:
        # Without waiting for the running step: its worker is fenced out (clearing the lease owner makes its next
        # write or renewal fail, so it abandons the attempt), and the next claim — any worker — stops the task as
        # cancelling, reconciling the in-flight effect like a crash's first (its outcome is never assumed).
        message = killed_message(command)
        return ({"status": TaskStatus.CANCELLING, "status_message": message, "lease_owner": None,
                 "lease_expires_at": None, "hint_at": Now()},
                [applied_event(command),
                 status_event(TaskStatus.CANCELLING, message, reason=reason_shown(command.reason))], True)
    if running and command.type != CommandType.KILL:  # (a kill of a claimed, not yet started task: below)
        # A stepping task that no worker holds is parked (waiting for a call's deadline, a downstream task, a server
        # to come back): its hint is due only when that wait ends — minutes, maybe. A worker is sent now instead, to
        # apply the stop at its first safe point (a claim is fenced, so the parked hint arriving later does nothing).
        woken = {} if leased else {"hint_at": Now()}
        if command.type == CommandType.PAUSE and status == TaskStatus.WORKING:
            message = "Pausing at the next safe point"
            return ({"status": TaskStatus.PAUSING, "status_message": message, **woken},
                    [status_event(TaskStatus.PAUSING, message)], False)
        if command.type == CommandType.CANCEL and status in (TaskStatus.WORKING, TaskStatus.PAUSING):
            message = "Cancelling at the next safe point"
            return ({"status": TaskStatus.CANCELLING, "status_message": message, **woken},
                    [status_event(TaskStatus.CANCELLING, message, reason=reason_shown(command.reason))], False)
        return {}, [], False
    # No worker holds it (queued without a lease, paused, waiting): what needs no worker happens now.
    if command.type == CommandType.SET_PRIORITY:
        return {"priority": command.payload["priority"]}, [applied_event(command)], True
    if command.type in (CommandType.CANCEL, CommandType.KILL):
        # Clearing the lease fences out a worker that claimed a queued task but has not started a step.
        # A kill that finds no step running is a cancel now, but it still reads as a kill (who, why) wherever the
        # status shows: the console's status label keys on the message (tasks_app.web.console.status_shown).
        message = killed_message(command) if command.type == CommandType.KILL else "Cancelled"
        return ({"status": TaskStatus.CANCELLED, "status_message": message, "completed_at": Now(),
                 "hint_at": None, "lease_owner": None, "lease_expires_at": None, "wait": None},
                [applied_event(command),
                 *transition_events(TaskStatus.CANCELLED, message, reason=reason_shown(command.reason))], True)
    if command.type == CommandType.PAUSE and status == TaskStatus.INPUT_REQUIRED:  # no worker would come for it
        return ({"status": TaskStatus.PAUSED, "status_message": "Paused"},
                [applied_event(command), status_event(TaskStatus.PAUSED, "Paused")], True)
    return {}, [], False  # a pause of a queued task: its worker pauses it before the first step


def _answer_now(command: SteeringCommand, status: TaskStatus, wait: dict, answers: dict) -> tuple[dict, list, bool]:
    """Resolve the open wait: the answer is stored by wait id, the wait cleared, and a waiting task goes back to a
    worker (a paused one stays paused: resume continues it)."""
    payload = command.payload
    answer = {"kind": wait["kind"], "name": wait["name"], "step": wait.get("step"), "by": command.requested_by,
              "commandId": str(command.id)}
    events = []
    if command.type == CommandType.PROVIDE_INPUT:
        files = payload.get("files", [])
        earlier = answers.get(wait["waitId"], {})
        answer.update(value=payload.get("value"),
                      files={**earlier.get("files", {}), **{f["name"]: f["ref"] for f in files}},
                      credentials={**earlier.get("credentials", {}), **payload.get("credentials", {})})
        events += [artifact_event(name=f["artifact"], ref=f["ref"], size=f["bytes"]) for f in files]
        value = payload.get("value")
        outcome = {"fields": sorted(value) if isinstance(value, dict) else [], "files": [f["name"] for f in files],
                   "credentials": sorted(payload.get("credentials", {}))}
        message = f"Input received for {wait['name']!r}"
        if wait.get("parts"):  # answered part by part (or whole): the task waits until every part is
            answered = {**(earlier.get("parts") or {}),
                        **({payload["part"]: value} if "part" in payload else dict(value))}
            complete = set(answered) >= set(wait["parts"])
            answer.update(parts=answered, value=answered if complete else None, complete=complete)
            outcome["part"] = payload.get("part")
            if not complete:
                events.insert(0, applied_event(command, waitId=wait["waitId"], **outcome))
                return ({"answers": {**answers, wait["waitId"]: answer},
                         "wait": {**wait, "answeredParts": sorted(answered)}}, events, True)
    else:
        decision = "approved" if command.type == CommandType.APPROVE else "rejected"
        answer.update(decision=decision, effectKey=wait["effect"]["key"], reason=reason_shown(command.reason))
        outcome = {"effect": wait["effect"]["name"], "decision": decision}
        message = f"{wait['effect']['name']} {decision}"
    updates = {"answers": {**answers, wait["waitId"]: answer}, "wait": None}
    events.insert(0, applied_event(command, waitId=wait["waitId"], **outcome))
    if status == TaskStatus.INPUT_REQUIRED:
        message = f"{message}: waiting for a worker"
        updates.update(status=TaskStatus.WORKING, status_message=message, hint_at=Now())
        events.append(status_event(TaskStatus.WORKING, message))
    return updates, events, True


def _budget_now(command: SteeringCommand, status: TaskStatus, wait: dict | None,
                usage: dict) -> tuple[dict, list, bool]:
    """set_budget for a task no worker holds: the new budgets, now. A task in the budget wait whose budgets now allow
    it goes back to a worker (a paused one stays paused with its wait cleared: resume continues it); one they still
    do not allow keeps waiting, its wait saying where it stands now."""
    payload = command.payload
    limits = {"max_steps": payload.get("maxSteps", usage.get("budget_steps")),
              "max_cost": payload.get("maxCost", usage.get("budget_cost")),
              "max_tokens": payload.get("maxTokens", usage.get("budget_tokens"))}
    if limits["max_cost"] is not None:
        limits["max_cost"] = Decimal(str(limits["max_cost"]))
    updates = {"budget_steps": limits["max_steps"], "budget_cost": limits["max_cost"],
               "budget_tokens": limits["max_tokens"]}
    if not wait or wait["kind"] != waits.BUDGET:
        return updates, [applied_event(command, budget=payload)], True
    used = {"steps": usage["steps_completed"], "cost": usage["cost_spent"], "tokens": usage["tokens_spent"], **limits}
    spent = waits.budgets_spent(**used)
    if spent:  # not enough yet
        still = waits.budget_wait(task_id=command.task_id, steps_completed=usage["steps_completed"],
                                  plan_version=wait.get("planVersion", 1), spent=spent,
                                  figures=waits.budget_figures(**used))
        updates["wait"] = still
        if status == TaskStatus.INPUT_REQUIRED:
            updates["status_message"] = f"Waiting for a budget: {still['prompt']}"[:500]
        return updates, [applied_event(command, budget=payload, waitId=wait["waitId"], stillSpent=spent),
                         input_required_event(still)], True
    updates["wait"] = None
    events = [applied_event(command, budget=payload, waitId=wait["waitId"])]
    if status == TaskStatus.INPUT_REQUIRED:
        message = "Budget raised: waiting for a worker"
        updates.update(status=TaskStatus.WORKING, status_message=message, hint_at=Now())
        events.append(status_event(TaskStatus.WORKING, message))
    return updates, events, True


# ---------------------------------------------------------------------------------------------------------------
# At a safe point
# ---------------------------------------------------------------------------------------------------------------
_NOT_AT_A_SAFE_POINT = {
    CommandType.RESUME: "`resume` does not apply to a running task.",
    CommandType.PROVIDE_INPUT: "The task is not waiting for input.",
    CommandType.APPROVE: "The task is not waiting for an approval.",
    CommandType.REJECT: "The task is not waiting for an approval.",
}


def steering_safe_point(point: SafePoint) -> SafePointDecision | None:
    """The engine's safe-point handler: the decision for the commands submitted since the cursor, or None when
    there is nothing to decide (see the module's docstring)."""
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
            if command.type == CommandType.SET_BUDGET and decision.budget:
                # A later set_budget, decided at its submission (no worker held the task then), wrote its budgets to
                # the row: an earlier one applied only now must not write over them.
                decision.budget = {k: v for k, v in decision.budget.items() if k not in command.payload}
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
        elif command.type == CommandType.SET_BUDGET:  # (the engine decides on the new budgets before the next step)
            decision.budget = {**(decision.budget or {}), **command.payload}
            decision.events.append(applied_event(command, budget=command.payload))
        else:  # e.g. a resume that raced a worker's claim of a task that was not paused after all
            decision.events.append(rejected_event(command, _NOT_AT_A_SAFE_POINT.get(
                command.type, f"`{command.type}` does not apply to a running task.")))
    return decision if decision.steering_cursor is not None else None
