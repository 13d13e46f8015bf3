"""Provider limits shared across the fleet (agents_app.provider_limits, issue 39 build 2's building block), against the
real Redis the suite uses: a concurrency cap that two clients racing cannot exceed and whose crashed holders free
themselves, requests and tokens per minute over a sliding window (time moved by an offset on Redis's own clock, not
waited for), a tenant's scope inside an endpoint's, and a refusal — never a skipped limit — when Redis is gone."""

from __future__ import annotations

import asyncio
import uuid

import redis.asyncio
from django.conf import settings

from agents_app.provider_limits import Grant, Limits, Refused, Scope, acquire

MINUTE_MS = 60_000


def scope(**limits) -> Scope:
    return Scope(f"test-{uuid.uuid4().hex[:12]}", Limits(**limits))


def run(coroutine_of):
    """Run ``coroutine_of(client)`` on a fresh loop with a client of the suite's Redis."""
    async def main():
        client = redis.asyncio.Redis.from_url(settings.REDIS_URL)
        try:
            return await coroutine_of(client)
        finally:
            await client.aclose()
    return asyncio.run(main())


def test_it_never_grants_more_slots_than_the_cap_to_clients_racing_for_them():
    endpoint = scope(max_concurrent=10)

    async def race(_client):
        clients = [redis.asyncio.Redis.from_url(settings.REDIS_URL) for _ in range(5)]
        try:
            return await asyncio.gather(*(acquire(clients[n % 5], [endpoint], tokens=0, hold_seconds=30)
                                          for n in range(40)))
        finally:
            for client in clients:
                await client.aclose()

    answers = run(race)

    granted = [answer for answer in answers if isinstance(answer, Grant)]
    refused = [answer for answer in answers if isinstance(answer, Refused)]
    assert len(granted) == 10 and len(refused) == 30
    assert {answer.limit for answer in refused} == {"concurrency"} and all(0 < a.retry_after <= 30 for a in refused)


def test_it_gives_a_released_slot_to_the_next_call_and_frees_a_dead_holders_slot_when_its_hold_ends():
    endpoint = scope(max_concurrent=1)

    async def calls(client):
        first = await acquire(client, [endpoint], tokens=0, hold_seconds=30)
        while_held = await acquire(client, [endpoint], tokens=0, hold_seconds=30)
        await first.release(client)
        after_release = await acquire(client, [endpoint], tokens=0, hold_seconds=0.3)  # then its holder "dies"
        while_dead_holds = await acquire(client, [endpoint], tokens=0, hold_seconds=30)
        await asyncio.sleep(0.4)  # (its hold ends on Redis's clock: nobody releases it)
        after_hold = await acquire(client, [endpoint], tokens=0, hold_seconds=30)
        return first, while_held, after_release, while_dead_holds, after_hold

    first, while_held, after_release, while_dead_holds, after_hold = run(calls)

    assert isinstance(first, Grant) and isinstance(after_release, Grant) and isinstance(after_hold, Grant)
    assert isinstance(while_held, Refused) and while_held.limit == "concurrency"
    assert isinstance(while_dead_holds, Refused) and while_dead_holds.retry_after <= 0.3


def test_it_counts_requests_per_minute_over_a_sliding_window():
    endpoint = scope(requests_per_minute=3)

    async def calls(client):
        answers = []
        for offset in (0, 10_000, 20_000, 30_000, MINUTE_MS + 1):  # ms after the first start, on Redis's clock
            answer = await acquire(client, [endpoint], tokens=0, hold_seconds=1, _now_offset_ms=offset)
            if isinstance(answer, Grant):
                await answer.release(client)
            answers.append(answer)
        return answers

    answers = run(calls)

    assert [isinstance(answer, Grant) for answer in answers] == [True, True, True, False, True]
    assert answers[3].limit == "requests" and 29 <= answers[3].retry_after <= 31  # the first start leaves at 60 s


def test_it_reserves_tokens_per_minute_and_counts_what_each_call_used_instead():
    endpoint = scope(tokens_per_minute=1000)

    async def calls(client):
        big = await acquire(client, [endpoint], tokens=800, hold_seconds=5)
        too_many = await acquire(client, [endpoint], tokens=300, hold_seconds=5)  # 800 reserved + 300 > 1000
        await big.release(client, tokens=150)  # it used far less than estimated
        now_fits = await acquire(client, [endpoint], tokens=800, hold_seconds=5)  # 150 + 800 <= 1000
        over = await acquire(client, [endpoint], tokens=100, hold_seconds=5)  # 950 + 100 > 1000
        next_minute = await acquire(client, [endpoint], tokens=900, hold_seconds=5, _now_offset_ms=MINUTE_MS + 1)
        return big, too_many, now_fits, over, next_minute

    big, too_many, now_fits, over, next_minute = run(calls)

    assert isinstance(big, Grant) and isinstance(now_fits, Grant) and isinstance(next_minute, Grant)
    assert isinstance(too_many, Refused) and too_many.limit == "tokens"
    assert isinstance(over, Refused) and over.limit == "tokens"


def test_it_holds_one_tenant_to_its_own_cap_inside_the_endpoints_and_takes_nothing_when_one_refuses():
    endpoint = scope(max_concurrent=4)
    tenant_a, tenant_b = scope(max_concurrent=2), scope(max_concurrent=2)

    async def calls(client):
        a = [await acquire(client, [endpoint, tenant_a], tokens=0, hold_seconds=30) for _ in range(3)]
        b = [await acquire(client, [endpoint, tenant_b], tokens=0, hold_seconds=30) for _ in range(2)]
        return a, b

    a, b = run(calls)

    assert [isinstance(answer, Grant) for answer in a] == [True, True, False]
    assert a[2].scope == tenant_a.name and a[2].limit == "concurrency"
    # Tenant a's refused call took no endpoint slot: tenant b still gets the endpoint's other two.
    assert all(isinstance(answer, Grant) for answer in b)


def test_it_refuses_rather_than_skips_a_limit_when_redis_cannot_be_reached():
    async def calls(_client):
        gone = redis.asyncio.Redis(host="127.0.0.1", port=1, socket_connect_timeout=1)
        try:
            return await acquire(gone, [scope(max_concurrent=100)], tokens=0, hold_seconds=30)
        finally:
            await gone.aclose()

    answer = run(calls)

    assert isinstance(answer, Refused) and answer.limit == "unavailable" and answer.retry_after > 0
