"""Per tool server limits across every worker process and host: a concurrency cap and a rate limit, kept in Redis.

    with server_slot(server):      # raises ToolBusy(retry_after=…) when the server is full or over its rate
        ...call the tool...

- **Concurrency**: at most `server.max_concurrent_calls` calls of one server run at once. A slot is a member of a
  sorted set scored by its expiry; the holder renews it every third of `tools.slot_seconds` while the call runs,
  so a slot whose worker crashed (SIGKILL, a lost host) frees itself at most slot_seconds after its last renewal —
  no one has to clean up after it. A call that outlives a lost slot (a worker paused longer than slot_seconds) is
  not stopped; it is logged, and its slot may have been given to another call meanwhile.
- **Rate**: at most `server.rate_per_minute` (else `tools.rate_per_minute`) calls START in any 60 seconds: a
  sliding window of the starts, one sorted-set member per call started in the last minute.

Both are checked and taken in one Lua script, atomically, so two workers racing for the last slot cannot both get
it, and a call refused by one limit takes nothing from the other. Times are Redis's clock (TIME), never a worker's:
workers on several hosts agree on when a slot expires. If Redis cannot be reached, the call is refused
(ToolLimitsUnavailable, a ToolBusy): a limit that cannot be counted is not skipped.

Redis is the short-lived store (settings.REDIS_URL): losing it forgets who holds slots, which frees them all at
once (a burst for the downstream servers at worst, never a lost task: the ledger is in PostgreSQL).
"""

from __future__ import annotations

import logging
import os
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import redis
from django.conf import settings

logger = logging.getLogger(__name__)

WINDOW_MS = 60_000
# How long to wait before trying a full server again: a running call usually ends sooner than its slot would expire.
BUSY_RETRY_SECONDS = 1.0
UNAVAILABLE_RETRY_SECONDS = 5.0
TOOL_BUSY = "tool_busy"

# KEYS: slots, starts. ARGV: token, max concurrent, slot ms, rate per minute, window ms.
# → {"ok", 0} or {"concurrency" | "rate", ms until the soonest slot expiry | until the oldest start leaves the window}
_ACQUIRE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local window = tonumber(ARGV[5])
-- Slots not renewed in time belong to crashed workers: they free themselves here.
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now - window)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[2]) then
  local soonest = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  return {'concurrency', tonumber(soonest[2]) - now}
end
if redis.call('ZCARD', KEYS[2]) >= tonumber(ARGV[4]) then
  local oldest = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
  return {'rate', tonumber(oldest[2]) + window - now}
end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[1])
redis.call('ZADD', KEYS[2], now, ARGV[1])
-- The keys themselves go once nothing has used them for longer than anything in them can live.
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[3]))
redis.call('PEXPIRE', KEYS[2], window)
return {'ok', 0}
"""

# KEYS: slots. ARGV: token, slot ms. → 1 renewed, 0 lost (it expired: another call may hold it now).
_RENEW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local expires = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not expires or tonumber(expires) <= now then
  redis.call('ZREM', KEYS[1], ARGV[1])
  return 0
end
redis.call('ZADD', KEYS[1], 'XX', now + tonumber(ARGV[2]), ARGV[1])
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[2]))
return 1
"""


class ToolBusy(Exception):
    """The server is at its concurrency cap or over its rate: the call was not made; try again after
    `retry_after` seconds (a hint: the step's retry, or the agent loop's, decides)."""

    type = TOOL_BUSY

    def __init__(self, server: str, limit: str, retry_after: float, message: str):
        super().__init__(message)
        self.server = server
        self.limit = limit  # "concurrency" | "rate" | "unavailable"
        self.retry_after = retry_after


class ToolLimitsUnavailable(ToolBusy):
    """Redis could not be reached: the limits cannot be counted, so the call is refused (fail closed)."""


def limit_keys(server) -> tuple[str, str]:
    """The server's two Redis keys (by id: names repeat across tenants). The braces keep both in one Redis Cluster
    slot, which the script needs."""
    return f"runtime:tools:{{server-{server.pk}}}:slots", f"runtime:tools:{{server-{server.pk}}}:starts"


class _Redis:
    """One client per process (a forked worker child makes its own) and URL, with the scripts registered on it."""

    def __init__(self):
        self.made_for = None
        self.lock = threading.Lock()

    def get(self):
        with self.lock:
            if self.made_for != (os.getpid(), settings.REDIS_URL):
                self.client = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=2, socket_connect_timeout=2)
                self.acquire = self.client.register_script(_ACQUIRE)
                self.renew = self.client.register_script(_RENEW)
                self.made_for = (os.getpid(), settings.REDIS_URL)
            return self


_redis = _Redis()


@dataclass
class Slot:
    """A held concurrency slot (and a counted start). `lost`: a renewal found it expired."""

    server: str
    keys: tuple[str, str]
    token: str
    slot_ms: int
    lost: bool = False
    _stop: threading.Event = field(default_factory=threading.Event, repr=False)
    _renewer: threading.Thread | None = field(default=None, repr=False)

    def _renew_until_released(self) -> None:
        while not self._stop.wait(self.slot_ms / 3000):
            try:
                renewed = _redis.get().renew(keys=[self.keys[0]], args=[self.token, self.slot_ms])
            except redis.RedisError as error:  # the next renewal may get through before the slot expires
                logger.warning("tool server %s: a call's slot was not renewed: %s", self.server,
                               type(error).__name__)
                continue
            if not renewed:
                self.lost = True
                logger.warning("tool server %s: a running call lost its concurrency slot (not renewed for "
                               "%.0f s); the cap may be exceeded until it ends", self.server, self.slot_ms / 1000)
                return

    def release(self) -> None:
        """Give the slot back (the start still counts for the rate). Safe to call twice."""
        self._stop.set()
        if self._renewer is not None and self._renewer is not threading.current_thread():
            self._renewer.join()
        try:
            _redis.get().client.zrem(self.keys[0], self.token)
        except redis.RedisError as error:  # it expires by itself within slot_seconds
            logger.warning("tool server %s: a slot was not released (%s); it frees itself within %.0f s",
                           self.server, type(error).__name__, self.slot_ms / 1000)


def slot_acquire(server, *, config_policy=None) -> Slot:
    """Take a slot of ``server`` (a ToolServer: pk, name, max_concurrent_calls, rate_per_minute) or raise
    ToolBusy. The caller must release() it; prefer `with server_slot(server)`. (For an async caller: run this and
    release() in a thread, e.g. anyio.to_thread.run_sync; they take one Redis round trip each.)"""
    tools = config_policy or settings.RUNTIME.tools
    slot_ms = int(tools.slot_seconds * 1000)
    rate = server.rate_per_minute or tools.rate_per_minute
    keys = limit_keys(server)
    token = uuid.uuid4().hex
    try:
        outcome, wait_ms = _redis.get().acquire(keys=list(keys), args=[token, server.max_concurrent_calls, slot_ms,
                                                                       rate, WINDOW_MS])
    except redis.RedisError as error:
        raise ToolLimitsUnavailable(
            server.name, "unavailable", UNAVAILABLE_RETRY_SECONDS,
            f"The limits of tool server {server.name} cannot be checked (Redis: {type(error).__name__}); the call "
            f"was not made.") from None
    outcome = outcome.decode() if isinstance(outcome, bytes) else outcome
    if outcome == "concurrency":
        raise ToolBusy(server.name, "concurrency", min(BUSY_RETRY_SECONDS, max(wait_ms, 0) / 1000),
                       f"Tool server {server.name} is running {server.max_concurrent_calls} calls already "
                       f"(max_concurrent_calls); the call was not made.")
    if outcome == "rate":
        raise ToolBusy(server.name, "rate", max(wait_ms, 1) / 1000,
                       f"Tool server {server.name} was called {rate} times in the last minute (rate_per_minute); "
                       f"the call was not made.")
    slot = Slot(server=server.name, keys=keys, token=token, slot_ms=slot_ms)
    slot._renewer = threading.Thread(target=slot._renew_until_released, name=f"tool-slot-{server.name}",
                                     daemon=True)
    slot._renewer.start()
    return slot


@contextmanager
def server_slot(server, *, config_policy=None) -> Iterator[Slot]:
    """Hold a slot of ``server`` for the block (slot_acquire), released when it ends, however it ends."""
    slot = slot_acquire(server, config_policy=config_policy)
    try:
        yield slot
    finally:
        slot.release()
