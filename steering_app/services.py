"""Submitting steering commands: one compare-and-set on the task's state_version, the command queued durably.

What a command does happens at the task's next safe point, written by its worker together with the step it
follows (steering_app.safepoint). Only when no worker holds the task and the command can take effect without one
(resume a paused task; answer a waiting one; change a queued task's priority) is it applied here, in the
submission's transaction.
"""

from __future__ import annotations

import base64
import binascii
import re
import uuid
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core.files.base import ContentFile
from django.core.files.storage import default_storage
from django.db import IntegrityError, transaction
from django.db.models.functions import Now
from jsonschema import Draft202012Validator

from config.canonical import nul_paths
from config.problems import Problem
from steering_app.models import CommandType, SteeringCommand
from tasks_app.db.dispatch import task_dispatch
from tasks_app.engine import waits
from tasks_app.events import artifact_event, chain_events, events_insert, status_event, transition_events
from tasks_app.ids import uuid7
from tasks_app.models import STEERING_OUTCOME_EVENTS, TERMINAL_STATUSES, Task, TaskEvent, TaskStatus
from tasks_app.redaction import has_secret_pattern, looks_like_secret, redact, redact_json
from tasks_app.registry import UnknownWorkflow, goal_parameters, registry
from tasks_app.services import CANCEL_REQUESTED, CANCEL_TOO_LATE, InvalidTransition

KILL_PERMISSION = "steering_app.kill_task"
# A task is created at state_version 1 with its steering cursor at 0: its first command moves it to 2.
CREATED_AT_VERSION = 1
_FILE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,80}$")
_FIELD_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,63}$")
# What each answering command may carry besides the wait's id.
_ANSWER_KEYS = {CommandType.PROVIDE_INPUT: {"waitId", "part", "value", "files", "credentials"},
                CommandType.APPROVE: {"waitId"}, CommandType.REJECT: {"waitId"}}
_WAIT_KIND = {CommandType.PROVIDE_INPUT: waits.INPUT, CommandType.APPROVE: waits.APPROVAL,
              CommandType.REJECT: waits.APPROVAL}


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


def _shown(reason: str) -> str:
    """A command's reason as events and the task's messages carry it: redacted (the command row keeps it whole,
    for the audit views, which redact it again when they show it)."""
    return redact(reason)


def applied_event(command: SteeringCommand, **extra) -> tuple[str, dict]:
    return "steering.applied", {"commandId": str(command.id), "type": command.type, "version": command.new_version,
                                "requestedBy": command.requested_by, "reason": _shown(command.reason), **extra}


def rejected_event(command: SteeringCommand, why: str) -> tuple[str, dict]:
    return "steering.rejected", {"commandId": str(command.id), "type": command.type, "version": command.new_version,
                                 "requestedBy": command.requested_by, "reason": _shown(command.reason), "why": why}


def _refused(detail: str, field: str, message: str) -> CommandRefused:
    return CommandRefused(detail, errors=[{"field": field, "message": message}])


def steering_payload_validate(command_type: str, payload: Any, *, task: Task | None = None) -> dict:
    """The payload's shape (what needs the task's current wait is checked under its lock, in _check_answer)."""
    if command_type not in CommandType.values:
        raise CommandRefused(f"Unknown command type {command_type!r}; use one of {', '.join(CommandType.values)}.",
                             errors=[{"field": "type", "message": "Unknown command type."}])
    payload = payload or {}
    if not isinstance(payload, dict):
        raise CommandRefused("The payload must be a JSON object.", errors=[{"field": "payload", "message": "Not an "
                                                                                                          "object."}])
    nul_fields = nul_paths(payload, "payload")
    if nul_fields:
        raise _refused("Text may not contain the NUL character (\\u0000).", nul_fields[0], "Contains a NUL character.")
    if command_type in _ANSWER_KEYS:
        return _answer_payload_validate(command_type, payload)
    if command_type == CommandType.ADJUST_GOAL:
        return _adjust_payload_validate(payload, task)
    if command_type == CommandType.SET_PRIORITY:
        priority = payload.get("priority")
        if not isinstance(priority, int) or isinstance(priority, bool) or not 0 <= priority <= 9 or len(payload) != 1:
            raise CommandRefused("set_priority takes {\"priority\": 0…9} and nothing else.",
                                 errors=[{"field": "payload.priority", "message": "An integer from 0 to 9."}])
    elif payload:
        raise CommandRefused(f"`{command_type}` takes no payload; send {{}} or leave it out.",
                             errors=[{"field": "payload", "message": "Must be empty."}])
    return payload


def _answer_payload_validate(command_type: str, payload: dict) -> dict:
    unknown = sorted(set(payload) - _ANSWER_KEYS[command_type])
    if unknown:
        raise _refused(f"`{command_type}` takes {', '.join(sorted(_ANSWER_KEYS[command_type]))}; not {unknown[0]!r}.",
                       f"payload.{unknown[0]}", "Unknown field.")
    try:
        uuid.UUID(str(payload.get("waitId")))
    except ValueError:
        raise _refused(f"`{command_type}` needs the waitId of the wait it answers (the snapshot's `wait.waitId`).",
                       "payload.waitId", "A wait id (UUID) is required.") from None
    if command_type == CommandType.PROVIDE_INPUT:
        credentials = payload.get("credentials", {})
        if not isinstance(credentials, dict):
            raise _refused("`credentials` maps field names to the names of secrets this deployment holds.",
                           "payload.credentials", "Must be an object.")
        held = settings.RUNTIME.credentials
        for field, name in credentials.items():
            where = f"payload.credentials.{field}"
            if not _FIELD_NAME.match(field):
                raise _refused("Credential field names are letters, digits, '_', '.' or '-'.", "payload.credentials",
                               "Invalid field name.")
            # Never echo the value: it may be the very secret that must not be stored.
            if not isinstance(name, str) or looks_like_secret(name):
                raise _refused("A credential is passed by the name of a secret this deployment holds, never by its "
                               "value; this value looks like a secret, and nothing was stored. Ask an operator to "
                               "add the secret to the deployment and send its name.", where,
                               "Looks like a secret value: send a secret's name.")
            if name not in held:
                raise _refused(f"This deployment holds no secret named {name!r}. Names it holds: "
                               f"{', '.join(held) or 'none (config/runtime.yaml `credentials`)'}.", where,
                               "Unknown secret name.")
        secret_at = _secret_value_path(payload.get("value"), "payload.value")
        if secret_at:
            raise _refused("The answer contains what looks like a secret (a token, key or password); nothing was "
                           "stored. Pass credentials by name in `credentials`.", secret_at, "Looks like a secret.")
        _files_validate(payload.get("files", []))
    return payload


def _secret_value_path(value: Any, path: str) -> str | None:
    """Where a structured answer holds a token, key or password (free text may hold long ids: only the known
    shapes are refused there)."""
    if isinstance(value, str):
        return path if has_secret_pattern(value) else None
    if isinstance(value, dict):
        return next((p for k, v in value.items() if (p := _secret_value_path(v, f"{path}.{k}"))), None)
    if isinstance(value, list):
        return next((p for i, v in enumerate(value) if (p := _secret_value_path(v, f"{path}.{i}"))), None)
    return None


def _files_validate(files: Any) -> None:
    policy = settings.RUNTIME.input_files
    if not isinstance(files, list) or len(files) > policy.max_files:
        raise _refused(f"`files` is a list of at most {policy.max_files} files.", "payload.files", "Too many files.")
    for index, item in enumerate(files):
        where = f"payload.files.{index}"
        if not isinstance(item, dict) or set(item) - {"name", "contentBase64", "contentType"} \
                or not isinstance(item.get("name"), str) or not isinstance(item.get("contentBase64"), str):
            raise _refused("Each file is {\"name\", \"contentBase64\", \"contentType\"?}.", where, "Malformed file.")
        if not _FILE_NAME.match(item["name"]):
            raise _refused("File names are 1–81 letters, digits, '.', '_' or '-'.", f"{where}.name", "Invalid name.")
        try:
            data = base64.b64decode(item["contentBase64"], validate=True)
        except (binascii.Error, ValueError):
            raise _refused("contentBase64 is not valid base64.", f"{where}.contentBase64", "Not base64.") from None
        if len(data) > policy.max_bytes:
            raise _refused(f"A file may have at most {policy.max_bytes} bytes; {item['name']!r} has {len(data)}.",
                           f"{where}.contentBase64", "Too large.")


def _adjust_payload_validate(payload: dict, task: Task | None) -> dict:
    unknown = sorted(set(payload) - {"goal", "parameters"})
    if unknown or not payload:
        raise _refused("adjust_goal takes {\"goal\": <the new goal>} and/or {\"parameters\": {…}} (the workflow's "
                       "goal parameters, GET /runtime/workflows).", f"payload.{unknown[0]}" if unknown else "payload",
                       "Unknown field." if unknown else "Send goal and/or parameters.")
    if "parameters" in payload:
        if not isinstance(payload["parameters"], dict):
            raise _refused("`parameters` must be an object.", "payload.parameters", "Must be an object.")
        if task is not None:
            try:
                workflow = registry.get(task.workflow_name)
            except UnknownWorkflow:
                raise _refused("This task's workflow is not registered here.", "payload", "Unknown workflow.") \
                    from None
            errors = workflow.goal_parameters_errors({**goal_parameters(task.goal), **payload["parameters"]})
            if errors:
                raise CommandRefused(f"The parameters do not match workflow {workflow.name!r}'s goal parameters.",
                                     errors=errors)
    return payload


def goal_adjusted(goal: Any, payload: dict) -> Any:
    """The goal after an adjust_goal: ``goal`` replaced, and/or ``parameters`` merged over the current ones."""
    new = payload["goal"] if "goal" in payload else goal
    if "parameters" not in payload:
        return new
    adjusted = dict(new) if isinstance(new, dict) else ({} if new is None else {"text": new})
    adjusted["parameters"] = {**goal_parameters(new), **payload["parameters"]}
    return adjusted


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
    if command_type == CommandType.ADJUST_GOAL and status == TaskStatus.CANCELLING:
        raise CommandRefused("The task is being cancelled: there is no plan left to adjust.",
                             currentStatus=status.value)


def _check_answer(command: SteeringCommand, status: TaskStatus, wait: dict | None, answers: dict) -> None:
    """provide_input / approve / reject answer exactly the task's open wait, and input must match its schema (a
    wait's part: that part's schema, once)."""
    payload = command.payload
    if wait is None:
        raise CommandRefused(f"The task is {status} and waits for nothing; there is no wait to answer.",
                             currentStatus=status.value)
    if payload["waitId"] != wait["waitId"]:
        raise _refused(f"The task's open wait is {wait['waitId']} ({wait['kind']} {wait['name']!r}), not "
                       f"{payload['waitId']}: it was answered or replaced. Read the snapshot's `wait`.",
                       "payload.waitId", "Not the open wait.")
    if wait["kind"] != _WAIT_KIND[command.type]:
        use = "provide_input" if wait["kind"] == waits.INPUT else "approve or reject"
        raise _refused(f"The open wait is {wait['kind']!r}: answer it with {use}.", "type", f"Use {use}.")
    if command.type == CommandType.PROVIDE_INPUT:
        schema = wait["schema"]
        if "part" in payload:
            parts = wait.get("parts") or {}
            if payload["part"] not in parts:
                raise _refused(f"Wait {wait['name']!r} has no part {payload['part']!r}"
                               + (f"; its parts: {', '.join(parts)}." if parts else "; answer it whole."),
                               "payload.part", "Unknown part.")
            if payload["part"] in (answers.get(wait["waitId"], {}).get("parts") or {}):
                raise _refused(f"Part {payload['part']!r} of wait {wait['name']!r} is already answered.",
                               "payload.part", "Already answered.")
            schema = parts[payload["part"]]["schema"]
        errors = [{"field": ".".join(["payload", "value", *map(str, error.absolute_path)]), "message": error.message}
                  for error in Draft202012Validator(schema).iter_errors(payload.get("value"))]
        if errors:
            raise CommandRefused(f"The value does not match the schema of wait {wait['name']!r}; nothing was stored "
                                 f"and the task still waits.", errors=errors, schema=wait["schema"])


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
            "answers", "priority").get(id=task.id)
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
        command = SteeringCommand(id=command_id or uuid7(), task_id=task.id, type=command_type,
                                  payload=payload, expected_version=expected_version,
                                  old_version=row["state_version"], new_version=row["state_version"] + 1,
                                  requested_by=requested_by, reason=reason)
        if command_type in _ANSWER_KEYS:
            _check_answer(command, status, row["wait"], row["answers"] or {})
        updates, events, applied = _apply_now(command, status, leased=row["lease_owner"] is not None,
                                              wait=row["wait"], answers=row["answers"] or {})
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
        if updates.get("hint_at") is not None:  # resumed, answered or killed: a worker must come for it
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


def _apply_now(command: SteeringCommand, status: TaskStatus, *, leased: bool, wait: dict | None,
               answers: dict) -> tuple[dict, list, bool]:
    """What the submission itself writes: (task updates, events, whether the command is decided by it). A command
    a worker must apply (the task is leased, or only its worker can make the move) is left to its next safe point;
    a pause or cancel of a working task shows at once as pausing / cancelling."""
    if command.type == CommandType.RESUME:  # only a paused task, which no worker holds
        if wait is not None:  # paused while waiting: it waits again, for the same answer
            message = f"Resumed: {wait['prompt']}"[:500]
            return ({"status": TaskStatus.INPUT_REQUIRED, "status_message": message},
                    [applied_event(command), status_event(TaskStatus.INPUT_REQUIRED, message)], True)
        message = "Resumed: waiting for a worker"
        return ({"status": TaskStatus.WORKING, "status_message": message, "hint_at": Now()},
                [applied_event(command), status_event(TaskStatus.WORKING, message)], True)
    if command.type in _ANSWER_KEYS:  # checked: the task waits (input_required, or paused in a wait), unleased
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
    if command.type == CommandType.KILL and stepping:
        # Without waiting for the running step: its worker is fenced out (clearing the lease owner makes its next
        # write or renewal fail, so it abandons the attempt), and the next claim — any worker — stops the task as
        # cancelling, reconciling the in-flight effect like a crash's first (its outcome is never assumed).
        message = f"Killed by an operator: {_shown(command.reason)}"[:500]
        return ({"status": TaskStatus.CANCELLING, "status_message": message, "lease_owner": None,
                 "lease_expires_at": None, "hint_at": Now()},
                [applied_event(command),
                 status_event(TaskStatus.CANCELLING, message, reason=_shown(command.reason))], True)
    if running and command.type != CommandType.KILL:  # (a kill of a claimed, not yet started task: below)
        if command.type == CommandType.PAUSE and status == TaskStatus.WORKING:
            message = "Pausing at the next safe point"
            return {"status": TaskStatus.PAUSING, "status_message": message}, [status_event(TaskStatus.PAUSING,
                                                                                          message)], False
        if command.type == CommandType.CANCEL and status in (TaskStatus.WORKING, TaskStatus.PAUSING):
            message = "Cancelling at the next safe point"
            return ({"status": TaskStatus.CANCELLING, "status_message": message},
                    [status_event(TaskStatus.CANCELLING, message, reason=_shown(command.reason))], False)
        return {}, [], False
    # No worker holds it (queued without a lease, paused, waiting): what needs no worker happens now.
    if command.type == CommandType.SET_PRIORITY:
        return {"priority": command.payload["priority"]}, [applied_event(command)], True
    if command.type in (CommandType.CANCEL, CommandType.KILL):
        # Clearing the lease fences out a worker that claimed a queued task but has not started a step.
        return ({"status": TaskStatus.CANCELLED, "status_message": "Cancelled", "completed_at": Now(),
                 "hint_at": None, "lease_owner": None, "lease_expires_at": None, "wait": None},
                [applied_event(command),
                 *transition_events(TaskStatus.CANCELLED, "Cancelled", reason=_shown(command.reason))], True)
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
        answer.update(decision=decision, effectKey=wait["effect"]["key"], reason=_shown(command.reason))
        outcome = {"effect": wait["effect"]["name"], "decision": decision}
        message = f"{wait['effect']['name']} {decision}"
    updates = {"answers": {**answers, wait["waitId"]: answer}, "wait": None}
    events.insert(0, applied_event(command, waitId=wait["waitId"], **outcome))
    if status == TaskStatus.INPUT_REQUIRED:
        message = f"{message}: waiting for a worker"
        updates.update(status=TaskStatus.WORKING, status_message=message, hint_at=Now())
        events.append(status_event(TaskStatus.WORKING, message))
    return updates, events, True


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
            "requestedBy": command.requested_by, "reason": _shown(command.reason),
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

