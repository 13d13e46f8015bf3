"""Rate limits for creating and steering tasks, per token (or signed-in user), shared by every web process.

    refusal = rate_limit_hit(action="create", identity="token-42", rate=rate_for("create", tenant_value))
    if refusal: answer 429 with Retry-After: refusal.retry_after_seconds

A limit is "N/second|minute|hour|day" (settings RATE_LIMIT_CREATE, RATE_LIMIT_STEER; a tenant may set its own):
at most N requests in ANY window of that length — a sliding window, one sorted-set member per counted request, kept
in Redis (settings.REDIS_URL) under `runtime:rate:<action>:<identity>`, which expires with the window. The check and
the count are one Lua script, atomic: two web processes racing for the last request of a window cannot both get it.
Times are Redis's clock (TIME), so web processes on several hosts agree on the window. A refused request is not
counted (a client that keeps retrying too early does not push its own window further out).

Redis unreachable: the request is ALLOWED (fail open) and a warning is logged, at most once per
UNAVAILABLE_BACKOFF_SECONDS, during which Redis is not asked again (so an outage costs no request a timeout).
A rate limit protects the service from a busy client; refusing every creation because the short-lived store is away
would turn a Redis outage into a full outage of the API. (The tool servers' limits, agents_app.limits, fail closed:
there a limit protects someone else's server.)

Why not a library: `limits` (the best kept) declares its Redis storage for redis-py < 8 (this project runs 8.1) and
counts with the web process's clock; django-ratelimit counts a fixed window in Django's cache and decorates views
only (the MCP endpoint is not a Django view). The script below is the sliding window agents_app.limits uses.
"""

from __future__ import annotations

import logging
import math
import os
import re
import threading
import time
from dataclasses import dataclass

import redis
from django.conf import settings
from django.core.exceptions import ValidationError

logger = logging.getLogger(__name__)

ACTIONS = ("create", "steer")
UNITS = {"second": 1, "minute": 60, "hour": 3600, "day": 86400}
OFF = "off"
_RATE = re.compile(r"^\s*(\d{1,9})\s*/\s*(second|minute|hour|day)s?\s*$")
UNAVAILABLE_BACKOFF_SECONDS = 5.0
# A web request must not wait long for a store it can do without.
REDIS_TIMEOUT_SECONDS = 0.5

# KEYS: the window (a sorted set). ARGV: limit, window ms, member.
# → 0: counted; else the ms until the oldest counted request leaves the window (then one more fits).
_HIT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local window = tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - window)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[1]) then
  local oldest = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  return math.max(tonumber(oldest[2]) + window - now, 1)
end
redis.call('ZADD', KEYS[1], now, ARGV[3])
redis.call('PEXPIRE', KEYS[1], window)
return 0
"""


@dataclass(frozen=True)
class Rate:
    count: int
    seconds: int
    text: str  # as configured, normalised: "60/minute"


def rate_parse(text: str | None) -> Rate | None:
    """"60/minute" → Rate(60, 60); "off" → None (no limit). ValueError for anything else."""
    value = (text or "").strip().lower()
    if value == OFF:
        return None
    match = _RATE.match(value)
    if match is None or int(match.group(1)) < 1:
        raise ValueError(f"{text!r} is not a rate: write N/second, N/minute, N/hour or N/day (N ≥ 1), or {OFF!r}")
    count, unit = int(match.group(1)), match.group(2)
    return Rate(count=count, seconds=UNITS[unit], text=f"{count}/{unit}")


def rate_limit_validator(value: str) -> None:
    """A model field's validator: empty (the deployment's default), "off", or a rate."""
    if value:
        try:
            rate_parse(value)
        except ValueError as error:
            raise ValidationError(str(error)) from None


def rate_for(action: str, tenant_value: str = "") -> Rate | None:
    """The limit for ``action``: the tenant's own when it set one, else the deployment's setting."""
    if tenant_value:
        try:
            return rate_parse(tenant_value)
        except ValueError:  # (the admin validates it; a row written otherwise falls back to the deployment's)
            logger.warning("a tenant's %s rate limit %r is not a rate; the deployment's applies", action,
                           tenant_value)
    return settings.RATE_LIMITS[action]


@dataclass(frozen=True)
class RateRefusal:
    action: str
    rate: Rate
    retry_after: float  # seconds until one more request fits

    @property
    def retry_after_seconds(self) -> int:
        """For a Retry-After header: whole seconds, at least 1."""
        return max(1, math.ceil(self.retry_after))

    def message(self, who: str) -> str:
        verb = "create tasks" if self.action == "create" else "steer or cancel tasks"
        return (f"Too many requests: {who} may {verb} at most {self.rate.text.replace('/', ' times per ')}. Nothing "
                f"was done; send it again after {self.retry_after_seconds} s (Retry-After).")


class _Redis:
    """One client per process and URL (a forked child makes its own), with the script registered on it; and the
    moment until which Redis is taken as away (fail open without asking)."""

    def __init__(self):
        self.made_for = None
        self.lock = threading.Lock()
        self.down_until = 0.0

    def get(self):
        with self.lock:
            if self.made_for != (os.getpid(), settings.REDIS_URL):
                self.client = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=REDIS_TIMEOUT_SECONDS,
                                                   socket_connect_timeout=REDIS_TIMEOUT_SECONDS)
                self.hit = self.client.register_script(_HIT)
                self.made_for = (os.getpid(), settings.REDIS_URL)
                self.down_until = 0.0
            return self


_redis = _Redis()


def rate_key(action: str, identity: str) -> str:
    return f"runtime:rate:{action}:{identity}"


def rate_limit_hit(*, action: str, identity: str, rate: Rate | None) -> RateRefusal | None:
    """Count one ``action`` request of ``identity`` ("token-<id>", "user-<id>": never a secret) against ``rate``;
    a RateRefusal when it is over (nothing counted), None when it may go on — also when there is no limit, or when
    Redis cannot be asked (fail open, logged)."""
    if rate is None:
        return None
    store = _redis.get()
    if time.monotonic() < store.down_until:
        return None
    try:
        wait_ms = store.hit(keys=[rate_key(action, identity)], args=[rate.count, rate.seconds * 1000,
                                                                    os.urandom(8).hex()])
    except redis.RedisError as error:
        store.down_until = time.monotonic() + UNAVAILABLE_BACKOFF_SECONDS
        logger.warning("rate limits not checked (Redis: %s); requests are let through for %.0f s",
                       type(error).__name__, UNAVAILABLE_BACKOFF_SECONDS)
        return None
    if not wait_ms:
        return None
    return RateRefusal(action=action, rate=rate, retry_after=int(wait_ms) / 1000)
