"""The example tool server (examples/tool_server.py) as a real process, called with the official `mcp` SDK's client
in both protocol eras: its tools and their annotations, an upsert applied once per idempotency key, an append applied
every time, a tool error as a result, a call that runs to its end after its caller went away, a bearer token; the
long-running `report` answering with a task (made once per key, asking a question, cancelled); its --state journal
outliving a SIGKILL."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import uuid

import httpx2
import pytest
from mcp.shared.exceptions import MCPError
from mcp.types import METHOD_NOT_FOUND, MISSING_REQUIRED_CLIENT_CAPABILITY

from examples.tool_server import IDEMPOTENCY_HEADER, IDEMPOTENCY_META_KEY
from tests.embedded_support import ROOT
from tests.tool_server_support import (
    SCRIPT,
    call_as_task,
    connect,
    running_tool_server,
    task_cancel,
    task_get,
    task_result,
    task_update,
)

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
def test_it_lists_the_five_tools_with_honest_annotations_and_input_schemas(server, mode):
    async def scenario():
        async with connect(server.url, mode=mode) as client:
            return client.protocol_version, {tool.name: tool for tool in (await client.list_tools()).tools}

    version, tools = run(scenario())

    assert version == ERAS[mode]
    assert set(tools) == {"lookup", "upsert", "append", "fail", "report"}
    lookup, upsert, append, fail, report = (tools[name].annotations
                                            for name in ("lookup", "upsert", "append", "fail", "report"))
    assert lookup.read_only_hint is True and fail.read_only_hint is True
    assert (upsert.read_only_hint, upsert.idempotent_hint, upsert.destructive_hint) == (False, True, True)
    assert (append.read_only_hint, append.idempotent_hint, append.destructive_hint, append.open_world_hint) == \
        (False, False, False, False)
    assert (report.read_only_hint, report.idempotent_hint, report.destructive_hint, report.open_world_hint) == \
        (False, False, False, False)
    schemas = {name: tool.input_schema for name, tool in tools.items()}
    assert {name: sorted(schema["required"]) for name, schema in schemas.items()} == {
        "lookup": ["key"], "upsert": ["key", "value"], "append": ["text"], "fail": ["message"], "report": ["title"]}
    for name in ("upsert", "append"):
        delay = schemas[name]["properties"]["delay_ms"]
        assert (delay["type"], delay["minimum"], delay["maximum"], delay["default"]) == ("integer", 0, 60000, 0)
    # The runtime's gateway calls a tool as a task when its listing says so; only 2025-11-25 has the field.
    execution = tools["report"].execution
    assert (execution.task_support if execution else None) == ("required" if mode == "legacy" else None)
    assert tools["report"].output_schema is None  # (see report: a client resolving the task checks it)
    assert [tool.execution for name, tool in tools.items() if name != "report"] == [None] * 4


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
    assert len(tools) == 5
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


# -- report: a long-running tool that answers with a task -----------------------------------------------------------
async def settled(client, task_id: str, statuses=("completed", "failed", "cancelled"), seconds: float = 10) -> dict:
    """tasks/get until the task's status is one of statuses (polled at 100 ms, faster than its pollIntervalMs)."""
    deadline = time.monotonic() + seconds
    while (task := await task_get(client, task_id))["status"] not in statuses:
        assert time.monotonic() < deadline, f"task {task_id} still {task['status']} after {seconds} s"
        await asyncio.sleep(0.1)
    return task


def task_lines(server, task_id: str) -> list[str]:
    return [line["event"] for line in server.calls(task_id=task_id)]


@era
def test_it_answers_report_with_a_task_that_works_then_completes_with_its_result(server, mode):
    title, call_key = unique("quarterly"), unique("call")

    async def scenario():
        async with connect(server.url, mode=mode, tasks=True) as client:
            created = await call_as_task(client, "report", {"title": title, "seconds": 1}, key=call_key)
            working = await task_get(client, created["taskId"])
            done = await settled(client, created["taskId"])
            result = await task_result(client, created["taskId"]) if mode == "legacy" else done["result"]
            return created, working, done, result

    created, working, done, result = run(scenario())

    assert created["status"] == working["status"] == "working" and "Writing the report" in working["statusMessage"]
    assert (working.get("pollIntervalMs") or working.get("pollInterval")) == 500
    assert done["status"] == "completed" and done["lastUpdatedAt"] > done["createdAt"]
    assert result["isError"] is False and result["structuredContent"] == {
        "title": title, "seconds": 1, "answer": None, "report": f"Report {title!r}, written in 1 s"}
    assert task_lines(server, created["taskId"]) == ["task_created", "task_finished"]
    [made] = server.calls(event="task_created", idempotency_key_meta=call_key)
    assert made["protocol_version"] == ERAS[mode] and made["call"] == server.calls(
        event="received", idempotency_key_meta=call_key)[0]["call"]


@era
def test_it_makes_one_task_per_idempotency_key_and_answers_the_same_key_with_it(server, mode):
    title, call_key, other_key = unique("weekly"), unique("call"), unique("call")
    arguments = {"title": title, "seconds": 0.2}

    async def scenario():
        async with connect(server.url, mode=mode, tasks=True) as client:
            first = await call_as_task(client, "report", arguments, key=call_key)
            await settled(client, first["taskId"])
            again = await call_as_task(client, "report", arguments, key=call_key)  # after it finished, too
            other = await call_as_task(client, "report", arguments, key=other_key)
            return first, again, other

    first, again, other = run(scenario())

    assert again["taskId"] == first["taskId"] != other["taskId"]
    assert again["status"] == "completed"  # the task as it stands now
    events = [(line["event"], line["idempotency_key_meta"]) for line in server.calls(tool="report")
              if line["arguments"]["title"] == title and line["event"] != "received"]
    assert events == [("task_created", call_key), ("task_finished", call_key), ("replayed", call_key),
                      ("task_created", other_key)] or events == [  # (the other task may finish first)
        ("task_created", call_key), ("task_finished", call_key), ("replayed", call_key),
        ("task_created", other_key), ("task_finished", other_key)]


def test_it_refuses_a_report_key_reused_for_other_arguments_without_making_a_task(server):
    call_key = unique("call")

    async def scenario():
        async with connect(server.url, tasks=True) as client:
            await call_as_task(client, "report", {"title": unique("a"), "seconds": 30}, key=call_key)
            return await client.call_tool("report", {"title": unique("b"), "seconds": 30},
                                          meta={IDEMPOTENCY_META_KEY: call_key})

    reused = run(scenario())

    assert reused.is_error is True and "created a task for other arguments" in reused.content[0].text
    assert [line["event"] for line in server.calls(idempotency_key_meta=call_key)] == [
        "received", "task_created", "received", "refused"]


@era
def test_it_refuses_a_report_not_called_as_a_task_and_makes_none(server, mode):
    title = unique("plain")

    async def scenario():
        async with connect(server.url, mode=mode) as client:  # no tasks extension (2026), no params.task (2025)
            with pytest.raises(MCPError) as refused:
                await client.call_tool("report", {"title": title})
            return refused.value

    refused = run(scenario())

    assert refused.error.code == (METHOD_NOT_FOUND if mode == "legacy" else MISSING_REQUIRED_CLIENT_CAPABILITY)
    assert [line["event"] for line in server.calls(tool="report") if line["arguments"]["title"] == title] == [
        "received", "refused"]


def test_it_asks_reports_question_and_puts_the_answer_taken_by_tasks_update_in_its_result(server):
    title = unique("budget")

    async def scenario():
        async with connect(server.url, tasks=True) as client:
            created = await call_as_task(client, "report", {"title": title, "seconds": 0.2,
                                                            "question": "Which quarter?"})
            asking = await task_get(client, created["taskId"])
            await task_update(client, created["taskId"], {"elsewhere": {"action": "accept", "content": {}}})
            with pytest.raises(MCPError, match="must be"):  # a malformed answer: refused, still asking
                await task_update(client, created["taskId"], {"question": {"action": "accept", "content": {}}})
            still = await task_get(client, created["taskId"])
            await task_update(client, created["taskId"], {"question": {"action": "accept",
                                                                       "content": {"answer": "Q3"}}})
            await task_update(client, created["taskId"], {"question": {"action": "accept",  # a repeat: ignored
                                                                       "content": {"answer": "Q4"}}})
            return created, asking, still, await settled(client, created["taskId"])

    created, asking, still, done = run(scenario())

    assert created["status"] == asking["status"] == still["status"] == "input_required"
    schema = {"type": "object", "properties": {"answer": {"type": "string", "title": "Answer"}}, "required": ["answer"]}
    assert asking["inputRequests"] == {"question": {"method": "elicitation/create", "params": {
        "mode": "form", "message": "Which quarter?", "requestedSchema": schema}}}
    assert done["status"] == "completed" and done["result"]["structuredContent"]["answer"] == "Q3"
    assert task_lines(server, created["taskId"]) == ["task_created", "task_answered", "task_finished"]


def test_it_completes_a_declined_question_with_a_tool_error_result(server):
    async def scenario():
        async with connect(server.url, tasks=True) as client:
            created = await call_as_task(client, "report", {"title": unique("x"), "question": "Go ahead?"})
            await task_update(client, created["taskId"], {"question": {"action": "decline"}})
            return await settled(client, created["taskId"])

    done = run(scenario())

    assert done["status"] == "completed" and done["result"]["isError"] is True and "no report" in str(done["result"])


@era
def test_it_cancels_a_working_report_task_which_then_never_completes(server, mode):
    async def scenario():
        async with connect(server.url, mode=mode, tasks=True) as client:
            created = await call_as_task(client, "report", {"title": unique("long"), "seconds": 1})
            answer = await task_cancel(client, created["taskId"])
            await asyncio.sleep(1.2)  # past the time it would have completed
            cancelled = await task_get(client, created["taskId"])
            again = None
            if mode == "legacy":  # 2025-11-25 refuses to cancel a finished task; 2026-07-28 acknowledges
                with pytest.raises(MCPError, match="cancelled already"):
                    await task_cancel(client, created["taskId"])
            else:
                again = await task_cancel(client, created["taskId"])
            return created, answer, cancelled, again

    created, answer, cancelled, again = run(scenario())

    assert cancelled["status"] == "cancelled" and cancelled["statusMessage"] == "Cancelled (tasks/cancel)"
    assert answer.get("status") == ("cancelled" if mode == "legacy" else None)  # (2026-07-28: an empty result)
    assert again is None or "status" not in again
    assert task_lines(server, created["taskId"]) == ["task_created", "task_cancelled"]


# -- --state: the journal outlives the process ----------------------------------------------------------------------
def test_it_keeps_values_appends_keys_and_tasks_across_a_sigkill_with_a_state_journal(tmp_path):
    state = tmp_path / "state" / "tools.jsonl"
    key, call_key, task_key = unique("colour"), unique("call"), unique("call")

    async def before(url):
        async with connect(url, tasks=True) as client:
            first = await client.call_tool("upsert", {"key": key, "value": "teal"},
                                           meta={IDEMPOTENCY_META_KEY: call_key})
            for text in ("one", "two"):
                await client.call_tool("append", {"text": text})
            working = await call_as_task(client, "report", {"title": "resumed", "seconds": 2}, key=task_key)
            return first.structured_content, working

    async def after(url):
        async with connect(url, tasks=True) as client:
            again = await client.call_tool("upsert", {"key": key, "value": "teal"},
                                           meta={IDEMPOTENCY_META_KEY: call_key})
            found = await client.call_tool("lookup", {"key": key})
            appended = await client.call_tool("append", {"text": "three"})
            same = await call_as_task(client, "report", {"title": "resumed", "seconds": 2}, key=task_key)
            return again.structured_content, found.structured_content, appended.structured_content, same, \
                await settled(client, same["taskId"])

    with running_tool_server(tmp_path, name="first", args=["--state", str(state)]) as first_server:
        first, working = run(before(first_server.url))
        os.killpg(first_server.process.pid, signal.SIGKILL)  # no shutdown of any kind; the task still working
        first_server.process.wait(timeout=10)
    with state.open("ab") as journal:
        journal.write(b'{"op": "append", "te')  # a record torn by a kill mid-write: its call was never answered
    with running_tool_server(tmp_path, name="second", args=["--state", str(state)]) as second_server:
        again, found, appended, same, resumed = run(after(second_server.url))
        second_lines = second_server.calls()
        second_on_it = subprocess.run([sys.executable, str(SCRIPT), "--port", "1", "--state", str(state)],
                                      capture_output=True, text=True, timeout=30)

    assert second_on_it.returncode == 2 and "another running tool server" in second_on_it.stderr  # (locked)
    assert again == first == {"key": key, "value": "teal", "previous": None, "version": 1}
    assert [line["event"] for line in second_lines if line.get("idempotency_key_meta") == call_key] == [
        "received", "replayed"]  # the key it applied before the kill: not applied again
    assert found == {"key": key, "found": True, "value": "teal", "version": 1}
    assert appended == {"index": 2, "count": 3}
    assert same["taskId"] == working["taskId"] and resumed["status"] == "completed"
    assert resumed["result"]["structuredContent"]["title"] == "resumed"
    # Created by the first process, finished by the second (resumed on its clock: maybe before the call asked again).
    assert sorted(line["event"] for line in second_lines if line.get("task_id") == working["taskId"]) == [
        "replayed", "task_finished"]
    records = [json.loads(line) for line in state.read_text().splitlines()]  # (the torn record cut off: all parse)
    assert [record["op"] for record in records][:4] == ["upsert", "append", "append", "task_created"]
    assert sorted(record["op"] for record in records[4:]) == ["append", "task_finished"]


def test_it_is_started_by_dev_py_with_its_state_journal_in_the_data_folder(tmp_path):
    data, text = tmp_path / "data", unique("kept")
    with running_tool_server(tmp_path, name="dev", script=ROOT / "deploy" / "dev.py", command=["tool-server"],
                             env={"EMBED_DATA": str(data)}) as server:
        run(call_once(server.url, "append", {"text": text}))

    [record] = [json.loads(line) for line in (data / "tool_server" / "state.jsonl").read_text().splitlines()]
    assert (record["op"], record["text"]) == ("append", text)


async def call_once(url: str, tool: str, arguments: dict):
    async with connect(url) as client:
        return await client.call_tool(tool, arguments)
