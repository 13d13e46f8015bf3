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
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path

import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from tests.embedded_support import ROOT, free_port

SCRIPT = ROOT / "examples" / "tool_server.py"
TOKEN_ENV = "TOOL_SERVER_TOKEN"


class ToolServerProcess:
    """One `python examples/tool_server.py` process on 127.0.0.1 (or `python script`: any server taking --port and
    --log and writing that call log), answering by the time the constructor returns."""

    def __init__(self, directory: Path, *, token: str | None = None, name: str = "tool-server",
                 python: str | None = None, script: Path = SCRIPT, args: Sequence[str] = (), port: int | None = None):
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        self.log_path = directory / f"{name}-{self.port}.calls.jsonl"
        self.output_path = directory / f"{name}-{self.port}.out"  # its standard output and error
        command = [python or sys.executable, str(script), "--port", str(self.port), "--log", str(self.log_path),
                   *args]
        environment = dict(os.environ)
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
        if self.process.poll() is not None:
            return  # a test stopped it itself
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)


@contextlib.contextmanager
def running_tool_server(directory: Path, *, token: str | None = None, name: str = "tool-server", **process):
    """A ToolServerProcess for the block (``process``: python, script, args), stopped after it."""
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
async def connect(url: str, *, mode: str = "auto", token: str | None = None, headers: dict | None = None):
    """The SDK's Client over Streamable HTTP: mode "legacy" speaks 2025-11-25 after `initialize`, "auto" finds
    2026-07-28 by `server/discover`. headers go on every HTTP request (e.g. Idempotency-Key)."""
    headers = {**({"Authorization": f"Bearer {token}"} if token else {}), **(headers or {})}
    async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=120)) as http:
        async with Client(streamable_http_client(url, http_client=http), mode=mode) as client:
            yield client
