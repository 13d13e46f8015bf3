"""Server-Sent Events: a task's events as they commit, and a tenant's status changes (ARCHITECTURE §8).

``GET /runtime/tasks/{id}/events`` (bearer token, or an admin session):
- another tenant's task, or none: 404 (problem+json) before any byte is streamed;
- first ``task.snapshot`` (the snapshot and the ``seq`` it reflects), unless ``Last-Event-ID`` (a seq) asks to
  resume after it;
- then every TaskEvent after it in seq order, ``id:`` its seq, ``event:`` its type, ``data:`` {taskId, seq, type,
  data}; ``: keep-alive`` comments; the stream ends after ``terminal``. A resume of a finished task with nothing
  after Last-Event-ID answers 204, which tells EventSource to stop reconnecting.

Where events come from. The subscription to the live fan-out (tasks_app.streaming) is made before anything is
read, so nothing committed after the read can be missed; what committed before is read from PostgreSQL once, at
connect. After that PostgreSQL is read again only when the live events show a gap (a seq skipped: a message lost,
a subscriber that fell behind, a Redis reconnect), never on a timer: a stream of a quiet task costs nothing.

``GET /runtime/events``: status, progress and terminal events of the caller's tenant's tasks (every tenant's, for
staff with tasks_app.view_task), for dashboards; live only, no replay: re-read the snapshots after a reconnect.

Both end when the bearer token that opened them is revoked or expires (tasks_app.web.stream_guard: re-checked every
oauth.stream_token_check_seconds, and once more before the terminal event): the last thing sent is
``event: stream.end`` with ``{"reason": "token_revoked" | "token_expired", "detail"}`` and no ``id`` (it is no event
of the task), and nothing of the task after it.
"""

from __future__ import annotations

import json

from asgiref.sync import sync_to_async
from django.core.serializers.json import DjangoJSONEncoder
from django.db import InterfaceError, OperationalError, connection
from django.http import HttpResponse, StreamingHttpResponse
from psycopg_pool import PoolTimeout
from rest_framework import exceptions

from config.base.asgi_handler import db_in_thread
from config.base.json_input import dumps_bounded
from config.base.problems import DATABASE_BUSY, DATABASE_UNAVAILABLE, problem_response
from tasks_app import access, selectors
from tasks_app.models import TERMINAL_STATUSES, Task, TaskEvent
from tasks_app.observability import metrics
from tasks_app.streaming import (
    ALL_TASKS_CHANNEL,
    LIVE_ONLY_TYPES,
    RESYNC,
    next_items,
    stream_message,
    subscribed,
    task_channel,
    tenant_channel,
)
from tasks_app.web.authentication import bearer_authenticate
from tasks_app.web.stream_guard import StreamCredential, StreamEnd, StreamGuard, credential_of

KEEP_ALIVE_SECONDS = 15.0
REPLAY_BATCH = 500
_FINISHED = {str(status) for status in TERMINAL_STATUSES}
_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}  # (and no proxy buffering)


def _database_unavailable(view):
    """Before the stream starts, a database that is busy or away is a 503 with Retry-After, as on the API; once it
    has started, an error ends it and the client resumes with Last-Event-ID."""

    async def guarded(request, *args, **kwargs):
        try:
            return await view(request, *args, **kwargs)
        except (PoolTimeout, OperationalError, InterfaceError) as error:
            busy = isinstance(error, PoolTimeout)
            response = problem_response(status_code=503, slug="database-unavailable",
                                        detail=DATABASE_BUSY if busy else DATABASE_UNAVAILABLE)
            response["Retry-After"] = "2"
            return response

    guarded.__name__, guarded.__doc__ = view.__name__, view.__doc__
    return guarded


@_database_unavailable
async def task_events(request, task_id):
    viewer, credential = await _viewer(request)
    if isinstance(viewer, HttpResponse):
        return viewer
    task = await db_in_thread(lambda: access.visible(viewer, Task.objects.filter(id=task_id)).values("id").first())
    if task is None:
        return problem_response(status_code=404, slug="not-found", detail=f"There is no task {task_id} in your tenant.")
    try:
        last_seq = _last_event_id(request)
    except ValueError:
        return problem_response(status_code=400, slug="invalid-request",
                                detail="Last-Event-ID must be the seq of an event this stream sent (an integer ≥ 0).")
    if last_seq is not None and await db_in_thread(lambda: _finished_with_nothing_after(task_id, last_seq)):
        return HttpResponse(status=204)  # a finished task, already streamed to its end: EventSource stops here
    url_for = request.build_absolute_uri
    return StreamingHttpResponse(_task_stream(task_id, last_seq, url_for, credential),
                                 content_type="text/event-stream", headers=_HEADERS)


@_database_unavailable
async def tenant_events(request):
    viewer, credential = await _viewer(request)
    if isinstance(viewer, HttpResponse):
        return viewer
    channel = ALL_TASKS_CHANNEL if viewer.every_tenant else tenant_channel(viewer.tenant.id)
    return StreamingHttpResponse(_live_stream(channel, credential), content_type="text/event-stream",
                                 headers=_HEADERS)


# -- the streams ----------------------------------------------------------------------------------------------------
async def _task_stream(task_id, last_seq: int | None, url_for, credential: StreamCredential | None):
    channel = task_channel(task_id)
    async with StreamGuard(credential) as guard, subscribed(channel) as listener, metrics.subscriber("sse_task"):
        guard.wake(listener)  # (a revocation wakes the wait below: the stream ends within the check interval)
        sent = last_seq
        if sent is None:
            snapshot, sent, finished = await db_in_thread(lambda: _snapshot_now(task_id, url_for))
            if finished and await guard.confirm():  # (a finished task's snapshot holds its result)
                yield _end(guard.ended)
                return
            yield _sse("task.snapshot", sent, {"taskId": str(task_id), "seq": sent, "snapshot": snapshot})
            if finished:
                return
        while True:
            # Read what was missed: everything at connect, later only after a gap (REPLAY_BATCH events a read).
            while True:
                batch = await db_in_thread(lambda sent=sent: _events_after(task_id, sent))
                if guard.ended or (any(e["type"] == "terminal" for e in batch) and await guard.confirm()):
                    yield _end(guard.ended)
                    return
                for event in batch:
                    yield _sse(event["type"], event["seq"], event)
                    sent = event["seq"]
                    if event["type"] == "terminal":
                        return
                if len(batch) < REPLAY_BATCH:
                    break
            caught_up = False
            while not caught_up:
                items, overflow = await next_items(listener, channel, timeout=KEEP_ALIVE_SECONDS)
                if guard.ended:  # (checked first: nothing that came with the wake-up is sent)
                    yield _end(guard.ended)
                    return
                if items is None:
                    yield ": keep-alive\n\n"
                    continue
                if overflow or any(item.type == RESYNC for item in items):
                    break  # events were dropped (here, or by a publisher that could not reach Redis): read them
                chunk, ended = [], False
                # Live-only items (an agent's tokens as they come) carry no id: they are not events of the task, a
                # reconnect's Last-Event-ID never names one, and one that is lost is not a gap to re-read.
                chunk += [f"event: {item.type}\ndata: {item.data}\n\n"
                          for item in items if item.type in LIVE_ONLY_TYPES]
                items = [item for item in items if item.type not in LIVE_ONLY_TYPES]
                for item in sorted(items, key=lambda i: int(i.id)):
                    seq = int(item.id)
                    if seq <= sent:
                        continue  # already read from PostgreSQL
                    if seq > sent + 1:
                        caught_up = True  # a gap: read from PostgreSQL what is between
                        break
                    if item.type == "terminal" and await guard.confirm():
                        chunk.append(_end(guard.ended))  # (what came before it in this wake-up, then the end)
                        ended = True
                        break
                    chunk.append(f"id: {seq}\nevent: {item.type}\ndata: {item.data}\n\n")
                    sent = seq
                    if item.type == "terminal":
                        ended = True
                        break
                if chunk:  # what one wake-up brought, in one write
                    yield "".join(chunk)
                if ended:
                    return


async def _live_stream(channel: str, credential: StreamCredential | None):
    async with StreamGuard(credential) as guard, subscribed(channel) as listener, \
            metrics.subscriber("sse_tenant"):
        guard.wake(listener)
        yield ": subscribed\n\n"
        while True:
            items, _overflow = await next_items(listener, channel, timeout=KEEP_ALIVE_SECONDS)
            if guard.ended:
                yield _end(guard.ended)
                return
            if items is None:
                yield ": keep-alive\n\n"
                continue
            for item in items:
                if item.type != RESYNC:  # (dashboards re-read snapshots after a reconnect; no replay here)
                    yield f"event: task\ndata: {item.data}\n\n"


def _end(end: StreamEnd) -> str:
    """The stream's last event when its token is no longer valid: no ``id`` (no event of the task; a reconnect's
    Last-Event-ID stays the last task event sent)."""
    return f"event: stream.end\ndata: {json.dumps(end.as_dict())}\n\n"


def _sse(event_type: str, seq: int, payload: dict) -> str:
    # (bounded: an event's data stored deeper than json.dumps walks is sent cut at the cap, not a broken stream)
    return f"id: {seq}\nevent: {event_type}\ndata: {dumps_bounded(payload, cls=DjangoJSONEncoder)}\n\n"


# -- reads (each in a worker thread, its connection returned to the pool at once: a stream holds none) ----------------
def _snapshot_now(task_id, url_for) -> tuple[dict, int, bool]:
    task = Task.objects.get(id=task_id)
    return selectors.task_snapshot(task, url_for=url_for), task.event_seq, task.status in _FINISHED


def _events_after(task_id, seq: int) -> list[dict]:
    """Up to REPLAY_BATCH of the task's events after ``seq``, in order (a range of the primary key (task, seq))."""
    rows = TaskEvent.objects.filter(task_id=task_id, seq__gt=seq).order_by("seq").values_list("seq", "type", "data")
    return [stream_message(task_id=task_id, seq=s, type=t, data=d) for s, t, d in rows[:REPLAY_BATCH]]


def _finished_with_nothing_after(task_id, seq: int) -> bool:
    return Task.objects.filter(id=task_id, status__in=_FINISHED, event_seq__lte=seq).exists()


def _last_event_id(request) -> int | None:
    raw = request.headers.get("Last-Event-ID") or request.GET.get("lastEventId")
    if raw is None or raw == "":
        return None
    value = int(raw)
    if value < 0:
        raise ValueError(raw)
    return value


# -- who is asking -------------------------------------------------------------------------------------------------
async def _viewer(request) -> tuple[access.Actor | HttpResponse, StreamCredential | None]:
    """The actor (tasks_app.access) if it may stream, else the 401/403 to answer; and the bearer token's stream
    credential, which the stream's guard re-checks (None for a session)."""
    if request.headers.get("Authorization"):
        try:
            authenticated = await db_in_thread(lambda: bearer_authenticate(request))
        except exceptions.AuthenticationFailed as failed:
            response = problem_response(status_code=401, slug="not-authenticated", detail=str(failed.detail))
            response["WWW-Authenticate"] = 'Bearer realm="runtime"'
            return response, None
        if authenticated is not None:
            return (await db_in_thread(lambda: _may_stream(access.actor_for_token(authenticated[1]))),
                    credential_of(authenticated[1]))
    user = await request.auser()
    # Loading the session and the user took a pooled connection in this request's thread; a stream lasts, so give it
    # back now rather than when the response ends (a console with many open task pages would hold the pool).
    await sync_to_async(lambda: connection.close(), thread_sensitive=True)()  # (that thread's connection)
    if not user.is_authenticated:
        response = problem_response(status_code=401, slug="not-authenticated",
                                    detail="Send `Authorization: Bearer <token>` or sign in to the admin.")
        response["WWW-Authenticate"] = 'Bearer realm="runtime"'
        return response, None
    return await db_in_thread(lambda: _may_stream(access.actor_for_user(user))), None


def _may_stream(actor: access.Actor) -> access.Actor | HttpResponse:
    try:
        access.access_check(actor, access.Action.STREAM)  # (a task of another tenant: not visible, a 404 later)
    except access.AccessDenied as denied:
        return problem_response(status_code=403, slug="permission-denied", detail=denied.detail)
    return actor
