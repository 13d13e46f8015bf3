"""Waiting for a task to change, from an async handler: its live events (tasks_app.streaming) wake the wait, and
the row in PostgreSQL says what is true — re-read on every event that can change the status and at least once a
second, so a lost event (events may be lost; the row is the truth) delays an answer by a second, never forever.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable

from mcp_bridge.asgi import in_thread
from tasks_app.models import TERMINAL_STATUSES, Task, TaskStatus
from tasks_app.streaming import next_batch, subscribed, task_channel

FALLBACK_POLL_SECONDS = 1.0
_NO_STATUS_CHANGE = {"progress", "log", "artifact", "checkpoint", "effect"}
_SETTLED = {*(str(status) for status in TERMINAL_STATUSES), str(TaskStatus.INPUT_REQUIRED)}


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
    async with subscribed(*channels) as listener:  # subscribed before the first read: nothing after it is missed
        task = await in_thread(read)
        if first is not None:
            await first(task)
        while not stop(task):
            remaining = deadline - loop.time()
            if remaining <= 0:
                return task
            batch, overflow = await next_batch(listener, timeout=min(FALLBACK_POLL_SECONDS, remaining))
            items = batch.get(channel) or ()
            for item in items:
                if item.type == "progress" and on_progress is not None:
                    data = json.loads(item.data).get("data") or {}
                    await on_progress(float(data.get("progress") or 0.0), str(data.get("phase") or ""))
            heard = [notices[1](json.loads(item.data)) for item in batch.get(notices[0], ())] if notices else []
            # Progress alone changes no status: re-read on anything else, a lost event, or the fallback tick.
            if not batch or overflow or any(may_change_status(item.type) for item in items):
                task = await in_thread(read)
            if any(heard):
                return task
    return task
