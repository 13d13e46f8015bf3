"""``subscriptions/listen`` (2026-07-28): the response is the stream. With the tasks extension a client names
``notifications.taskIds``; it then gets ``notifications/tasks`` (the whole DetailedTask) each time one of them
changes status, fed by the tasks' events through Redis (tasks_app.streaming) and re-read from PostgreSQL — the row
is the truth, an event only says when to look. Nothing is replayed: a client that reconnects calls tasks/get.

The contract the SDK's ListenHandler keeps, kept here too: subscribe before the acknowledgement, so nothing is lost
between the two; the acknowledgement is the first frame and echoes only what is honoured (the caller's own tasks;
list-changed kinds are not offered: the tool, prompt and resource lists change only with a deployment); every frame
carries ``_meta["io.modelcontextprotocol/subscriptionId"]``. The stream ends once every task it follows is finished.

It also ends when the token that opened it is revoked or expires (tasks_app.web.stream_guard: re-checked every
oauth.stream_token_check_seconds, at its expiry, and once more before a task's final state is sent): the answer to
the listen request is then the JSON-RPC error mcp_bridge.waiting.TOKEN_ENDED, and nothing of the tasks after it.
"""

from __future__ import annotations

from typing import Any, Literal

import mcp.types as types
from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp.shared.subscriptions import SUBSCRIPTION_ID_META_KEY
from mcp_types import INVALID_PARAMS, INVALID_REQUEST
from pydantic import ConfigDict

from mcp_bridge import auth, bridge
from mcp_bridge.asgi import in_thread
from mcp_bridge.negotiation import declared, extension_required
from mcp_bridge.waiting import may_change_status, stream_guard, token_ended
from tasks_app.models import Task
from tasks_app.observability import metrics
from tasks_app.streaming import next_batch, subscribed, task_channel

MAX_TASKS_PER_STREAM = 100
_FINISHED = ("completed", "failed", "cancelled")
FALLBACK_POLL_SECONDS = 5.0


class TaskNotificationParams(types.NotificationParams):
    model_config = ConfigDict(extra="allow")


class TaskNotification(types.Notification[TaskNotificationParams, Literal["notifications/tasks"]]):
    method: Literal["notifications/tasks"] = "notifications/tasks"
    params: TaskNotificationParams


def _own_tasks(principal: auth.Principal, task_ids: list[str]) -> list[str]:
    """The requested ids that are the caller's tasks (another tenant's is dropped as silently as an unknown one)."""
    own = []
    for task_id in task_ids:
        try:
            own.append(str(bridge.task_read(principal, task_id).id))
        except MCPError:
            continue
    return own


def _snapshots(principal: auth.Principal, task_ids: list[str]) -> dict[str, dict]:
    """The DetailedTask of each (a task purged meanwhile by the retention sweep is simply no longer followed)."""
    tasks = Task.objects.filter(id__in=task_ids, tenant=principal.tenant)
    return {str(task.id): bridge.detailed_task(task) for task in tasks}


async def listen(ctx: ServerRequestContext, params: types.SubscriptionsListenRequestParams):
    subscription_id = ctx.request_id
    if subscription_id is None:
        raise MCPError(INVALID_REQUEST, "subscriptions/listen needs a request id.")
    principal = auth.current_principal.get()
    requested = (params.notifications.model_extra or {}).get("taskIds")
    task_ids: list[str] = []
    if requested is not None:
        if not declared(ctx):
            raise extension_required("A task subscription")
        if not isinstance(requested, list) or not all(isinstance(i, str) for i in requested) \
                or len(requested) > MAX_TASKS_PER_STREAM:
            raise MCPError(INVALID_PARAMS, f"notifications.taskIds is a list of at most {MAX_TASKS_PER_STREAM} task "
                           "ids.")
        task_ids = await in_thread(_own_tasks, principal, list(dict.fromkeys(requested)))
    meta: dict[str, Any] = {SUBSCRIPTION_ID_META_KEY: subscription_id}
    honored = types.SubscriptionFilter.model_validate({"taskIds": task_ids} if requested is not None else {})
    async with stream_guard() as guard, subscribed(*(task_channel(task_id) for task_id in task_ids)) as listener, \
            metrics.subscriber("listen"):
        guard.wake(listener)  # (a revocation wakes the wait below: the stream ends within the check interval)
        await ctx.session.send_notification(types.SubscriptionsAcknowledgedNotification(
            params=types.SubscriptionsAcknowledgedNotificationParams(notifications=honored, _meta=meta)),
            related_request_id=subscription_id)
        if not task_ids:
            return await _idle(listener, guard)
        sent: dict[str, tuple] = {}
        changed = set(task_ids)  # first pass: anything that moved between the tasks/get and this subscription
        while True:
            snapshots = await in_thread(_snapshots, principal, sorted(changed))
            for task_id, snapshot in snapshots.items():  # the current state first, then each change of status
                mark = (snapshot["status"], snapshot.get("statusMessage"))
                if sent.get(task_id) == mark:
                    continue
                # Checked before each notification; a task's final state (its result) after one more check.
                if guard.ended or (mark[0] in _FINISHED and await guard.confirm()):
                    raise token_ended(guard.ended)
                await ctx.session.send_notification(
                    TaskNotification(params=TaskNotificationParams.model_validate({**snapshot, "_meta": meta})),
                    related_request_id=subscription_id)
                sent[task_id] = mark
            task_ids = [task_id for task_id in task_ids if task_id in sent]  # (a purged one is dropped)
            if all(sent[task_id][0] in _FINISHED for task_id in task_ids):
                return types.SubscriptionsListenResult(_meta=meta)
            batch, overflow = await next_batch(listener, timeout=FALLBACK_POLL_SECONDS)
            if guard.ended:
                raise token_ended(guard.ended)
            changed = set(task_ids) if overflow or not batch else {
                channel.removeprefix(task_channel("")) for channel, items in batch.items()
                if any(may_change_status(item.type) for item in items)}
            changed &= set(task_ids)


async def _idle(listener, guard) -> Any:
    """A stream that follows no task: open (keep-alives come from the transport) until the client leaves, or its
    token ends."""
    while True:
        await next_batch(listener, timeout=3600)
        if guard.ended:
            raise token_ended(guard.ended)

