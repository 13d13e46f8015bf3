"""The scripted language model (tests/clients/scripted_model.py: the reply forms, the request log's fields) as a real
process on a free port, for tests of code that calls an OpenAI-compatible model.

    def test_it_…(scripted_model):           # one process per test session (tests/conftest.py); unique keys
        key = unique_key("ask")              # put it in the goal: the first user message carries it
        scripted_model.script(key, [{"tool_calls": [{"name": "lookup", "arguments": {"key": "a"}}]},
                                    {"content_from": "last_tool_result"}])
        … OpenAI(base_url=scripted_model.url, api_key="test") … goal=f"… {key} …"
        assert scripted_model.turn_counts(key) == {0: 1, 1: 1}

or a process of its own: `with running_scripted_model(tmp_path) as model: …`.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from tests.embedded_support import ROOT, free_port, process_group_stop

SCRIPT = ROOT / "tests" / "clients" / "scripted_model.py"


def unique_key(label: str = "conversation") -> str:
    """A conversation key no other test (nor another run against the same process) uses."""
    return f"{label}-{uuid.uuid4().hex[:12]}"


class ScriptedModel:
    """One `python tests/clients/scripted_model.py` process on 127.0.0.1, answering by the time the constructor
    returns; `url` is the base URL an OpenAI client takes (…/v1)."""

    def __init__(self, directory: Path, *, name: str = "scripted-model", port: int | None = None):
        self.port = port or free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.url = f"{self.base}/v1"
        self.log_path = directory / f"{name}-{self.port}.requests.jsonl"
        self.output_path = directory / f"{name}-{self.port}.out"  # its standard output and error
        command = [sys.executable, str(SCRIPT), "--port", str(self.port), "--log", str(self.log_path)]
        self.process = subprocess.Popen(command, cwd=ROOT, stdout=self.output_path.open("w"),
                                        stderr=subprocess.STDOUT, start_new_session=True)
        self._wait_until_it_answers(seconds=30)

    def _wait_until_it_answers(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while True:
            assert self.process.poll() is None, f"the scripted model exited: {self.output_path.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"the scripted model did not answer: {self.output_path.read_text()}"
            try:
                urllib.request.urlopen(f"{self.url}/models", timeout=2).close()
                return
            except OSError:
                time.sleep(0.05)

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(f"{self.base}{path}", data=data, method=method,
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as error:
            raise AssertionError(f"{method} {path}: {error.code} {error.read().decode()}") from None

    def script(self, key: str, replies: list[dict[str, Any]]) -> None:
        """Install (or replace) conversation `key`'s replies, one per turn (the forms: tests/clients/
        scripted_model.py). A malformed script fails here, with the reason."""
        self._call("POST", "/_scripts", {"key": key, "replies": replies})

    def requests(self, key: str | None = None, **fields) -> list[dict[str, Any]]:
        """The requests the model received (conversation `key`'s, or all), in order; with fields, only those whose
        values equal them (`requests(key, turn=2, status=200)`)."""
        query = f"?{urllib.parse.urlencode({'conversation': key})}" if key is not None else ""
        entries = self._call("GET", f"/_requests{query}")["requests"]
        return [entry for entry in entries if all(entry.get(name) == value for name, value in fields.items())]

    def turn_counts(self, key: str) -> dict[int, int]:
        """How many requests each turn of conversation `key` received, errors answered included: {turn: count}."""
        return dict(sorted(Counter(entry["turn"] for entry in self.requests(key)).items()))

    def wait_for_request(self, key: str, seconds: float = 10, **fields) -> dict[str, Any]:
        """The first request of conversation `key` with these fields, waiting for it to arrive (it is logged when it
        arrives, before a delay_ms)."""
        deadline = time.monotonic() + seconds
        while not (found := self.requests(key, **fields)):
            assert time.monotonic() < deadline, f"no request of {key} with {fields}: {self.requests(key)}"
            time.sleep(0.02)
        return found[0]

    def reset(self, key: str | None = None) -> None:
        """Forget every script and request, or conversation `key`'s only."""
        self._call("POST", "/_reset", {"key": key} if key is not None else {})

    def stop(self) -> None:
        process_group_stop(self.process, grace=5)


@contextlib.contextmanager
def running_scripted_model(directory: Path, **process):
    """A ScriptedModel for the block, stopped after it."""
    model = ScriptedModel(directory, **process)
    try:
        yield model
    finally:
        model.stop()
