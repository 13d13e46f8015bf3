"""The example tool server (examples/tool_server.py, docs/tools.md) as a real process on a free port with its call log
in a test's folder, and the official `mcp` SDK's client connected to it.

    def test_it_…(tool_server):           # a fresh server for the test, stopped after it
        … tool_server.url, tool_server.calls(tool="append", event="applied") …

or, for a server shared by a module: `with running_tool_server(tmp_path_factory.mktemp("tools")) as server: …`.
Another server script that writes the same call log runs the same way, by another python if need be:
`running_tool_server(tmp_path, python=FASTMCP.python(), script=FASTMCP_SERVER)` (tests/clients/), with `args` for
its own options.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import httpx2
import mcp.types as types
import pytest
from mcp import Client
from mcp.client import ClaimContext, ClientExtension, ResultClaim
from mcp.client.streamable_http import streamable_http_client
from pydantic import Field

from agents_app.mcp_client import TASKS_EXTENSION, TaskIdParams, TaskUpdateParams
from agents_app.mcp_client import CancelTaskRequest as CancelTask
from agents_app.mcp_client import GetTaskRequest as GetTask
from agents_app.mcp_client import UpdateTaskRequest as UpdateTask
from examples.tool_server import IDEMPOTENCY_META_KEY
from tests.embedded_support import ROOT, free_port, process_group_stop

SCRIPT = ROOT / "examples" / "tool_server.py"
TOKEN_ENV = "TOOL_SERVER_TOKEN"


class ToolServerProcess:
    """One `python examples/tool_server.py` process on 127.0.0.1 (or `python script [command…]`: any server taking
    --port and --log and writing that call log), answering by the time the constructor returns."""

    def __init__(self, directory: Path, *, token: str | None = None, name: str = "tool-server",
                 python: str | None = None, script: Path = SCRIPT, args: Sequence[str] = (),
                 command: Sequence[str] = (), env: dict[str, str] | None = None, port: int | None = None):
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        self.log_path = directory / f"{name}-{self.port}.calls.jsonl"
        self.output_path = directory / f"{name}-{self.port}.out"  # its standard output and error
        command = [python or sys.executable, str(script), *command, "--port", str(self.port), "--log",
                   str(self.log_path), *args]
        environment = {**os.environ, **(env or {})}
        if token is not None:
            environment[TOKEN_ENV] = token
            command += ["--token-env", TOKEN_ENV]
        self.process = subprocess.Popen(command, cwd=ROOT, env=environment, stdout=self.output_path.open("w"),
                                        stderr=subprocess.STDOUT, start_new_session=True)
        self._wait_until_it_answers(seconds=30)

    def _wait_until_it_answers(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while True:
            assert self.process.poll() is None, f"the tool server exited: {self.output_path.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"the tool server did not answer: {self.output_path.read_text()}"
            try:
                urllib.request.urlopen(self.url, timeout=2).close()
                return
            except urllib.error.HTTPError:
                return  # any HTTP answer (405 for a bare GET, 401 without the token) means it is serving
            except OSError:
                time.sleep(0.05)

    def calls(self, **fields) -> list[dict]:
        """The call log's lines, parsed, in order; with fields, only the lines whose values equal them
        (`calls(tool="append", event="applied")`)."""
        if not self.log_path.exists():
            return []
        lines = [json.loads(line) for line in self.log_path.read_text().splitlines() if line]
        return [line for line in lines if all(line.get(name) == value for name, value in fields.items())]

    def wait_for_call(self, seconds: float = 10, **fields) -> dict:
        """The first log line with these fields, waiting for it to be written."""
        deadline = time.monotonic() + seconds
        while not (found := self.calls(**fields)):
            assert time.monotonic() < deadline, f"no call log line with {fields}: {self.calls()}"
            time.sleep(0.02)
        return found[0]

    def stop(self) -> None:
        process_group_stop(self.process, grace=5)


@contextlib.contextmanager
def running_tool_server(directory: Path, *, token: str | None = None, name: str = "tool-server", **process):
    """A ToolServerProcess for the block (``process``: python, script, command, args, env), stopped after it."""
    server = ToolServerProcess(directory, token=token, name=name, **process)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def tool_server(tmp_path):
    """A fresh example tool server for one test, its call log in the test's tmp_path."""
    with running_tool_server(tmp_path) as server:
        yield server


@contextlib.asynccontextmanager
async def connect(url: str, *, mode: str = "auto", token: str | None = None, headers: dict | None = None,
                  tasks: bool = False):
    """The SDK's Client over Streamable HTTP: mode "legacy" speaks 2025-11-25 after `initialize`, "auto" finds
    2026-07-28 by `server/discover`. headers go on every HTTP request (e.g. Idempotency-Key). tasks: the client
    declares the tasks extension (TasksClaim), for call_as_task and the tasks/* helpers below."""
    headers = {**({"Authorization": f"Bearer {token}"} if token else {}), **(headers or {})}
    async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=120)) as http:
        async with Client(streamable_http_client(url, http_client=http), mode=mode,
                          extensions=[TasksClaim()] if tasks else None) as client:
            yield client


# -- the tasks extension (2026-07-28) as a client, on the SDK's own extension interface, for the example's `report` ----
CREATED_TASK_META = "tests/created-task"  # where the claim puts the task a call was answered with


class CreatedTask(types.Result):
    result_type: Literal["task"] = Field("task", alias="resultType")
    task_id: str = Field(alias="taskId")
    status: str
    poll_interval_ms: int | None = Field(None, alias="pollIntervalMs")


class DetailedTask(types.Result):
    task_id: str = Field(alias="taskId")
    status: str
    status_message: str | None = Field(None, alias="statusMessage")
    created_at: str = Field(alias="createdAt")
    last_updated_at: str = Field(alias="lastUpdatedAt")
    ttl_ms: int | None = Field(alias="ttlMs")
    poll_interval_ms: int | None = Field(None, alias="pollIntervalMs")
    input_requests: dict[str, Any] | None = Field(None, alias="inputRequests")
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None


async def _kept(created: CreatedTask, ctx: ClaimContext) -> types.CallToolResult:
    return types.CallToolResult(content=[], _meta={CREATED_TASK_META: created.model_dump(by_alias=True,
                                                                                          exclude_none=True)})


class TasksClaim(ClientExtension):
    """Declares the tasks extension (so a server may answer a call with a task) and hands the task back in _meta."""

    identifier = TASKS_EXTENSION

    def claims(self):
        return [ResultClaim(result_type="task", model=CreatedTask, resolve=_kept)]


async def call_as_task(client: Client, tool: str, arguments: dict, *, key: str | None = None) -> dict:
    """tools/call answered with a task, in either era (2025-11-25: with params.task): the created task, as a dict."""
    meta = {IDEMPOTENCY_META_KEY: key} if key else None
    if client.protocol_version == "2025-11-25":
        # (the raw send, as agents_app.mcp_client's: the SDK's client checks any tools/call answer as a CallToolResult)
        raw = await client.session._dispatcher.send_raw_request(
            "tools/call", {"name": tool, "arguments": arguments, "task": {"ttl": 60_000},
                           **({"_meta": meta} if meta else {})}, {})
        return types.CreateTaskResult.model_validate(raw).task.model_dump(by_alias=True, exclude_none=True)
    result = await client.call_tool(tool, arguments, meta=meta)
    assert result.meta and CREATED_TASK_META in result.meta, f"not answered with a task: {result}"
    return result.meta[CREATED_TASK_META]


async def task_get(client: Client, task_id: str) -> dict:
    """tasks/get: a 2026-07-28 DetailedTask, or the 2025-11-25 Task."""
    if client.protocol_version == "2025-11-25":
        task = await client.session.send_request(
            types.GetTaskRequest(params=types.GetTaskRequestParams(task_id=task_id)), types.GetTaskResult)
    else:
        task = await client.session.send_request(GetTask(params=TaskIdParams(taskId=task_id)), DetailedTask)
    return task.model_dump(by_alias=True, exclude={"meta"}, exclude_none=True, mode="json")


async def task_update(client: Client, task_id: str, responses: dict) -> None:
    await client.session.send_request(UpdateTask(params=TaskUpdateParams(taskId=task_id, inputResponses=responses)),
                                      types.Result)


async def task_cancel(client: Client, task_id: str) -> dict:
    if client.protocol_version == "2025-11-25":
        answer = await client.session.send_request(
            types.CancelTaskRequest(params=types.CancelTaskRequestParams(task_id=task_id)), types.CancelTaskResult)
    else:
        answer = await client.session.send_request(CancelTask(params=TaskIdParams(taskId=task_id)), types.Result)
    return answer.model_dump(by_alias=True, exclude_none=True, mode="json")


async def task_result(client: Client, task_id: str) -> dict:
    """2025-11-25 tasks/result: the finished task's CallToolResult."""
    answer = await client.session.send_request(
        types.GetTaskPayloadRequest(params=types.GetTaskPayloadRequestParams(task_id=task_id)), types.CallToolResult)
    return answer.model_dump(by_alias=True, exclude_none=True, mode="json")
