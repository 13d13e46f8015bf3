"""Waiting for a task to change, from an async handler: its live events (tasks_app.streaming) wake the wait, and
the row in PostgreSQL says what is true — re-read on every event that can change the status and at least once a
second, so a lost event (events may be lost; the row is the truth) delays an answer by a second, never forever.

Every wait is a stream its token opened (a 2025-11-25 ``tasks/result``, a foreground ``tools/call``, a ``tasks/cancel``
that waits): it ends when that token is revoked or expires (tasks_app.web.stream_guard — re-checked every
oauth.stream_token_check_seconds, at its expiry, and once more before a finished task is handed back) with the
JSON-RPC error TOKEN_ENDED, and nothing of the task after it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable

from mcp.shared.exceptions import MCPError

from config.base.problems import problem_type_uri
from mcp_bridge import auth
from mcp_bridge.asgi import in_thread
from tasks_app.models import TERMINAL_STATUSES, Task, TaskStatus
from tasks_app.streaming import next_batch, subscribed, task_channel
from tasks_app.web.stream_guard import StreamEnd, StreamGuard

FALLBACK_POLL_SECONDS = 1.0
# The JSON-RPC error that ends a stream whose token was revoked or expired while it was open (data: reason
# "token_revoked" | "token_expired", detail, type). The MCP specification names none; this one is in the range
# JSON-RPC leaves to servers, beside RATE_LIMITED (-32029, mcp_bridge.asgi). The client authenticates again.
TOKEN_ENDED = -32031
_NO_STATUS_CHANGE = {"progress", "log", "artifact", "checkpoint", "effect"}
_FINISHED = {str(status) for status in TERMINAL_STATUSES}
_SETTLED = {*_FINISHED, str(TaskStatus.INPUT_REQUIRED)}


def token_ended(end: StreamEnd) -> MCPError:
    """The error a stream ends with when its token stopped being valid (nothing of the task in it)."""
    return MCPError(TOKEN_ENDED, end.detail, {**end.as_dict(), "type": problem_type_uri("not-authenticated")})


def stream_guard() -> StreamGuard:
    """A guard on the token of the request being answered (mcp_bridge.auth.current_principal)."""
    principal = auth.current_principal.get(None)
    return StreamGuard(getattr(principal, "credential", None))


def may_change_status(event_type: str) -> bool:
    """Could an event of this type come with a change of the task's status? (Unknown types: assume so.)"""
    return event_type not in _NO_STATUS_CHANGE


async def until_settled(read: Callable[[], Task], task_id, *, timeout: float,
                        on_progress: Callable[[float, str], Awaitable[None]] | None = None,
                        stop: Callable[[Task], bool] | None = None,
                        notices: tuple[str, Callable[[dict], bool]] | None = None,
                        first: Callable[[Task], Awaitable[None]] | None = None) -> Task:
    """The task once it is finished or waits for input (or once ``stop(task)`` holds), or as it is when ``timeout``
    seconds have passed. ``on_progress(progress, phase)`` is awaited for each live progress event. ``notices``:
    (channel, hear) — a second channel (mcp_bridge.elicitation's), each of whose messages is handed to ``hear`` as
    its JSON data; one it answers True for ends the wait, the task as last read. ``first(task)`` is awaited with the
    first read, once subscribed: a notice answering what it sends cannot come before this wait listens."""
    stop = stop or (lambda task: task.status in _SETTLED)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    channel = task_channel(task_id)
    channels = (channel, notices[0]) if notices else (channel,)
    # Subscribed before the first read: nothing after it is missed. The guard wakes the wait when the token ends.
    async with stream_guard() as guard, subscribed(*channels) as listener:
        guard.wake(listener)
        task = await _settled(guard, await in_thread(read))
        if first is not None:
            await first(task)
        while not stop(task):
            remaining = deadline - loop.time()
            if remaining <= 0:
                return task
            batch, overflow = await next_batch(listener, timeout=min(FALLBACK_POLL_SECONDS, remaining))
            if guard.ended:  # (before anything that came with the wake-up is handed on)
                raise token_ended(guard.ended)
            items = batch.get(channel) or ()
            for item in items:
                if item.type == "progress" and on_progress is not None:
                    data = json.loads(item.data).get("data") or {}
                    await on_progress(float(data.get("progress") or 0.0), str(data.get("phase") or ""))
            heard = [notices[1](json.loads(item.data)) for item in batch.get(notices[0], ())] if notices else []
            # Progress alone changes no status: re-read on anything else, a lost event, or the fallback tick.
            if not batch or overflow or any(may_change_status(item.type) for item in items):
                task = await _settled(guard, await in_thread(read))
            if any(heard):
                return task
    return task


async def _settled(guard: StreamGuard, task: Task) -> Task:
    """``task`` as read, unless the token ended: a finished task (its result, its error) is handed back only after
    one more check of the token, so a revocation just before the end is not outrun by the result."""
    if guard.ended or (task.status in _FINISHED and await guard.confirm()):
        raise token_ended(guard.ended)
    return task
