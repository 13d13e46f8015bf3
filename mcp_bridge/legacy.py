"""2025-11-25 tasks (experimental, in core) for clients that still drive them — Microsoft's agent framework, for one.

- ``initialize`` advertises ``capabilities.tasks`` (list, cancel, requests.tools.call); tools/list entries carry
  ``execution.taskSupport``.
- ``tools/call`` with ``params.task`` (a ttl) answers ``{"task": Task}`` once the row is committed: a Server
  middleware short-circuits it, since the SDK validates a 2025 tools/call result as a CallToolResult.
- ``tasks/get`` → Task; ``tasks/result`` blocks until the task is finished and answers its CallToolResult (with the
  related-task ``_meta``) or its JSON-RPC error, sending ``notifications/tasks/status`` on that stream as the status
  changes; ``tasks/list`` pages the tenant's tasks; ``tasks/cancel`` → the Task (a finished one: -32602).
- In this era a tool error (isError) is ``failed``.
- A task waiting for input (or approval) is asked on the ``tasks/result`` stream, as the spec says: an
  ``elicitation/create`` (form mode, related-task ``_meta``) whose JSON-RPC id carries the task, the wait and the
  asker, signed — so the client's response, POSTed to any web process, is applied there as provide_input / approve /
  reject (mcp_bridge.elicitation; nothing is kept in this process). The stream then waits on and answers the result;
  an answer the wait refuses is asked again, saying why; a declined question ends tasks/result with an error (the
  task still waits). Only a token with ``tasks:write`` is asked. A question no 2025 form can carry (nested schemas)
  is not asked: the statusMessage says where to answer it (the REST API or the console), as for every waiting task.
"""

from __future__ import annotations

import asyncio

import anyio
import mcp.types as types
from django.conf import settings
from mcp.shared.exceptions import MCPError
from mcp.shared.message import ServerMessageMetadata
from mcp_types import INTERNAL_ERROR, INVALID_PARAMS, METHOD_NOT_FOUND, JSONRPCRequest

from mcp_bridge import auth, bridge, elicitation, mapping
from mcp_bridge.asgi import in_thread
from mcp_bridge.waiting import until_settled
from tasks_app.models import TERMINAL_STATUSES, Task, TaskStatus
from tasks_app.observability import tracing
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
        elsewhere = f"POST /runtime/tasks/{task.id}/steering (provide_input) or the console"
        message = (f"{message} — call tasks/result to be asked (an elicitation), or answer through {elsewhere}."
                   if elicitation.can_ask(task) else
                   f"{message} — answer it through {elsewhere}; a 2025-11-25 form cannot carry this question.")
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
    meta = params.get("_meta") if isinstance(params.get("_meta"), dict) else {}
    key = meta.get(bridge.IDEMPOTENCY_META)
    task = await in_thread(bridge.task_start, principal, workflow, arguments,
                           idempotency_key=key if isinstance(key, str) else None,
                           trace_context=tracing.carrier_from_meta(meta))
    return {"task": task_2025(task)}


async def tasks_get(ctx, params) -> dict:
    return await in_thread(_current, auth.current_principal.get(), params.task_id)


class _Asking:
    """What one tasks/result stream asked (the question's key and nonce) and what came back about it (notices from
    whichever process received the answer: mcp_bridge.elicitation)."""

    def __init__(self, ctx, principal):
        self.ctx, self.principal = ctx, principal
        self.may = auth.WRITE in principal.scopes  # answering is a write: a read-only token is not asked
        self.key = self.nonce = self.again = self.declined = None

    def outdated(self, task: Task) -> bool:
        """Is there something else to ask than what was asked (another wait, fewer open parts)?"""
        if not self.may or task.status != TaskStatus.INPUT_REQUIRED:
            return False
        question = elicitation.question_for(task.wait)
        return question is not None and question.key != self.key

    def hear(self, notice: dict) -> bool:
        if notice.get("question") != self.nonce:
            return False  # another stream's question
        if notice.get("outcome") == elicitation.REFUSED:
            self.again = notice.get("detail") or "Your answer was not accepted."
        elif notice.get("outcome") == elicitation.DECLINED:
            self.declined = notice.get("action") or "decline"
        else:  # the client cannot show the form: stop asking on this stream, wait as before
            self.may = False
        return True

    async def ask(self, task: Task) -> None:
        """Send the question on this request's stream, once per question (and again after a refused answer)."""
        question = elicitation.question_for(task.wait) if self.may else None
        if question is None or (question.key == self.key and self.again is None):
            return
        self.key, self.nonce = question.key, elicitation.new_nonce()
        params = dict(question.params)
        if self.again:
            params["message"] = f"{self.again} {params['message']}"
            self.again = None
        params["_meta"] = {mapping.RELATED_TASK: {"taskId": str(task.id)}}
        await _send_request(self.ctx, elicitation.request_id(task, question, self.principal, self.nonce),
                            "elicitation/create", params)


async def _send_request(ctx, request_id: str, method: str, params: dict) -> None:
    """A server-to-client request on this request's own stream, not awaited. The SDK's stateless transport refuses
    them (NoBackChannelError: the reply arrives as another HTTP request, perhaps to another process, where nothing
    awaits it). The reply is ours to route instead (mcp_bridge.asgi → elicitation.answer_receive), so the request is
    written as the dispatcher writes its notifications, with the related request id that puts it on this stream.
    SDK internals (mcp==2.3.0's JSONRPCDispatcher._write): tests/test_mcp_sdk1.py fails if they move."""
    outbound = ctx.session._request_outbound
    try:
        await outbound._dispatcher._write(JSONRPCRequest(jsonrpc="2.0", id=request_id, method=method, params=params),
                                          ServerMessageMetadata(related_request_id=ctx.request_id))
    except (anyio.BrokenResourceError, anyio.ClosedResourceError):
        pass  # the client went away: nobody to ask (as the dispatcher drops a notification then)


async def tasks_result(ctx, params) -> dict:
    """Blocks until the task is finished (up to MCP_RESULT_WAIT_SECONDS, then an error naming it: ask again), asking
    the client its open question meanwhile (see the module's docstring)."""
    principal = auth.current_principal.get()
    task = await in_thread(bridge.task_read, principal, params.task_id)
    task_id = task.id
    asking = _Asking(ctx, principal)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + settings.MCP_RESULT_WAIT_SECONDS
    shown = [None]

    async def show_and_ask(current: Task) -> None:
        """notifications/tasks/status on this stream at every change until it finishes, and the open question —
        sent once the wait listens, so that no notice about its answer can come before (mcp_bridge.waiting)."""
        if current.status in _FINISHED:
            return
        if current.status != shown[0]:
            shown[0] = current.status
            await ctx.session.send_notification(types.TaskStatusNotification(
                params=types.TaskStatusNotificationParams.model_validate(task_2025(current))),
                related_request_id=ctx.request_id)
        if current.status == TaskStatus.INPUT_REQUIRED:
            await asking.ask(current)

    while task.status not in _FINISHED and loop.time() < deadline:
        task = await until_settled(lambda: Task.objects.get(id=task_id), task_id,
                                   timeout=max(0.0, deadline - loop.time()), first=show_and_ask,
                                   stop=lambda current: current.status in _FINISHED or current.status != shown[0]
                                   or asking.outdated(current),
                                   notices=(elicitation.notice_channel(task_id), asking.hear))
        if asking.declined and task.status == TaskStatus.INPUT_REQUIRED:
            raise MCPError(INTERNAL_ERROR, f"Task {task.id}'s question was {asking.declined}d; the task still waits "
                           "for the answer. Call tasks/result again to be asked again, answer it through the REST API "
                           "or the console, or cancel the task (tasks/cancel).",
                           {"taskId": str(task.id), "status": "input_required", "elicitation": asking.declined})
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
