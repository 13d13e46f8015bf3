"""2025-11-25 tasks (experimental, in core) for clients that still drive them — Microsoft's agent framework, for one.

- ``initialize`` advertises ``capabilities.tasks`` (list, cancel, requests.tools.call); tools/list entries carry
  ``execution.taskSupport``.
- ``tools/call`` with ``params.task`` (a ttl) answers ``{"task": Task}`` once the row is committed: a Server
  middleware short-circuits it, since the SDK validates a 2025 tools/call result as a CallToolResult.
- ``tasks/get`` → Task; ``tasks/result`` blocks until the task is finished and answers its CallToolResult (with the
  related-task ``_meta``) or its JSON-RPC error, sending ``notifications/tasks/status`` on that stream as the status
  changes; ``tasks/list`` pages the tenant's tasks; ``tasks/cancel`` → the Task (a finished one: -32602).
- In this era a tool error (isError) is ``failed``. A task waiting for input cannot ask a stateless 2025 client
  (there is no back channel): it shows ``input_required`` with a statusMessage naming where to answer it (the
  steer_task tool cannot, provide_input is the REST API's or the console's), and tasks/result keeps waiting.
"""

from __future__ import annotations

import asyncio

import mcp.types as types
from django.conf import settings
from mcp.shared.exceptions import MCPError
from mcp_types import INTERNAL_ERROR, INVALID_PARAMS, METHOD_NOT_FOUND

from mcp_bridge import auth, bridge, mapping
from mcp_bridge.asgi import in_thread
from mcp_bridge.waiting import until_settled
from tasks_app.models import TERMINAL_STATUSES, Task, TaskStatus
from tasks_app.selectors import EXTERNAL_STATUS

PAGE = 50
_FINISHED = {str(status) for status in TERMINAL_STATUSES}


def task_2025(task: Task, *, result: dict | None = None) -> dict:
    """The 2025-11-25 Task: ttl / pollInterval (ms), and ``failed`` for a tool error."""
    fields = mapping.task_fields(task, retention_days=bridge.retention_days())
    status = fields["status"]
    if status == "completed" and result is not None and result.get("isError"):
        status = "failed"
    message = fields["statusMessage"]
    if status == "input_required":
        message = (f"{message} — answer it through POST /runtime/tasks/{task.id}/steering (provide_input) or the "
                   f"console; this protocol version cannot carry the question.")
    return {"taskId": fields["taskId"], "status": status, "statusMessage": message,
            "createdAt": fields["createdAt"], "lastUpdatedAt": fields["lastUpdatedAt"], "ttl": fields["ttlMs"],
            "pollInterval": fields["pollIntervalMs"]}


def _current(principal, task_id) -> dict:
    task = bridge.task_read(principal, task_id)
    result = bridge.tool_result(task) if task.status == TaskStatus.COMPLETED else None
    return task_2025(task, result=result)


async def tools_call_as_task(ctx, call_next):
    """Server middleware: a 2025 tools/call with ``params.task`` becomes a task (everything else passes on)."""
    params = ctx.params or {}
    if ctx.method != "tools/call" or ctx.protocol_version != "2025-11-25" or params.get("task") is None:
        return await call_next(ctx)
    principal = auth.current_principal.get()
    name = params.get("name")
    workflow = bridge.workflow_for(principal, name) if isinstance(name, str) else None
    if workflow is None:
        raise MCPError(INVALID_PARAMS, f"Unknown tool: {name}")
    if workflow.mcp_task_support == "forbidden":
        raise MCPError(METHOD_NOT_FOUND, f"Tool {name!r} does not run as a task: call it without params.task.")
    arguments = params.get("arguments") or {}
    errors = workflow.input_errors(arguments) if isinstance(arguments, dict) else [{"field": "arguments",
                                                                                   "message": "Not an object."}]
    if errors:
        raise MCPError(INVALID_PARAMS, f"The arguments of {name!r} do not match its inputSchema.", {"errors": errors})
    task = await in_thread(bridge.task_start, principal, workflow, arguments)
    return {"task": task_2025(task)}


async def tasks_get(ctx, params) -> dict:
    return await in_thread(_current, auth.current_principal.get(), params.task_id)


async def tasks_result(ctx, params) -> dict:
    """Blocks until the task is finished (up to MCP_RESULT_WAIT_SECONDS, then an error naming it: ask again)."""
    principal = auth.current_principal.get()
    task = await in_thread(bridge.task_read, principal, params.task_id)
    task_id = task.id
    loop = asyncio.get_running_loop()
    deadline = loop.time() + settings.MCP_RESULT_WAIT_SECONDS
    while task.status not in _FINISHED and loop.time() < deadline:
        shown = task.status  # notifications/tasks/status on this stream at every change, until it finishes
        await ctx.session.send_notification(types.TaskStatusNotification(
            params=types.TaskStatusNotificationParams.model_validate(task_2025(task))),
            related_request_id=ctx.request_id)
        task = await until_settled(lambda: Task.objects.get(id=task_id), task_id,
                                   timeout=max(0.0, deadline - loop.time()),
                                   stop=lambda current, shown=shown: current.status != shown)
    related = {mapping.RELATED_TASK: {"taskId": str(task.id)}}
    if task.status == TaskStatus.COMPLETED:
        result = await in_thread(bridge.tool_result, task)
        return {**result, "_meta": related}
    if task.status in (TaskStatus.FAILED, TaskStatus.DEAD_LETTERED):
        error = mapping.task_error(task)
        raise MCPError(error["code"], error["message"], error["data"])
    if task.status == TaskStatus.CANCELLED:
        raise MCPError(INTERNAL_ERROR, "The task was cancelled.", {"taskId": str(task.id), "status": "cancelled"})
    raise MCPError(INTERNAL_ERROR, f"Task {task.id} is still {EXTERNAL_STATUS[TaskStatus(task.status)]}; call "
                   "tasks/result again.", {"taskId": str(task.id), "internalStatus": task.status})


def _list(principal, cursor: str | None) -> dict:
    tasks, next_cursor = bridge.tenant_tasks_page(principal, cursor, size=PAGE)
    listed = {"tasks": [task_2025(task) for task in tasks]}
    if next_cursor:
        listed["nextCursor"] = next_cursor
    return listed


async def tasks_list(ctx, params) -> dict:
    return await in_thread(_list, auth.current_principal.get(), params.cursor if params else None)


def _cancel(principal, task_id):
    task = bridge.task_read(principal, task_id)
    if task.status in _FINISHED:
        raise MCPError(INVALID_PARAMS, f"Task {task.id} is already {EXTERNAL_STATUS[TaskStatus(task.status)]}; it "
                       "cannot be cancelled.")
    return bridge.client_cancel(principal, task_id).id


async def tasks_cancel(ctx, params) -> dict:
    """2025-11-25: the answer is the cancelled task. A running task stops at its next safe point (its running step
    finishes first, and an effect in flight is never cut off), so this waits for it, at most MCP_CANCEL_WAIT_SECONDS;
    a step still running then is answered as it stands — working, "Cancelling at the next safe point" — and
    tasks/get says `cancelled` once it is."""
    principal = auth.current_principal.get()
    task_id = await in_thread(_cancel, principal, params.task_id)
    await until_settled(lambda: Task.objects.get(id=task_id), task_id, timeout=settings.MCP_CANCEL_WAIT_SECONDS,
                        stop=lambda task: task.status in _FINISHED or task.status == TaskStatus.DEAD_LETTERED)
    return await in_thread(_current, principal, params.task_id)


def capabilities() -> types.ServerTasksCapability:
    return types.ServerTasksCapability(
        list=types.TasksListCapability(), cancel=types.TasksCancelCapability(),
        requests=types.ServerTasksRequestsCapability(tools=types.TasksToolsCapability(call=types.TasksCallCapability())))
