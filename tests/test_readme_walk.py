"""The README's walk-through runs as written: the ```bash blocks marked `<!-- walk -->` (after "First run") and
`<!-- walk: greeting -->` (the complete workflow) are run in order, in one bash, against a real uvicorn process and a
real celery worker on the test database, and what they print is what the README says they show: a slow task
paused, refused at a stale version, resumed and cancelled; an approval answered at its version; the greeting's wait
answered and its result.

The `<!-- walk: setup -->` block runs too, in a folder whose var/dev-api-token holds the test's token; only the base
URL it sets is replaced afterwards, by the test server's (it listens on a free port, never the 8000 the README shows).
Needs bash, curl and jq, as the README says (.ci/run installs curl and jq when they are missing)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from uuid import UUID

import pytest

from agents_app.models import ToolServer
from tasks_app.examples import external
from tasks_app.examples.demo_steps import EFFECTS_LOG
from tasks_app.models import Task
from tests.embedded_support import ROOT
from tests.engine_support import configure
from tests.tool_server_support import tool_server  # noqa: F401 — the fixture

AGENT_GOAL = "Store the colour teal under the key colour"  # (the README's agent goal: the scripted conversation)
MARKED_BLOCK = re.compile(r"^<!-- walk(?:: (?P<label>[\w-]+))? -->\n```bash\n(?P<body>.*?)^```$", re.S | re.M)
SEPARATOR = "::walk-block::"

pytestmark = pytest.mark.skipif(
    not all(shutil.which(tool) for tool in ("bash", "curl", "jq")),
    reason="the README's walk needs bash, curl and jq (apt-get install curl jq); .ci/run installs them")


def walk_blocks(readme: str) -> list[tuple[str, str]]:
    """(label, text) of every marked block, in the README's order; the label is '' for the plain `<!-- walk -->`."""
    return [(match.group("label") or "", match.group("body")) for match in MARKED_BLOCK.finditer(readme)]


def json_lines(output: str) -> list[dict]:
    return [json.loads(line) for line in output.splitlines() if line.startswith("{")]


def test_it_finds_the_marked_blocks_where_the_readme_teaches_them():
    readme = (ROOT / "README.md").read_text()
    blocks = walk_blocks(readme)
    labels = [label for label, _ in blocks]

    assert labels[0] == "setup" and labels.count("setup") == 1 and labels[-2:] == ["greeting", "agent"]
    assert labels.count("") >= 4
    assert readme.index("<!-- walk") > readme.index("## First run")
    # Every block that uses a task id captured it in the walk first (TASK=$(… | jq -r .taskId)).
    walk_text = "".join(body for _, body in blocks)
    assert walk_text.index("TASK=$(") < walk_text.index("$TASK")
    assert "<taskId>" not in walk_text and "127.0.0.1:8000" not in walk_text.replace(blocks[0][1], "")


@pytest.mark.django_db(transaction=True)
def test_it_runs_the_readme_walk_as_written_against_a_real_server_and_worker(web, workers, api, tenant, external_root,
                                                                              tmp_path, scripted_model, tool_server,  # noqa: F811
                                                                              settings):
    blocks = walk_blocks((ROOT / "README.md").read_text())
    # The agent block: the scripted model stands in for MODEL_BASE_URL (the README's reader sets a real one), the
    # example tool server is the tenant's `reports`, as `run` registers it.
    model_env = {"RUNTIME_MODEL__BASE_URL": scripted_model.url, "RUNTIME_MODEL__NAME": "scripted-1"}
    configure(settings, model={"base_url": scripted_model.url, "name": "scripted-1"})
    ToolServer.objects.create(tenant=tenant, name="reports", url=tool_server.url, timeout_seconds=5)
    scripted_model.script(AGENT_GOAL, [
        {"content": "I will store it.", "tool_calls": [{"name": "reports__upsert",
                                                        "arguments": {"key": "colour", "value": "teal"}}]},
        {"content_from": "last_tool_result", "content": "Stored: "}])
    server = web(EXTRA_APPS="examples.greeting", **model_env)
    workers("walk", concurrency=2, env={"EXTRA_APPS": "examples.greeting", **model_env})
    folder = tmp_path / "project"
    (folder / "var").mkdir(parents=True)
    (folder / "var" / "dev-api-token").write_text(api.raw_token)

    (_, setup), *walk = blocks
    script = "\n".join([
        "set -u",  # a variable a block uses before any block set it fails here, not silently
        setup,
        'echo "API=$API TOKEN=${#TOKEN} characters"',
        f"export API={server.url('/runtime')}",
        *(f"echo {SEPARATOR}\n{body}" for _, body in walk),
    ])
    ran = subprocess.run(["bash", "-c", script], cwd=folder, capture_output=True, text=True, timeout=180,
                         env={**os.environ, "TOKEN": "", "API": ""})
    shown = f"exit {ran.returncode}\n--- stdout\n{ran.stdout}\n--- stderr\n{ran.stderr}"
    setup_output, *outputs = ran.stdout.split(SEPARATOR + "\n")

    assert ran.returncode == 0 and ran.stderr == "" and len(outputs) == len(walk), shown
    assert setup_output == f"API=http://127.0.0.1:8000/runtime TOKEN={len(api.raw_token)} characters\n", shown
    created, stream, pause, cancel, approval, greeting, agent = outputs

    # The slow task: created, working; its stream opens with the snapshot; paused; a stale version is a 409.
    slow = Task.objects.get(id=UUID(created.splitlines()[0]))
    assert json_lines(created)[0]["status"] == "working" and slow.input == {"steps": 60, "sleep_ms": 1000}, shown
    assert "event: task.snapshot" in stream, shown
    accepted, paused, stale = json_lines(pause)
    assert accepted["status"] == "accepted" and paused["internalStatus"] == "paused", shown
    assert stale["status"] == 409 and stale["current"] == paused["stateVersion"], shown
    # Resumed, then cancelled before its 60 steps; the history says so, with the versions each was decided on.
    resumed, cancelling, cancelled, *history = json_lines(cancel)
    assert resumed["status"] == "accepted" and cancelling["status"] in ("working", "cancelled"), shown  # (running, or
    # between two slices: then cancelled at once)
    assert cancelled["status"] == "cancelled" and cancelled["stepsCompleted"] < 60, shown
    assert [(c["type"], c["status"], c["reason"]) for c in history] == [  # newest first; the 409 stored nothing
        ("cancel", "applied", "enough for a first run"), ("resume", "applied", ""),
        ("pause", "applied", "check the draft")], shown
    # The approval: the wait is the effect's, approved at its version; the task completes and the effect ran once.
    waiting, approved, done = json_lines(approval)
    assert waiting["status"] == "input_required" and waiting["wait"]["kind"] == "approval", shown
    assert approved["status"] == "accepted" and done == {"status": "completed", "result": {"steps": 3}}, shown
    approval_task = Task.objects.exclude(id=slow.id).get(workflow_name="demo_steps")
    assert sum(line.startswith(f"{approval_task.id}:") for line in external.lines(EFFECTS_LOG)) == 3
    # The greeting: its question, the answer at its version, the text sent.
    asked, answered, sent = json_lines(greeting)
    assert asked["internalStatus"] == "input_required" and asked["prompt"].startswith("Send 'Hello, Ada!'?"), shown
    assert answered["status"] == "accepted", shown
    assert sent["status"] == "completed" and sent["result"]["sent"] == "Hello, Ada, welcome!", shown
    # The agent: to its end, then completed; the model asked for the tool, the server applied it once, the model
    # answered from its result.
    terminal, snapshot = agent.splitlines()
    assert terminal == "event: terminal" and json.loads(snapshot)["status"] == "completed", shown
    assert json.loads(snapshot)["result"]["answer"].startswith('Stored: {"key":"colour","value":"teal"') or \
        '"value": "teal"' in json.loads(snapshot)["result"]["answer"], shown
    assert len(tool_server.calls(tool="upsert", event="applied")) == 1
    assert scripted_model.turn_counts(AGENT_GOAL) == {0: 1, 1: 1}
    assert sorted(Task.objects.values_list("status", flat=True)) == ["cancelled", "completed", "completed",
                                                                     "completed"]
