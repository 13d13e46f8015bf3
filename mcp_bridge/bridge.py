"""What the MCP methods do, over the runtime's services and selectors (synchronous: the server module runs each
in a thread). Every read and write is scoped to the principal's tenant: another tenant's task id is not found,
exactly as an unknown one is.
"""

from __future__ import annotations

import json
import logging
import uuid
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.core import signing
from django.core.serializers.json import DjangoJSONEncoder
from django.db.models import Q
from django.utils import timezone
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS

from config.base.json_input import bounded_copy, dumps_bounded
from config.base.problems import Problem
from mcp_bridge import auth, mapping
from mcp_bridge.auth import FORK_TOOL, STEER_TOOL, Principal
from steering_app import services as steering
from steering_app.errors import CommandRefused, VersionConflict
from tasks_app import access, forks, selectors
from tasks_app.errors import IdempotencyKeyReused, InvalidIdempotencyKey, InvalidTransition
from tasks_app.models import Task, TaskStatus
from tasks_app.registry import UnknownWorkflow, Workflow, registry
from tasks_app.services import task_create
from tasks_app.web.artifacts import artifact_content_type

logger = logging.getLogger(__name__)

TASK_NOT_FOUND = "Failed to retrieve task: Task not found"


def retention_days() -> int:
    return settings.RUNTIME.retention_days


def _visible(principal: Principal, workflow: type[Workflow], kind: str) -> bool:
    """Of this MCP kind, one the caller's tenant may run, and a fixture only for the fixture tenant."""
    return (workflow.mcp_kind == kind and principal.tenant.may_run(workflow.name)
            and (not workflow.mcp_fixture or principal.fixture))


def visible_workflows(principal: Principal, kind: str = "tool") -> list[type[Workflow]]:
    """The workflows of one MCP kind the caller may use."""
    return [workflow for workflow in registry.all() if _visible(principal, workflow, kind)]


def workflow_for(principal: Principal, name: str, kind: str = "tool") -> type[Workflow] | None:
    try:
        workflow = registry.get(name)
    except UnknownWorkflow:
        return None
    return workflow if _visible(principal, workflow, kind) else None


def tool_input_schema(name: str) -> dict | None:
    """A tool's inputSchema by name, for the SDK's Mcp-Param header checks (x-mcp-header, SEP-2243)."""
    if name == STEER_TOOL:
        return STEER_INPUT_SCHEMA
    if name == FORK_TOOL:
        return FORK_INPUT_SCHEMA
    try:
        workflow = registry.get(name)
    except UnknownWorkflow:
        return None
    return workflow.input_schema if workflow.mcp_kind == "tool" else None


_CURSOR_SALT = "mcp_bridge.cursor"


def tenant_tasks_page(principal: Principal, cursor: str | None, *, size: int,
                      only: tuple[str, ...] = ()) -> tuple[list[Task], str | None]:
    """A page of the caller's tenant's tasks, newest first, and the cursor of the next page: the last task's
    (created_at, id), signed so that a client cannot forge one (keyset paging, served by task_tenant_created_idx)."""
    tasks = access.visible(auth.access_of(principal), Task.objects.all()).order_by("-created_at", "-id")
    if only:
        tasks = tasks.only(*only)
    if cursor:
        try:
            created_at, task_id = signing.loads(cursor, salt=_CURSOR_SALT)
        except (signing.BadSignature, ValueError, TypeError):
            raise MCPError(INVALID_PARAMS, "Invalid cursor: use nextCursor from the previous page.") from None
        tasks = tasks.filter(Q(created_at__lt=created_at) | Q(created_at=created_at, id__lt=task_id))
    page = list(tasks[:size + 1])
    if len(page) <= size:
        return page, None
    last = page[size - 1]
    return page[:size], signing.dumps([last.created_at.isoformat(), str(last.id)], salt=_CURSOR_SALT)


# The idempotency key an MCP client may send with a task-creating tools/call (this runtime's own client does, as
# agents_app.mcp_client.IDEMPOTENCY_META): the same key answers with the task it created first, as the REST API's
# Idempotency-Key does — so a caller that retries after losing the answer never creates a second task.
IDEMPOTENCY_META = "io.agentruntime/idempotency-key"


def idempotency_key_of(params) -> str | None:
    meta = getattr(params, "meta", None) or {}
    key = meta.get(IDEMPOTENCY_META) if isinstance(meta, dict) else None
    return key if isinstance(key, str) else None


def task_start(principal: Principal, workflow: type[Workflow], arguments: dict, *, foreground: bool = False,
               idempotency_key: str | None = None, trace_context: dict | None = None) -> Task:
    """Create the task; it is committed when this returns (task_create runs outside any transaction), so a
    CreateTaskResult built from it names a task every web process can already read. A task started for a foreground
    call gets a deadline (MCP_FOREGROUND_TASK_SECONDS): a client that walks away from its rounds of input leaves a
    task the reaper ends, not one that waits forever."""
    deadline = timezone.now() + timedelta(seconds=settings.MCP_FOREGROUND_TASK_SECONDS) if foreground else None
    try:
        return task_create(tenant=principal.tenant, owner=principal.user, workflow=workflow.name, input=arguments,
                           deadline_at=deadline, idempotency_key=idempotency_key, trace_context=trace_context,
                           agent_identity=principal.actor,
                           created_by_token_id=principal.access.token_id if principal.access else None).task
    except (InvalidIdempotencyKey, IdempotencyKeyReused) as refused:
        raise MCPError(INVALID_PARAMS, f"{refused.detail} (_meta {IDEMPOTENCY_META!r})") from None


# requestState of a foreground call's rounds (SEP-2322): the task and the tool, signed with SECRET_KEY (every web
# process checks it alike; nothing is kept between rounds) and timestamped. Tampered, expired or another tool's →
# -32602. The task is still read in the caller's tenant: a state cannot reach another tenant's task.
_STATE_SALT = "mcp_bridge.requestState"


def request_state_seal(task: Task, tool: str) -> str:
    return signing.dumps({"task": str(task.id), "tool": tool, "wait": (task.wait or {}).get("waitId")},
                         salt=_STATE_SALT, compress=True)


def request_state_open(principal: Principal, state: str, tool: str) -> Task:
    try:
        sealed = signing.loads(state, salt=_STATE_SALT, max_age=settings.MCP_FOREGROUND_TASK_SECONDS)
    except signing.BadSignature:
        raise MCPError(INVALID_PARAMS, "requestState failed its integrity check (changed, or expired): call the tool "
                       "again without it.") from None
    if sealed.get("tool") != tool:
        raise MCPError(INVALID_PARAMS, "requestState belongs to another tool: echo the one this tool returned.")
    return task_read(principal, sealed["task"])


def task_read(principal: Principal, task_id: Any) -> Task:
    """The caller's task, or -32602 "not found" (for an unknown id, a malformed one and another tenant's alike)."""
    try:
        parsed = uuid.UUID(str(task_id))
    except ValueError:
        raise MCPError(INVALID_PARAMS, TASK_NOT_FOUND) from None
    try:  # (the one access rule, tasks_app.access: another tenant's task is not found, as an unknown one)
        return access.task_for(auth.access_of(principal), access.Action.READ_TASK, parsed)
    except access.AccessNotFound:
        raise MCPError(INVALID_PARAMS, TASK_NOT_FOUND) from None


def artifacts_of(task: Task, artifacts: dict[str, dict] | None = None) -> list[dict]:
    """The task's committed artifacts as a tool result links them (``artifacts``: selectors' by-name dict, if read)."""
    artifacts = selectors.task_artifacts(task_id=task.id) if artifacts is None else artifacts
    return [{"name": name, "uri": mapping.resource_uri(task.id, name), "mimeType": artifact_content_type(name),
             "bytes": artifact["bytes"]} for name, artifact in artifacts.items()]


def tool_result(task: Task, artifacts: dict[str, dict] | None = None) -> dict:
    """A completed task's CallToolResult (the workflow's mcp_result hook, or the default); ``artifacts`` as read by
    the caller, or read here."""
    artifacts = artifacts_of(task, artifacts)
    try:
        return _shaped_result(task, task.result, artifacts)
    except RecursionError:  # (a hook's json.dumps of a result stored deeper than it walks: shaped from it cut)
        return _shaped_result(task, bounded_copy(task.result), artifacts)


def _shaped_result(task: Task, result: Any, artifacts: Any) -> dict:
    try:
        workflow = registry.get(task.workflow_name)()
        shaped = workflow.mcp_result(result, artifacts)
    except UnknownWorkflow:
        shaped = None
    return shaped if shaped is not None else mapping.default_tool_result(result, artifacts)


def detailed_task(task: Task) -> dict:
    result = tool_result(task) if task.status == TaskStatus.COMPLETED else None
    return mapping.detailed_task(task, retention_days=retention_days(), result=result)


def task_get(principal: Principal, task_id: Any) -> dict:
    return detailed_task(task_read(principal, task_id))


def task_answer(principal: Principal, task_id: Any, responses: Any, *, by_name: bool = False) -> int:
    """tasks/update (and the rounds of a foreground call, ``by_name``): each response to a question the task still
    asks becomes provide_input / approve / reject, checked by the steering service. A bad one is -32602 with what
    was wrong, and the task still waits. Unknown or already-answered keys are ignored (the extension: updates are
    eventually consistent and may repeat). Returns how many answers were submitted."""
    if not isinstance(responses, dict):
        raise MCPError(INVALID_PARAMS, "params.inputResponses must be an object: {key from inputRequests: result}.")
    task = task_read(principal, task_id)
    try:
        commands = mapping.answer_commands(task.wait if task.status == TaskStatus.INPUT_REQUIRED else None, responses,
                                           by_name=by_name)
    except mapping.BadAnswer as error:
        raise MCPError(INVALID_PARAMS, str(error), {"taskId": str(task.id)}) from None
    submitted = 0
    for command_type, payload in commands:
        try:
            steering.steering_submit(task=task, command_type=command_type, payload=payload, expected_version=None,
                                     requested_by=principal.actor)
            submitted += 1
        except CommandRefused as refused:
            if already_answered(task, payload):
                continue  # answered meanwhile (a retried update, or another client): nothing to do
            raise MCPError(INVALID_PARAMS, str(refused.detail),
                           {"taskId": str(task.id), "errors": refused.errors or []}) from None
    return submitted


def already_answered(task: Task, payload: dict) -> bool:
    """Is the wait (or part) an answer was refused for no longer open? (Then the refusal changes nothing.)"""
    task.refresh_from_db(fields=["wait", "answers", "status"])
    return payload["waitId"] not in {record["waitId"] for _, record in mapping.open_requests(task.wait).values()} \
        or (payload.get("part") is not None
            and payload["part"] in ((task.wait or {}).get("answeredParts") or ()))


def client_cancel(principal: Principal, task_id: Any) -> Task:
    """tasks/cancel for a client: the one cancel path (steering_cancel: a command applied at the task's next safe
    point); a finished task is acknowledged as it is (the extension: cancellation is cooperative and idempotent)."""
    task = task_read(principal, task_id)
    try:
        return steering.steering_cancel(task=task, reason="cancelled by an MCP client", requested_by=principal.actor)
    except InvalidTransition:
        task.refresh_from_db()
        return task


STEER_ACTIONS = ("pause", "resume", "cancel", "adjust_goal", "set_priority")
STEER_INPUT_SCHEMA = {
    "type": "object",
    "properties": {
        "taskId": {"type": "string", "description": "The task to steer (a taskId from tools/call or tasks/get)."},
        "action": {"enum": list(STEER_ACTIONS)},
        "expectedVersion": {"type": "integer", "minimum": 0, "description": "The stateVersion you last read; a "
                            "task that changed since is not steered (the result carries its current version)."},
        "goal": {"description": "adjust_goal: the new goal."},
        "parameters": {"type": "object", "description": "adjust_goal: goal parameters of the workflow."},
        "priority": {"type": "integer", "minimum": 0, "maximum": 9, "description": "set_priority: 0…9."},
        "reason": {"type": "string", "maxLength": 2000, "description": "Kept in the task's audit trail."},
    },
    "required": ["taskId", "action", "expectedVersion"],
    "additionalProperties": False,
}


def task_steer(principal: Principal, arguments: dict) -> dict:
    """The steer_task tool: one steering command guarded by expectedVersion. A refusal is a tool error (isError)
    the agent can act on — a version conflict carries the task's current stateVersion and snapshot."""
    task = task_read(principal, arguments["taskId"])
    action = arguments["action"]
    payload = {key: arguments[key] for key in ("goal", "parameters") if key in arguments} \
        if action == "adjust_goal" else ({"priority": arguments.get("priority")} if action == "set_priority" else {})
    try:
        submitted = steering.steering_submit(task=task, command_type=action, payload=payload,
                                             expected_version=arguments["expectedVersion"],
                                             reason=arguments.get("reason", ""), requested_by=principal.actor)
    except VersionConflict as conflict:
        task.refresh_from_db()
        return _tool_error(str(conflict.detail), {"error": "version_conflict",
                                                  "currentVersion": conflict.extra["currentVersion"],
                                                  "snapshot": _snapshot(task)})
    except CommandRefused as refused:
        return _tool_error(str(refused.detail), {"error": "refused", "errors": refused.errors or [],
                                                 **{k: v for k, v in refused.extra.items() if k != "schema"}})
    task.refresh_from_db()
    structured = {"commandId": str(submitted.command.id), "stateVersion": submitted.state_version,
                  "replayed": submitted.replayed, "snapshot": _snapshot(task)}
    return {"content": [{"type": "text", "text": f"{action} accepted (stateVersion {submitted.state_version}); "
                         f"the task is {structured['snapshot']['internalStatus']}."}],
            "structuredContent": structured, "isError": False}


FORK_INPUT_SCHEMA = {
    "type": "object",
    "properties": {
        "taskId": {"type": "string", "description": "The task to fork (a taskId from tools/call or tasks/get)."},
        "fromStep": {"type": "integer", "minimum": 1, "description": "The step the fork starts again at (1 = the "
                                                                      "first); the steps before it are inherited."},
        "fromTurn": {"type": "integer", "minimum": 1, "description": "For an agent: the turn the conversation "
                                                                      "starts again at (instead of fromStep)."},
        "goal": {"description": "The fork's goal (default: the original's)."},
        "input": {"type": "object", "description": "The fork's input (default: the original's)."},
    },
    "required": ["taskId"],
    "additionalProperties": False,
}


def task_fork(principal: Principal, arguments: dict) -> dict:
    """The fork_task tool (tasks_app.forks): a new task from a step of one of the caller's; a refusal is a tool
    error the agent can act on."""
    task = task_read(principal, arguments["taskId"])
    try:
        fork = forks.fork_create(original=task, owner=principal.user, actor=principal.actor,
                                 from_step=arguments.get("fromStep"), from_turn=arguments.get("fromTurn"),
                                 **({"goal": arguments["goal"]} if "goal" in arguments else {}),
                                 input=arguments.get("input"))
    except Problem as refused:
        return _tool_error(str(refused.detail), {"error": refused.slug, "errors": refused.errors or []})
    snapshot = _snapshot(fork)
    return {"content": [{"type": "text", "text": f"Forked {task.id} at step {fork.forked_from_step}: task {fork.id} "
                                                 f"is {snapshot['internalStatus']}."}],
            "structuredContent": {"taskId": str(fork.id), "snapshot": snapshot}, "isError": False}


def _snapshot(task: Task) -> dict:
    snapshot = selectors.task_snapshot(task, url_for=lambda path: path)
    # (bounded: a goal, result or error stored deeper than json.dumps walks — written by SQL — comes back cut at the
    # cap with config.base.json_input's marker, where the round trip raised RecursionError: a JSON-RPC internal error)
    return json.loads(dumps_bounded(snapshot, cls=DjangoJSONEncoder))


def _tool_error(text: str, structured: dict) -> dict:
    return {"content": [{"type": "text", "text": text}], "structuredContent": structured, "isError": True}
