"""Validating a steering command: its payload's shape, whether it applies in the task's status, and whether an
answer fits the task's open wait. Pure checks that raise CommandRefused saying what was wrong; nothing is written.

steering_payload_validate runs before the submission's transaction; refuse_for_status and check_answer run inside
it, on the values read under the task row's lock (steering_app.services._submit).
"""

from __future__ import annotations

import base64
import binascii
import re
import uuid
from decimal import Decimal, InvalidOperation
from typing import Any

from django.conf import settings
from jsonschema import Draft202012Validator

from config.base.canonical import nul_paths
from steering_app.errors import CommandRefused
from steering_app.models import CommandType, SteeringCommand
from tasks_app.engine import waits
from tasks_app.models import BUDGET_MAX_TOKENS, TERMINAL_STATUSES, Task, TaskStatus
from tasks_app.redaction import has_secret_pattern, looks_like_secret
from tasks_app.registry import UnknownWorkflow, goal_parameters, registry

_FILE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,80}$")
_FIELD_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,63}$")
# What each answering command may carry besides the wait's id.
ANSWER_KEYS = {CommandType.PROVIDE_INPUT: {"waitId", "part", "value", "files", "credentials"},
               CommandType.APPROVE: {"waitId"}, CommandType.REJECT: {"waitId"}}
_WAIT_KIND = {CommandType.PROVIDE_INPUT: waits.INPUT, CommandType.APPROVE: waits.APPROVAL,
              CommandType.REJECT: waits.APPROVAL}


def _refused(detail: str, field: str, message: str) -> CommandRefused:
    return CommandRefused(detail, errors=[{"field": field, "message": message}])


def steering_payload_validate(command_type: str, payload: Any, *, task: Task | None = None) -> dict:
    """The payload's shape (what needs the task's current wait is checked under its lock, in check_answer)."""
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
    if command_type in ANSWER_KEYS:
        return _answer_payload_validate(command_type, payload)
    if command_type == CommandType.ADJUST_GOAL:
        return _adjust_payload_validate(payload, task)
    if command_type == CommandType.SET_BUDGET:
        return _budget_payload_validate(payload)
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
    unknown = sorted(set(payload) - ANSWER_KEYS[command_type])
    if unknown:
        raise _refused(f"`{command_type}` takes {', '.join(sorted(ANSWER_KEYS[command_type]))}; not {unknown[0]!r}.",
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


# maxCost as budget.maxCost at create (Task.budget_cost: 12 digits, 4 after the point).
_MAX_COST = Decimal(10) ** 8
_SET_BUDGET_HELP = ("set_budget takes any of maxSteps, maxCost, maxTokens: each a number, or null to remove that "
                    "budget.")


def _budget_payload_validate(payload: dict) -> dict:
    """set_budget's payload, with maxCost as exact decimal text (a JSON number such as 0.1 is taken as written)."""
    unknown = sorted(set(payload) - set(waits.BUDGET_NAMES.values()))
    if unknown or not payload:
        raise _refused(_SET_BUDGET_HELP, f"payload.{unknown[0]}" if unknown else "payload",
                       "Unknown field." if unknown else "Send at least one of maxSteps, maxCost, maxTokens.")
    budget = dict(payload)
    for name, low, high in (("maxSteps", 1, 2_147_483_647), ("maxTokens", 0, BUDGET_MAX_TOKENS)):
        value = payload.get(name)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high):
            raise _refused(_SET_BUDGET_HELP, f"payload.{name}", f"A whole number from {low} to {high}, or null.")
    if payload.get("maxCost") is not None:
        cost = payload["maxCost"]
        try:
            if isinstance(cost, bool) or not isinstance(cost, int | float | str):
                raise InvalidOperation
            amount = Decimal(str(cost).strip())
        except InvalidOperation:
            amount = None
        if amount is None or not amount.is_finite() or not 0 <= amount < _MAX_COST \
                or amount.as_tuple().exponent < -4:
            raise _refused(_SET_BUDGET_HELP, "payload.maxCost",
                           f"A number from 0 to under {_MAX_COST:,} with at most 4 decimal places, or null.")
        budget["maxCost"] = f"{amount:.4f}"
    return budget


def refuse_for_status(command_type: str, status: TaskStatus) -> None:
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


def check_answer(command: SteeringCommand, status: TaskStatus, wait: dict | None, answers: dict) -> None:
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
        use = {waits.INPUT: "provide_input", waits.APPROVAL: "approve or reject",
               waits.BUDGET: "set_budget (raise the budget that is spent)"}.get(wait["kind"], "another command")
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
