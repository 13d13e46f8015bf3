"""The official `mcp` SDK's client, as an agent would use it against our endpoint, with the tasks extension on the
client side (the SDK has the hooks but not the extension: ClientExtension + ResultClaim, as mcp.md §3.3 shows)."""

from __future__ import annotations

import asyncio
import contextlib

import httpx2
import mcp.types as types
from mcp import Client
from mcp.client import ClaimContext, ClientExtension, ResultClaim
from mcp.client.streamable_http import streamable_http_client

from agents_app.mcp_client import (
    CancelTaskRequest,
    DetailedTask,
    DownstreamTask,
    GetTaskRequest,
    TaskIdParams,
    TaskUpdateParams,
    UpdateTaskRequest,
)

EXTENSION = "io.modelcontextprotocol/tasks"


# The tasks extension's requests and results, as the runtime's own client defines them (agents_app.mcp_client).
CreateTaskResult = DownstreamTask


async def get_task(session, task_id: str) -> DetailedTask:
    return await session.send_request(GetTaskRequest(params=TaskIdParams(taskId=task_id)), DetailedTask)


async def update_task(session, task_id: str, responses: dict) -> types.Result:
    return await session.send_request(
        UpdateTaskRequest(params=TaskUpdateParams(taskId=task_id, inputResponses=responses)), types.Result)


async def cancel_task(session, task_id: str) -> types.Result:
    return await session.send_request(CancelTaskRequest(params=TaskIdParams(taskId=task_id)), types.Result)


async def poll_until(session, task_id: str, statuses: set[str], seconds: float = 60) -> DetailedTask:
    deadline = asyncio.get_running_loop().time() + seconds
    while True:
        task = await get_task(session, task_id)
        if task.status in statuses:
            return task
        assert asyncio.get_running_loop().time() < deadline, f"task {task_id} still {task.status}"
        await asyncio.sleep(0.1)


async def _resolve(created: CreateTaskResult, ctx: ClaimContext) -> types.CallToolResult:
    task = await poll_until(ctx.session, created.task_id, {"completed", "failed", "cancelled"})
    if task.status == "completed":
        return types.CallToolResult.model_validate(task.result)
    raise RuntimeError(f"task {task.status}: {task.error}")


class TasksExtension(ClientExtension):
    identifier = EXTENSION

    def claims(self):
        return [ResultClaim(result_type="task", model=CreateTaskResult, resolve=_resolve)]


@contextlib.asynccontextmanager
async def mcp_client(url: str, token: str | None, *, tasks: bool = True, mode: str = "auto"):
    """A connected mcp.Client with a bearer token (and the tasks extension declared, unless ``tasks=False``)."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(60, read=120)) as http:
        transport = streamable_http_client(url, http_client=http)
        async with Client(transport, mode=mode, extensions=[TasksExtension()] if tasks else None) as client:
            yield client


async def call_tool_as_2025_task(session, name: str, arguments: dict, *, ttl: int = 60_000) -> types.CreateTaskResult:
    """tools/call with ``params.task`` on a 2025-11-25 session. The v2 SDK has no task-augmented call (its v1
    ``experimental.call_tool_as_task`` was removed) and checks every tools/call result against CallToolResult, so
    this one request goes through the session's raw JSON-RPC send; everything after it (tasks/get, tasks/result,
    tasks/list, tasks/cancel) is the SDK's typed send_request."""
    raw = await session._dispatcher.send_raw_request(
        "tools/call", {"name": name, "arguments": arguments, "task": {"ttl": ttl}}, {})
    return types.CreateTaskResult.model_validate(raw)
