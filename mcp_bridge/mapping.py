"""Runtime task ⇄ MCP wire shapes: pure functions, no I/O (the server module reads and writes).

Status: the task's external status (tasks_app.selectors.EXTERNAL_STATUS) is the MCP status; the internal one
(paused, recovering, …) shows in statusMessage. A tool's own failure is a *completed* task whose result has
``isError: true`` (2026-07-28); ``failed`` is a failed or dead-lettered task, with a JSON-RPC shaped ``error``.

Waits → ``inputRequests``. The key of a request is the wait's id (``<waitId>.<part>`` for a part of a wait with
several): wait ids are derived from where the task asked (tasks_app.engine.waits), so a key is unique over the
task's life and the same after a crash and re-entry, as the extension requires.
- an input wait → an elicitation (form mode). Elicitation schemas are flat objects of primitive fields; a wait
  schema that is one is sent as it is and its content is the answer. Any other schema is wrapped as one field
  ``value`` (a primitive) or ``json`` (JSON text, parsed back) — the answer is still checked against the wait's own
  schema by the steering service.
- an approval → a confirm elicitation (``approve``: boolean), its message showing the effect's redacted arguments.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from config.base import json_input
from config.base.json_input import bounded_copy, max_depth, nesting_depth
from tasks_app.engine import waits
from tasks_app.models import TaskStatus
from tasks_app.selectors import DEFAULT_STATUS_MESSAGE, EXTERNAL_STATUS

EXTENSION = "io.modelcontextprotocol/tasks"
RELATED_TASK = "io.modelcontextprotocol/related-task"
SNAPSHOT_META = "agent-runtime/snapshot"
DAY_MS = 86_400_000
_PRIMITIVES = {"string", "number", "integer", "boolean"}
PART_SEPARATOR = "."
# A wait schema may name the request to send for it instead of a form (its answer is that request's result, checked
# against the same schema): {"x-mcp-request": {"method": "sampling/createMessage", "params": {…}}, "type": "object"}.
MCP_REQUEST = "x-mcp-request"
_CAPABILITY_OF = {"elicitation/create": "elicitation", "sampling/createMessage": "sampling", "roots/list": "roots"}


class BadAnswer(ValueError):
    """An inputResponses entry that cannot be an answer (wrong shape); the task still waits."""


def iso(moment: datetime | None) -> str | None:
    return moment.isoformat().replace("+00:00", "Z") if moment else None


def status_message(task) -> str:
    status = TaskStatus(task.status)
    if status == TaskStatus.INPUT_REQUIRED and task.wait:
        return task.wait.get("prompt") or DEFAULT_STATUS_MESSAGE[status]
    return task.status_message or DEFAULT_STATUS_MESSAGE[status]


def poll_interval_ms(task) -> int:
    return 5000 if task.status in (TaskStatus.PAUSED, TaskStatus.INPUT_REQUIRED) else 1000


def task_fields(task, *, retention_days: int) -> dict[str, Any]:
    """The extension's Task: what CreateTaskResult and every DetailedTask carry (ttlMs: the retention purge's, from
    creation; null when tasks are kept forever)."""
    return {"taskId": str(task.id), "status": EXTERNAL_STATUS[TaskStatus(task.status)],
            "statusMessage": status_message(task), "createdAt": iso(task.created_at),
            "lastUpdatedAt": iso(task.updated_at or task.created_at), "ttlMs": retention_days * DAY_MS or None,
            "pollIntervalMs": poll_interval_ms(task)}


def task_error(task) -> dict[str, Any]:
    """A failed or dead-lettered task's error, JSON-RPC shaped (never a stack trace: the message the task kept)."""
    error = task.error if isinstance(task.error, dict) else {}
    message = str(error.get("message") or error.get("reason") or DEFAULT_STATUS_MESSAGE[TaskStatus(task.status)])
    data = {"taskId": str(task.id), "internalStatus": task.status}
    for key in ("type", "reason"):  # (reason: why a task was dead-lettered, e.g. effect_outcome_unknown)
        if error.get(key):
            data[key] = str(error[key])
    code = error.get("code") if isinstance(error.get("code"), int) else -32603
    return {"code": code, "message": message[:2000], "data": data}


# -- waits → inputRequests ------------------------------------------------------------------------------------------
def _is_flat_object(schema: dict) -> bool:
    properties = schema.get("properties")
    return (schema.get("type") == "object" and isinstance(properties, dict) and bool(properties)
            and all(isinstance(p, dict) and p.get("type") in _PRIMITIVES for p in properties.values()))


def elicitation_schema(schema: dict) -> tuple[dict, str | None]:
    """(requestedSchema, wrapper): wrapper None → the content is the answer; "value"/"json" → it is under that
    field (json: as JSON text)."""
    if _is_flat_object(schema):
        return schema, None
    if schema.get("type") in _PRIMITIVES:
        return {"type": "object", "properties": {"value": schema}, "required": ["value"]}, "value"
    return {"type": "object", "required": ["json"], "properties": {"json": {
        "type": "string", "title": "JSON", "description": "The answer as JSON text, matching: "
        + json_input.dumps_bounded(schema, separators=(",", ":"))[:1500]}}}, "json"


def _elicit(message: str, schema: dict) -> dict:
    return {"method": "elicitation/create",
            "params": {"mode": "form", "message": message, "requestedSchema": elicitation_schema(schema)[0]}}


def open_requests(wait: dict | None, *, by_name: bool = False) -> dict[str, tuple[str | None, dict]]:
    """The open wait's unanswered questions: key → (part or None, the wait record). Keys are the wait id (with
    ``.<part>``) for a task, which a client may answer at any time in its life; or, ``by_name``, the wait's (or
    part's) name, for the rounds of one foreground request (SEP-2322 keys are the server's to choose)."""
    if not wait or wait["kind"] == waits.BUDGET:  # (an operator raises a spent budget: set_budget, not an answer)
        return {}
    if wait.get("parts"):
        answered = set(wait.get("answeredParts") or ())
        return {(part if by_name else f"{wait['waitId']}{PART_SEPARATOR}{part}"): (part, wait)
                for part in wait["parts"] if part not in answered}
    return {(wait["name"] if by_name else wait["waitId"]): (None, wait)}


def _question(record: dict, part: str | None) -> tuple[dict, str]:
    if part is not None:
        spec = record["parts"][part]
        return spec["schema"], spec.get("prompt") or record["prompt"]
    return record["schema"], record["prompt"]


def input_request(record: dict, part: str | None) -> dict:
    """One question as the client's request: an approval's confirm form, the request a schema names under
    ``x-mcp-request`` (sampling/createMessage, roots/list: the answer is that request's result), or a form."""
    if record["kind"] == waits.APPROVAL:
        effect = record.get("effect") or {}
        arguments = json_input.dumps_bounded(effect.get("arguments"), sort_keys=True)[:1500]
        return {"method": "elicitation/create", "params": {
            "mode": "form", "message": f"{record['prompt']} Arguments: {arguments}",
            "requestedSchema": {"type": "object", "required": ["approve"], "properties": {"approve": {
                "type": "boolean", "title": f"Approve {effect.get('name', record['name'])}?"}}}}}
    if _is_outcome_question(record, part):
        return {"method": "elicitation/create", "params": {
            "mode": "form", "message": record["prompt"], "requestedSchema": OUTCOME_ELICITATION,
            # The facts the message says in words, as the wait has them (server, tool, arguments, key, sent at,
            # why, annotations, deadline): a client may lay them out itself.
            "_meta": {"agent-runtime/effect": record.get("effect") or {}}}}
    schema, prompt = _question(record, part)
    if isinstance(schema.get(MCP_REQUEST), dict):
        return schema[MCP_REQUEST]
    return _elicit(prompt, schema)


# "Did this effect happen?" (waits.effect_outcome_wait) as a flat form — its wait schema's `result` (any JSON) would
# otherwise make the whole answer one JSON text field. No default: a client preselects nothing (issue 38, build 3).
OUTCOME_ELICITATION = {
    "type": "object", "required": ["outcome"],
    "properties": {
        "outcome": {"type": "string", "title": "Did it happen?", "enum": ["applied", "not_applied", "abandon"],
                    "description": "applied: it happened; not_applied: it did not, call it again with the same key; "
                                   "abandon: fail the task."},
        "result": {"type": "string", "title": "Its result (JSON text, optional, only with applied)",
                   "description": "What it returned, as the step should receive it."},
    },
}


def _is_outcome_question(record: dict, part: str | None) -> bool:
    return part is None and record["kind"] == waits.INPUT and record.get("name") == "effect_outcome" and \
        record.get("schema") == waits.OUTCOME_SCHEMA


def _outcome_answer(content: dict, key: str) -> dict:
    """An OUTCOME_ELICITATION form's content as the wait's answer ({"outcome", "result"?}: result parsed from its
    JSON text); the wait's own schema still checks it (steering_app.validation)."""
    value = {"outcome": content.get("outcome")}
    text = content.get("result")
    if text not in (None, ""):
        try:
            if not isinstance(text, str):
                raise TypeError("not text")
            value["result"] = json_input.loads(text)
        except (TypeError, ValueError):
            raise BadAnswer(f"inputResponses[{key!r}].content.result is not valid JSON text.") from None
    return value


def input_requests(wait: dict | None, *, by_name: bool = False) -> dict[str, dict]:
    return {key: input_request(record, part) for key, (part, record) in open_requests(wait, by_name=by_name).items()}


def capability_of(request: dict) -> str:
    """The client capability a request needs (elicitation, sampling or roots)."""
    return _CAPABILITY_OF.get(request.get("method"), "elicitation")


def detailed_task(task, *, retention_days: int, result: dict | None) -> dict[str, Any]:
    """tasks/get and notifications/tasks: the Task plus what its status carries (``result`` is the CallToolResult
    of a completed task, built by the caller who can read its artifacts)."""
    detailed = task_fields(task, retention_days=retention_days)
    # What the runtime knows beyond the extension's fields: the stateVersion steer_task needs as expectedVersion,
    # the internal status behind "working", progress and phase.
    detailed["_meta"] = {SNAPSHOT_META: {"internalStatus": task.status, "stateVersion": task.state_version,
                                         "progress": task.progress, "phase": task.phase,
                                         "statusUrl": f"/runtime/tasks/{task.id}"}}
    status = detailed["status"]
    if status == "input_required":
        detailed["inputRequests"] = input_requests(task.wait)
    elif status == "completed":
        detailed["result"] = result
    elif status == "failed":
        detailed["error"] = task_error(task)
    return detailed


# -- inputResponses → steering commands -----------------------------------------------------------------------------
def answer_commands(wait: dict | None, responses: dict[str, Any], *, by_name: bool = False) -> list[tuple[str, dict]]:
    """[(command type, payload)] for the responses that answer the open wait; keys that are unknown or already
    answered are skipped (the extension says to ignore them, whatever they carry). Raises BadAnswer for a known
    key whose response has the wrong shape, or a decline of an input (there is no "no answer" to give)."""
    commands = []
    for key, (part, record) in open_requests(wait, by_name=by_name).items():
        if key not in responses:
            continue
        response = responses[key]
        schema, _prompt = _question(record, part)
        if record["kind"] == waits.INPUT and isinstance(schema.get(MCP_REQUEST), dict):
            if not isinstance(response, dict):  # the request's result (CreateMessageResult, ListRootsResult)
                raise BadAnswer(f"inputResponses[{key!r}] must be the result of {schema[MCP_REQUEST]['method']}.")
            value = response
        else:
            value = _elicited(key, record, schema, response)
            if record["kind"] == waits.APPROVAL:
                commands.append(("approve" if value else "reject", {"waitId": record["waitId"]}))
                continue
        payload = {"waitId": record["waitId"], "value": value}
        if part is not None:
            payload["part"] = part
        commands.append(("provide_input", payload))
    return commands


def _elicited(key: str, record: dict, schema: dict, response: Any) -> Any:
    """An ElicitResult's answer: the approval decision, or the form's value."""
    if not isinstance(response, dict) or response.get("action") not in ("accept", "decline", "cancel"):
        raise BadAnswer(f"inputResponses[{key!r}] must be an ElicitResult: {{\"action\": \"accept\", "
                        f"\"content\": {{…}}}} (or decline / cancel).")
    action, content = response["action"], response.get("content")
    if record["kind"] == waits.APPROVAL:
        return action == "accept" and isinstance(content, dict) and content.get("approve") is True
    if action != "accept":
        raise BadAnswer(f"inputResponses[{key!r}] {action}s the question, but the task needs the answer to go "
                        "on; it still waits. Answer it, or cancel the task (tasks/cancel).")
    if not isinstance(content, dict):
        raise BadAnswer(f"inputResponses[{key!r}].content must be an object (the requested form's fields).")
    if not record.get("parts") and _is_outcome_question(record, None):
        return _outcome_answer(content, key)
    return _unwrapped(content, schema, key)


def _unwrapped(content: dict, schema: dict, key: str) -> Any:
    wrapper = elicitation_schema(schema)[1]
    if wrapper is None:
        return content
    if wrapper not in content:
        raise BadAnswer(f"inputResponses[{key!r}].content needs the field {wrapper!r}.")
    if wrapper == "json":
        try:  # (under config.base.json_input's rules: JSON text nested 10,000 levels raised RecursionError, a -32603)
            if not isinstance(content["json"], str):
                raise TypeError("not text")
            return json_input.loads(content["json"])
        except (TypeError, ValueError):
            raise BadAnswer(f"inputResponses[{key!r}].content.json is not valid JSON text.") from None
    return content[wrapper]


# -- results ------------------------------------------------------------------------------------------------------
def resource_uri(task_id, name: str) -> str:
    return f"runtime://tasks/{task_id}/artifacts/{name}"


def default_tool_result(result: Any, artifacts: list[dict]) -> dict[str, Any]:
    """A completed task's CallToolResult: its result as JSON text and structuredContent, a link per artifact."""
    try:
        text = json.dumps(result, default=str)
    except RecursionError:  # stored deeper than json.dumps walks (written by SQL): cut at the cap, as shown anywhere
        result = bounded_copy(result)
        text = json.dumps(result, default=str)
    if nesting_depth(text, stop_above=max_depth()) > max_depth():
        # Deeper than the cap but within json.dumps' reach (300 levels…): the SDK's serializer refuses past about
        # 255 (a JSON-RPC internal error), so structuredContent and the text are cut at the cap too.
        result = bounded_copy(result)
        text = json.dumps(result, default=str)
    content: list[dict] = [{"type": "text", "text": text}]
    for artifact in artifacts:
        content.append({"type": "resource_link", "uri": artifact["uri"], "name": artifact["name"],
                        "mimeType": artifact.get("mimeType") or "application/octet-stream"})
    structured = result if isinstance(result, dict) else {"result": result}
    return {"content": content, "structuredContent": structured, "isError": False}
