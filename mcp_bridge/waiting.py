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
from tasks_app.streaming import next_items, subscribed, task_channel

FALLBACK_POLL_SECONDS = 1.0
_NO_STATUS_CHANGE = {"progress", "log", "artifact", "checkpoint", "effect"}
_SETTLED = {*(str(status) for status in TERMINAL_STATUSES), str(TaskStatus.INPUT_REQUIRED)}


def may_change_status(event_type: str) -> bool:
    """Could an event of this type come with a change of the task's status? (Unknown types: assume so.)"""
    return event_type not in _NO_STATUS_CHANGE


async def until_settled(read: Callable[[], Task], task_id, *, timeout: float,
                        on_progress: Callable[[float, str], Awaitable[None]] | None = None,
                        stop: Callable[[Task], bool] | None = None) -> Task:
    """The task once it is finished or waits for input (or once ``stop(task)`` holds), or as it is when ``timeout``
    seconds have passed. ``on_progress(progress, phase)`` is awaited for each live progress event."""
    stop = stop or (lambda task: task.status in _SETTLED)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    channel = task_channel(task_id)
    async with subscribed(channel) as listener:  # subscribed before the first read: nothing after it is missed
        task = await in_thread(read)
        while not stop(task):
            remaining = deadline - loop.time()
            if remaining <= 0:
                return task
            items, overflow = await next_items(listener, channel, timeout=min(FALLBACK_POLL_SECONDS, remaining))
            for item in items or ():
                if item.type == "progress" and on_progress is not None:
                    data = json.loads(item.data).get("data") or {}
                    await on_progress(float(data.get("progress") or 0.0), str(data.get("phase") or ""))
            # Progress alone changes no status: re-read on anything else, a lost event, or the fallback tick.
            if items is None or overflow or any(may_change_status(item.type) for item in items):
                task = await in_thread(read)
    return task
