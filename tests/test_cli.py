"""The `runtime` CLI and the Python client (tasks_app.client) against a real uvicorn process and real celery workers:
the README's CLI block run as written with .venv/bin/runtime, the commands and client calls it does not show, the
exit codes and problem details a script sees, and `runtime tasks watch` following a task across a restart of the web
process without a gap. Also: the client imports nothing of the server, and where it finds the server and token."""

from __future__ import annotations

import asyncio
import json
import os
import pty
import re
import select
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from django.contrib.auth.models import Permission

from agents_app.models import ToolServer
from steering_app.selectors import steering_history
from tasks_app.client import AsyncRuntimeClient, NotFound, RuntimeClient, VersionConflict
from tasks_app.client.config import resolve
from tasks_app.client.errors import ConfigurationError
from tasks_app.models import Task
from tests import workflows
from tests.embedded_support import ROOT
from tests.engine_support import configure, drive
from tests.web_support import WebProcess
from tests.worker_support import wait_until

RUNTIME = Path(sys.executable).with_name("runtime")  # the console script deploy/dev.py installs
CLI_BLOCK = re.compile(r"^<!-- cli-walk -->\n```bash\n(?P<body>.*?)^```$", re.S | re.M)
SERVER_PACKAGES = {"django", "rest_framework", "config", "steering_app", "agents_app", "checkpoints_app",
                   "mcp_bridge", "celery", "psycopg"}

pytestmark = pytest.mark.skipif(not all(shutil.which(tool) for tool in ("bash", "jq")),
                                reason="the README's CLI block needs bash and jq (.ci/run installs jq)")


def cli(server, token, *args, env=None, timeout=60) -> subprocess.CompletedProcess:
    """`runtime ARGS` as a user runs it: the console script, in a folder of its own, configured by the environment."""
    environment = {**os.environ, "RUNTIME_URL": server.url(""), "RUNTIME_TOKEN": token, **(env or {})}
    environment.pop("TOKEN", None)
    return subprocess.run([str(RUNTIME), *args], capture_output=True, text=True, timeout=timeout, env=environment,
                          cwd=server.log.parent)


def cli_at_once(server, token, *commands: list[str]) -> list[subprocess.CompletedProcess]:
    """Several independent `runtime` commands side by side (each is a process start): like cli() each."""
    environment = {**os.environ, "RUNTIME_URL": server.url(""), "RUNTIME_TOKEN": token}
    environment.pop("TOKEN", None)
    started = [(command, subprocess.Popen([str(RUNTIME), *command[1:]], text=True, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, cwd=server.log.parent,
                                          env={**environment, "RUNTIME_TOKEN": command[0]}))
               for command in commands]
    finished = []
    for command, process in started:
        out, err = process.communicate(timeout=60)
        finished.append(subprocess.CompletedProcess(command[1:], process.returncode, out, err))
    return finished


def json_lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def test_it_imports_the_client_without_the_server_or_django(tmp_path):
    """What a laptop has: the client package alone (copied out of the checkout), httpx2, no settings."""
    shutil.copytree(ROOT / "tasks_app" / "client", tmp_path / "tasks_app" / "client",
                    ignore=shutil.ignore_patterns("__pycache__"))
    probe = ("import json, sys, tasks_app.client, tasks_app.client.cli; "
             "print(json.dumps([tasks_app.client.__file__, sorted({m.split('.')[0] for m in sys.modules})]))")
    env = {key: value for key, value in os.environ.items() if key not in ("DJANGO_SETTINGS_MODULE", "PYTHONPATH")}
    ran = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=30)

    assert ran.returncode == 0, ran.stderr
    where, modules = json.loads(ran.stdout)
    assert where == str(tmp_path / "tasks_app" / "client" / "__init__.py")
    assert not SERVER_PACKAGES & set(modules), sorted(SERVER_PACKAGES & set(modules))
    # The console script exists (deploy/dev.py installed the project) and runs without a server or a token.
    helped = subprocess.run([str(RUNTIME), "--help"], env=env, capture_output=True, text=True, timeout=30)
    assert helped.returncode == 0 and "Exit codes" in helped.stdout and "RUNTIME_TOKEN" in helped.stdout


def test_it_finds_the_server_and_token_in_the_environment_or_the_config_file(tmp_path, monkeypatch):
    token_file = tmp_path / "dev-api-token"
    token_file.write_text("art_from_file\n")
    config = tmp_path / "config.toml"
    config.write_text(f'[default]\nurl = "http://runtime.local:9000/"\ntoken_file = "{token_file}"\n\n'
                      f'[staging]\nurl = "https://staging.example.com/runtime"\ntoken = "art_staging"\n')
    for name in ("RUNTIME_URL", "RUNTIME_TOKEN", "TOKEN", "RUNTIME_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("RUNTIME_CONFIG", str(config))

    from_file = resolve()
    monkeypatch.setenv("TOKEN", "art_readme")  # the README's export
    readme = resolve()
    monkeypatch.setenv("RUNTIME_TOKEN", "art_env")
    monkeypatch.setenv("RUNTIME_URL", "http://127.0.0.1:8077/runtime")
    from_env = resolve()
    staging = resolve(profile="staging")  # a profile named on the command line wins over the environment

    assert (from_file.url, from_file.token) == ("http://runtime.local:9000", "art_from_file")
    assert (readme.url, readme.token) == ("http://runtime.local:9000", "art_readme")
    assert (from_env.url, from_env.token) == ("http://127.0.0.1:8077", "art_env")
    assert (staging.url, staging.token) == ("https://staging.example.com", "art_staging")
    assert "art_" not in repr(staging)  # the token is never shown
    with pytest.raises(ConfigurationError, match=r"no profile \[prod\]"):
        resolve(profile="prod")
    monkeypatch.delenv("RUNTIME_TOKEN")
    monkeypatch.delenv("TOKEN")
    monkeypatch.setenv("RUNTIME_CONFIG", str(tmp_path / "absent.toml"))
    with pytest.raises(ConfigurationError, match="No API token"):
        resolve()


@pytest.mark.django_db(transaction=True)
def test_it_runs_the_readme_cli_block_and_every_command_against_a_real_server(web, workers, api, tenant, new_task,
                                                                               external_root, settings, tmp_path):
    assert RUNTIME.exists(), "deploy/dev.py installs the project's console script into the virtualenv"
    api.user.user_permissions.add(Permission.objects.get(codename="kill_task"))  # (as the README's admin has it)
    ToolServer.objects.create(tenant=tenant, name="reports", url="http://127.0.0.1:8765/mcp")
    artifact_task = _task_with_artifacts(new_task, settings)
    server = web()
    workers("cli", concurrency=2)
    token = api.raw_token

    # 1. The README's block, as written, in a project folder whose var/dev-api-token is the test's token and whose
    # .venv/bin/runtime is the console script; only RUNTIME_URL comes from outside (the server's free port).
    block = CLI_BLOCK.search((ROOT / "README.md").read_text()).group("body")
    folder = tmp_path / "project"
    (folder / "var").mkdir(parents=True)
    (folder / "var" / "dev-api-token").write_text(token)
    (folder / ".venv" / "bin").mkdir(parents=True)
    (folder / ".venv" / "bin" / "runtime").symlink_to(RUNTIME)
    environment = {**os.environ, "RUNTIME_URL": server.url(""), "HOME": str(tmp_path), "TOKEN": ""}
    environment.pop("RUNTIME_TOKEN", None)
    ran = subprocess.run(["bash", "-c", "set -eu -o pipefail\n" + block], cwd=folder, capture_output=True,
                         text=True, timeout=240, env=environment)
    shown = f"exit {ran.returncode}\n--- stdout\n{ran.stdout}\n--- stderr\n{ran.stderr}"
    (tmp_path / "cli-walk.out").write_text(shown)  # (what the block printed, to compare with the README's comments)

    assert ran.returncode == 0 and ran.stderr == "", shown
    assert re.search(r"^[0-9a-f-]{36}  demo_steps  completed \(completed\)$", ran.stdout, re.M), shown
    assert re.search(r"^pause: accepted \(command [0-9a-f-]{36}, stateVersion \d+\)", ran.stdout, re.M), shown
    steered = json_lines(ran.stdout)[0]
    assert steered["priority"] == 8 and steered["internalStatus"] in ("queued", "working"), shown
    assert ran.stdout.count("watch: exit 1\n") == 2, shown  # the cancelled task, the rejected effect's
    assert re.search(r"^ +\d+ progress$", ran.stdout, re.M), shown  # runtime events, counted by type
    assert {"status": "completed", "result": {"steps": 2, "note": "looks good"}} in json_lines(ran.stdout), shown
    assert {"status": "completed", "result": {"steps": 2}} in json_lines(ran.stdout), shown
    assert "waits (input " in ran.stdout and "A note for step 1, please" in ran.stdout, shown
    assert re.search(r"^reports +http://127.0.0.1:8765/mcp  not checked  0 tools$", ran.stdout, re.M), shown
    steered_task = Task.objects.get(priority=8)
    assert [(c["type"], c["status"]) for c in reversed(steering_history(task=steered_task))] == [
        ("pause", "applied"), ("set_priority", "applied"), ("adjust_goal", "applied"), ("resume", "applied"),
        ("cancel", "applied")]
    assert steered_task.status == "cancelled"
    assert sorted(Task.objects.exclude(id=artifact_task.id).values_list("status", flat=True)) == [
        "cancelled", "completed", "completed", "completed", "failed"]

    # 2. The README's other commands: artifacts, the tenant's events, kill (fork: below, with the client).
    tenant_events = subprocess.Popen([str(RUNTIME), "events", "--limit", "2", "--output", "json"], text=True,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     env={**os.environ, "RUNTIME_URL": server.url(""), "RUNTIME_TOKEN": token})
    started = time.monotonic()
    task = str(artifact_task.id)
    listed, fetched, missing = cli_at_once(
        server, token, [token, "artifacts", "list", task, "--output", "json"],
        [token, "artifacts", "get", task, "report.md", "--to", "report.md"], [token, "artifacts", "get", task, "x.md"])
    assert [(a["name"], a["bytes"]) for a in json.loads(listed.stdout)] == [("report.md", 11), ("data.json", 8)]
    assert fetched.returncode == 0 and (server.log.parent / "report.md").read_text() == "# Findings\n"
    assert missing.returncode == 3 and "has no artifact named 'x.md'" in missing.stderr
    time.sleep(max(0.0, 1 - (time.monotonic() - started)))  # (the tenant's stream is live only: subscribed by now)
    slow = json.loads(cli(server, token, "tasks", "create", "demo_steps", "--input",
                          '{"steps": 100, "sleep_ms": 200}', "--output", "json").stdout)["taskId"]
    wait_until(slow, lambda task: task.steps_completed >= 1)
    killed = cli(server, token, "steer", "kill", slow, "--reason", "stuck")
    assert killed.returncode == 0 and killed.stdout.startswith("kill: accepted"), killed.stderr
    assert cli(server, token, "tasks", "watch", slow).returncode == 1
    out, err = tenant_events.communicate(timeout=30)
    assert tenant_events.returncode == 0 and len(json_lines(out)) == 2, err
    assert {line["data"]["taskId"] for line in json_lines(out)} == {slow}

    # 3. What a script sees when something is wrong: an exit code, and the problem's details on stderr.
    unknown, invalid, refused, unreachable, usage = cli_at_once(
        server, token, [token, "tasks", "get", str(uuid.uuid4())],
        [token, "tasks", "create", "demo_steps", "--input", '{"steps": "many"}'],
        ["art_not_a_token", "tasks", "list"], [token, "tasks", "list", "--url", "http://127.0.0.1:9"],
        [token, "steer", "priority", slow, "12"])
    assert (unknown.returncode, invalid.returncode, refused.returncode, unreachable.returncode, usage.returncode) \
        == (3, 2, 5, 6, 2)
    assert "Not found (404)" in unknown.stderr and "see /runtime/problems/not-found" in unknown.stderr
    assert "input.steps:" in invalid.stderr and "Input does not match the workflow's schema (422)" in invalid.stderr
    assert "Invalid or revoked token" in refused.stderr and "art_not_a_token" not in refused.stderr + refused.stdout
    running = json.loads(cli(server, token, "tasks", "create", "demo_steps", "--input",
                             '{"steps": 100, "sleep_ms": 200}', "--output", "json").stdout)["taskId"]
    stale, nothing_to_approve = cli_at_once(server, token, [token, "steer", "pause", running, "--expected-version",
                                                            "99"], [token, "approve", running])
    retried = cli(server, token, "steer", "pause", running, "--expected-version", "99", "--retry", "--output", "json")
    assert stale.returncode == 4 and "The task changed since you read it (409)" in stale.stderr
    assert re.search(r"the task is now at stateVersion \d+ \(", stale.stderr) and "--retry" in stale.stderr
    assert nothing_to_approve.returncode == 4 and "there is no wait to answer" in nothing_to_approve.stderr
    assert retried.returncode == 0 and json.loads(retried.stdout)["status"] == "accepted", retried.stderr
    # (the cancel shorthand needs no version; a completed task cannot be cancelled: 409)
    assert cli(server, token, "steer", "cancel", running).returncode == 0
    wait_until(running, lambda task: task.status == "cancelled")
    completed = Task.objects.filter(status="completed").exclude(id=artifact_task.id).first()
    too_late = cli(server, token, "steer", "cancel", str(completed.id))
    assert too_late.returncode == 4 and "(409)" in too_late.stderr, too_late.stderr

    # 4. The Python client's own calls: typed results, create_and_wait, expectedVersion, errors, the async twin.
    with RuntimeClient(server.url(""), token) as client:
        seen = []
        done = client.create_and_wait("demo_steps", {"steps": 3}, timeout=60, on_event=seen.append)
        assert (done.status, done.result, done.steps_completed) == ("completed", {"steps": 3}, 3)
        history = [event.seq for event in seen if not event.opening]
        assert seen[0].opening and history == list(range(seen[0].seq + 1, seen[0].seq + 1 + len(history)))
        assert seen[-1].type == "terminal"
        assert [e.seq for e in client.events(done.task_id)] == list(range(1, seen[-1].seq + 1))
        task = client.create_task("demo_steps", {"steps": 100, "sleep_ms": 200})
        with pytest.raises(VersionConflict) as conflict:
            client.pause(task.task_id, expected_version=7)
        assert conflict.value.snapshot.task_id == task.task_id and conflict.value.exit_code == 4
        decided = []
        accepted = client.pause(task.task_id, expected_version=7, reason="the client's test",
                                retry_on_conflict=lambda current: decided.append(current.state_version) or True)
        assert accepted.status == "accepted" and len(decided) == 1  # asked once, with the task as it was then
        assert client.cancel(task.task_id).task_id == task.task_id
        with pytest.raises(NotFound):
            client.get_task(str(uuid.uuid4()))
        assert [t.name for t in client.tool_servers()] == ["reports"]
        # Fork: a new task that starts again at step 2 of a finished one, followed to its end.
        original = client.create_and_wait("demo_steps", {"steps": 3, "effect": False}, timeout=60)
        forked, bad_step = cli_at_once(
            server, token, [token, "fork", original.task_id, "--from-step", "2", "--goal", "again", "--wait",
                            "--output", "json"], [token, "fork", original.task_id, "--from-step", "9"])
        fork = json_lines(forked.stdout)[-1]
        assert forked.returncode == 0 and fork["status"] == "completed", forked.stderr
        assert fork["forkedFrom"] == {"taskId": original.task_id, "fromStep": 2} and fork["result"] == {"steps": 3}
        assert bad_step.returncode == 2 and "fromStep: From 1 to 4" in bad_step.stderr, bad_step.stderr
        assert [f["taskId"] for f in client.lineage(original.task_id)["forks"]] == [fork["taskId"]]

    async def async_calls():
        async with AsyncRuntimeClient(server.url(""), token) as client:
            finished = await client.create_and_wait("demo_steps", {"steps": 2}, timeout=60)
            page = await client.list_tasks(status="completed", limit=2)
            files = await client.artifacts(str(artifact_task.id))
            return finished, page, files

    finished, page, files = asyncio.run(async_calls())
    assert finished.status == "completed" and page.tasks[0].task_id == finished.task_id and len(page.tasks) == 2
    assert [f.name for f in files] == ["report.md", "data.json"]

    # 5. `runtime tasks watch` across a restart of the web process: it reconnects with Last-Event-ID and shows every
    # event, each once, in seq order, though the task went on while no web process was up.
    _watch_survives_a_web_restart(server, token, tmp_path)


def _watch_survives_a_web_restart(server, token, tmp_path):
    task_id = json.loads(cli(server, token, "tasks", "create", "demo_steps", "--input",
                             '{"steps": 20, "sleep_ms": 400}', "--output", "json").stdout)["taskId"]  # (8 s: the
    # server is stopped while it runs, even on a loaded machine)
    environment = {**os.environ, "RUNTIME_URL": server.url(""), "RUNTIME_TOKEN": token, "TERM": "xterm"}
    watcher = subprocess.Popen([str(RUNTIME), "tasks", "watch", task_id, "--output", "json"], text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=environment)
    terminal, screen = pty.openpty()  # a second watcher, as a person at a terminal sees it: the progress bar
    person = subprocess.Popen([str(RUNTIME), "tasks", "watch", task_id], stdout=screen, stderr=subprocess.DEVNULL,
                              env=environment)
    os.close(screen)
    # The person's watcher is connected before the server goes away (a first connection refused is exit 6, at once:
    # there is nothing to follow yet); it has drawn where the task stands by then.
    ready, _, _ = select.select([terminal], [], [], 30)
    assert ready, "the terminal watcher showed nothing in 30 s"
    first_drawn = os.read(terminal, 65536).decode(errors="replace")
    shown = []
    while not any('"type": "progress"' in line for line in shown):  # following it: the stream is open
        shown.append(watcher.stdout.readline())
        assert shown[-1], watcher.stderr.read()
    server.stop()  # SIGTERM: the open stream is ended after the shutdown grace
    before = Task.objects.get(id=task_id).steps_completed
    # Steps committed while no web process was up (or all of them, on a slow machine): the watcher must read them.
    wait_until(task_id, lambda task: task.steps_completed >= before + 2 or task.status == "completed")
    again = WebProcess(tmp_path, name="web-again", port=server.port)
    try:
        out, err = watcher.communicate(timeout=60)
        person.wait(timeout=60)
    finally:
        again.stop()
    drawn = first_drawn + _read_all(terminal)

    lines = json_lines("".join(shown) + out)
    events, final = lines[:-1], lines[-1]
    opening, history = events[0], events[1:]
    seqs = [event["seq"] for event in history]
    assert watcher.returncode == 0 and final["status"] == "completed", err
    assert "reconnecting after event #" in err, err  # it did lose the stream
    assert opening["type"] == "task.snapshot" and "snapshot" in opening["data"]
    assert seqs == list(range(opening["seq"] + 1, opening["seq"] + 1 + len(seqs))), seqs  # no gap, no repeat
    assert history[-1]["type"] == "terminal" and not any("gap" in event for event in events)
    progress = [event["data"]["data"]["stepsCompleted"] for event in history if event["type"] == "progress"]
    first = opening["data"]["snapshot"]["stepsCompleted"]
    assert progress == list(range(first + 1, 21)), progress  # every step after the first snapshot, once
    assert person.returncode == 0 and "\r[########################] 100%  20 steps" in drawn, drawn
    assert f"{task_id}  demo_steps  completed (completed)" in drawn, drawn


def _read_all(fd: int) -> str:
    """What a process wrote to the terminal whose other side is ``fd``, once it has ended."""
    chunks = []
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # (EIO: the other side is closed and everything was read)
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(fd)
    return b"".join(chunks).decode(errors="replace")


def _task_with_artifacts(new_task, settings) -> Task:
    """A finished task whose steps wrote report.md and data.json (tests/workflows' scripted workflow, run here)."""
    name = uuid.uuid4().hex
    workflows.SCRIPTS[name] = {0: [{"do": "artifact", "name": "report.md", "content": "# Findings\n"}],
                               1: [{"do": "artifact", "name": "data.json", "content": '{"v": 2}'}]}
    configure(settings, step_retry={"backoff_seconds": 0})
    task = new_task("scripted", script=name, steps=2)
    assert drive(task.id) == ["completed"]
    workflows.SCRIPTS.pop(name, None)
    return task


def test_it_lists_only_the_tenants_own_tool_servers_to_a_token_that_may_read(api, other_api, tenant, other_tenant):
    ToolServer.objects.create(tenant=tenant, name="reports", url="http://127.0.0.1:8765/mcp",
                              tools=[{"name": "lookup"}, {"name": "upsert"}], protocol_version="2025-11-25",
                              credential="REPORTS_TOKEN")
    ToolServer.objects.create(tenant=other_tenant, name="theirs", url="http://127.0.0.1:8766/mcp")

    mine, theirs = api.get("/runtime/tool-servers"), other_api.get("/runtime/tool-servers")
    api.credentials()
    anonymous = api.get("/runtime/tool-servers")

    assert mine.status_code == 200
    assert [(s["name"], s["tools"], s["protocolVersion"]) for s in mine.json()["toolServers"]] == [
        ("reports", ["lookup", "upsert"], "2025-11-25")]
    assert "REPORTS_TOKEN" not in mine.content.decode()  # (not even the credential's variable name)
    assert [s["name"] for s in theirs.json()["toolServers"]] == ["theirs"]
    assert anonymous.status_code == 401 and anonymous["Content-Type"] == "application/problem+json"


def test_it_notices_a_gap_in_the_seqs_and_drops_repeats_across_connections():
    """The watch's bookkeeping (tasks_app.client._core), on the stream's own text: the server resumes after
    Last-Event-ID without gaps, so a skipped seq is what the client re-reads the snapshot for."""
    from tasks_app.client._core import SseDecoder, WatchState

    def events(text):
        decoder = SseDecoder()
        return [event for line in text.split("\n") if (event := decoder.feed(line)) is not None]

    first = events('id: 4\nevent: task.snapshot\ndata: {"taskId": "t", "seq": 4, "snapshot": {"taskId": "t", '
                   '"status": "working"}}\n\n: keep-alive\n\nid: 5\nevent: progress\ndata: {"seq": 5, "data": '
                   '{"stepsCompleted": 3}}\n\nid: 6\nevent: task.snapshot\ndata: {"seq": 6, "data": '
                   '{"nextStep": 4}}\n\n')
    again = events('id: 6\nevent: checkpoint\ndata: {}\n\nid: 9\nevent: progress\ndata: {"seq": 9}\n\n'
                   'event: llm.delta\ndata: {"text": "Hel"}\n\nid: 10\nevent: terminal\ndata: {"seq": 10}\n\n')
    state = WatchState(None)

    verdicts = [(event.type, event.seq, state.classify(event)) for event in first + again]

    assert verdicts == [("task.snapshot", 4, "pass"), ("progress", 5, "pass"), ("task.snapshot", 6, "pass"),
                        ("checkpoint", 6, "skip"), ("progress", 9, "gap"), ("llm.delta", None, "pass"),
                        ("terminal", 10, "pass")]
    assert first[0].opening and not first[2].opening and first[1].payload == {"stepsCompleted": 3}
    assert state.missing == (7, 8) and state.done and state.request_headers()["Last-Event-ID"] == "10"
