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
from pydantic import Field

from config.base.problems import Problem
from mcp_bridge import auth, bridge, legacy, mapping, resources
from mcp_bridge.asgi import in_thread
from mcp_bridge.listen import listen
from mcp_bridge.negotiation import declared, extension_required, modern
from mcp_bridge.waiting import until_settled
from tasks_app.models import Task, TaskStatus
from tasks_app.observability import tracing

logger = logging.getLogger(__name__)

EXTENSION = mapping.EXTENSION
SERVER_NAME, SERVER_VERSION = "agent-runtime", "0.1.0"
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


def _fork_tool(*, legacy: bool) -> types.Tool:
    return types.Tool(
        name=auth.FORK_TOOL, input_schema=bridge.FORK_INPUT_SCHEMA,
        description="Fork a task from a step (or an agent from a turn), with a corrected goal or input if given: a "
                    "new task that starts again there; the effects before that step are inherited, never repeated, "
                    "and each effect the original made from there on waits for a person's approval before it runs "
                    "again. The original goes on unchanged.",
        annotations=types.ToolAnnotations(title="Fork a task", read_only_hint=False, destructive_hint=False,
                                          idempotent_hint=False, open_world_hint=False),
        execution=types.ToolExecution(task_support="forbidden") if legacy else None)


async def list_tools(ctx: ServerRequestContext, params) -> types.ListToolsResult:
    principal = auth.current_principal.get()
    legacy = not modern(ctx)
    tools = [_tool(workflow, legacy=legacy) for workflow in bridge.visible_workflows(principal)]
    return types.ListToolsResult(tools=[*tools, _steer_tool(legacy=legacy), _fork_tool(legacy=legacy)])


async def call_tool(ctx: ServerRequestContext, params: types.CallToolRequestParams):
    principal = auth.current_principal.get()
    arguments = params.arguments or {}
    if params.name == auth.STEER_TOOL:
        errors = _steer_argument_errors(arguments)
        if errors:
            return _invalid_arguments(params.name, errors)
        return types.CallToolResult.model_validate(await in_thread(bridge.task_steer, principal, arguments))
    if params.name == auth.FORK_TOOL:
        errors = [f"{'.'.join(map(str, e.absolute_path)) or 'arguments'}: {e.message}"
                  for e in _FORK_VALIDATOR.iter_errors(arguments)]
        if errors:
            return _invalid_arguments(params.name, errors)
        return types.CallToolResult.model_validate(await in_thread(bridge.task_fork, principal, arguments))
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
    with_extension = declared(ctx)
    if workflow.mcp_task_support == "required" and not with_extension:
        if modern(ctx):
            raise extension_required(f"Tool {params.name!r} runs only as a task; it")
        raise MCPError(METHOD_NOT_FOUND, f"Tool {params.name!r} runs only as a task: call it with params.task.")
    if with_extension and workflow.mcp_task_support != "forbidden" and not workflow.mcp_input_first:
        task = await in_thread(bridge.task_start, principal, workflow, arguments,
                               idempotency_key=bridge.idempotency_key_of(params),
                               trace_context=tracing.carrier_from_meta(getattr(params, "meta", None)))
        return _created(task)
    return await _foreground(ctx, principal, workflow, arguments, params)


def _created(task) -> dict:
    return {"resultType": "task", **mapping.task_fields(task, retention_days=bridge.retention_days())}


def _missing_capabilities(ctx: ServerRequestContext, workflow) -> dict:
    capabilities = ctx.session.client_capabilities
    return {name: {} for name in workflow.mcp_client_capabilities
            if getattr(capabilities, name, None) is None}


def _responses(params) -> dict | None:
    responses = getattr(params, "input_responses", None)  # (only the SEP-2322 methods' params carry them)
    if responses is None:
        return None
    return {key: value.model_dump(by_alias=True, exclude_none=True, mode="json") if hasattr(value, "model_dump")
            else value for key, value in responses.items()}


_STEER_VALIDATOR = Draft202012Validator(bridge.STEER_INPUT_SCHEMA)
_FORK_VALIDATOR = Draft202012Validator(bridge.FORK_INPUT_SCHEMA)


def _steer_argument_errors(arguments: dict) -> list[str]:
    return [f"{'.'.join(map(str, e.absolute_path)) or 'arguments'}: {e.message}"
            for e in _STEER_VALIDATOR.iter_errors(arguments)]


def _invalid_arguments(name: str, errors: list[str]) -> types.CallToolResult:
    text = f"The arguments of {name!r} do not match its inputSchema: " + "; ".join(errors)
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)], is_error=True)


class _Settled:
    """What a foreground run came to: the task (finished, waiting, or still running at the bound), or an answer to
    return as it is (an InputRequiredResult, or the CreateTaskResult of a task that took over after its input)."""

    def __init__(self, task=None, answer=None):
        self.task, self.answer = task, answer


async def _run_in_foreground(ctx: ServerRequestContext, principal: auth.Principal, workflow, arguments: dict,
                             params, *, name: str) -> _Settled:
    """A task run while the request waits, up to MCP_SYNC_WAIT_SECONDS. When it waits for input, a 2026-07-28
    client gets an InputRequiredResult (SEP-2322) keyed by the wait's names, the task in a signed requestState;
    its retry answers through the steering services and waits again (a workflow with mcp_input_first, for a client
    with the tasks extension, becomes a task once its input is in). A task still running at the bound goes on: it
    can be read, steered and cancelled (nothing is orphaned)."""
    responses = _responses(params)
    request_state = getattr(params, "request_state", None)
    if request_state is not None:
        task = await in_thread(bridge.request_state_open, principal, request_state, name)
    else:
        task = await in_thread(bridge.task_start, principal, workflow, arguments, foreground=True,
                               trace_context=tracing.carrier_from_meta(getattr(params, "meta", None)))
    task_id = task.id
    loop = asyncio.get_running_loop()
    deadline = loop.time() + settings.MCP_SYNC_WAIT_SECONDS

    async def progress(value: float, phase: str) -> None:
        await ctx.session.report_progress(round(value * 100, 2), 100, phase or None)

    while True:
        task = await until_settled(lambda: Task.objects.get(id=task_id), task_id,
                                   timeout=max(0.0, deadline - loop.time()), on_progress=progress)
        if task.status != TaskStatus.INPUT_REQUIRED or not modern(ctx):
            return _Settled(task=task)
        if responses:
            answered = await in_thread(bridge.task_answer, principal, task_id, responses, by_name=True)
            if answered:
                for key in mapping.open_requests(task.wait, by_name=True):
                    responses.pop(key, None)  # used: a later question of the same name is asked anew
                if workflow.mcp_input_first and declared(ctx):
                    return _Settled(answer=_created(await in_thread(Task.objects.get, id=task_id)))
                continue
        requests = mapping.input_requests(task.wait, by_name=True)
        allowed = {key: request for key, request in requests.items() if _client_can(ctx, request)}
        if not allowed:
            needed = {mapping.capability_of(request): {} for request in requests.values()}
            raise MCPError(MISSING_REQUIRED_CLIENT_CAPABILITY, "This needs input the client cannot give.",
                           {"requiredCapabilities": needed, "taskId": str(task_id)})
        state = await in_thread(bridge.request_state_seal, task, name)
        return _Settled(answer=types.InputRequiredResult.model_validate({"inputRequests": allowed,
                                                                         "requestState": state}))


def _unfinished(task) -> MCPError:
    """A foreground task that did not complete: its failure as the error, or an error that names it."""
    status = TaskStatus(task.status)
    if status in (TaskStatus.FAILED, TaskStatus.DEAD_LETTERED):
        error = mapping.task_error(task)
        return MCPError(error["code"], error["message"], error["data"])
    detail = {TaskStatus.INPUT_REQUIRED: "waits for input", TaskStatus.CANCELLED: "was cancelled"}.get(
        status, "is still running")
    return MCPError(INTERNAL_ERROR, f"Task {task.id} {detail}; follow it at /runtime/tasks/{task.id}, or call from a "
                    f"client that declares the {EXTENSION} extension.",
                    {"taskId": str(task.id), "internalStatus": task.status, "statusUrl": f"/runtime/tasks/{task.id}"})


async def _foreground(ctx: ServerRequestContext, principal: auth.Principal, workflow, arguments: dict, params):
    settled = await _run_in_foreground(ctx, principal, workflow, arguments, params, name=params.name)
    if settled.answer is not None:
        return settled.answer
    task = settled.task
    if task.status == TaskStatus.COMPLETED:
        return types.CallToolResult.model_validate(await in_thread(bridge.tool_result, task))
    if task.status == TaskStatus.CANCELLED:
        return types.CallToolResult(content=[types.TextContent(type="text", text="The task was cancelled.")],
                                    is_error=True)
    raise _unfinished(task)


# -- prompts, resources and completions: workflows of those kinds, run in the foreground ------------------------------
async def list_prompts(ctx: ServerRequestContext, params) -> types.ListPromptsResult:
    principal = auth.current_principal.get()
    return types.ListPromptsResult(prompts=[
        types.Prompt.model_validate({"name": workflow.name, "description": workflow.description,
                                     "arguments": workflow.mcp_prompt_arguments})
        for workflow in bridge.visible_workflows(principal, "prompt")])


async def get_prompt(ctx: ServerRequestContext, params: types.GetPromptRequestParams):
    principal = auth.current_principal.get()
    workflow = bridge.workflow_for(principal, params.name, "prompt")
    if workflow is None:
        raise MCPError(INVALID_PARAMS, f"Unknown prompt: {params.name}")
    arguments = dict(params.arguments or {})
    errors = workflow.input_errors(arguments)
    if errors:
        raise MCPError(INVALID_PARAMS, f"The arguments of prompt {params.name!r} are invalid.", {"errors": errors})
    settled = await _run_in_foreground(ctx, principal, workflow, arguments, params, name=f"prompt:{params.name}")
    if settled.answer is not None:
        return settled.answer
    if settled.task.status != TaskStatus.COMPLETED:
        raise _unfinished(settled.task)
    return types.GetPromptResult.model_validate(settled.task.result)


async def list_resources(ctx: ServerRequestContext, params) -> types.ListResourcesResult:
    principal = auth.current_principal.get()
    fixed = [types.Resource.model_validate(workflow.mcp_resource)
             for workflow in bridge.visible_workflows(principal, "resource") if "uri" in workflow.mcp_resource]
    artifacts, next_cursor = await in_thread(resources.artifact_resources, principal, params.cursor if params else None)
    listed = ([] if params and params.cursor else fixed) + [types.Resource.model_validate(a) for a in artifacts]
    return types.ListResourcesResult(resources=listed, next_cursor=next_cursor)


async def list_resource_templates(ctx: ServerRequestContext, params) -> types.ListResourceTemplatesResult:
    principal = auth.current_principal.get()
    templates = [types.ResourceTemplate.model_validate(workflow.mcp_resource)
                 for workflow in bridge.visible_workflows(principal, "resource")
                 if "uriTemplate" in workflow.mcp_resource]
    templates.append(types.ResourceTemplate(uri_template=resources.ARTIFACT_TEMPLATE, name="task-artifact",
                                            description="A committed artifact of one of your tasks (immutable)."))
    return types.ListResourceTemplatesResult(resource_templates=templates)


async def read_resource(ctx: ServerRequestContext, params: types.ReadResourceRequestParams):
    principal = auth.current_principal.get()
    uri = str(params.uri)
    if uri.startswith("runtime://"):
        contents = await in_thread(resources.artifact_read, principal, uri)
        if contents is None:
            raise _resource_not_found(uri)
        return types.ReadResourceResult.model_validate({"contents": [contents]})
    found = resources.resource_workflow_for(principal, uri)
    if found is None:
        raise _resource_not_found(uri)
    workflow, template_params = found
    settled = await _run_in_foreground(ctx, principal, workflow, {"uri": uri, "params": template_params}, params,
                                       name=f"resource:{uri}")
    if settled.answer is not None:
        return settled.answer
    if settled.task.status != TaskStatus.COMPLETED:
        raise _unfinished(settled.task)
    return types.ReadResourceResult.model_validate(settled.task.result)


def _resource_not_found(uri: str) -> MCPError:
    return MCPError(INVALID_PARAMS, "Resource not found", {"uri": uri})


async def complete(ctx: ServerRequestContext, params: types.CompleteRequestParams) -> types.CompleteResult:
    principal = auth.current_principal.get()
    completers = bridge.visible_workflows(principal, "completion")
    if not completers:
        return types.CompleteResult(completion=types.Completion(values=[], total=0, has_more=False))
    request = params.model_dump(by_alias=True, exclude_none=True, mode="json", include={"ref", "argument", "context"})
    settled = await _run_in_foreground(ctx, principal, completers[0], request, params, name="completion")
    if settled.answer is not None or settled.task.status != TaskStatus.COMPLETED:
        raise _unfinished(settled.task) if settled.task else MCPError(INTERNAL_ERROR, "A completion cannot ask.")
    return types.CompleteResult(completion=types.Completion.model_validate(settled.task.result))


def _client_can(ctx: ServerRequestContext, request: dict) -> bool:
    return getattr(ctx.session.client_capabilities, mapping.capability_of(request), None) is not None


# -- tasks: the 2026-07-28 extension, and the 2025-11-25 methods on the same names ---------------------------------
async def tasks_get(ctx: ServerRequestContext, params: TaskIdParams) -> dict:
    if not modern(ctx):
        return await legacy.tasks_get(ctx, params)
    if not declared(ctx):
        raise extension_required("tasks/get")
    return await in_thread(bridge.task_get, auth.current_principal.get(), params.task_id)


async def tasks_update(ctx: ServerRequestContext, params: TaskUpdateParams) -> dict:
    if not modern(ctx):
        raise MCPError(METHOD_NOT_FOUND, "tasks/update is a method of the 2026-07-28 tasks extension.")
    if not declared(ctx):
        raise extension_required("tasks/update")
    await in_thread(bridge.task_answer, auth.current_principal.get(), params.task_id, params.input_responses)
    return {}


async def tasks_cancel(ctx: ServerRequestContext, params: TaskIdParams) -> dict:
    if not modern(ctx):
        return await legacy.tasks_cancel(ctx, params)
    if not declared(ctx):
        raise extension_required("tasks/cancel")
    await in_thread(bridge.client_cancel, auth.current_principal.get(), params.task_id)
    return {}


async def tasks_result(ctx: ServerRequestContext, params: TaskIdParams) -> dict:
    if modern(ctx):  # removed from the 2026 surface: tasks/get inlines the result
        raise MCPError(METHOD_NOT_FOUND, "Method not found: tasks/result (tasks/get carries the result).")
    return await legacy.tasks_result(ctx, params)


async def tasks_list(ctx: ServerRequestContext, params: types.PaginatedRequestParams | None) -> dict:
    if modern(ctx):
        raise MCPError(METHOD_NOT_FOUND, "Method not found: tasks/list.")
    return await legacy.tasks_list(ctx, params)


async def problems_as_errors(ctx, call_next):
    """Server middleware: what a service refuses (a Problem, which the REST API answers 4xx with problem details —
    text with NUL, a command the task's state refuses, …) is -32602 with the same detail and field errors, for every
    method, never an "Internal server error"."""
    try:
        return await call_next(ctx)
    except Problem as problem:
        raise MCPError(INVALID_PARAMS, str(problem.detail), {"errors": problem.errors or [], **problem.extra}) \
            from None


class RuntimeServer(Server):
    def get_capabilities(self, *args, **kwargs) -> types.ServerCapabilities:
        capabilities = super().get_capabilities(*args, **kwargs)
        # The tool, prompt and resource lists change only with a deployment, and resources are not subscribable:
        # say so, rather than promise notifications that never come.
        for listed in (capabilities.tools, capabilities.prompts, capabilities.resources):
            if listed is not None:
                listed.list_changed = False
        if capabilities.resources is not None:
            capabilities.resources.subscribe = False
        if kwargs.get("protocol_version") is None:  # the initialize (2025-11-25) derivation: legacy tasks
            capabilities.tasks = legacy.capabilities()
        return capabilities


def build_server() -> Server:
    server = RuntimeServer(SERVER_NAME, version=SERVER_VERSION, instructions=INSTRUCTIONS,
                    cache_hints={"tools/list": CacheHint(ttl_ms=300_000, scope="private"),
                                 "prompts/list": CacheHint(ttl_ms=300_000, scope="private"),
                                 "resources/templates/list": CacheHint(ttl_ms=300_000, scope="private"),
                                 "resources/list": CacheHint(ttl_ms=0, scope="private"),
                                 "resources/read": CacheHint(ttl_ms=0, scope="private")},
                    get_tool_input_schema=bridge.tool_input_schema,
                    on_list_tools=list_tools, on_call_tool=call_tool, on_list_prompts=list_prompts,
                    on_get_prompt=get_prompt, on_list_resources=list_resources,
                    on_list_resource_templates=list_resource_templates, on_read_resource=read_resource,
                    on_completion=complete, on_subscriptions_listen=listen)
    server.add_request_handler("tasks/get", TaskIdParams, tasks_get)
    server.add_request_handler("tasks/update", TaskUpdateParams, tasks_update)
    server.add_request_handler("tasks/cancel", TaskIdParams, tasks_cancel)
    server.add_request_handler("tasks/result", TaskIdParams, tasks_result)
    server.add_request_handler("tasks/list", types.PaginatedRequestParams, tasks_list)
    server.middleware.append(problems_as_errors)
    server.middleware.append(legacy.tools_call_as_task)
    server.extensions[EXTENSION] = {}
    return server


def build_manager(server: Server) -> StreamableHTTPSessionManager:
    # Host and Origin are checked by mcp_bridge.asgi against ALLOWED_HOSTS (Django's matching), before auth.
    return StreamableHTTPSessionManager(app=server, stateless=True, json_response=False,
                                        security_settings=TransportSecuritySettings(
                                            enable_dns_rebinding_protection=False))
