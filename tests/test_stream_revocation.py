"""Issue 37, finding 9: a revoked or expired token kept receiving every stream it had opened — the SSE task events,
a 2025-11-25 `tasks/result`, a 2026-07-28 `subscriptions/listen` all delivered the task's final result after the
revocation. Here the attacker's streams are opened on a real uvicorn process, the tokens (API and OAuth) are revoked
or left to expire, and a real worker then runs the task to its end: each stream must have ended within seconds with
its end event, and nothing of the task after it (tasks_app.web.stream_guard)."""

from __future__ import annotations

import asyncio
import hashlib
import http.client
import json
import math
import threading
import time
from dataclasses import dataclass, field
from datetime import timedelta

import httpx2
import pytest
from django.contrib.auth import get_user_model
from oauth2_provider.models import Application

from tasks_app.models import ApiToken, TenantMembership
from tasks_app.services import api_token_create, api_token_revoke, task_create, tenant_get_or_create
from tests.support.mcp import EXT, MODERN
from tests.support.oauth import issued_token
from tests.worker_support import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("external_root")]
SHARED_WEB = True

TOKEN_ENDED = -32031  # (mcp_bridge.waiting.TOKEN_ENDED: the documented code)
REVOKED, EXPIRED = "token_revoked", "token_expired"  # (tasks_app.web.stream_guard's reasons)
END_WITHIN = 5.0  # seconds after the revocation: the check interval (1 s here) and a loaded machine's slack


@dataclass
class Stream:
    """One streamed answer read as it comes, each SSE event with the moment it arrived."""

    name: str
    status: int | None = None
    events: list[tuple[float, str, dict]] = field(default_factory=list)  # (monotonic, event, data)
    ended_at: float | None = None
    error: str = ""
    opened: threading.Event = field(default_factory=threading.Event)

    @property
    def last(self) -> tuple[str, dict]:
        return self.events[-1][1:] if self.events else ("", {})

    def text(self) -> str:
        return json.dumps([data for _, _, data in self.events])


def follow(port: int, name: str, path: str, *, token: str, body: dict | None = None,
           headers: dict | None = None) -> tuple[Stream, threading.Thread]:
    stream = Stream(name)

    def read():
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        head = {"Accept": "text/event-stream" if body is None else "application/json, text/event-stream",
                "Authorization": f"Bearer {token}", **(headers or {})}
        try:
            if body is None:
                connection.request("GET", path, headers=head)
            else:
                connection.request("POST", path, body=json.dumps(body).encode(),
                                   headers={**head, "Content-Type": "application/json"})
            response = connection.getresponse()
            stream.status = response.status
            current: dict = {}
            while True:
                line = response.readline()
                stream.opened.set()
                if not line:
                    break
                line = line.decode().rstrip("\r\n")
                if line == "" and "data" in current:
                    stream.events.append((time.monotonic(), current.get("event", ""), json.loads(current["data"])))
                    current = {}
                elif line and not line.startswith(":"):
                    key, _, value = line.partition(":")
                    current[key] = value.removeprefix(" ")
        except (OSError, http.client.HTTPException) as error:
            stream.error = repr(error)
        finally:
            stream.ended_at = time.monotonic()
            stream.opened.set()
            connection.close()

    thread = threading.Thread(target=read, daemon=True, name=name)
    thread.start()
    return stream, thread


def mcp_request(method: str, params: dict, *, modern: bool) -> tuple[dict, dict]:
    """A JSON-RPC request body and its headers, as the 2026-07-28 (modern) or 2025-11-25 wire has it."""
    if modern:
        params = {**params, "_meta": {"io.modelcontextprotocol/protocolVersion": MODERN,
                                      "io.modelcontextprotocol/clientCapabilities": {"extensions": {EXT: {}}}}}
        headers = {"MCP-Protocol-Version": MODERN, "Mcp-Method": method}
    else:
        headers = {"MCP-Protocol-Version": "2025-11-25"}
    return {"jsonrpc": "2.0", "id": 7, "method": method, "params": params}, headers


@pytest.fixture
def people(transactional_db):
    tenant = tenant_get_or_create(slug="acme", name="Acme")
    user = get_user_model().objects.create_user("mallory")
    TenantMembership.objects.create(user=user, tenant=tenant)
    return tenant, user


def open_streams(server, tenant, user, task, *, expires_in=timedelta(hours=1)):
    """The attacker's five streams, with two API tokens and two OAuth access tokens (one for /runtime, one for /mcp):
    SSE task events (an API token; an OAuth token), the tenant's SSE (the first API token again: its streams share
    one watch), a 2026 subscriptions/listen (the second API token), a 2025 tasks/result (the /mcp OAuth token)."""
    api_one = api_token_create(tenant=tenant, user=user, name="one")[1]
    api_two = api_token_create(tenant=tenant, user=user, name="two")[1]
    oauth_rest = issued_token(user, tenant, [server.url("/runtime")], expires_in=expires_in)
    oauth_mcp = issued_token(user, tenant, [server.url("/mcp")], expires_in=expires_in)
    listen_body, listen_headers = mcp_request("subscriptions/listen", {"notifications": {"taskIds": [str(task.id)]}},
                                              modern=True)
    result_body, result_headers = mcp_request("tasks/result", {"taskId": str(task.id)}, modern=False)
    streams = dict(
        sse_api=follow(server.port, "sse_api", f"/runtime/tasks/{task.id}/events", token=api_one),
        sse_oauth=follow(server.port, "sse_oauth", f"/runtime/tasks/{task.id}/events", token=oauth_rest),
        sse_tenant=follow(server.port, "sse_tenant", "/runtime/events", token=api_one),
        listen=follow(server.port, "listen", "/mcp", token=api_two, body=listen_body, headers=listen_headers),
        tasks_result=follow(server.port, "tasks_result", "/mcp", token=oauth_mcp, body=result_body,
                            headers=result_headers),
    )
    for stream, _ in streams.values():
        assert stream.opened.wait(20), f"{stream.name} did not open"
        assert stream.status == 200 and stream.ended_at is None, (stream.name, stream.status, stream.error)
    return streams, {"api_one": api_one, "api_two": api_two, "oauth_rest": oauth_rest, "oauth_mcp": oauth_mcp}


def assert_ended_for(streams, reason: str, since: float, within: float) -> None:
    for stream, thread in streams.values():
        thread.join(max(0.1, since + within + 2 - time.monotonic()))
        assert stream.ended_at is not None, f"{stream.name} still open {within} s after: {stream.text()[-500:]}"
        took = stream.ended_at - since
        assert took < within, f"{stream.name} ended {took:.1f} s after"
        event, data = stream.last
        if stream.name.startswith("sse"):
            assert (event, data.get("reason")) == ("stream.end", reason), (stream.name, stream.text()[-500:])
            assert "detail" in data
        else:  # MCP: the request's answer is a JSON-RPC error with the documented code
            assert data.get("id") == 7 and data.get("error", {}).get("code") == TOKEN_ENDED, (stream.name, data)
            assert data["error"]["data"]["reason"] == reason


def test_it_ends_every_stream_of_a_revoked_token_within_seconds_and_sends_nothing_of_the_task_after(
        web, workers, people):
    tenant, user = people
    server = web(RUNTIME_OAUTH__STREAM_TOKEN_CHECK_SECONDS="1")
    task = task_create(tenant=tenant, owner=None, workflow="demo_steps", input={"steps": 2, "sleep_ms": 200}).task
    streams, tokens = open_streams(server, tenant, user, task)  # (no worker yet: the task waits, its streams too)

    revoked_at = time.monotonic()
    for name in ("api_one", "api_two"):  # (an operator revokes them)
        raw = tokens[name]
        api_token_revoke(token=ApiToken.objects.get(prefix=raw[:12]), revoked_by="user:op")
    for name in ("oauth_rest", "oauth_mcp"):  # (the client revokes them, RFC 7009)
        checksum = hashlib.sha256(tokens[name].encode()).hexdigest()
        client_id = Application.objects.get(accesstoken__token_checksum=checksum).client_id
        assert httpx2.post(server.url("/oauth/revoke/"), data={"token": tokens[name],
                                                               "client_id": client_id}).status_code == 200
    workers("after-revocation")  # the task now runs to its end while the streams are (or were) open
    assert_ended_for(streams, REVOKED, revoked_at, END_WITHIN)
    wait_until(task.id, lambda t: t.status == "completed")
    time.sleep(0.5)  # (anything still on its way to a stream would have arrived)

    # Nothing of the task's end reached any of them: no terminal event, no completed status, no result.
    for stream, _ in streams.values():
        text = stream.text()
        assert '"terminal"' not in text and '"completed"' not in text, (stream.name, text[-800:])
        assert not any("result" in data and "error" not in data for _, _, data in stream.events
                       if stream.name in ("listen", "tasks_result")), stream.name


def test_it_ends_a_stream_at_its_oauth_token_s_expiry_without_waiting_for_a_check(web, people):
    tenant, user = people
    # Checked every minute only: the end must come from the token's expiry itself.
    server = web(RUNTIME_OAUTH__STREAM_TOKEN_CHECK_SECONDS="60")
    task = task_create(tenant=tenant, owner=None, workflow="demo_steps", input={"steps": 1}).task
    expires = time.monotonic() + 4  # (taken first: each token expires at this moment or a little later)
    oauth_rest = issued_token(user, tenant, [server.url("/runtime")], expires_in=timedelta(seconds=4))
    oauth_mcp = issued_token(user, tenant, [server.url("/mcp")], expires_in=timedelta(seconds=4))
    body, headers = mcp_request("subscriptions/listen", {"notifications": {"taskIds": [str(task.id)]}}, modern=True)
    streams = {"sse_oauth": follow(server.port, "sse_oauth", f"/runtime/tasks/{task.id}/events", token=oauth_rest),
               "listen": follow(server.port, "listen", "/mcp", token=oauth_mcp, body=body, headers=headers)}
    for stream, _ in streams.values():
        assert stream.opened.wait(20) and stream.status == 200, (stream.name, stream.status, stream.error)
    assert_ended_for(streams, EXPIRED, expires, 3.5)
    for stream, _ in streams.values():  # not before it
        assert stream.ended_at > expires - 0.2, (stream.name, stream.ended_at - expires, stream.text()[-300:])


def test_it_checks_a_token_once_per_interval_for_all_its_streams_and_wakes_them_when_it_ends(settings):
    """The guard's cost: one statement per token per process per interval, however many streams it has open."""
    from dataclasses import replace

    from tasks_app.web.stream_guard import StreamCredential, StreamGuard

    settings.RUNTIME = replace(settings.RUNTIME, oauth=replace(settings.RUNTIME.oauth,
                                                               stream_token_check_seconds=0.2))
    calls, valid = [], [True]

    def remaining():
        calls.append(time.monotonic())
        return math.inf if valid[0] else None

    class Listener:
        def __init__(self):
            self.aevent = asyncio.Event()

    async def scenario():
        credential = StreamCredential(key="test:one", remaining=remaining)
        async with StreamGuard(credential) as first, StreamGuard(credential) as second, \
                StreamGuard(StreamCredential(key="test:other", remaining=lambda: math.inf)) as other:
            listeners = [Listener(), Listener()]
            first.wake(listeners[0])
            second.wake(listeners[1])
            await asyncio.sleep(0.9)
            checks_while_valid = len(calls)
            valid[0] = False
            await asyncio.wait_for(asyncio.gather(*(listener.aevent.wait() for listener in listeners)), 2)
            return checks_while_valid, first.ended, second.ended, other.ended

    checks_while_valid, first_end, second_end, other_end = asyncio.run(scenario())
    assert 3 <= checks_while_valid <= 5  # ≈ 0.9 / 0.2 for both streams together, not twice that
    assert first_end.reason == second_end.reason == REVOKED and other_end is None
