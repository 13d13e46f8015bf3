"""The chaos soak: people and agents at work while processes, PostgreSQL and Valkey fail under them, for a bounded
time; then every guarantee is checked and printed.

    python3.11 deploy/dev.py chaos --soak [--minutes 2] [--seed 1] [--arrive-every 1.0] [--drain-seconds 60]

On its own embedded PostgreSQL and Valkey (bench/chaos.py's, with its short lease: 3 s), a supervised fleet — two
workers, beat, the web tier (uvicorn) and the example MCP tool server (with its journal, --state) — plus the scripted
model (tests/clients/scripted_model.py, the agents' language model; never killed: it is outside the system). Tasks:

  long            demo_steps whose steps (3.2 s) outlast the lease: only heartbeats keep it;
  timeouts        demo_steps whose every effect lands, then answers after its timeout: the retry must reconcile it
                  (applied), never call it again;
  demo            demo_steps of short steps, each with one ledger effect (bench/chaos.py's normal batch);
  steered         demo_steps that a person steers over the REST API while they run: answer (the task asks for a note:
                  provide_input), approve (an effect waits for approval), pause_resume, adjust (adjust_goal, sent
                  first with a stale expectedVersion, which must be refused with 409, then with the current one) and
                  cancel. Commands carry a commandId and are retried with it (a web process killed mid-request, a
                  503 while PostgreSQL is down), as a careful client does;
  mcp_tool        one upsert on the tool server each, through the gateway (its idempotency key);
  agent           the built-in agent: every turn but the last asks the tool server for an upsert, the last answers.

Faults, one at a time (bench/chaos.py's injector, in shuffled rounds so every kind happens early, stopping after 70 %
of the time so the run shows it converges): kill_worker (SIGKILL, sometimes re-armed at an engine fault point),
kill_beat, kill_web, postgres_outage (a crash: `pg_ctl stop -m immediate`), kill_db_connections, valkey_outage
(stopped, restarted from its append-only file), valkey_lost (SIGKILLed and restarted without its AOF or snapshot:
every queued message is gone), duplicate_messages (every message queued or delivered-but-unacked is pushed again:
delivered twice) and tool_server_restart (SIGKILL; it restarts from its journal).

Checked at the end, and printed as one JSON line (exit 1 when a guarantee broke):
- every task in its expected terminal state (cancel: cancelled; every other: completed);
- 0 duplicate effects: demo effects counted in the effects log outside the database, tool effects in the tool
  server's call log ("applied" per idempotency key), and every completed task's every effect present;
- every command the API accepted has exactly one outcome event (steering.applied / steering.rejected) — 0 lost,
  0 applied twice — and every stale one was refused with 409;
- every task's audit chain verifies (`manage.py verify_events`);
- the longest time a task went without progress (bench/chaos.py's watch; a long step's own length not counted) and
  its bound, lease + reaper + 5 s; steered tasks, which wait for their person by design, are left out. Faults come
  5–6 s apart so that every kind fits in two minutes, which lets two of them stack: the bound is enforced only with
  --stall-check.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "deploy"))

from embedded import EmbeddedPostgres, EmbeddedValkey  # noqa: E402

from bench import chaos  # noqa: E402

SOAK_FAULTS = (*chaos.FAULT_KINDS, "kill_beat", "kill_web", "valkey_lost", "duplicate_messages",
               "tool_server_restart")
TENANT = "soak"
TOOL_SERVER = "tools"
MODEL_NAME = "soak-scripted"
STEERED_KINDS = ("answer", "approve", "pause_resume", "adjust", "cancel")
# How long a client keeps retrying one command (with its commandId) before it gives up: longer than any outage.
COMMAND_PATIENCE_SECONDS = 60
LONG_STEP_MS = 3200  # over the 3 s lease
DEFAULT_OUTAGE_SECONDS = 2.0  # how long PostgreSQL or Valkey is down per outage fault unless --outage-seconds says


class SoakFleet(chaos.Fleet):
    """bench/chaos.py's supervised workers and beat, plus the web tier and the tool server."""

    def __init__(self, *args, web_port: int, tools_port: int, scratch: Path, **kwargs):
        super().__init__(*args, **kwargs)
        self.web_port, self.tools_port, self.scratch = web_port, tools_port, scratch

    def faults_for(self, name: str) -> str:
        return "" if name in ("web", "tools") else super().faults_for(name)

    def command(self, name: str) -> list[str]:
        if name == "web":
            return [sys.executable, "-m", "uvicorn", "config.asgi:application", "--host", "127.0.0.1", "--port",
                    str(self.web_port), "--log-level", "warning", "--no-access-log"]
        if name == "tools":
            return [sys.executable, str(ROOT / "examples" / "tool_server.py"), "--host", "127.0.0.1", "--port",
                    str(self.tools_port), "--log", str(self.scratch / "tools.calls.jsonl"), "--state",
                    str(self.scratch / "tools.state.jsonl")]
        return super().command(name)


class SoakWatch(chaos.ProgressWatch):
    """bench/chaos.py's progress watch, which also takes on the tasks that arrive during the run."""

    last_poll = 0.0

    def observe(self, rows: list[tuple[str, str, int]], now: float) -> None:
        if self.clock_started is not None:
            for task_id, status, steps in rows:
                if task_id not in self.steps:
                    self.steps[task_id], self.still_since[task_id] = steps, now
                    self.longest[task_id] = (0.0, now, now)
                    if status not in chaos.TERMINAL:
                        self.pending.add(task_id)
                        self.all_terminal.clear()
        super().observe(rows, now)
        self.last_poll = time.monotonic()


class SoakInjector(chaos.FaultInjector):
    """bench/chaos.py's faults and the soak's own."""

    def kill_beat(self) -> str:
        self.fleet.kill("beat")
        return "beat"

    def kill_web(self) -> str:
        self.fleet.kill("web")
        return "web"

    def tool_server_restart(self) -> str:
        self.fleet.kill("tools")
        return "tools"

    def valkey_lost(self) -> str:
        pid = self.valkey._pid()
        if pid is not None:
            os.kill(pid, 9)
        while self.valkey.ping():
            time.sleep(0.05)
        for leftover in ("appendonlydir", "dump.rdb"):  # what a restart would have read the queues back from
            path = self.valkey.dir / leftover
            shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)
        self.outage = (self.clock() + self.outage_seconds["valkey_outage"], "valkey_lost")
        return f"{self.outage_seconds['valkey_outage']}s, queues dropped"

    def duplicate_messages(self) -> str:
        import redis

        client = redis.Redis.from_url(self.valkey.url)
        pushed = 0
        try:
            for key in client.scan_iter(count=1000):
                if client.type(key) == b"list" and not key.startswith(b"_kombu"):
                    items = client.lrange(key, 0, -1)
                    if items:
                        pushed += client.rpush(key, *items) and len(items)
            # Delivered to a worker, not acknowledged yet: kombu keeps them in `unacked` as [message, exchange,
            # routing key]; the same message queued again is a second delivery.
            for raw in client.hvals("unacked"):
                message, _, routing_key = json.loads(raw)
                client.rpush(routing_key or "celery", json.dumps(message))
                pushed += 1
        except redis.RedisError as error:
            return f"failed: {str(error)[:80]}"
        finally:
            client.close()
        return f"{pushed} messages pushed again"


# -------------------------------------------------------------------------------------------------------------
# People: a steering client over the REST API
# -------------------------------------------------------------------------------------------------------------
def ok(status: int) -> bool:
    return 200 <= status < 300


class Person(threading.Thread):
    """Steers the steered tasks through the web tier, as a careful client: reads the snapshot, decides, sends the
    command with the snapshot's stateVersion and a commandId, and retries with the same commandId while the answer is
    not known (connection refused or cut, 5xx, 429)."""

    def __init__(self, base: str, token: str, plans: dict[str, str], rng: random.Random):
        super().__init__(daemon=True, name="person")
        self.base, self.token, self.plans, self.rng = base, token, dict(plans), rng
        self.done: dict[str, str] = {}  # task -> what is left to do ("" when finished)
        self.cancelled: set[str] = set()  # cancel accepted (a task that ended first is not cancelled: completed)
        self.accepted: dict[str, tuple[str, str]] = {}  # commandId -> (task, type)
        self.stale_refused = 0
        self.stale_sent = 0
        self.stale_accepted = 0
        self.gave_up: list[str] = []
        self.retries = 0
        self.unknown_outcomes = 0
        self.stopping = threading.Event()
        self.lock = threading.Lock()
        self.seen: set[str] = set()
        self.threshold = {task_id: rng.uniform(0.1, 0.7) for task_id in plans}

    def request(self, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
        request = urllib.request.Request(f"{self.base}{path}", method=method,
                                         data=json.dumps(body).encode() if body is not None else None)
        request.add_header("Authorization", f"Bearer {self.token}")
        request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, json.loads(response.read() or b"null")
        except urllib.error.HTTPError as error:
            try:
                return error.code, json.loads(error.read() or b"null")
            except (ValueError, OSError):
                return error.code, {}
        except (OSError, ValueError):
            return 0, {}  # refused, cut, timed out: the outcome is unknown

    def snapshot(self, task_id: str) -> dict | None:
        status, body = self.request("GET", f"/runtime/tasks/{task_id}")
        return body if status == 200 else None

    def send(self, task_id: str, command: str, version: int, payload: dict | None = None) -> int:
        """POST the command until its outcome is known; the status it ended with (0: gave up)."""
        command_id = str(uuid.uuid4())
        body = {"type": command, "expectedVersion": version, "payload": payload or {}, "commandId": command_id,
                "reason": "chaos soak"}
        deadline = time.monotonic() + COMMAND_PATIENCE_SECONDS
        first = True
        while time.monotonic() < deadline and not self.stopping.is_set():
            if not first:
                self.retries += 1
            status, _ = self.request("POST", f"/runtime/tasks/{task_id}/steering", body)
            if status == 0:
                self.unknown_outcomes += 1
            first = False
            if 200 <= status < 300:
                self.accepted[command_id] = (task_id, command)
                return status
            if status in (409, 400, 404, 422):
                return status
            time.sleep(0.5)  # 0, 429, 5xx: not known yet; the same commandId again
        self.gave_up.append(f"{task_id} {command}")
        return 0

    def steer(self, task_id: str, plan: str) -> None:
        """Take on one more task (the arrivals hand over the steered ones they create)."""
        with self.lock:
            self.plans[task_id] = plan
            self.threshold[task_id] = self.rng.uniform(0.1, 0.7)  # how far along it is when the person acts

    def run(self) -> None:
        pending: dict[str, str] = {}
        while not self.stopping.wait(0.3):
            with self.lock:
                pending.update({task_id: plan for task_id, plan in self.plans.items() if task_id not in self.seen})
                self.seen.update(pending)
            for task_id in list(pending):
                snapshot = self.snapshot(task_id)
                if snapshot is None:
                    continue
                if self.step(task_id, pending[task_id], snapshot):
                    del pending[task_id]
        self.left = sorted(pending)

    def step(self, task_id: str, plan: str, snapshot: dict) -> bool:
        """One look at a steered task; True once nothing is left to do for it."""
        status, version, wait = snapshot["internalStatus"], snapshot["stateVersion"], snapshot.get("wait") or {}
        if status in chaos.TERMINAL:
            return True
        progress = snapshot["progress"]
        due = progress >= self.threshold[task_id]
        if plan == "answer" and status == "input_required" and wait.get("kind") == "input":
            return ok(self.send(task_id, "provide_input", version, {"waitId": wait["waitId"],
                                                                      "value": {"note": "from the soak"}}))
        if plan == "approve" and status == "input_required" and wait.get("kind") == "approval":
            return ok(self.send(task_id, "approve", version, {"waitId": wait["waitId"]}))
        if plan == "cancel" and due:
            if ok(self.send(task_id, "cancel", version)):
                self.cancelled.add(task_id)
                return True
            return False
        if plan == "adjust" and due:
            self.stale_sent += 1
            stale = self.send(task_id, "adjust_goal", version - 1, {"goal": "stale goal"})
            self.stale_refused += stale == 409
            self.stale_accepted += ok(stale)
            return ok(self.send(task_id, "adjust_goal", version, {"goal": f"adjusted by the soak {task_id}"}))
        if plan == "pause_resume":
            if status == "paused":
                return ok(self.send(task_id, "resume", version))
            if status == "working" and due and task_id not in self.done:
                if ok(self.send(task_id, "pause", version)):
                    self.done[task_id] = "resume"
        return False


class Arrivals(threading.Thread):
    """New work while the faults strike: every `every` seconds, one task of the next kind (demo, steered, mcp_tool,
    agent) created over the REST API with an Idempotency-Key, retried with the same key until the answer is known —
    so a create whose answer a killed web process or a crashed PostgreSQL swallowed is neither lost nor made twice."""

    KINDS = ("demo", "steered", "mcp_tool", "agent")

    def __init__(self, person: Person, model_base: str, size: dict, *, every: float, until: float, origin: float):
        super().__init__(daemon=True, name="arrivals")
        self.person, self.model_base, self.size = person, model_base, size
        self.every, self.until, self.origin = every, until, origin
        self.created: dict[str, list[str]] = {kind: [] for kind in self.KINDS}
        self.keys = 0
        self.retries = 0
        self.gave_up = 0
        self.ended_at: float | None = None  # (time.monotonic())
        self.stopping = threading.Event()

    def create(self, body: dict) -> str | None:
        key = f"soak-create-{uuid.uuid4().hex}"
        self.keys += 1
        deadline = time.monotonic() + COMMAND_PATIENCE_SECONDS
        while time.monotonic() < deadline and not self.stopping.is_set():
            request = urllib.request.Request(f"{self.person.base}/runtime/tasks", method="POST",
                                             data=json.dumps(body).encode())
            request.add_header("Authorization", f"Bearer {self.person.token}")
            request.add_header("Content-Type", "application/json")
            request.add_header("Idempotency-Key", key)
            try:
                with urllib.request.urlopen(request, timeout=10) as response:
                    return json.loads(response.read())["taskId"]
            except urllib.error.HTTPError as error:
                if error.code not in (429, 500, 502, 503, 504):
                    raise SystemExit(f"create refused ({error.code}): {error.read()[:300]!r}") from None
            except (OSError, ValueError):
                pass  # refused, cut, timed out: the same key again
            self.retries += 1
            time.sleep(0.5)
        self.gave_up += 1
        return None

    def run(self) -> None:
        number = 0
        while not self.stopping.wait(self.every) and time.monotonic() - self.origin < self.until:
            kind = self.KINDS[number % len(self.KINDS)]
            body = arrival(kind, number, self.size, self.model_base)
            task_id = self.create(body)
            if task_id is not None:
                self.created[kind].append(task_id)
                if kind == "steered":
                    self.person.steer(task_id, STEERED_KINDS[number // len(self.KINDS) % len(STEERED_KINDS)])
            number += 1
        self.ended_at = time.monotonic()


def arrival(kind: str, number: int, size: dict, model_base: str) -> dict:
    """The create request of one arriving task."""
    if kind == "demo":
        return {"workflow": "demo_steps", "input": {"steps": 40, "sleep_ms": 50}}
    if kind == "steered":
        plan = STEERED_KINDS[number // len(Arrivals.KINDS) % len(STEERED_KINDS)]
        steps = size["steered_steps"]
        extra = {"answer": {"ask_at": steps // 2}, "approve": {"approve_at": steps // 2}}.get(plan, {})
        return {"workflow": "demo_steps", "input": {"steps": steps, "sleep_ms": 80, **extra}}
    if kind == "mcp_tool":
        return {"workflow": "mcp_tool", "input": {"server": TOOL_SERVER, "tool": "upsert",
                                                  "arguments": {"key": f"soak-arrival-{number}", "value": "v"}}}
    key = f"soak-arrival-agent-{number}-{uuid.uuid4().hex[:8]}"
    script(model_base, key, size["agent_turns"])
    return {"workflow": "agent", "input": {"goal": f"Set the soak keys ({key}), then say so.", "servers": [TOOL_SERVER],
                                           "maxTurns": size["agent_turns"]}}


# -------------------------------------------------------------------------------------------------------------
# The run
# -------------------------------------------------------------------------------------------------------------
def start_model(scratch: Path) -> tuple[subprocess.Popen, str]:
    port = chaos.free_port()
    process = subprocess.Popen([sys.executable, str(ROOT / "tests" / "clients" / "scripted_model.py"), "--port",
                                str(port), "--log", str(scratch / "model.requests.jsonl")], cwd=ROOT,
                               stdout=(scratch / "model.out").open("w"), stderr=subprocess.STDOUT,
                               start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            urllib.request.urlopen(f"{base}/v1/models", timeout=2).close()
            return process, base
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the scripted model did not start: {(scratch / 'model.out').read_text()[-2000:]}")
            time.sleep(0.05)


def script(model_base: str, key: str, turns: int) -> None:
    replies = [{"tool_calls": [{"name": f"{TOOL_SERVER}__upsert", "arguments": {"key": f"{key}-{turn}",
                                                                               "value": f"v{turn}"}}]}
               for turn in range(turns - 1)] + [{"content": f"Set the {turns - 1} keys of {key}."}]
    request = urllib.request.Request(f"{model_base}/_scripts", method="POST",
                                     data=json.dumps({"key": key, "replies": replies}).encode())
    request.add_header("Content-Type", "application/json")
    urllib.request.urlopen(request, timeout=10).close()


def wait_until_serving(url: str, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(url, timeout=2).close()
            return
        except urllib.error.HTTPError:
            return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"{url} did not answer in {seconds} s")


FAULT_SHARE = 0.7  # faults during the first 70 % of the run; the rest shows it converges


def sizes(minutes: float) -> dict:
    """The tasks made before the run: two demo tasks and the long one last about as long as the faults do (a task's
    steps run one after another), so the faults keep striking a busy fleet; a few of every other kind. The volume comes
    from the arrivals (--arrive-every)."""
    busy = FAULT_SHARE * minutes * 60
    return {"demo": 2, "demo_steps": max(40, round(busy / 0.1)), "steered": len(STEERED_KINDS) * 2,
            "steered_steps": 30, "mcp_tool": 6, "agent": 3, "agent_turns": 4,
            "long": 1, "long_steps": max(3, round(0.8 * busy / (LONG_STEP_MS / 1000))), "timeouts": 2,
            "timeout_steps": 8}


def setup(env: dict, scratch: Path, tools_url: str, model_base: str, size: dict, rng: random.Random) -> dict:
    """Tenant, tool server and policy, an API token, every task; in this process, before any fault."""
    os.environ.update(env)
    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.db import connections

    from agents_app.models import TenantToolPolicy, ToolServer
    from agents_app.services import tool_server_add
    from tasks_app.services import api_token_create, task_create, tenant_get_or_create

    tenant = tenant_get_or_create(slug=TENANT)
    TenantToolPolicy.objects.update_or_create(tenant=tenant, defaults={"allow": [f"{TOOL_SERVER}.*"],
                                                                       "allowed_hosts": ["127.0.0.1"]})
    server = tool_server_add(tenant_slug=TENANT, name=TOOL_SERVER, url=tools_url, actor="soak", timeout_seconds=10)
    ToolServer.objects.filter(id=server.id).update(max_concurrent_calls=16, rate_per_minute=100_000)
    user = get_user_model().objects.create_user(username="soak-operator", password=None)
    _, token = api_token_create(tenant=tenant, user=user, name="soak")

    def create(workflow: str, input: dict) -> str:
        return str(task_create(tenant=tenant, owner=user, workflow=workflow, input=input).task.id)

    batches: dict[str, list[str]] = {"long": [], "timeouts": [], "demo": [], "steered": [], "mcp_tool": [],
                                     "agent": []}
    plans: dict[str, str] = {}
    # First, as they need the most time: steps longer than the lease (only heartbeats keep it), and effects that land
    # but answer after their timeout (the retry must reconcile them as applied, never call them again).
    for _ in range(size["long"]):
        batches["long"].append(create("demo_steps", {"steps": size["long_steps"], "sleep_ms": LONG_STEP_MS}))
    for _ in range(size["timeouts"]):
        batches["timeouts"].append(create("demo_steps", {
            "steps": size["timeout_steps"], "effect_answer_ms": chaos.EFFECT_ANSWER_MS,
            "effect_timeout_ms": chaos.EFFECT_TIMEOUT_MS}))
    for _ in range(size["demo"]):
        batches["demo"].append(create("demo_steps", {"steps": size["demo_steps"], "sleep_ms": 50}))
    for number in range(size["steered"]):
        plan = STEERED_KINDS[number % len(STEERED_KINDS)]
        steps = size["steered_steps"]
        extra = {"answer": {"ask_at": steps // 2}, "approve": {"approve_at": steps // 2}}.get(plan, {})
        task_id = create("demo_steps", {"steps": steps, "sleep_ms": 80, **extra})
        batches["steered"].append(task_id)
        plans[task_id] = plan
    for number in range(size["mcp_tool"]):
        batches["mcp_tool"].append(create("mcp_tool", {"server": TOOL_SERVER, "tool": "upsert",
                                                       "arguments": {"key": f"soak-tool-{number}", "value": "v"}}))
    for number in range(size["agent"]):
        key = f"soak-agent-{number}-{uuid.uuid4().hex[:8]}"
        script(model_base, key, size["agent_turns"])
        batches["agent"].append(create("agent", {"goal": f"Set the soak keys ({key}), then say so.",
                                                 "servers": [TOOL_SERVER], "maxTurns": size["agent_turns"]}))
    rng.shuffle(batches["demo"])
    connections.close_all()  # PostgreSQL will crash under them
    return {"batches": batches, "plans": plans, "token": token}


def stacks_of_stuck(fleet: SoakFleet, url: str, scratch: Path) -> dict:
    """When tasks are still held by a worker at the end (a slice that stopped progressing while its lease was
    renewed), every worker process's thread stacks (SIGUSR2: config/celery.py), the frames of ours only."""
    with chaos.db_connect(url) as conn:
        held = conn.execute("SELECT count(*) FROM tasks_app_task WHERE lease_owner IS NOT NULL").fetchone()[0]
    if not held:
        return {}
    workers = {name: process for name, process in fleet.processes.items() if name.startswith("worker")}
    sizes = {name: (scratch / f"{name}.log").stat().st_size for name in workers}
    for process in workers.values():
        listed = subprocess.run(["pgrep", "-g", str(process.pid)], capture_output=True, text=True).stdout.split()
        for pid in listed:
            try:
                os.kill(int(pid), signal.SIGUSR2)
            except (ProcessLookupError, ValueError):
                pass
    time.sleep(1.5)
    stacks = {}
    for name in workers:
        with (scratch / f"{name}.log").open(errors="replace") as log:
            log.seek(sizes[name])
            dumped = log.read()
        ours = [line.strip() for line in dumped.splitlines()
                if line.startswith(("Thread ", "Current thread")) or "/tasks_app/" in line or "/agents_app/" in line]
        stacks[name] = "\n".join(ours)[-6000:]
    return {"held_leases": held, **stacks}


def verify(env: dict, scratch: Path, made: dict, person: Person, size: dict) -> dict:
    from django.db import connections

    connections.close_all()
    from tasks_app.models import Step, Task, TaskEvent

    batches = made["batches"]
    status = {str(task_id): value for task_id, value in Task.objects.values_list("id", "status")}
    # Cancelled where the cancel was applied; a cancel that came after the task ended is rejected, and it completed.
    cancels = dict(TaskEvent.objects.filter(type="steering.applied", data__type="cancel")
                   .values_list("task_id", "data__commandId"))
    expected = {task_id: ("cancelled" if task_id in {str(t) for t in cancels} else "completed")
                for ids in batches.values() for task_id in ids}
    wrong = {task_id: status.get(task_id) for task_id, want in expected.items() if status.get(task_id) != want}
    # Demo effects, outside the database: one line per effect applied.
    effects_log = scratch / "external" / "demo_effects.log"
    effect_counts = Counter(effects_log.read_text().split() if effects_log.exists() else [])
    demo_ids = set(batches["demo"]) | set(batches["steered"]) | set(batches["long"]) | set(batches["timeouts"])
    committed = Counter(str(task_id) for task_id in Step.objects.filter(
        task_id__in=demo_ids, status="committed").values_list("task_id", flat=True))
    missing = sum(1 for task_id in demo_ids if status.get(task_id) == "completed"
                  for seq in range(1, committed[task_id] + 1) if f"{task_id}:{seq}:record" not in effect_counts)
    demo_duplicates = sum(n - 1 for n in effect_counts.values() if n > 1)
    # Tool effects, in the tool server's call log: "applied" once per idempotency key.
    applied = Counter()
    calls_log = scratch / "tools.calls.jsonl"
    for line in (calls_log.read_text().splitlines() if calls_log.exists() else []):
        try:
            entry = json.loads(line)
        except ValueError:
            continue  # a line torn by a SIGKILL mid-write
        if entry.get("event") == "applied" and entry.get("tool") == "upsert":
            applied[entry.get("idempotency_key_meta") or entry.get("idempotency_key_header")] += 1
    tool_duplicates = sum(n - 1 for n in applied.values() if n > 1)
    tool_expected = len(batches["mcp_tool"]) + len(batches["agent"]) * (size["agent_turns"] - 1)
    expected_count = sum(len(ids) for ids in batches.values())
    # Commands: exactly one outcome event per accepted command.
    outcomes = Counter(TaskEvent.objects.filter(type__in=["steering.applied", "steering.rejected"],
                                                data__commandId__in=list(person.accepted))
                       .values_list("data__commandId", flat=True))
    lost_commands = [command for command in person.accepted if outcomes[command] == 0]
    doubled_commands = [command for command in person.accepted if outcomes[command] > 1]
    audit = subprocess.run([sys.executable, "manage.py", "verify_events"], cwd=ROOT, env=env, capture_output=True,
                           text=True, timeout=300)
    return {
        "tasks": {name: len(ids) for name, ids in batches.items()},
        "tasks_stored_beyond_those_created": len(status) - expected_count,  # a retried create made twice
        "statuses": dict(Counter(status.get(task_id, "missing") for task_id in expected)),
        "not_as_expected": dict(list(wrong.items())[:10]), "not_as_expected_count": len(wrong),
        "demo_effects": sum(effect_counts.values()), "demo_duplicate_effects": demo_duplicates,
        "demo_missing_effects": missing,
        "tool_effects_applied": sum(applied.values()), "tool_effects_expected": tool_expected,
        "tool_duplicate_effects": tool_duplicates,
        "commands_accepted": len(person.accepted), "commands_by_type": dict(Counter(t for _, t in
                                                                                   person.accepted.values())),
        "commands_lost": len(lost_commands), "commands_applied_twice": len(doubled_commands),
        "command_retries": person.retries, "command_unknown_outcomes": person.unknown_outcomes,
        "commands_given_up": person.gave_up[:10],
        "stale_sent": person.stale_sent, "stale_refused_409": person.stale_refused,
        "stale_accepted": person.stale_accepted,
        "steering_left_undone": getattr(person, "left", []),
        "audit_chains_ok": audit.returncode == 0, "audit_output": audit.stdout.strip()[-300:],
    }


def stall_bound(outage_seconds: float) -> float:
    """The longest a task may go without progress: chaos's bound for a blip of DEFAULT_OUTAGE_SECONDS, plus however
    much longer the outages are (a task waits out the whole outage, then recovers as after a blip)."""
    return chaos.STALL_BOUND_SECONDS + max(0.0, outage_seconds - DEFAULT_OUTAGE_SECONDS)


def run(args) -> dict:
    (ROOT / "var").mkdir(exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="soak-", dir=ROOT / "var"))
    os.chmod(scratch, 0o755)
    rng = random.Random(args.seed)
    pg = EmbeddedPostgres(scratch, chaos.free_port(), "soak")
    valkey = EmbeddedValkey(scratch, chaos.free_port())
    web_port, tools_port = chaos.free_port(), chaos.free_port()
    model = None
    fleet = injector = watch = person = arrivals = None
    size = sizes(args.minutes)
    try:
        model, model_base = start_model(scratch)
        env = dict(os.environ)
        env.update(DATABASE_URL=pg.url, REDIS_URL=valkey.url, EXTERNAL_ROOT=str(scratch / "external"),
                   MEDIA_ROOT=str(scratch / "media"), RUNTIME_LEASE_SECONDS=str(chaos.LEASE_SECONDS),
                   RUNTIME_HEARTBEAT_SECONDS=str(chaos.HEARTBEAT_SECONDS),
                   RUNTIME_REAPER_INTERVAL_SECONDS=str(chaos.REAPER_INTERVAL_SECONDS),
                   RUNTIME_REDISPATCH_AFTER_SECONDS="5", RUNTIME_MAX_RECOVERIES="50", RUNTIME_SLICE_SECONDS="0.5",
                   DB_CONN_MAX_AGE="0", LOG_LEVEL="WARNING", RUNTIME_MODEL__BASE_URL=f"{model_base}/v1",
                   RUNTIME_MODEL__NAME=MODEL_NAME, DJANGO_SETTINGS_MODULE="config.settings",
                   SECRET_KEY=os.environ.get("SECRET_KEY", "soak-" + uuid.uuid4().hex),
                   ALLOWED_HOSTS="127.0.0.1,localhost")
        pg.start()
        pg.ensure_database()
        valkey.start()
        subprocess.run([sys.executable, "manage.py", "migrate", "-v", "0"], cwd=ROOT, env=env, check=True)
        fleet = SoakFleet(env, scratch, random.Random(args.seed), size["demo_steps"], [], web_port=web_port,
                          tools_port=tools_port, scratch=scratch)
        fleet.start("tools")
        wait_until_serving(f"http://127.0.0.1:{tools_port}/mcp")
        made = setup(env, scratch, f"http://127.0.0.1:{tools_port}/mcp", model_base, size, rng)
        all_ids = [task_id for ids in made["batches"].values() for task_id in ids]
        fleet.short_step_task_ids = made["batches"]["demo"]  # (where an armed lease-renewal kill may strike)
        origin = time.monotonic()
        for name in ("web", "worker1", "worker2", "beat"):
            fleet.start(name)
        wait_until_serving(f"http://127.0.0.1:{web_port}/readyz")
        watch = SoakWatch(pg.url, all_ids, origin)
        watch.start()
        person = Person(f"http://127.0.0.1:{web_port}", made["token"], made["plans"], random.Random(f"{args.seed}:p"))
        person.start()
        seconds = args.minutes * 60
        arrivals = Arrivals(person, model_base, size, every=args.arrive_every, until=FAULT_SHARE * seconds,
                            origin=origin)
        arrivals.start()
        injector = SoakInjector(args.faults, random.Random(f"{args.seed}:faults"), fleet, pg, valkey,
                                {"postgres_outage": args.outage_seconds, "valkey_outage": args.outage_seconds},
                                # Faults 5–6 s apart (a lease, a reaper pass, a second), not a long step apart as in
                                # bench/chaos.py: every kind fits in a 2-minute run. A stall may then be two faults'
                                # doing, so the bound is reported, and enforced only with --stall-check.
                                made["batches"]["long"], 1.0, origin, until=FAULT_SHARE * seconds)
        # Faults and arrivals end within the bound; then the run ends when every task is terminal — at most
        # --drain-seconds past the bound (a loaded machine, or faults that stacked late, may leave a few tasks
        # still running at the bound: slow, not wrong; still running after the drain is a failure).
        while injector.clock() < seconds + args.drain_seconds and not (
                watch.all_terminal.is_set() and arrivals.ended_at is not None and watch.last_poll > arrivals.ended_at):
            injector.tick(fleet_working=watch.clock_started is not None)
            fleet.keep_alive()
            time.sleep(chaos.POLL_SECONDS)
        elapsed = injector.clock()
        injector.end_outage(now=True)
        watch.finish()
        arrivals.stopping.set()
        arrivals.join(timeout=15)
        for kind, ids in arrivals.created.items():
            made["batches"][kind] += ids
        person.stopping.set()
        person.join(timeout=15)
        stuck_stacks = stacks_of_stuck(fleet, pg.url, scratch)
        fleet.stop()
        result = {"seconds": round(elapsed, 1), "seed": args.seed,
                  "drained_past_bound_seconds": round(max(0.0, elapsed - seconds), 1),
                  **verify(env, scratch, made, person, size)}
        if stuck_stacks:
            result["stuck_stacks"] = stuck_stacks
        result.update({"arrivals": {kind: len(ids) for kind, ids in arrivals.created.items()},
                       "create_retries": arrivals.retries, "creates_given_up": arrivals.gave_up})
        # A steered task waits for its person (a pause, a question) by design; a long step holds no progress for its
        # own length: the first is not bounded, the second is measured beyond its step.
        steered, long_ids = set(made["batches"]["steered"]), set(made["batches"]["long"])
        stalls = {task_id: ((seconds - LONG_STEP_MS / 1000, start, end) if task_id in long_ids else
                            (seconds, start, end))
                  for task_id, (seconds, start, end) in watch.longest.items() if task_id not in steered}
        worst = max(stalls.items(), key=lambda item: item[1][0], default=(None, (0.0, 0.0, 0.0)))
        timeline = sorted(injector.timeline + fleet.armed_kills(time.time() - injector.clock())
                          + [(round(at - injector.origin, 1), what) for at, what in fleet.own_exits])
        result.update({
            "faults": dict(injector.counts), "process_restarts": dict(fleet.restarts),
            "armed_fault_points": dict(fleet.armed), "terminated_db_connections": injector.terminated_connections,
            "longest_stall_seconds": round(worst[1][0], 1), "longest_stall_task": worst[0],
            "longest_stall_window": [round(worst[1][1], 1), round(worst[1][2], 1)],
            "stall_bound_seconds": stall_bound(args.outage_seconds),
            "fault_timeline": [f"{at} {what}" for at, what in timeline],
        })
        result["stall_ok"] = result["longest_stall_seconds"] <= result["stall_bound_seconds"]
        result["ok"] = (result["not_as_expected_count"] == 0 and result["tasks_stored_beyond_those_created"] == 0
                        and result["creates_given_up"] == 0 and result["demo_duplicate_effects"] == 0
                        and result["demo_missing_effects"] == 0 and result["tool_duplicate_effects"] == 0
                        and result["tool_effects_applied"] == result["tool_effects_expected"]
                        and result["commands_lost"] == 0 and result["commands_applied_twice"] == 0
                        and result["stale_accepted"] == 0 and not result["commands_given_up"]
                        and result["audit_chains_ok"] and (result["stall_ok"] or not args.stall_check))
        return result
    finally:
        for thread in (person, arrivals):
            if thread is not None:
                thread.stopping.set()
        if fleet is not None:
            fleet.stop()
        if watch is not None:
            watch.stopping.set()
        if model is not None:
            model.kill()
        valkey.stop()
        pg.stop()
        if os.environ.get("CHAOS_KEEP") != "1":
            shutil.rmtree(scratch, ignore_errors=True)


def fault_list(text: str) -> list[str]:
    kinds = [kind.strip() for kind in text.split(",") if kind.strip()]
    unknown = sorted(set(kinds) - set(SOAK_FAULTS))
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown fault {', '.join(unknown)}; known: {', '.join(SOAK_FAULTS)}")
    return kinds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=2.0, help="the run's bound (faults: its first 70 %%)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--faults", type=fault_list, default=list(SOAK_FAULTS),
                        help=f"comma-separated, from {','.join(SOAK_FAULTS)} (default all)")
    parser.add_argument("--arrive-every", type=float, default=1.0,
                        help="seconds between two tasks created over the API while the faults strike")
    parser.add_argument("--outage-seconds", type=float, default=DEFAULT_OUTAGE_SECONDS,
                        help="how long PostgreSQL or Valkey is down (the stall bound grows by as much beyond 2 s)")
    parser.add_argument("--drain-seconds", type=float, default=60.0,
                        help="after the bound, how long the tasks still running may take to finish")
    parser.add_argument("--stall-check", action="store_true",
                        help="fail the run when a task went longer than the bound without progress")
    args = parser.parse_args()
    result = run(args)
    print(json.dumps(result))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
