"""Live events: published to Redis after they commit, fanned out to SSE subscribers on every web process
(ARCHITECTURE §8). Events may be lost on the way; the TaskEvent table and the snapshot are the truth.

Publishing. Whoever commits task events (a worker's fenced write, a steering submission, a create, the reaper)
calls ``events_publish`` after the commit: one pipelined round trip to Redis, one PUBLISH per event. Each
message names its task's channel and its tenant; the receiving web process also hands status, progress and
terminal events to the subscribers of the tenant's channel and of the all-tasks channel (dashboards, the
console's list), so a dashboard costs the publisher nothing. A Redis that does not answer costs a publisher at
most PUBLISH_TIMEOUT once, then PUBLISH_PAUSE_SECONDS of not trying: a step is never held up by the stream.

Fan-out. The web process keeps one Redis subscription (``FanOut``), the messages in django-eventstream's format,
handed to django-eventstream's ListenerManager, which queues them for each local subscriber of the channel
(bounded: a subscriber that falls behind is flagged, and its stream re-reads what it missed from PostgreSQL).
django-eventstream's own Redis listener stops for good on the first connection error; ours reconnects, and after
a reconnect flags every subscriber the same way, because what was published meanwhile is gone.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
import time
from urllib.parse import urlparse

import redis
from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder
from django_eventstream.event import Event as StreamEvent
from django_eventstream.views import Listener, get_listener_manager

logger = logging.getLogger(__name__)

# Event types a dashboard follows (the tenant and all-tasks channels); the rest only reach a task's own stream.
DASHBOARD_TYPES = frozenset({"status", "progress", "terminal"})
ALL_TASKS_CHANNEL = "tasks"
PUBLISH_TIMEOUT = 0.5
PUBLISH_PAUSE_SECONDS = 5.0


def task_channel(task_id) -> str:
    return f"task-{task_id}"


def tenant_channel(tenant_id) -> str:
    return f"tenant-{tenant_id}"


def redis_topic() -> str:
    """The one Redis pub/sub topic of this deployment. Pub/sub ignores Redis database numbers, so the number in
    REDIS_URL is part of the name: deployments (and test runs) sharing a server do not hear each other."""
    database = (urlparse(settings.STREAM_REDIS_URL).path or "/0").lstrip("/") or "0"
    return f"runtime-events:{database}"


def stream_message(*, task_id, seq: int, type: str, data: dict) -> dict:
    """What a subscriber receives for one event (SSE data): the same shape for a live and a replayed event."""
    return {"taskId": str(task_id), "seq": seq, "type": type, "data": data}


# Sent in place of events a publisher could not publish: the task's subscribers re-read its events from PostgreSQL.
RESYNC = "resync"


class _Publisher:
    """One Redis client per process (a prefork child makes its own), with a pause after a failure.

    Events it could not publish are not kept; the tasks they belong to are, and once Redis answers again (a retry
    PUBLISH_PAUSE_SECONDS later, on a timer, so even a task that publishes nothing more is covered) each gets a
    RESYNC message: its subscribers re-read from PostgreSQL what they missed — a terminal event included, which no
    later event would otherwise reveal as missing."""

    def __init__(self):
        self.client: redis.Redis | None = None
        self.pid: int | None = None
        self.paused_until = 0.0
        self.lock = threading.Lock()
        self.unpublished: set[str] = set()  # task channels with events that were not published
        self.retry: threading.Timer | None = None

    def publish(self, messages: list[tuple[str, str, str, int | None, int | None]], task_channels: set[str]) -> None:
        if not messages:
            return
        if time.monotonic() < self.paused_until:
            self._remember(task_channels)
            return
        try:
            self._send(messages)
        except Exception as error:  # noqa: BLE001  (the events are committed: a publish must never fail the caller)
            # Called after a commit — a create's, a steering submission's, a worker's fenced write: raising here
            # would answer 500 for what is done (and a client retrying a create makes a second task). Whatever
            # Redis or its client does, the subscribers re-read from PostgreSQL.
            self.paused_until = time.monotonic() + PUBLISH_PAUSE_SECONDS
            self._remember(task_channels)
            logger.warning("live events not published for %.0f s (subscribers re-read them): %s: %s",
                           PUBLISH_PAUSE_SECONDS, type(error).__name__, error,
                           exc_info=not isinstance(error, redis.RedisError))

    def _client(self) -> redis.Redis:
        # One client per process, made under the lock. Race: a web process's first requests publish at once from
        # the thread pool's threads; each made a client and the last replaced the others, and a replaced client
        # closes its connection pool when collected — under a thread still reading a reply from it (a ValueError
        # or AttributeError out of redis-py, not a RedisError). A prefork child (a new pid) makes its own.
        client = self.client
        if self.pid == os.getpid() and client is not None:
            return client
        with self.lock:
            if self.pid != os.getpid() or self.client is None:
                self.client = redis.Redis.from_url(settings.STREAM_REDIS_URL, socket_timeout=PUBLISH_TIMEOUT,
                                                   socket_connect_timeout=PUBLISH_TIMEOUT)
                self.pid, self.unpublished, self.retry = os.getpid(), set(), None
            return self.client

    def _send(self, messages) -> None:
        topic = redis_topic()
        pipe = self._client().pipeline(transaction=False)
        for channel, event_type, data, seq, tenant_id in messages:
            # django-eventstream's Redis message ({channel, event_type, data (JSON text), pub_id}), with the tenant.
            pipe.publish(topic, json.dumps({"channel": channel, "event_type": event_type, "data": data,
                                            "pub_id": seq, "tenant": tenant_id}))
        pipe.execute()

    def _remember(self, task_channels: set[str]) -> None:
        with self.lock:
            self.unpublished |= task_channels
            if self.retry is None:
                self.retry = threading.Timer(PUBLISH_PAUSE_SECONDS, self._resync)
                self.retry.daemon = True
                self.retry.start()

    def _resync(self) -> None:
        with self.lock:
            channels, self.unpublished, self.retry = self.unpublished, set(), None
        try:
            self._send([(channel, RESYNC, "{}", None, None) for channel in sorted(channels)])
        except Exception:  # noqa: BLE001  (still away: try again later; a timer thread has no caller to tell)
            self._remember(channels)
        else:
            self.paused_until = 0.0


_publisher = _Publisher()


def events_publish(*, task_id, tenant_id, events) -> None:
    """Publish committed events (TaskEvent rows, or (seq, type, data) triples). Call after the commit."""
    messages = []
    for event in events:
        seq, type_, data = (event.seq, event.type, event.data) if hasattr(event, "seq") else event
        text = json.dumps(stream_message(task_id=task_id, seq=seq, type=type_, data=data), cls=DjangoJSONEncoder)
        messages.append((task_channel(task_id), type_, text, seq, tenant_id))
    _publisher.publish(messages, {task_channel(task_id)})


def notice_publish(*, channel: str, type: str, data: dict) -> None:
    """Publish a short-lived notice that is no task event (never stored, no seq) to the subscribers of ``channel``
    on every web process — never a task's own channel, whose streams number every item. Lost if Redis is away: a
    listener must not depend on it (mcp_bridge.elicitation: a lost notice costs a question asked again later)."""
    _publisher.publish([(channel, type, json.dumps(data, cls=DjangoJSONEncoder), 0, None)], set())


# Live only: published to a task's subscribers as it happens and never stored (no TaskEvent row, no seq, outside the
# hash chain), so a subscriber that was away misses it for good — the committed events say what came of it. An
# agent's model output as it is generated (agents_app.agent) is one.
LIVE_ONLY_TYPES = frozenset({"llm.delta"})


def live_publish(*, task_id, type: str, data: dict) -> None:
    """Publish a live-only item (LIVE_ONLY_TYPES) to the task's stream subscribers; lost if Redis is away."""
    if type not in LIVE_ONLY_TYPES:
        raise ValueError(f"{type!r} is not a live-only type ({sorted(LIVE_ONLY_TYPES)})")
    text = json.dumps({"taskId": str(task_id), "type": type, "data": data}, cls=DjangoJSONEncoder)
    _publisher.publish([(task_channel(task_id), type, text, None, None)], set())


class FanOut:
    """This web process's one subscription to the deployment's topic, kept alive across Redis restarts."""

    RECONNECT_MAX_SECONDS = 2.0

    def __init__(self):
        self.ready = asyncio.Event()  # subscribed: what is published from now on reaches local subscribers
        self.task: asyncio.Task | None = None

    def ensure_running(self) -> None:
        """Start the subscription on the running loop, once. The task is kept here: a task nobody references is
        garbage-collected mid-await (django-eventstream starts its listener that way, and it died so)."""
        if self.task is None or self.task.done():
            self.task = asyncio.get_running_loop().create_task(self.start(), name="live-events-fan-out")

    async def start(self):
        from redis.asyncio import Redis

        delay = 0.1
        while True:
            client = Redis.from_url(settings.STREAM_REDIS_URL, socket_connect_timeout=2, health_check_interval=10)
            pubsub = client.pubsub()
            try:
                await pubsub.subscribe(redis_topic())
                if self.ready.is_set() is False and delay > 0.1:
                    logger.info("live events: subscribed again")
                self._everyone_catch_up()  # (after a reconnect: what was published meanwhile is gone)
                self.ready.set()
                delay = 0.1
                async for message in pubsub.listen():
                    if message["type"] == "message":
                        self._deliver(message["data"])
            except asyncio.CancelledError:
                raise
            except Exception as error:  # Redis went away (or answered nonsense): reconnect, never give up
                self.ready.clear()
                logger.warning("live events: subscription lost (%s: %s); reconnecting", type(error).__name__, error)
            finally:
                try:
                    await pubsub.aclose()
                    await client.aclose()
                except Exception:
                    pass
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.RECONNECT_MAX_SECONDS)

    @staticmethod
    def _deliver(raw) -> None:
        try:
            message = json.loads(raw)
            event = StreamEvent(message["channel"], message["event_type"], message["data"], id=message["pub_id"])
        except (ValueError, KeyError, TypeError):
            logger.warning("live events: a message that is not an event was ignored")
            return
        manager = get_listener_manager()
        manager.add_to_queues(event.channel, event)
        if event.type in DASHBOARD_TYPES:  # the dashboards' channels, from the same message
            if message.get("tenant") is not None:
                manager.add_to_queues(tenant_channel(message["tenant"]), event)
            manager.add_to_queues(ALL_TASKS_CHANNEL, event)

    @staticmethod
    def _everyone_catch_up() -> None:
        manager = get_listener_manager()
        with manager.lock:
            listeners = {listener for group in manager.listeners_by_channel.values() for listener in group}
            for listener in listeners:
                listener.overflow = True
        for listener in listeners:
            listener.wake_threadsafe()


_fan_out: FanOut | None = None


def fan_out() -> FanOut:
    """This process's fan-out, running (started by the first stream). It feeds django-eventstream's
    ListenerManager, which is told its own Redis listener is already running so it never starts one."""
    global _fan_out
    if _fan_out is None:
        _fan_out = FanOut()
        manager = get_listener_manager()
        manager.redis_listener, manager.redis_listener_started = _fan_out, True
    _fan_out.ensure_running()
    return _fan_out


# How long a new subscriber waits for this process's subscription (only the first of a process, or while Redis is
# away); without it the reader still starts from PostgreSQL and catches up once subscribed.
SUBSCRIBE_WAIT_SECONDS = 3.0


class subscribed:
    """A django-eventstream Listener on ``channels`` for this stream's life, registered before anything is read."""

    def __init__(self, *channels: str):
        self.channels = set(channels)
        self.listener = Listener()

    async def __aenter__(self) -> Listener:
        hub = fan_out()
        self.listener.channels = self.channels
        self.listener.assign_loop()
        get_listener_manager().add_listener(self.listener)
        try:
            await asyncio.wait_for(hub.ready.wait(), SUBSCRIBE_WAIT_SECONDS)
        except TimeoutError:
            pass  # Redis away: start from PostgreSQL; the reconnect flags this stream to catch up
        return self.listener

    async def __aexit__(self, *exc_info) -> None:
        get_listener_manager().remove_listener(self.listener)


async def next_items(listener: Listener, channel: str, *, timeout: float):
    """(items, overflow) queued for ``channel``; (None, False) after ``timeout`` seconds with none."""
    try:
        async with asyncio.timeout(timeout):  # (no task per wait, as wait_for would create)
            await listener.aevent.wait()
    except TimeoutError:
        return None, False
    manager = get_listener_manager()
    with manager.lock:
        items = listener.channel_items.pop(channel, [])
        overflow, listener.overflow = listener.overflow, False
        listener.aevent.clear()
    return items, overflow


async def next_batch(listener: Listener, *, timeout: float) -> tuple[dict[str, list], bool]:
    """({channel: items}, overflow) for every channel of ``listener``; ({}, False) after ``timeout`` with none."""
    try:
        async with asyncio.timeout(timeout):
            await listener.aevent.wait()
    except TimeoutError:
        return {}, False
    manager = get_listener_manager()
    with manager.lock:
        batch, listener.channel_items = dict(listener.channel_items), {}
        overflow, listener.overflow = listener.overflow, False
        listener.aevent.clear()
    return batch, overflow
