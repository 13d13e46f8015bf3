"""Durable downstream tool calls (agents_app.gateway, agents_app.mcp_client; docs/tools.md) against servers other
than the example one in its default era (issue 21: "both eras of downstream server, two server libraries; a server
that is down, slow, or answers garbage: clear events, bounded retries, no stuck worker"):

- a second server library, FastMCP 4.1 (tests/clients/fastmcp_tool_server.py, in its own venv), serving both eras
  (our client's "auto" finds 2026-07-28) and pinned to 2025-11-25 (then "auto" falls back to `initialize`);
- the official SDK's example server (examples/tool_server.py), which always serves both eras (mcp 2.3.0 has no knob
  to restrict it), with our client pinned to each (mcp_client.PROTOCOL_MODE);
- a raw server that misbehaves on tools/call (tests/clients/bad_server.py), and no server at all.

Each era is read back from the server's own call log (the era each tools/call came in) as well as the server row.
"""

from __future__ import annotations

import time

import pytest
from django.db.models.functions import Now

from agents_app import mcp_client
from agents_app.gateway.call import NOT_SENT_TRIES
from agents_app.models import ToolServer
from checkpoints_app.models import SideEffect
from tasks_app.models import Task, TaskEvent
from tasks_app.services import task_create
from tests.clients.bad_server import TOOLS as BAD_SERVER_TOOLS
from tests.clients.support import FASTMCP
from tests.embedded_support import ROOT, free_port
from tests.engine_support import configure, create_engine_task, drive, effect_deadlines_pass
from tests.support.tasks import events_of
from tests.tool_server_support import running_tool_server
from tests.worker_support import wait_for_status

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("external_root"), pytest.mark.slow]

FASTMCP_SERVER = ROOT / "tests" / "clients" / "fastmcp_tool_server.py"
BAD_SERVER = ROOT / "tests" / "clients" / "bad_server.py"
LEGACY, MODERN = "2025-11-25", "2026-07-28"
BOUND_SECONDS = 30  # every misbehaving server's task is decided within this


# -- the servers (one process per module and kind: FastMCP takes seconds to start) ----------------------------------
@pytest.fixture(scope="module")
def fastmcp_server(tmp_path_factory):
    with running_tool_server(tmp_path_factory.mktemp("fastmcp"), name="fastmcp", python=FASTMCP.python(),
                             script=FASTMCP_SERVER) as server:
        yield server


@pytest.fixture(scope="module")
def fastmcp_legacy_server(tmp_path_factory):
    with running_tool_server(tmp_path_factory.mktemp("fastmcp-legacy"), name="fastmcp-legacy",
                             python=FASTMCP.python(), script=FASTMCP_SERVER, args=["--era", LEGACY]) as server:
        yield server


@pytest.fixture(scope="module")
def sdk_server(tmp_path_factory):
    with running_tool_server(tmp_path_factory.mktemp("sdk")) as server:
        yield server


# server kind → (its fixture, the client's protocol mode, the era the calls must come in)
SERVERS = {
    "fastmcp-both-eras": ("fastmcp_server", "auto", MODERN),
    "fastmcp-2025-only": ("fastmcp_legacy_server", "auto", LEGACY),  # auto falls back to the initialize handshake
    "sdk-client-pinned-2025": ("sdk_server", "legacy", LEGACY),
    "sdk-client-pinned-2026": ("sdk_server", MODERN, MODERN),  # adopted without server/discover
}


@pytest.fixture(params=sorted(SERVERS))
def downstream(request, tenant, monkeypatch):
    """(the server process, the era its calls must come in), with the tenant's row `shop` pointing at it."""
    fixture, mode, era = SERVERS[request.param]
    server = request.getfixturevalue(fixture)
    monkeypatch.setattr(mcp_client, "PROTOCOL_MODE", mode)
    ToolServer.objects.create(tenant=tenant, name="shop", url=server.url, timeout_seconds=5)
    return server, era


def call_task(tenant, tool: str, arguments: dict, *, server: str = "shop") -> Task:
    return create_engine_task(tenant, "mcp_tool", server=server, tool=tool, arguments=arguments)


def assert_row_speaks(era: str) -> None:
    assert ToolServer.objects.get(name="shop").protocol_version == era


# -- two server libraries, both eras --------------------------------------------------------------------------------
def test_it_applies_an_idempotent_call_once_when_it_is_made_again_with_its_key(tenant, downstream):
    """An earlier attempt's upsert landed and its answer was lost (made here with the task's key, the ledger row left
    unknown): the step calls it again with the same key, in _meta and as Idempotency-Key, and the server replays it."""
    server, era = downstream
    task = call_task(tenant, "upsert", {"key": "colour", "value": "teal"})
    key = f"{task.id}:1:shop.upsert:1"
    first = mcp_client.run(mcp_client.call(server.url, "upsert", {"key": "colour", "value": "teal"}, token=None,
                                           key=key, timeout=5))
    SideEffect.objects.create(task_id=task.id, step_seq=1, key=key, name="shop.upsert:1", status="unknown",
                              attempts=1, lease_epoch=0)

    assert drive(task.id)[-1] == "completed"

    task.refresh_from_db()
    received = server.calls(tool="upsert", event="received", idempotency_key_meta=key)
    assert len(received) == 2 and all(line["idempotency_key_header"] == key for line in received)
    assert received[-1]["protocol_version"] == era
    assert len(server.calls(event="applied", idempotency_key_meta=key)) == 1
    assert len(server.calls(event="replayed", idempotency_key_meta=key)) == 1
    assert task.result["structuredContent"] == first["structuredContent"]  # the first call's answer
    assert SideEffect.objects.get(task_id=task.id, key=key).status == "succeeded"
    assert [e["key"] for e in events_of(task, "tool.call")] == [key]
    assert_row_speaks(era)


def test_it_appends_once_and_gives_a_tools_error_as_a_result(tenant, downstream):
    server, era = downstream
    appended = call_task(tenant, "append", {"text": "a line"})
    failing = call_task(tenant, "fail", {"message": "no such customer"})

    assert drive(appended.id)[-1] == "completed" and drive(failing.id)[-1] == "completed"

    appended.refresh_from_db()
    failing.refresh_from_db()
    key = f"{appended.id}:1:shop.append:1"
    [applied] = server.calls(tool="append", event="applied", idempotency_key_meta=key)
    assert applied["idempotency_key_header"] == key and applied["protocol_version"] == era
    assert appended.result["isError"] is False and appended.result["structuredContent"] == applied["result"]
    assert failing.result["isError"] is True and "no such customer" in str(failing.result["content"])
    assert events_of(appended, "tool.result")[0]["outcome"] == "ok"
    assert events_of(failing, "tool.result")[0]["outcome"] == "tool error"
    assert_row_speaks(era)


# -- servers that misbehave -----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def bad_server(tmp_path_factory):
    """One process, an endpoint per way of misbehaving (http://…/<mode>); a slow answer comes after 4 s."""
    with running_tool_server(tmp_path_factory.mktemp("bad"), name="bad", script=BAD_SERVER,
                             args=["--delay", "4"]) as server:
        yield server


def bad_row(tenant, server, mode: str) -> ToolServer:
    """The tenant's server `bad` at the endpoint misbehaving so; a call waits 1 s for its answer."""
    return ToolServer.objects.create(tenant=tenant, name="bad", url=f"http://127.0.0.1:{server.port}/{mode}",
                                     timeout_seconds=1)


def timed_drive(task) -> tuple[str, float, Task]:
    began = time.monotonic()
    outcome = drive(task.id)[-1]
    seconds = time.monotonic() - began
    task.refresh_from_db()
    return outcome, seconds, task


def tool_events(task) -> list[str]:
    # In the chain's order: without order_by PostgreSQL returns them in whatever order its plan reads them (a fresh
    # clone's CI got ['tool.result', 'tool.call']).
    return list(TaskEvent.objects.filter(task_id=task.id, type__startswith="tool.").order_by("seq")
                .values_list("type", flat=True))


def test_it_asks_a_person_when_a_slow_server_leaves_a_non_idempotent_call_unknown(tenant, bad_server):
    bad_row(tenant, bad_server, "slow")
    task = call_task(tenant, "append", {"text": "a line"}, server="bad")
    key = f"{task.id}:1:bad.append:1"

    # No answer in time: the call may still land until its deadline, so the task waits without a worker (issue 38);
    # the deadline is then made to pass (time moved, not waited for) and only then is a person asked.
    assert drive(task.id, calls=1, until_done=False) == ["parked"] and not Task.objects.get(id=task.id).wait
    effect_deadlines_pass(task.id)
    outcome, seconds, task = timed_drive(task)

    assert outcome == "input_required" and seconds < BOUND_SECONDS
    assert task.wait["name"] == "effect_outcome" and task.wait["effect"]["key"] == key
    assert task.wait["effect"]["unknownWhy"] == "timed_out"
    assert len(bad_server.calls(event="received", idempotency_key_meta=key)) == 1  # never called again blindly
    assert SideEffect.objects.get(task_id=task.id, key=key).status == "unknown"
    assert events_of(task, "input_required")[0]["effect"]["key"] == key and tool_events(task) == []


def test_it_calls_a_slow_idempotent_tool_again_with_its_key_a_bounded_number_of_times(tenant, bad_server, settings):
    bad_row(tenant, bad_server, "slow")
    task = call_task(tenant, "upsert", {"key": "colour", "value": "teal"}, server="bad")
    key = f"{task.id}:1:bad.upsert:1"

    outcome, seconds, task = timed_drive(task)

    # Both attempts the step has for a call that timed out (step_retry.tool_timeout_attempts) went with the same key.
    # The outcome is still unknown, but the tool is idempotent: calling it again with its key is safe, so the task
    # fails, saying so (a slow server), rather than waiting in the dead letters for an operator.
    attempts = settings.RUNTIME.step_retry.tool_timeout_attempts
    received = bad_server.calls(event="received", idempotency_key_meta=key)
    assert len(received) == attempts == 2 and all(line["idempotency_key_header"] == key for line in received)
    assert outcome == "failed" and task.error["type"] == "ToolTimeout"
    assert "whether it ran is not known" in task.error["message"]
    assert SideEffect.objects.get(task_id=task.id, key=key).status == "failed"  # (reconciled: not applied)
    assert tool_events(task) == [] and seconds < BOUND_SECONDS


@pytest.mark.parametrize("mode", ["not-json", "not-jsonrpc", "wrong-result", "http-500"])
def test_it_takes_an_answer_it_cannot_use_as_an_unknown_outcome(tenant, bad_server, mode):
    """The server got the call (it answered), so it may have run the tool: append is neither read-only nor
    idempotent, so a person is asked; it is never called again, nor taken as refused."""
    bad_row(tenant, bad_server, mode)
    task = call_task(tenant, "append", {"text": "a line"}, server="bad")
    key = f"{task.id}:1:bad.append:1"

    outcome, seconds, task = timed_drive(task)

    assert outcome == "input_required" and task.wait["effect"]["key"] == key
    assert len(bad_server.calls(event="received", idempotency_key_meta=key)) == 1
    assert SideEffect.objects.get(task_id=task.id, key=key).status == "unknown"
    assert tool_events(task) == [] and seconds < BOUND_SECONDS


def test_it_tries_a_503_again_with_backoff_then_waits_for_the_server_then_fails_as_unavailable_with_nothing_sent(
        tenant, bad_server, settings):
    """Not reached (HTTP 503 in front of it): tried NOT_SENT_TRIES times within the attempt, then the step parks
    (no worker held) and tries again after 1 s, 2 s … until tools.unreachable_wait_seconds is spent, then fails —
    every request known not to have run, so the ledger row is `failed`, never `unknown`."""
    configure(settings, step_retry={"max_attempts": 2}, tools={"unreachable_wait_seconds": 3})
    bad_row(tenant, bad_server, "http-503")
    task = call_task(tenant, "append", {"text": "a line"}, server="bad")
    key = f"{task.id}:1:bad.append:1"

    began = time.monotonic()
    outcomes = drive(task.id)
    seconds = time.monotonic() - began
    task.refresh_from_db()

    # try 1 → parked 1 s, try 2 → parked 2 s (1 + 2 = the 3 s budget), try 3 fails the attempt; the step's second
    # attempt (step_retry) is try 4, already past the budget: the task fails.
    assert outcomes.count("parked") == 2 and outcomes[-1] == "failed"
    assert task.status == "failed" and task.error["type"] == "ToolUnavailable" and len(task.error["attempts"]) == 2
    assert "HTTP 503" in task.error["message"] and "nothing was sent" in task.error["message"]
    assert "waited about 3 s for it in 4 tries" in task.error["message"]
    assert len(bad_server.calls(event="received", idempotency_key_meta=key)) == NOT_SENT_TRIES * 4
    assert SideEffect.objects.get(task_id=task.id, key=key).status == "failed"  # known not to have happened
    assert tool_events(task) == [] and events_of(task, "terminal") == [{"status": "failed"}]
    assert seconds < BOUND_SECONDS


def test_it_does_not_wait_for_a_server_whose_answer_only_a_configuration_change_mends(tenant, bad_server, settings):
    """A 404 (a wrong URL; a 401 for a wrong credential alike) is not sent, but no waiting mends it: no parking and no
    quick tries within the attempt — the step's retries, then the task fails, saying what the server answered."""
    configure(settings, step_retry={"max_attempts": 2})  # (tools.unreachable_wait_seconds stays 600)
    row = bad_row(tenant, bad_server, "no-such-endpoint")
    ToolServer.objects.filter(id=row.id).update(tools=BAD_SERVER_TOOLS, tools_read_at=Now())  # (listed once)
    task = call_task(tenant, "append", {"text": "a line"}, server="bad")

    outcome, seconds, task = timed_drive(task)

    assert outcome == "failed" and task.error["type"] == "ToolUnavailable" and len(task.error["attempts"]) == 2
    assert "HTTP 404" in task.error["message"] and "nothing was sent" in task.error["message"]
    assert "waited" not in task.error["message"] and seconds < 10
    assert SideEffect.objects.get(task_id=task.id).attempts == 2  # one call per step attempt


def test_it_takes_a_json_rpc_invalid_params_error_as_a_refusal(tenant, bad_server, settings):
    configure(settings, step_retry={"max_attempts": 2})
    bad_row(tenant, bad_server, "refuse")
    task = call_task(tenant, "append", {"text": "a line"}, server="bad")
    key = f"{task.id}:1:bad.append:1"

    outcome, seconds, task = timed_drive(task)

    assert outcome == "failed" and task.error["type"] == "ToolRefused" and "-32602" in task.error["message"]
    # refused is known not to have run, and the same request would be refused again: no retry, nobody is asked
    assert task.error["reason"] == "tool_refused" and task.error.get("attempts") is None
    assert len(bad_server.calls(event="received", idempotency_key_meta=key)) == 1
    assert SideEffect.objects.get(task_id=task.id, key=key).status == "failed"
    assert tool_events(task) == [] and seconds < BOUND_SECONDS


def test_it_waits_without_a_worker_for_a_server_that_is_down_and_calls_it_once_it_is_back(tenant, workers,
                                                                                         sdk_server, tmp_path):
    """A real worker (one, solo): a call to a server nobody listens on is not sent; the step parks (its status
    message says so) instead of failing or holding the worker, which runs another task meanwhile; the server starts on
    that port and the parked call goes through — once, with its key — and the task completes."""
    port = free_port()
    row = ToolServer.objects.create(tenant=tenant, name="down", url=f"http://127.0.0.1:{port}/mcp",
                                    timeout_seconds=1, tools=sdk_server_tools(sdk_server))
    ToolServer.objects.filter(id=row.id).update(tools_read_at=Now())  # its tool list was read while it was up
    ToolServer.objects.create(tenant=tenant, name="shop", url=sdk_server.url, timeout_seconds=5)
    workers("tool-worker", pool="solo")

    down = task_create(tenant=tenant, owner=None, workflow="mcp_tool",
                       input={"server": "down", "tool": "upsert", "arguments": {"key": "k", "value": "v"}}).task
    deadline = time.monotonic() + BOUND_SECONDS
    while "Waiting for down to answer" not in (Task.objects.get(id=down.id).status_message or ""):
        assert time.monotonic() < deadline, Task.objects.get(id=down.id).status_message
        time.sleep(0.1)
    parked = Task.objects.get(id=down.id)
    after = task_create(tenant=tenant, owner=None, workflow="mcp_tool",
                        input={"server": "shop", "tool": "lookup", "arguments": {"key": "colour"}}).task
    after = wait_for_status(after.id, {"completed", "failed", "dead_lettered", "input_required"}, seconds=10)

    assert parked.status == "working" and parked.lease_owner is None  # waiting, holding no worker
    assert "could not connect" in parked.status_message and "nothing was sent" in parked.status_message
    assert after.status == "completed"  # the only worker ran it meanwhile
    with running_tool_server(tmp_path, port=port) as back:
        down = wait_for_status(down.id, {"completed", "failed", "dead_lettered", "input_required"},
                               seconds=BOUND_SECONDS)
        key = f"{down.id}:1:down.upsert:1"
        assert down.status == "completed" and down.result["structuredContent"]["value"] == "v"
        assert len(back.calls(tool="upsert", event="applied", idempotency_key_meta=key)) == 1
    effect = SideEffect.objects.get(task_id=down.id)
    assert effect.status == "succeeded" and effect.attempts >= 2  # (each try after a wait counts one)
    assert not SideEffect.objects.filter(status="started").exists()
    assert tool_events(down) == ["tool.call", "tool.result"]


def sdk_server_tools(server) -> list[dict]:
    """The example server's tool list, as a row keeps it."""
    return mcp_client.run(mcp_client.describe(server.url, token=None, timeout=10)).tools


def test_it_negotiates_again_when_the_era_a_server_spoke_is_no_longer_answered(tenant, fastmcp_legacy_server):
    """A call speaks the 2026-07-28 version the server negotiated when its tools were last read (no server/discover
    per call); a server that now speaks only 2025-11-25 refuses it — nothing ran — and the call is made again after
    negotiating."""
    from agents_app.gateway.catalogue import tools_refresh

    row = ToolServer.objects.create(tenant=tenant, name="shop", url=fastmcp_legacy_server.url, timeout_seconds=5)
    tools_refresh(row)
    ToolServer.objects.filter(id=row.id).update(protocol_version="2026-07-28")  # as if it spoke it last time
    task = call_task(tenant, "append", {"text": "once"})

    outcome = drive(task.id)[-1]
    assert outcome == "completed", Task.objects.get(id=task.id).error

    key = f"{task.id}:1:shop.append:1"
    applied = fastmcp_legacy_server.calls(event="applied", idempotency_key_meta=key)
    assert len(applied) == 1 and applied[0]["protocol_version"] == LEGACY


def test_it_runs_an_agent_whose_tools_are_served_by_fastmcp(tenant, fastmcp_server, scripted_model, settings):
    """The agent loop against the second server library: the model shown FastMCP's tools, the call made once with its
    key, its result read back by the model."""
    from tests.scripted_model_support import unique_key

    configure(settings, model={"base_url": scripted_model.url, "name": "scripted-1"})
    ToolServer.objects.create(tenant=tenant, name="shop", url=fastmcp_server.url, timeout_seconds=5)
    key = unique_key("fastmcp")
    scripted_model.script(key, [{"tool_calls": [{"name": "shop__upsert", "arguments": {"key": key, "value": "v"}}]},
                                {"content_from": "last_tool_result"}])
    task = task_create(tenant=tenant, owner=None, workflow="agent", input={"goal": key, "servers": ["shop"]}).task

    assert drive(task.id)[-1] == "completed"

    first, second = scripted_model.requests(key)
    assert {"shop__lookup", "shop__upsert", "shop__append", "shop__fail"} <= set(first["tools"])
    applied = fastmcp_server.calls(tool="upsert", event="applied")
    assert [line["idempotency_key_meta"] for line in applied if line["arguments"]["key"] == key] == [
        f"{task.id}:2:shop.upsert:1"]
    assert key in Task.objects.get(id=task.id).result["answer"]
