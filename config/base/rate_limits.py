"""Rate limits for creating and steering tasks, per person and per tenant, shared by every web process.

    refusal = rate_limits_hit(action="create", person="user-42", tenant=tenant)
    if refusal: answer 429 with Retry-After: refusal.retry_after_seconds

Two buckets count each request, and the request goes through only if both have room:
- **the person's** (settings RATE_LIMIT_CREATE, RATE_LIMIT_STEER; a tenant may set its own per-person limit): one
  bucket per account, `user-<id>`, across their signed-in session (the admin's forms, the REST API) and every bearer
  token of theirs (API tokens, OAuth access tokens; REST and MCP) — a person with three tokens and a session has one
  limit, not four (issue 37: the session and a token were separate buckets);
- **the tenant's** (settings RATE_LIMIT_TENANT_CREATE, RATE_LIMIT_TENANT_STEER), `tenant-<id>`, across all its people:
  one tenant's many accounts do not add up to more than this.

A limit is "N/second|minute|hour|day": at most N requests in ANY window of that length — a sliding window, one
sorted-set member per counted request, kept in Redis (settings.REDIS_URL) under `runtime:rate:<action>:<identity>`,
which expires with the window. The check and the count of both buckets are one Lua script, atomic: two web processes
racing for the last request of a window cannot both get it, and a request refused by one bucket is counted in
neither. Times are Redis's clock (TIME), so web processes on several hosts agree on the window. A refused request is
not counted (a client that keeps retrying too early does not push its own window further out). A request that does
several things at once (a bulk action steering 20 tasks) counts as many (``cost``).

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

# KEYS: the windows (sorted sets), one per bucket. ARGV: member, cost, then limit and window ms of each key.
# → {0, 0}: counted `cost` times in every window; else {i, ms}: the bucket i (1-based) that is full, and the ms until
# enough of its counted requests leave the window (then `cost` more fit) — nothing counted anywhere.
_HIT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local cost = tonumber(ARGV[2])
local refused, wait = 0, 0
for i, key in ipairs(KEYS) do
  local limit, window = tonumber(ARGV[2 * i + 1]), tonumber(ARGV[2 * i + 2])
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now - window)
  local used = redis.call('ZCARD', key)
  if used + cost > limit then
    local w = window
    if cost <= limit then
      local oldest = redis.call('ZRANGE', key, used + cost - limit - 1, used + cost - limit - 1, 'WITHSCORES')
      w = math.max(tonumber(oldest[2]) + window - now, 1)
    end
    if w > wait then refused, wait = i, w end
  end
end
if refused > 0 then return {refused, wait} end
for i, key in ipairs(KEYS) do
  for n = 1, cost do redis.call('ZADD', key, now, ARGV[1] .. ':' .. n) end
  redis.call('PEXPIRE', key, tonumber(ARGV[2 * i + 2]))
end
return {0, 0}
"""
PERSON, TENANT = "person", "tenant"


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
    bucket: str = PERSON  # whose limit it is: the person's (across their session and tokens) or the tenant's

    @property
    def retry_after_seconds(self) -> int:
        """For a Retry-After header: whole seconds, at least 1."""
        return max(1, math.ceil(self.retry_after))

    def message(self, who: str = "") -> str:
        """For people: whose limit was met (``who`` names the person's: "your account"; the tenant's is said
        so), the limit, and when to send it again."""
        verb = "create tasks" if self.action == "create" else "steer or cancel tasks"
        who = "your tenant (all its people and tokens together)" if self.bucket == TENANT else \
            (who or "your account") + " (its session and every token of it together)"
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
    """Count one ``action`` request of ``identity`` ("user-<id>", "tenant-<id>": never a secret) against ``rate``
    alone; a RateRefusal when it is over (nothing counted), None when it may go on — also when there is no limit,
    or when Redis cannot be asked (fail open, logged). The interfaces ask rate_limits_hit (both buckets)."""
    return _hit(action, [(identity, rate, PERSON)])


def tenant_rate_for(action: str) -> Rate | None:
    """The tenant-wide limit for ``action`` (settings RATE_LIMIT_TENANT_CREATE / RATE_LIMIT_TENANT_STEER)."""
    return settings.RATE_LIMITS_TENANT[action]


def person_identity(user, *, token_id: int | None = None) -> str:
    """Whose person bucket a request counts in: the account (``user-<id>``), whether it came signed in or with any of
    its tokens; a token without an account (none is made so) counts alone, ``token-<id>``."""
    if user is not None and getattr(user, "pk", None):
        return f"user-{user.pk}"
    return f"token-{token_id}"


def rate_limits_hit(*, action: str, person: str, tenant, cost: int = 1) -> RateRefusal | None:
    """Count ``cost`` ``action`` requests of ``person`` (person_identity) in ``tenant`` (a Tenant: its id, and its
    own per-person limit ``<action>_rate_limit``) against the person's limit and the tenant-wide one, atomically
    (both have room, or nothing is counted); a RateRefusal saying which bucket is full, or None (also without
    limits, and with Redis away: fail open, logged). Every interface's one check (REST, the admin's forms, MCP)."""
    buckets = [(person, rate_for(action, getattr(tenant, f"{action}_rate_limit", "") or ""), PERSON)]
    if tenant is not None and getattr(tenant, "id", None) is not None:
        buckets.append((f"tenant-{tenant.id}", tenant_rate_for(action), TENANT))
    return _hit(action, buckets, cost=cost)


def _hit(action: str, buckets: list[tuple[str, Rate | None, str]], *, cost: int = 1) -> RateRefusal | None:
    buckets = [bucket for bucket in buckets if bucket[1] is not None]
    if not buckets or cost < 1:
        return None
    store = _redis.get()
    if time.monotonic() < store.down_until:
        return None
    args = [os.urandom(8).hex(), cost]
    for _, rate, _ in buckets:
        args += [rate.count, rate.seconds * 1000]
    try:
        refused, wait_ms = store.hit(keys=[rate_key(action, identity) for identity, _, _ in buckets], args=args)
    except redis.RedisError as error:
        store.down_until = time.monotonic() + UNAVAILABLE_BACKOFF_SECONDS
        logger.warning("rate limits not checked (Redis: %s); requests are let through for %.0f s",
                       type(error).__name__, UNAVAILABLE_BACKOFF_SECONDS)
        return None
    if not refused:
        return None
    _, rate, bucket = buckets[int(refused) - 1]
    return RateRefusal(action=action, rate=rate, retry_after=int(wait_ms) / 1000, bucket=bucket)
