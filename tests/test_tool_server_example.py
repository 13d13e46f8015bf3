"""The example tool server (examples/tool_server.py) as a real process, called with the official `mcp` SDK's client
in both protocol eras: its tools and their annotations, an upsert applied once per idempotency key, an append applied
every time, a tool error as a result, a call that runs to its end after its caller went away, a bearer token."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import uuid

import httpx2
import pytest

from examples.tool_server import IDEMPOTENCY_HEADER, IDEMPOTENCY_META_KEY
from tests.tool_server_support import SCRIPT, connect, running_tool_server

ERAS = {"legacy": "2025-11-25", "auto": "2026-07-28"}  # Client mode → the protocol version it ends up speaking
era = pytest.mark.parametrize("mode", list(ERAS))


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """One server for the module (a process start is most of a test's time); each test uses keys and texts of its
    own, and counts only its own lines."""
    with running_tool_server(tmp_path_factory.mktemp("tools")) as server:
        yield server


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def run(coroutine):
    return asyncio.run(coroutine)


@era
def test_it_lists_the_four_tools_with_honest_annotations_and_input_schemas(server, mode):
    async def scenario():
        async with connect(server.url, mode=mode) as client:
            return client.protocol_version, {tool.name: tool for tool in (await client.list_tools()).tools}

    version, tools = run(scenario())

    assert version == ERAS[mode]
    assert set(tools) == {"lookup", "upsert", "append", "fail"}
    lookup, upsert, append, fail = (tools[name].annotations for name in ("lookup", "upsert", "append", "fail"))
    assert lookup.read_only_hint is True and fail.read_only_hint is True
    assert (upsert.read_only_hint, upsert.idempotent_hint, upsert.destructive_hint) == (False, True, True)
    assert (append.read_only_hint, append.idempotent_hint, append.destructive_hint, append.open_world_hint) == \
        (False, False, False, False)
    schemas = {name: tool.input_schema for name, tool in tools.items()}
    assert {name: sorted(schema["required"]) for name, schema in schemas.items()} == {
        "lookup": ["key"], "upsert": ["key", "value"], "append": ["text"], "fail": ["message"]}
    for name in ("upsert", "append"):
        delay = schemas[name]["properties"]["delay_ms"]
        assert (delay["type"], delay["minimum"], delay["maximum"], delay["default"]) == ("integer", 0, 60000, 0)


@era
def test_it_applies_an_upsert_once_per_idempotency_key_and_answers_the_first_result_again(server, mode):
    key, first_key, other_key = unique("colour"), unique("call"), unique("call")

    async def upsert(value: str, call_key: str, header: bool):
        async with connect(server.url, mode=mode, headers={IDEMPOTENCY_HEADER: call_key} if header else {}) as client:
            return await client.call_tool("upsert", {"key": key, "value": value}, meta={IDEMPOTENCY_META_KEY: call_key})

    async def scenario():
        return (await upsert("red", first_key, header=True), await upsert("blue", other_key, header=False),
                await upsert("red", first_key, header=True))

    first, other, again = run(scenario())

    assert first.structured_content == {"key": key, "value": "red", "previous": None, "version": 1}
    assert other.structured_content["version"] == 2  # a new key applies
    assert again.structured_content == first.structured_content and not again.is_error  # the first answer, again
    lines = [line for line in server.calls(tool="upsert") if line["arguments"]["key"] == key]
    assert [(line["event"], line["idempotency_key_meta"]) for line in lines] == [
        ("received", first_key), ("applied", first_key), ("received", other_key), ("applied", other_key),
        ("received", first_key), ("replayed", first_key)]
    assert lines[0]["idempotency_key_header"] == first_key and lines[2]["idempotency_key_header"] is None
    assert lines[0]["call"] == lines[1]["call"] != lines[4]["call"] == lines[5]["call"]


@era
def test_it_applies_every_append_even_with_the_same_idempotency_key(server, mode):
    text, call_key = unique("line"), unique("call")

    async def scenario():
        async with connect(server.url, mode=mode, headers={IDEMPOTENCY_HEADER: call_key}) as client:
            return [await client.call_tool("append", {"text": text}, meta={IDEMPOTENCY_META_KEY: call_key})
                    for _ in range(2)]

    first, second = run(scenario())

    assert second.structured_content["count"] == first.structured_content["count"] + 1
    applied = [line for line in server.calls(tool="append", event="applied") if line["arguments"]["text"] == text]
    assert len(applied) == 2 and {line["idempotency_key_meta"] for line in applied} == {call_key}


@era
def test_it_looks_up_what_upsert_stored_and_changes_nothing(server, mode):
    key, missing = unique("city"), unique("nowhere")

    async def scenario():
        async with connect(server.url, mode=mode) as client:
            await client.call_tool("upsert", {"key": key, "value": "Lisbon"})
            return [await client.call_tool("lookup", {"key": name}) for name in (key, key, missing)]

    found, again, not_found = run(scenario())

    assert found.structured_content == again.structured_content == {
        "key": key, "found": True, "value": "Lisbon", "version": 1}
    assert not_found.structured_content == {"key": missing, "found": False, "value": None, "version": 0}


@era
def test_it_answers_fail_with_a_tool_error_result(server, mode):
    message = unique("the printer is on fire")

    async def scenario():
        async with connect(server.url, mode=mode) as client:
            return await client.call_tool("fail", {"message": message})

    result = run(scenario())

    assert result.is_error is True and message in result.content[0].text
    assert [line["event"] for line in server.calls(tool="fail") if line["arguments"] == {"message": message}] == [
        "received", "applied"]


def test_it_refuses_an_idempotency_key_reused_for_other_arguments_without_applying(server):
    key, call_key = unique("size"), unique("call")

    async def scenario():
        async with connect(server.url) as client:
            await client.call_tool("upsert", {"key": key, "value": "S"}, meta={IDEMPOTENCY_META_KEY: call_key})
            return await client.call_tool("upsert", {"key": key, "value": "XL"},
                                          meta={IDEMPOTENCY_META_KEY: call_key})

    reused = run(scenario())

    assert reused.is_error is True and "applied to other arguments" in reused.content[0].text
    events = [line["event"] for line in server.calls(tool="upsert") if line["arguments"]["key"] == key]
    assert events == ["received", "applied", "received", "refused"]


def test_it_refuses_an_upsert_whose_meta_and_header_keys_differ(server):
    key = unique("mood")

    async def scenario():
        async with connect(server.url, headers={IDEMPOTENCY_HEADER: unique("header")}) as client:
            return await client.call_tool("upsert", {"key": key, "value": "calm"},
                                          meta={IDEMPOTENCY_META_KEY: unique("meta")})

    result = run(scenario())

    assert result.is_error is True and "differ" in result.content[0].text
    assert [line["event"] for line in server.calls(tool="upsert") if line["arguments"]["key"] == key] == [
        "received", "refused"]


def test_it_applies_a_retry_arriving_while_the_first_call_sleeps_once(server):
    """The race the in-flight map guards: the caller gives up on a slow call and retries with the same key before
    the first has applied; both found the key unapplied."""
    key, call_key = unique("slow"), unique("call")

    async def call(arguments):
        async with connect(server.url) as client:
            return await client.call_tool("upsert", arguments, meta={IDEMPOTENCY_META_KEY: call_key})

    async def scenario():
        first = asyncio.create_task(call({"key": key, "value": "v", "delay_ms": 800}))
        await asyncio.to_thread(server.wait_for_call, tool="upsert", event="received", idempotency_key_meta=call_key)
        retry = await call({"key": key, "value": "v"})  # no delay_ms: it is not part of what the key stands for
        return await first, retry

    first, retry = run(scenario())

    assert retry.structured_content == first.structured_content == {
        "key": key, "value": "v", "previous": None, "version": 1}
    events = [line["event"] for line in server.calls(idempotency_key_meta=call_key)]
    assert events == ["received", "received", "applied", "replayed"]


@era
def test_it_applies_a_call_whose_caller_went_away_mid_call(server, mode):
    """The unknown outcome the runtime must handle: the answer is lost, the effect lands."""
    text = unique("orphan")

    async def scenario():
        async def call():
            async with connect(server.url, mode=mode) as client:
                await client.call_tool("append", {"text": text, "delay_ms": 500})

        caller = asyncio.create_task(call())
        await asyncio.to_thread(server.wait_for_call, tool="append", event="received", arguments={
            "text": text, "delay_ms": 500})
        caller.cancel()  # closes its HTTP connection
        with pytest.raises(asyncio.CancelledError):
            await caller

    run(scenario())

    applied = server.wait_for_call(tool="append", event="applied", arguments={"text": text, "delay_ms": 500})
    assert applied["result"]["count"] >= 1


def test_it_refuses_a_request_without_the_bearer_token_and_serves_one_with_it(tmp_path):
    token = f"secret-{uuid.uuid4().hex}"
    with running_tool_server(tmp_path, token=token, name="bearer") as server:
        refused = [httpx2.post(server.url, json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, headers=headers)
                   for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": token})]

        async def scenario():
            async with connect(server.url, token=token) as client:
                return (await client.list_tools()).tools

        tools = run(scenario())
        output = server.output_path.read_text()

    assert [response.status_code for response in refused] == [401, 401, 401]
    assert refused[0].headers["content-type"] == "application/problem+json"
    assert refused[0].headers["www-authenticate"].startswith("Bearer")
    assert "Authorization: Bearer <token>" in refused[0].json()["detail"]
    assert len(tools) == 4
    assert token not in output and server.calls() == []  # no tool was called: refused requests reach no tool


def test_it_refuses_to_start_when_the_token_variable_is_not_set():
    done = subprocess.run([sys.executable, str(SCRIPT), "--port", "1", "--token-env", "NO_SUCH_TOKEN_VARIABLE"],
                          capture_output=True, text=True, timeout=30, env={"PATH": "/usr/bin:/bin"})

    assert done.returncode == 2 and "NO_SUCH_TOKEN_VARIABLE" in done.stderr and "not set" in done.stderr


@era
def test_it_logs_a_call_it_refuses_as_received_with_no_effect(server, mode):
    """A call the runtime should never have sent (an invented tool, arguments outside the schema) still shows."""
    text = unique("too-slow")

    async def scenario():
        async with connect(server.url, mode=mode) as client:
            return [await client.call_tool("shell_root", {"text": text}),
                    await client.call_tool("append", {"text": text, "delay_ms": 60_001})]

    invented, out_of_range = run(scenario())

    assert invented.is_error and out_of_range.is_error
    lines = [line for line in server.calls() if (line["arguments"] or {}).get("text") == text]
    assert [(line["tool"], line["event"]) for line in lines] == [
        ("shell_root", "received"), ("shell_root", "refused"), ("append", "received"), ("append", "refused")]
