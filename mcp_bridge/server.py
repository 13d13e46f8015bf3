"""The MCP server: the official SDK's low-level Server, stateless Streamable HTTP, over runtime tasks.

Handlers are thin: each takes the request's principal (set by mcp_bridge.asgi), runs the matching function of
mcp_bridge.bridge in a thread, and shapes the answer. One endpoint serves both protocol eras (the SDK routes on
MCP-Protocol-Version):
- 2026-07-28: server/discover, per-request _meta, and the tasks extension (io.modelcontextprotocol/tasks):
  tools/call → CreateTaskResult for a client that declared it, tasks/get | update | cancel;
- 2025-11-25 (initialize): tools run in the foreground within MCP_SYNC_WAIT_SECONDS.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import mcp.types as types
from django.conf import settings
from jsonschema import Draft202012Validator
from mcp.server.caching import CacheHint
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.exceptions import MCPError
from mcp_types import INTERNAL_ERROR, INVALID_PARAMS, METHOD_NOT_FOUND, MISSING_REQUIRED_CLIENT_CAPABILITY
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import Field

from mcp_bridge import auth, bridge, mapping
from mcp_bridge.asgi import in_thread
from mcp_bridge.waiting import until_settled
from tasks_app.models import Task, TaskStatus

logger = logging.getLogger(__name__)

EXTENSION = mapping.EXTENSION
INSTRUCTIONS = (
    "Each tool runs a workflow of the Agent Runtime as a durable task. Clients that declare the "
    "io.modelcontextprotocol/tasks extension get a task to poll (tasks/get), answer (tasks/update) or cancel "
    "(tasks/cancel); others get the result when it finishes within a bounded wait. steer_task pauses, resumes, "
    "cancels, re-prioritises or adjusts the goal of a task, guarded by its stateVersion."
)


class TaskIdParams(types.RequestParams):
    task_id: str = Field(alias="taskId")


class TaskUpdateParams(TaskIdParams):
    input_responses: Any = Field(default=None, alias="inputResponses")


def _modern(ctx: ServerRequestContext) -> bool:
    return ctx.protocol_version in MODERN_PROTOCOL_VERSIONS


def _declared(ctx: ServerRequestContext) -> bool:
    """Did this request's client declare the tasks extension? (2026-07-28 only: per request, in its _meta.)"""
    capabilities = ctx.session.client_capabilities
    return _modern(ctx) and bool(capabilities and capabilities.extensions and EXTENSION in capabilities.extensions)


def _extension_required(what: str) -> MCPError:
    return MCPError(MISSING_REQUIRED_CLIENT_CAPABILITY, f"{what} needs the {EXTENSION} extension: declare it in the "
                    "request's _meta clientCapabilities.extensions.",
                    {"requiredCapabilities": {"extensions": {EXTENSION: {}}}})


# -- tools ----------------------------------------------------------------------------------------------------------
def _tool(workflow, *, legacy: bool) -> types.Tool:
    annotations = types.ToolAnnotations.model_validate(workflow.mcp_annotations) if workflow.mcp_annotations \
        else None
    return types.Tool(name=workflow.name, description=workflow.description, input_schema=workflow.input_schema,
                      annotations=annotations,
                      execution=types.ToolExecution(task_support=workflow.mcp_task_support) if legacy else None)


def _steer_tool(*, legacy: bool) -> types.Tool:
    return types.Tool(
        name=auth.STEER_TOOL, input_schema=bridge.STEER_INPUT_SCHEMA,
        description="Steer a running task: pause, resume, cancel, adjust_goal (goal / parameters) or set_priority, "
                    "guarded by expectedVersion (the stateVersion you last read). Needs the `steer` scope.",
        annotations=types.ToolAnnotations(title="Steer a task", read_only_hint=False, destructive_hint=False,
                                          idempotent_hint=False, open_world_hint=False),
        execution=types.ToolExecution(task_support="forbidden") if legacy else None)


async def list_tools(ctx: ServerRequestContext, params) -> types.ListToolsResult:
    principal = auth.current_principal.get()
    legacy = not _modern(ctx)
    tools = [_tool(workflow, legacy=legacy) for workflow in bridge.visible_workflows(principal)]
    return types.ListToolsResult(tools=[*tools, _steer_tool(legacy=legacy)])


async def call_tool(ctx: ServerRequestContext, params: types.CallToolRequestParams):
    principal = auth.current_principal.get()
    arguments = params.arguments or {}
    if params.name == auth.STEER_TOOL:
        errors = _argument_errors(bridge.STEER_INPUT_SCHEMA, arguments)
        if errors:
            return _invalid_arguments(params.name, errors)
        return types.CallToolResult.model_validate(await in_thread(bridge.task_steer, principal, arguments))
    workflow = bridge.workflow_for(principal, params.name)
    if workflow is None:
        raise MCPError(INVALID_PARAMS, f"Unknown tool: {params.name}")
    errors = workflow.input_errors(arguments)
    if errors:  # the model can correct its arguments: a tool error, not a protocol one (SEP-1303)
        return _invalid_arguments(params.name, [f"{e['field']}: {e['message']}" for e in errors])
    missing = _missing_capabilities(ctx, workflow)
    if missing:
        raise MCPError(MISSING_REQUIRED_CLIENT_CAPABILITY, f"Tool {params.name!r} needs the client capabilities "
                       f"{', '.join(missing)}.", {"requiredCapabilities": missing})
    declared = _declared(ctx)
    if workflow.mcp_task_support == "required" and not declared:
        if _modern(ctx):
            raise _extension_required(f"Tool {params.name!r} runs only as a task; it")
        raise MCPError(METHOD_NOT_FOUND, f"Tool {params.name!r} runs only as a task: call it with params.task.")
    if declared and workflow.mcp_task_support != "forbidden" and not workflow.mcp_input_first:
        task = await in_thread(bridge.task_start, principal, workflow, arguments)
        return _created(task)
    return await _foreground(ctx, principal, workflow, arguments, params)


def _created(task) -> dict:
    return {"resultType": "task", **mapping.task_fields(task, retention_days=bridge.retention_days())}


def _missing_capabilities(ctx: ServerRequestContext, workflow) -> dict:
    capabilities = ctx.session.client_capabilities
    return {name: {} for name in workflow.mcp_client_capabilities
            if getattr(capabilities, name, None) is None}


def _responses(params) -> dict | None:
    if params.input_responses is None:
        return None
    return {key: value.model_dump(by_alias=True, exclude_none=True, mode="json") if hasattr(value, "model_dump")
            else value for key, value in params.input_responses.items()}


def _argument_errors(schema: dict, arguments: dict) -> list[str]:
    return [f"{'.'.join(map(str, e.absolute_path)) or 'arguments'}: {e.message}"
            for e in Draft202012Validator(schema).iter_errors(arguments)]


def _invalid_arguments(name: str, errors: list[str]) -> types.CallToolResult:
    text = f"The arguments of {name!r} do not match its inputSchema: " + "; ".join(errors)
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)], is_error=True)


async def _foreground(ctx: ServerRequestContext, principal: auth.Principal, workflow, arguments: dict, params):
    """A task run while the request waits: the result when it finishes within MCP_SYNC_WAIT_SECONDS. When it waits
    for input, a 2026-07-28 client gets an InputRequiredResult (SEP-2322) keyed by the wait's names, with the task
    in a signed requestState; its retry answers through the steering services and waits again (a workflow with
    mcp_input_first, for a client with the tasks extension, becomes a task once its first input is in). Otherwise an
    error naming the task, which goes on: it can be read, steered and cancelled (nothing is orphaned)."""
    responses = _responses(params)
    if params.request_state is not None:
        task = await in_thread(bridge.request_state_open, principal, params.request_state, params.name)
    else:
        task = await in_thread(bridge.task_start, principal, workflow, arguments, foreground=True)
    task_id = task.id
    loop = asyncio.get_running_loop()
    deadline = loop.time() + settings.MCP_SYNC_WAIT_SECONDS

    async def progress(value: float, phase: str) -> None:
        await ctx.session.report_progress(round(value * 100, 2), 100, phase or None)

    while True:
        task = await until_settled(lambda: Task.objects.get(id=task_id), task_id,
                                   timeout=max(0.0, deadline - loop.time()), on_progress=progress)
        status = TaskStatus(task.status)
        if status != TaskStatus.INPUT_REQUIRED or not _modern(ctx):
            break
        if responses:
            answered = await in_thread(bridge.task_answer, principal, task_id, responses, by_name=True)
            if answered:
                for key in mapping.open_requests(task.wait, by_name=True):
                    responses.pop(key, None)  # used: a later question of the same name is asked anew
                if workflow.mcp_input_first and _declared(ctx):
                    return _created(await in_thread(Task.objects.get, id=task_id))
                continue
        requests = mapping.input_requests(task.wait, by_name=True)
        allowed = {key: request for key, request in requests.items() if _client_can(ctx, request)}
        if not allowed:
            needed = {mapping.capability_of(request): {} for request in requests.values()}
            raise MCPError(MISSING_REQUIRED_CLIENT_CAPABILITY, "The tool needs input this client cannot give.",
                           {"requiredCapabilities": needed, "taskId": str(task_id)})
        return types.InputRequiredResult.model_validate(
            {"inputRequests": allowed, "requestState": await in_thread(bridge.request_state_seal, task, params.name)})
    if status == TaskStatus.COMPLETED:
        return types.CallToolResult.model_validate(await in_thread(bridge.tool_result, task))
    if status in (TaskStatus.FAILED, TaskStatus.DEAD_LETTERED):
        error = mapping.task_error(task)
        raise MCPError(error["code"], error["message"], error["data"])
    if status == TaskStatus.CANCELLED:
        return types.CallToolResult(content=[types.TextContent(type="text", text="The task was cancelled.")],
                                    is_error=True)
    detail = "waits for input" if status == TaskStatus.INPUT_REQUIRED else "is still running"
    raise MCPError(INTERNAL_ERROR, f"Task {task.id} {detail}; follow it at /runtime/tasks/{task.id}, or call the tool "
                   f"from a client that declares the {EXTENSION} extension.",
                   {"taskId": str(task.id), "internalStatus": task.status, "statusUrl": f"/runtime/tasks/{task.id}"})


def _client_can(ctx: ServerRequestContext, request: dict) -> bool:
    return getattr(ctx.session.client_capabilities, mapping.capability_of(request), None) is not None


# -- the tasks extension (2026-07-28) ---------------------------------------------------------------------------------
async def tasks_get(ctx: ServerRequestContext, params: TaskIdParams) -> dict:
    if not _declared(ctx):
        raise _extension_required("tasks/get")
    return await in_thread(bridge.task_get, auth.current_principal.get(), params.task_id)


async def tasks_update(ctx: ServerRequestContext, params: TaskUpdateParams) -> dict:
    if not _declared(ctx):
        raise _extension_required("tasks/update")
    await in_thread(bridge.task_answer, auth.current_principal.get(), params.task_id, params.input_responses)
    return {}


async def tasks_cancel(ctx: ServerRequestContext, params: TaskIdParams) -> dict:
    if not _declared(ctx):
        raise _extension_required("tasks/cancel")
    await in_thread(bridge.task_cancel, auth.current_principal.get(), params.task_id)
    return {}


def build_server() -> Server:
    server = Server("agent-runtime", version="0.1.0", instructions=INSTRUCTIONS,
                    cache_hints={"tools/list": CacheHint(ttl_ms=300_000, scope="private")},
                    on_list_tools=list_tools, on_call_tool=call_tool)
    server.add_request_handler("tasks/get", TaskIdParams, tasks_get)
    server.add_request_handler("tasks/update", TaskUpdateParams, tasks_update)
    server.add_request_handler("tasks/cancel", TaskIdParams, tasks_cancel)
    server.extensions[EXTENSION] = {}
    return server


def build_manager(server: Server) -> StreamableHTTPSessionManager:
    # Host and Origin are checked by mcp_bridge.asgi against ALLOWED_HOSTS (Django's matching), before auth.
    return StreamableHTTPSessionManager(app=server, stateless=True, json_response=False,
                                        security_settings=TransportSecuritySettings(
                                            enable_dns_rebinding_protection=False))
