"""Provider limits shared across the fleet (issue 39, build 2): for a model endpoint — and for one tenant on it — a
concurrency cap, requests per minute and tokens per minute, counted in Redis so that every process of every host
takes from the same budget, with Redis's clock (TIME), never a worker's. A building block: the asynchronous I/O
process that will make the fleet's model calls asks here before each call and queues what is refused; nothing calls
it yet.

    grant = await acquire(client, [Scope("endpoint:…", limits), Scope("endpoint:…:tenant:7", tenant_limits)],
                          tokens=estimate, hold_seconds=timeout + margin)
    if isinstance(grant, Refused): wait grant.retry_after, then ask again
    ...the call...
    await grant.release(client, tokens=actual)   # gives the slot back, counts the tokens it really used

Every scope a call names is checked and taken in one Lua script, atomically: two processes racing for the last slot
cannot both get it, and a call refused by one limit takes nothing from another.
- **Concurrency**: a slot is a sorted-set member scored by when it expires — the call's own bound (``hold_seconds``:
  its timeout and a margin), so a holder that died (SIGKILL, a lost host) frees its slot by itself; no renewal, so
  a process with thousands of calls in flight writes nothing while they run.
- **Requests per minute**: the starts of the last 60 s, one member each (a sliding window).
- **Tokens per minute**: each start reserves its estimate; release() replaces the estimate with what the call used.
  A running total is kept beside the members and each member's tokens leave it as the member leaves the window, so
  a check costs the same however many calls the window holds.
If Redis cannot be reached, the call is refused (``unavailable``): a limit that cannot be counted is not skipped.
Losing Redis forgets every count (a burst for the provider at worst, never a lost task).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

import redis

WINDOW_MS = 60_000
UNAVAILABLE_RETRY_SECONDS = 5.0

# KEYS: per scope, 5 keys (slots, starts, token members, token amounts, token total). ARGV: call id, now offset (ms,
# tests only: 0), hold ms, window ms, tokens, then per scope: max concurrent, requests per minute, tokens per minute
# (-1: no such limit). → {"ok", 0} or {scope index, limit name, ms until it may pass}.
_ACQUIRE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ARGV[2])
local id, hold, window, tokens = ARGV[1], tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local scopes = #KEYS / 5
for s = 0, scopes - 1 do
  local slots, starts, members, amounts, total = KEYS[s*5+1], KEYS[s*5+2], KEYS[s*5+3], KEYS[s*5+4], KEYS[s*5+5]
  redis.call('ZREMRANGEBYSCORE', slots, '-inf', now)
  redis.call('ZREMRANGEBYSCORE', starts, '-inf', now - window)
  -- Tokens leave the total as their call leaves the window (each member once: amortised O(1) a check).
  local gone = redis.call('ZRANGEBYSCORE', members, '-inf', now - window)
  for _, member in ipairs(gone) do
    local amount = tonumber(redis.call('HGET', amounts, member) or '0')
    redis.call('DECRBY', total, amount)
    redis.call('HDEL', amounts, member)
  end
  if #gone > 0 then redis.call('ZREMRANGEBYSCORE', members, '-inf', now - window) end
  local cap, rpm, tpm = tonumber(ARGV[6+s*3]), tonumber(ARGV[7+s*3]), tonumber(ARGV[8+s*3])
  if cap >= 0 and redis.call('ZCARD', slots) >= cap then
    local soonest = redis.call('ZRANGE', slots, 0, 0, 'WITHSCORES')
    return {s, 'concurrency', tonumber(soonest[2]) - now}
  end
  if rpm >= 0 and redis.call('ZCARD', starts) >= rpm then
    local oldest = redis.call('ZRANGE', starts, 0, 0, 'WITHSCORES')
    return {s, 'requests', tonumber(oldest[2]) + window - now}
  end
  if tpm >= 0 and tonumber(redis.call('GET', total) or '0') + tokens > tpm then
    local oldest = redis.call('ZRANGE', members, 0, 0, 'WITHSCORES')
    local wait = 1000
    if oldest[2] then wait = tonumber(oldest[2]) + window - now end
    return {s, 'tokens', wait}
  end
end
for s = 0, scopes - 1 do
  local slots, starts, members, amounts, total = KEYS[s*5+1], KEYS[s*5+2], KEYS[s*5+3], KEYS[s*5+4], KEYS[s*5+5]
  redis.call('ZADD', slots, now + hold, id)
  redis.call('ZADD', starts, now, id)
  redis.call('ZADD', members, now, id)
  redis.call('HSET', amounts, id, tokens)
  redis.call('INCRBY', total, tokens)
  -- The keys go once nothing has used them for longer than anything in them can live.
  for _, key in ipairs({slots, starts, members, amounts, total}) do
    redis.call('PEXPIRE', key, math.max(hold, window))
  end
end
return {'ok', 0}
"""

# KEYS: as above. ARGV: call id, tokens used (-1: unchanged). → the slot given back in every scope; the tokens
# counted replaced by those used, if the call is still in the window.
_RELEASE = """
local id, used = ARGV[1], tonumber(ARGV[2])
for s = 0, #KEYS / 5 - 1 do
  local slots, amounts, total = KEYS[s*5+1], KEYS[s*5+4], KEYS[s*5+5]
  redis.call('ZREM', slots, id)
  local reserved = redis.call('HGET', amounts, id)
  if used >= 0 and reserved then
    redis.call('HSET', amounts, id, used)
    redis.call('INCRBY', total, used - tonumber(reserved))
  end
end
return 1
"""


@dataclass(frozen=True)
class Limits:
    """A scope's limits; None: no such limit."""

    max_concurrent: int | None = None
    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None


@dataclass(frozen=True)
class Scope:
    """What is limited (a model endpoint, one tenant on it), by a name unique in the deployment."""

    name: str
    limits: Limits

    def keys(self) -> list[str]:
        # (the braces keep a scope's keys in one Redis Cluster slot; several scopes in one call need one node)
        base = f"runtime:provider:{{{self.name}}}"
        return [f"{base}:slots", f"{base}:starts", f"{base}:token-members", f"{base}:token-amounts",
                f"{base}:token-total"]


@dataclass(frozen=True)
class Refused:
    """Not now: ``scope`` is at its ``limit`` ("concurrency", "requests", "tokens"; "unavailable": Redis could not
    be asked); asking again after ``retry_after`` seconds may pass."""

    scope: str
    limit: str
    retry_after: float


@dataclass
class Grant:
    """A call may go: its slot in every scope, and its tokens reserved. release() when it ended, however it ended."""

    call_id: str
    keys: list[str] = field(repr=False)
    released: bool = False

    async def release(self, client, *, tokens: int | None = None) -> None:
        """Give the slots back and count ``tokens`` (what the call used) instead of the estimate. Safe to call
        twice. Redis not reached: the slots free themselves when their hold ends."""
        if self.released:
            return
        self.released = True
        try:
            await client.eval(_RELEASE, len(self.keys), *self.keys, self.call_id, -1 if tokens is None else int(tokens))
        except redis.RedisError:
            pass


async def acquire(client, scopes: list[Scope], *, tokens: int, hold_seconds: float,
                  window_ms: int = WINDOW_MS, _now_offset_ms: int = 0) -> Grant | Refused:
    """Take a slot and reserve ``tokens`` in every scope at once, or say which limit refuses and for how long.
    ``client``: a redis.asyncio client. ``hold_seconds``: the longest the call can take (its slot frees itself then)."""
    keys = [key for scope in scopes for key in scope.keys()]
    call_id = uuid.uuid4().hex
    numbers = []
    for scope in scopes:
        limits = scope.limits
        numbers += [-1 if value is None else int(value)
                    for value in (limits.max_concurrent, limits.requests_per_minute, limits.tokens_per_minute)]
    try:
        answer = await client.eval(_ACQUIRE, len(keys), *keys, call_id, _now_offset_ms,
                                   max(int(hold_seconds * 1000), 1), window_ms, max(int(tokens), 0), *numbers)
    except redis.RedisError:
        return Refused(scope=scopes[0].name if scopes else "", limit="unavailable",
                       retry_after=UNAVAILABLE_RETRY_SECONDS)
    first = answer[0].decode() if isinstance(answer[0], bytes) else answer[0]
    if first == "ok":
        return Grant(call_id=call_id, keys=keys)
    limit = answer[1].decode() if isinstance(answer[1], bytes) else answer[1]
    return Refused(scope=scopes[int(first)].name, limit=limit, retry_after=max(int(answer[2]), 1) / 1000)
