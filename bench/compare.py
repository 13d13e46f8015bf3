"""This runtime, a plain Celery chain (the floor) and DBOS Transact 3.4 side by side, in one run, on one PostgreSQL
and one Valkey.

    python3.11 deploy/dev.py bench --compare [--repeat 3] [--systems runtime,chain,dbos] [--tasks 200] [--steps 20]
                                             [--idle-seconds 60] [--workloads w2,w4,w1,w1big,w3,w3one]

The services are bench/engine.py's: an embedded PostgreSQL 18 (fsync and synchronous_commit on,
pg_stat_statements with track = all) and an embedded Valkey, in a scratch folder under var/, removed afterwards.
DBOS runs in its own virtualenv (var/venv-dbos, made here from bench/peers/requirements-dbos.txt the first time or
when the pins change) from bench/peers/dbos_app.py. Each system gets 2 worker processes × 4 steps in flight:
Celery prefork for the runtime and the chain (no gossip, mingle or heartbeat); two DBOS processes with executor
ids w1 and w2, `worker_concurrency` 4, the queue polled every 0.05 s. The runtime also runs beat (its reaper), as
a deployment does, and its CPU counts among the workers'.

For each repeat, the systems in turn (interleaved: runtime, chain, dbos, runtime, …), each from an identical reset
— its database dropped and made again (the runtime's from a migrated template, DBOS's by its own migrations on
launch), its broker database flushed — then a warm-up of 10 tasks, then the workloads:

- w2: 20 tasks one after another (closed loop): create → first step, per-step time (latency ÷ steps);
- w1: `tasks` × `steps` created at once: steps/s (first create → last completion), p50/p95/p99 create → complete,
  and per step: statements, commits, WAL, tuples written, Valkey commands, CPU by process group, new connections;
- w1big: w1 with 32 KB of fresh random text as each step's state (the runtime: demo_steps' payload; the chain: each
  link's message; DBOS: each step's recorded output);
- w4: `idle-seconds` with the workers (and the runtime's beat) up and no task: statements, commits, WAL, Valkey
  commands and CPU per second;
- wa: `--wa-agents` agents of `--wa-turns` turns created at once, against the scripted model (tests/clients/
  scripted_model.py, answering at once) and the example MCP tool server (examples/tool_server.py), both started once
  for the run: every turn but the last is one model answer asking for one tool call (bench.upsert, a key of its own),
  the last a plain answer. The runtime: its `agent` workflow (the gateway, the ledger, the transcript); the chain
  and DBOS: the loop a hand-rolled agent would be (bench/peers/agent_turn.py: the openai and mcp SDKs, a chain link
  or a DBOS model step and tool step per turn). Figures: turns/s, p50/p95 create → complete, per turn statements,
  commits, WAL, CPU; lost agents, tool effects applied twice (the tool server's log), turns the model was asked
  twice (the model's log);
- w3: w1 with 50 ms steps; every worker SIGKILLed (its whole process group) once 40 % of the steps are done, new
  ones started 2 s later (DBOS's with the same executor ids, which its recovery needs; the runtime's and the chain's
  with new names). Figures: for the tasks in flight at the kill (leased; PENDING; a chain started and not done),
  the time from the new workers being ready to each one's next step (max and p50) — the failover — and from the
  kill; kill → all complete; lost tasks (not complete 120 s after the restart); duplicate effects.

Timestamps: each system's own (the runtime's and DBOS's tables, the database's clock; the chain's Redis hash and
effects file, this host's clock, which the database shares). Effects: one line per step run in an effects file
(the runtime: its ledger's effect log), duplicates being lines beyond one per task and step. The table prints
median [min–max] over the repeats and the ratios of the runtime to each peer; the last line is the JSON of every
run, also written to var/bench-results/. Figures and the machine: docs/performance.md, "Side by side".
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "deploy"))

from bench.engine import (  # noqa: E402
    BENCH_DB,
    FLOOR_BROKER_DB,
    RUNTIME_BROKER_DB,
    FloorDriver,
    RuntimeDriver,
    Services,
    django_env,
    groups_kill,
    groups_stop,
    pct,
)
from bench.peers import agent_turn  # noqa: E402
from bench.stats import Counters, Meter, process_tree_cpu_s  # noqa: E402

DBOS_DB = "bench_dbos"
TEMPLATE_DB = "bench_template"
CHAIN_DB = "bench_chain"  # empty: the chain writes nothing to PostgreSQL, and its meter must see exactly that
DBOS_VENV = ROOT / "var" / "venv-dbos"
DBOS_REQUIREMENTS = ROOT / "bench" / "peers" / "requirements-dbos.txt"
DBOS_APP = ROOT / "bench" / "peers" / "dbos_app.py"
WARM_UP_TASKS = 10
W2_TASKS = 20
BIG_PAYLOAD = 32 * 1024
CRASH_AT = 0.4
CRASH_SLEEP_MS = 50
RESTART_AFTER_S = 2.0
LOST_AFTER_S = 120.0
STALL_S = 40.0
WORKLOADS = ("w2", "w4", "w1", "w1big", "wa", "w3", "w3one")  # W4 before W1: its idle rates correct W1's late counters
AGENT_WARM_UP = 16  # agents of 2 turns before WA's window: each worker process imports the SDKs and connects first


def ensure_dbos_venv() -> Path:
    """var/venv-dbos with exactly the pinned DBOS, (re)made when the pins changed: never the project's venv, whose
    SQLAlchemy-free pins DBOS's own would fight."""
    python = DBOS_VENV / "bin" / "python"
    pins = hashlib.sha256(DBOS_REQUIREMENTS.read_bytes()).hexdigest()
    marker = DBOS_VENV / "installed-pins.sha256"
    if python.exists() and marker.exists() and marker.read_text() == pins:
        return python
    print(f"[compare] installing DBOS into {DBOS_VENV} (bench/peers/requirements-dbos.txt)", file=sys.stderr,
          flush=True)
    base = getattr(sys, "_base_executable", sys.executable)  # a venv's python makes a venv of the base one
    subprocess.run([base, "-m", "venv", "--clear", str(DBOS_VENV)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "--disable-pip-version-check", "-qq", "-r",
                    str(DBOS_REQUIREMENTS)], check=True)
    marker.write_text(pins)
    return python


def recreate_database(services: Services, name: str, template: str | None = None) -> None:
    import psycopg

    with psycopg.connect(services.admin_url("postgres"), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')  # names are this module's constants
        if template:  # FILE_COPY: a checkpoint, not the template's every page through the WAL the meter reads
            conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}" STRATEGY FILE_COPY')


def kill_one(processes: list[subprocess.Popen]) -> None:
    """SIGKILL the first worker's whole process group (a host's OOM kill of one worker) and forget it."""
    process = processes.pop(0)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def effects_in(path: Path, created: dict) -> list[tuple[str, int, float]]:
    """(task, step index, epoch s) of each line "<task>:<index> <epoch s>" of an effects file, for the tasks in
    `created` (the chain's and DBOS's steps write such lines)."""
    rows = []
    for line in path.read_text().splitlines():
        effect, _, at = line.rpartition(" ")
        task, _, index = effect.rpartition(":")
        if task in created:
            rows.append((task, int(index), float(at)))
    return rows


def cpu_of(pids: list[int]) -> float:
    import psutil

    total = 0.0
    for pid in pids:
        try:
            total += process_tree_cpu_s(psutil.Process(pid), reaped=False)
        except psutil.Error:
            continue
    return total


# -------------------------------------------------------------------------------------------------------------
# The three systems behind one interface
# -------------------------------------------------------------------------------------------------------------
class Runtime(RuntimeDriver):
    """This runtime: demo_steps tasks (one ledger effect per step) created through the service the API uses."""

    name = "runtime"

    def __init__(self, services: Services, env: dict, workers: int, concurrency: int):
        self.services, self.env = services, env
        super().__init__(services, env, workers, concurrency)
        self.beat: subprocess.Popen | None = None
        self.driver_pids: list[int] = []

    def reset(self) -> None:
        from django.db import connections

        connections.close_all()
        self.observer.close()
        recreate_database(self.services, BENCH_DB, TEMPLATE_DB)
        import psycopg

        self.observer = psycopg.connect(self.services.meter_url(BENCH_DB), autocommit=True)
        self.fleet.broker.flushdb()
        from tasks_app.services import tenant_get_or_create

        self.tenant = tenant_get_or_create(slug="bench")
        (Path(self.env["EXTERNAL_ROOT"]) / "demo_effects.log").unlink(missing_ok=True)
        if self.env.get("AGENT_TOOL_URL"):  # WA: the tenant's tool server and a policy letting its agents call it
            from agents_app.models import TenantToolPolicy, ToolServer
            from agents_app.services import tool_server_add

            TenantToolPolicy.objects.update_or_create(tenant=self.tenant, defaults={
                "allow": [f"{agent_turn.SERVER}.*"], "allowed_hosts": ["127.0.0.1"]})
            server = tool_server_add(tenant_slug="bench", name=agent_turn.SERVER, url=self.env["AGENT_TOOL_URL"],
                                     actor="bench", timeout_seconds=30)
            ToolServer.objects.filter(id=server.id).update(max_concurrent_calls=100, rate_per_minute=10_000)

    def start(self) -> None:
        log = (self.services.scratch / "runtime-beat.log").open("a")
        self.beat = subprocess.Popen([sys.executable, "-m", "celery", "-A", "config", "beat", "--loglevel", "WARNING",
                                      "--pidfile="], cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        self.fleet.start()

    def restart_workers(self) -> None:
        self.fleet.start()

    def kill_one(self) -> None:
        kill_one(self.fleet.processes)

    def stop(self) -> None:
        self.fleet.stop()
        if self.beat is not None:
            os.killpg(self.beat.pid, signal.SIGTERM)
            self.beat.wait(timeout=20)
            self.beat = None

    @property
    def pids(self) -> list[int]:
        return self.fleet.pids + ([self.beat.pid] if self.beat else [])

    def create(self, n: int, steps: int, *, payload_bytes: int = 0, sleep_ms: int = 0) -> list:
        self.workflow_input = {key: value for key, value in (("payload_bytes", payload_bytes), ("sleep_ms", sleep_ms),
                                                              ("payload_fresh", bool(payload_bytes))) if value}
        return super().create(n, steps)

    def create_agents(self, keys: list[str], turns: int) -> list:
        from tasks_app.services import task_create

        return [task_create(tenant=self.tenant, owner=None, workflow="agent",
                            input={"goal": agent_turn.goal(key), "servers": [agent_turn.SERVER],
                                   "maxTurns": turns}).task.id for key in keys]

    def in_flight(self, ids: list) -> list:
        return [row[0] for row in self.observer.execute(
            "SELECT id FROM tasks_app_task WHERE id = ANY(%s) AND lease_owner IS NOT NULL AND NOT status = ANY(%s)",
            [ids, self.TERMINAL]).fetchall()]

    def resumed_after(self, ids: list, since: float) -> dict:
        """{task: epoch s of its first step committed, or its completion, after `since`}."""
        return {str(task): at for task, at in self.observer.execute(
            "SELECT t.id, extract(epoch FROM least(min(s.finished_at), "
            "       CASE WHEN t.completed_at > to_timestamp(%(since)s) THEN t.completed_at END))::float8 "
            "  FROM tasks_app_task t LEFT JOIN tasks_app_step s "
            "    ON s.task_id = t.id AND s.finished_at > to_timestamp(%(since)s) "
            " WHERE t.id = ANY(%(ids)s) GROUP BY t.id, t.completed_at", {"ids": ids, "since": since}).fetchall()
            if at is not None}


class Chain(FloorDriver):
    """The floor: a chain of plain Celery tasks (bench/floor.py), early ack, no result backend, no durability."""

    def __init__(self, services: Services, env: dict, workers: int, concurrency: int):
        super().__init__(services, env, workers, concurrency)
        self.driver_pids: list[int] = []

    def reset(self) -> None:
        self.fleet.broker.flushdb()
        self.floor.reset()

    def start(self) -> None:
        self.fleet.start()

    restart_workers = start

    def kill_one(self) -> None:
        kill_one(self.fleet.processes)

    def stop(self) -> None:
        self.fleet.stop()

    @property
    def pids(self) -> list[int]:
        return self.fleet.pids

    def create(self, n: int, steps: int, *, payload_bytes: int = 0, sleep_ms: int = 0) -> dict:
        started = time.perf_counter()
        created = self.floor.create(n, steps, payload_bytes=payload_bytes, sleep_ms=sleep_ms)
        self.create_ms.append((time.perf_counter() - started) * 1000 / n)
        return created

    def create_agents(self, keys: list[str], turns: int) -> dict:
        return self.floor.create_agents(keys, turns)

    def _effects(self, created: dict) -> list[tuple[str, int, float]]:
        return effects_in(self.floor.effects_path(), created)

    def done_fraction(self, created: dict, steps: int) -> float:
        return len({(task, index) for task, index, _ in self._effects(created)}) / (len(created) * steps)

    def in_flight(self, created: dict) -> list:
        started = {task for task, _, _ in self._effects(created)}
        done = self.floor.done_store().hmget(self.floor.DONE_KEY, list(started)) if started else []
        return [task for task, finished in zip(started, done) if finished is None]

    def resumed_after(self, created: dict, since: float) -> dict:
        """{task: epoch s of its first step run after `since`} (a chain's last link is its completion)."""
        first: dict = {}
        for task, _, at in self._effects(created):
            if at > since:
                first[task] = min(at, first.get(task, at))
        return first


class Dbos:
    """DBOS Transact 3.4 in its own virtualenv: 2 worker processes (executor ids w1, w2) and a client process that
    enqueues through DBOSClient; timings from its workflow_status table and the effects file."""

    name = "dbos"
    uses_postgres = True
    TERMINAL = ("SUCCESS", "ERROR", "CANCELLED", "MAX_RECOVERY_ATTEMPTS_EXCEEDED")

    def __init__(self, services: Services, python: Path, workers: int, concurrency: int, poll: float):
        self.services, self.python, self.workers, self.concurrency, self.poll = (
            services, python, workers, concurrency, poll)
        self.url = f"postgresql://postgres@127.0.0.1:{services.pg.port}/{DBOS_DB}"
        self.effects = services.scratch / "dbos-effects.log"
        self.processes: list[subprocess.Popen] = []
        self.client: subprocess.Popen | None = None
        self.observer = None
        self.create_ms: list[float] = []
        self.fleet = self  # (bench.engine's phases read driver.fleet.pids)

    def env(self, **extra) -> dict:
        return {"PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", "/tmp"), "DBOS_URL": self.url,
                "EFFECTS": str(self.effects), "PYTHONUNBUFFERED": "1",
                **{name: os.environ[name] for name in ("AGENT_MODEL_URL", "AGENT_TOOL_URL") if name in os.environ},
                **extra}

    def reset(self) -> None:
        if self.observer is not None:
            self.observer.close()
            self.observer = None
        recreate_database(self.services, DBOS_DB)  # DBOS makes it again, with its schema, on launch
        self.effects.write_text("")

    def restart_workers(self, *, one_by_one: bool = False) -> None:
        """Start the workers, w1 … wN (a restart: the same executor ids, which DBOS's recovery needs), all at once;
        `one_by_one` for the first start, whose first launch creates the database and runs DBOS's migrations."""
        started = []
        for n in range(1, self.workers + 1):
            ready = self.services.scratch / f"dbos-w{n}.ready"
            ready.unlink(missing_ok=True)
            log = (self.services.scratch / f"dbos-worker{n}.log").open("a")
            process = subprocess.Popen(
                [str(self.python), str(DBOS_APP), "worker"], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                env=self.env(EXECUTOR_ID=f"w{n}", CONCURRENCY=str(self.concurrency), POLL=str(self.poll),
                             READY_FILE=str(ready)), start_new_session=True)
            self.processes.append(process)
            started.append((process, ready, log.name))
            if one_by_one or n == self.workers:
                deadline = time.monotonic() + 60
                for process, ready, log_name in started:
                    while not ready.exists():
                        if process.poll() is not None or time.monotonic() > deadline:
                            raise SystemExit(f"a DBOS worker did not start; see {log_name}")
                        time.sleep(0.02)
                started = []

    def kill_one(self) -> None:
        kill_one(self.processes)

    def start(self) -> None:
        import psycopg

        self.restart_workers(one_by_one=True)
        self.observer = psycopg.connect(self.services.meter_url(DBOS_DB), autocommit=True)
        self.client = subprocess.Popen([str(self.python), str(DBOS_APP), "client"], cwd=ROOT, env=self.env(),
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                       start_new_session=True)

    def kill(self) -> None:
        groups_kill(self.processes)
        self.processes = []

    def stop(self) -> None:
        if self.client is not None:
            self.client.stdin.write('{"op": "quit"}\n')
            self.client.stdin.flush()
            self.client.wait(timeout=20)
            self.client = None
        groups_stop(self.processes)
        self.processes = []

    @property
    def pids(self) -> list[int]:
        return [process.pid for process in self.processes]

    @property
    def driver_pids(self) -> list[int]:
        return [self.client.pid] if self.client else []

    def create(self, n: int, steps: int, *, payload_bytes: int = 0, sleep_ms: int = 0) -> dict:
        started = time.perf_counter()
        self.client.stdin.write(json.dumps({"op": "enqueue", "n": n, "steps": steps, "payload_bytes": payload_bytes,
                                            "sleep_ms": sleep_ms}) + "\n")
        self.client.stdin.flush()
        answer = json.loads(self.client.stdout.readline())
        self.create_ms.append((time.perf_counter() - started) * 1000 / n)
        return dict(zip(answer["ids"], answer["created"]))

    def create_agents(self, keys: list[str], turns: int) -> dict:
        self.client.stdin.write(json.dumps({"op": "enqueue_agents", "keys": keys, "turns": turns}) + "\n")
        self.client.stdin.flush()
        answer = json.loads(self.client.stdout.readline())
        return dict(zip(answer["ids"], answer["created"]))

    def _unfinished(self, created: dict) -> int:
        return self.observer.execute("SELECT count(*) FROM dbos.workflow_status WHERE workflow_uuid = ANY(%s) "
                                     "AND NOT status = ANY(%s)", [list(created), list(self.TERMINAL)]).fetchone()[0]

    def wait(self, created: dict, timeout: float = 900) -> None:
        deadline = time.monotonic() + timeout
        while self._unfinished(created):
            if time.monotonic() > deadline:
                raise SystemExit("DBOS workflows did not finish in time")
            time.sleep(0.1)

    def _effects(self, created: dict) -> list[tuple[str, int, float]]:
        return effects_in(self.effects, created)

    done_fraction = Chain.done_fraction

    def resumed_after(self, created: dict, since: float) -> dict:
        """{workflow: epoch s of its first step run, or its completion, after `since`}."""
        first = Chain.resumed_after(self, created, since)
        for workflow, completed in self.observer.execute(
                "SELECT workflow_uuid, completed_at FROM dbos.workflow_status WHERE workflow_uuid = ANY(%s) "
                "AND completed_at > %s", [list(created), since * 1000]).fetchall():
            first[workflow] = min(completed / 1000, first.get(workflow, completed / 1000))
        return first

    def in_flight(self, created: dict) -> list:
        return [row[0] for row in self.observer.execute(
            "SELECT workflow_uuid FROM dbos.workflow_status WHERE workflow_uuid = ANY(%s) AND status = 'PENDING'",
            [list(created)]).fetchall()]

    def timings(self, created: dict) -> dict:
        rows = self.observer.execute(
            "SELECT workflow_uuid, status, created_at, completed_at FROM dbos.workflow_status "
            "WHERE workflow_uuid = ANY(%s)", [list(created)]).fetchall()
        done = [row for row in rows if row[1] == "SUCCESS" and row[3] is not None]
        effects = self._effects(created)
        first: dict = {}
        for task, index, at in effects:
            if index == 0:
                first[task] = min(at, first.get(task, at))
        return {"completed": len(done), "lost": len(created) - len(done),
                "first_created": min(row[2] for row in rows) / 1000,
                "last_completed": max((row[3] for row in done), default=0) / 1000,
                "latencies_ms": sorted(float(row[3] - row[2]) for row in done),
                "first_step_ms": sorted((at - created[task]) * 1000 for task, at in first.items()),
                "duplicate_effects": len(effects) - len({(task, index) for task, index, _ in effects})}


# -------------------------------------------------------------------------------------------------------------
# Workloads
# -------------------------------------------------------------------------------------------------------------
class Window:
    """Counters around a phase: the system's database (statements, commits, WAL, tuples), CPU by process group (its
    workers, the PostgreSQL server with exited backends, Valkey, the driver: this process and any client process of
    the system), Valkey commands.

    A backend's commits, tuples and sessions reach the shared counters up to 10 s after it went idle (bench/stats.py),
    so a system that writes to PostgreSQL is settled before the first snapshot and again after the phase. Everything
    exact at once (statements, WAL, CPU, Valkey) is read the moment the phase ends; with `idle` (the system's W4 rates)
    the late counters are read after the settle, less what the idle system did meanwhile — DBOS polls its queue ~20
    times a second, which would otherwise add ~0.4 commits to each of 4,000 steps. Without `idle` (W4 itself) the
    whole window, settle included, is counted."""

    LATE = ("commits", "tuples_written", "new_connections")

    def __init__(self, meter: Meter, system, *, idle: dict | None = None):
        self.meter, self.system, self.idle = meter, system, idle
        self.settle = system.uses_postgres

    def __enter__(self):
        self.meter.worker_pids = self.system.pids
        if self.settle:
            self.meter.settle()
        self.before, self.before_client = self.meter.snapshot(), cpu_of(self.system.driver_pids)
        return self

    def __exit__(self, *exc):
        if exc[0] is not None:
            return
        self.meter.worker_pids = self.system.pids
        end, client = self.meter.snapshot(), cpu_of(self.system.driver_pids)
        if self.settle:
            self.meter.settle()
            late = self.meter.snapshot()
            if self.idle is None:
                end, client = late, cpu_of(self.system.driver_pids)
        self.cost: Counters = end - self.before
        self.cost.cpu_driver_s += client - self.before_client
        if self.settle and self.idle is not None:
            for name in self.LATE:
                idle = self.idle.get(name, 0) * (late.wall_s - end.wall_s)
                setattr(self.cost, name, getattr(late, name) - getattr(self.before, name) - idle)


def w2(system, steps: int) -> dict:
    latencies, first_steps = [], []
    for _ in range(W2_TASKS):
        handle = system.create(1, steps)
        system.wait(handle, timeout=60)
        t = system.timings(handle)
        latencies += t["latencies_ms"]
        first_steps += t["first_step_ms"]
    return {"create_to_first_step_ms_p50": round(statistics.median(first_steps), 1),
            "per_step_ms": round(statistics.median(latencies) / steps, 2),
            "p95_ms": round(pct(latencies, 0.95), 1)}


def w1(system, meter: Meter, tasks: int, steps: int, payload_bytes: int = 0, idle: dict | None = None) -> dict:
    with Window(meter, system, idle=idle) as window:
        handle = system.create(tasks, steps, payload_bytes=payload_bytes)
        system.wait(handle, timeout=900)
    t = system.timings(handle)
    elapsed = t["last_completed"] - t["first_created"]
    return {"steps_per_s": round(t["completed"] * steps / elapsed, 1), "elapsed_s": round(elapsed, 2),
            "p50_ms": round(pct(t["latencies_ms"], 0.5)), "p95_ms": round(pct(t["latencies_ms"], 0.95)),
            "p99_ms": round(pct(t["latencies_ms"], 0.99)), "lost": t["lost"],
            "duplicate_effects": t["duplicate_effects"], "per_step": window.cost.per(tasks * steps)}


def w4(system, meter: Meter, seconds: float) -> dict:
    """Idle: the rates per second, and which statements make them (pg_stat_statements is reset first: no window of
    another phase is open, so nothing else loses its counts)."""
    meter.reset()
    started = time.monotonic()
    with Window(meter, system) as window:
        time.sleep(seconds)
    elapsed = time.monotonic() - started
    return {"per_s": window.cost.per(window.cost.wall_s),
            "statements_per_s": [[round(calls / elapsed, 3), " ".join(query.split())[:140]]
                                 for calls, toplevel, _, _, query in meter.top_statements(12) if toplevel]}


class Agents:
    """WA's two called servers, started once for the run: the scripted model and the example tool server."""

    def __init__(self, scratch: Path):
        from bench.agent_turns import model_base_url, start_model
        from bench.tool_calls import Remote

        self.model_log = scratch / "model.requests.jsonl"
        self.tool_log = scratch / "tool-server.calls.jsonl"
        self.model = start_model(scratch)
        self.model_url = model_base_url(self.model)
        self.tool_server = Remote("tool-server", [sys.executable, str(ROOT / "examples" / "tool_server.py"), "--log",
                                                  str(self.tool_log)], scratch, "/mcp")

    def env(self) -> dict:
        return {"AGENT_MODEL_URL": self.model_url, "AGENT_TOOL_URL": self.tool_server.url,
                "RUNTIME_MODEL__BASE_URL": self.model_url, "RUNTIME_MODEL__NAME": agent_turn.MODEL_NAME}

    def script(self, count: int, turns: int) -> list[str]:
        """`count` conversations of `turns` turns: each turn but the last asks for one upsert of a key of its own."""
        import urllib.request

        keys = [f"wa-{os.urandom(6).hex()}" for _ in range(count)]
        for key in keys:
            replies = [{"tool_calls": [{"name": f"{agent_turn.SERVER}__upsert",
                                        "arguments": {"key": f"{key}-{turn}", "value": f"v{turn}"}}],
                        "usage": {"prompt_tokens": 400 + 150 * turn, "completion_tokens": 30}}
                       for turn in range(turns - 1)]
            replies.append({"content": "Done: every key is set.",
                            "usage": {"prompt_tokens": 400, "completion_tokens": 10}})
            request = urllib.request.Request(self.model_url.removesuffix("/v1") + "/_scripts", method="POST",
                                             data=json.dumps({"key": key, "replies": replies}).encode(),
                                             headers={"Content-Type": "application/json"})
            urllib.request.urlopen(request, timeout=10).close()
        return keys

    @staticmethod
    def _lines(path: Path, since: int) -> list[dict]:
        if not path.exists():
            return []
        with path.open("rb") as log:
            log.seek(since)
            return [json.loads(line) for line in log.read().splitlines() if line.strip()]

    def marks(self) -> tuple[int, int]:
        return tuple(path.stat().st_size if path.exists() else 0 for path in (self.model_log, self.tool_log))

    def checks(self, since: tuple[int, int], keys: list[str], turns: int) -> dict:
        """From the servers' own logs: turns the model was asked more than once (or not at all), errors it answered,
        and tool effects applied more than once (an upsert's key applied twice) or missing."""
        wanted = set(keys)
        asked = [entry for entry in self._lines(self.model_log, since[0]) if entry.get("conversation") in wanted]
        counts: dict = {}
        for entry in asked:
            counts[(entry["conversation"], entry["turn"])] = counts.get((entry["conversation"], entry["turn"]), 0) + 1
        applied: dict = {}
        for entry in self._lines(self.tool_log, since[1]):
            key = (entry.get("arguments") or {}).get("key", "")
            if entry.get("event") == "applied" and key.rsplit("-", 1)[0] in wanted:
                applied[key] = applied.get(key, 0) + 1
        return {"turns_asked_twice": sum(1 for n in counts.values() if n > 1),
                "turns_not_asked": len(keys) * turns - len(counts),
                "model_errors": sum(1 for entry in asked if entry.get("status") != 200),
                "tool_effects_applied_twice": sum(1 for n in applied.values() if n > 1),
                "tool_effects_missing": len(keys) * (turns - 1) - len(applied)}

    def stop(self) -> None:
        self.model.stop()
        self.tool_server.stop()


def wa(system, meter: Meter, agents: Agents, count: int, turns: int, idle: dict | None = None) -> dict:
    system.wait(system.create_agents(agents.script(AGENT_WARM_UP, 2), 2), timeout=120)
    keys = agents.script(count, turns)
    since = agents.marks()
    with Window(meter, system, idle=idle) as window:
        handle = system.create_agents(keys, turns)
        system.wait(handle, timeout=900)
    t = system.timings(handle)
    elapsed = t["last_completed"] - t["first_created"]
    return {"turns_per_s": round(t["completed"] * turns / elapsed, 1), "elapsed_s": round(elapsed, 2),
            "p50_ms": round(pct(t["latencies_ms"], 0.5)), "p95_ms": round(pct(t["latencies_ms"], 0.95)),
            "lost": t["lost"], **agents.checks(since, keys, turns), "per_turn": window.cost.per(count * turns)}


def finished_within(system, handle, seconds: float) -> bool:
    """Whether every task of `handle` ended within `seconds` (each system's wait raises on its timeout)."""
    try:
        system.wait(handle, timeout=seconds)
        return True
    except (SystemExit, RuntimeError):
        return False


def _drain(system, handle, steps: int) -> None:
    """Until all complete, or nothing moved for STALL_S (longer than the runtime's 30 s lease: a lease waited out is
    slow, not lost), or LOST_AFTER_S: what is not complete then counts as lost (the chain's early-acked links)."""
    deadline, last, moved = time.monotonic() + LOST_AFTER_S, -1.0, time.monotonic()
    while time.monotonic() < deadline and not finished_within(system, handle, 2.0):
        fraction = system.done_fraction(handle, steps)
        if fraction > last:
            last, moved = fraction, time.monotonic()
        elif time.monotonic() - moved > STALL_S:
            break


def _resumption(system, handle, in_flight: list, since: float) -> dict:
    resumed = system.resumed_after(list(handle), since)
    waits = [resumed[task] - since for task in map(str, in_flight) if task in resumed]
    never = sum(1 for task in map(str, in_flight) if task not in resumed)
    if never or not waits:  # a maximum over the tasks that did resume would flatter a system that strands some
        return {"max_s": None, "p50_s": None, "never": never}
    return {"max_s": round(max(waits), 2), "p50_s": round(statistics.median(waits), 2), "never": never}


def w3(system, tasks: int, steps: int, *, only_one: bool = False) -> dict:
    """SIGKILL every worker at 40 % and start new ones 2 s later; or (`only_one`, W3-one) SIGKILL one of the two and
    start none: the other has to take over the dead one's tasks."""
    handle = system.create(tasks, steps, sleep_ms=CRASH_SLEEP_MS)
    while system.done_fraction(handle, steps) < CRASH_AT:
        time.sleep(0.01)
    killed_at = time.time()
    system.kill_one() if only_one else system.fleet.kill()
    in_flight = system.in_flight(handle)  # (with only_one: the survivor's too, which go on at once)
    out = {"done_at_kill": round(system.done_fraction(handle, steps), 3), "in_flight_at_kill": len(in_flight)}
    if not only_one:
        time.sleep(RESTART_AFTER_S)
        restarted_at = time.time()
        system.restart_workers()
        out["restart_to_ready_s"] = round(time.time() - restarted_at, 2)
    _drain(system, handle, steps)
    t = system.timings(handle)
    since = killed_at if only_one else restarted_at
    resumption = _resumption(system, handle, in_flight, since)
    out.update({"failover_max_s": resumption["max_s"], "failover_p50_s": resumption["p50_s"],
                "in_flight_never_resumed": resumption["never"],
                "kill_to_all_complete_s": round(t["last_completed"] - killed_at, 1) if not t["lost"] else None,
                "lost": t["lost"], "duplicate_effects": t["duplicate_effects"]})
    return out


def run_block(system, meter: Meter, args, agents: Agents | None = None) -> dict:
    """One system, one repeat: reset, start, warm up, the workloads, stop."""
    system.reset()
    system.start()
    out: dict = {}
    idle = None
    try:
        system.wait(system.create(WARM_UP_TASKS, args.steps), timeout=120)
        for workload in args.workloads:
            print(f"[compare]   {system.name} {workload}", file=sys.stderr, flush=True)
            if workload == "w2":
                out["w2"] = w2(system, args.steps)
            elif workload == "w1":
                out["w1"] = w1(system, meter, args.tasks, args.steps, idle=idle)
            elif workload == "w1big":
                out["w1big"] = w1(system, meter, args.tasks, args.steps, payload_bytes=BIG_PAYLOAD, idle=idle)
            elif workload == "wa":
                out["wa"] = wa(system, meter, agents, args.wa_agents, args.wa_turns, idle=idle)
            elif workload == "w4":
                out["w4"] = w4(system, meter, args.idle_seconds)
                idle = out["w4"]["per_s"]
            elif workload == "w3":
                out["w3"] = w3(system, args.tasks, args.steps)
            elif workload == "w3one":
                out["w3one"] = w3(system, args.tasks, args.steps, only_one=True)
        return out
    finally:
        system.stop()


# -------------------------------------------------------------------------------------------------------------
# Report
# -------------------------------------------------------------------------------------------------------------
# (label, path, which way is better: +1 higher, -1 lower, 0 no ratio)
FIGURES = [
    ("W1 steps/s", ("w1", "steps_per_s"), 1),
    ("W1 p50 / p95 / p99 create → complete, ms", [("w1", "p50_ms"), ("w1", "p95_ms"), ("w1", "p99_ms")], -1),
    ("W1 statements/step", ("w1", "per_step", "statements"), -1),
    ("W1 commits/step", ("w1", "per_step", "commits"), -1),
    ("W1 WAL bytes/step", ("w1", "per_step", "wal_bytes"), -1),
    ("W1 tuples written/step", ("w1", "per_step", "tuples_written"), -1),
    ("W1 Valkey commands/step", ("w1", "per_step", "redis_commands"), -1),
    ("W1 new connections/step", ("w1", "per_step", "new_connections"), -1),
    ("W1 CPU ms/step: workers", ("w1", "per_step", "cpu_workers_ms"), -1),
    ("W1 CPU ms/step: PostgreSQL", ("w1", "per_step", "cpu_postgres_ms"), -1),
    ("W1 CPU ms/step: Valkey", ("w1", "per_step", "cpu_redis_ms"), -1),
    ("W1 CPU ms/step: driver", ("w1", "per_step", "cpu_driver_ms"), -1),
    ("W1 CPU ms/step: whole machine", ("w1", "per_step", "cpu_machine_ms"), -1),
    ("W1 lost; duplicate effects", [("w1", "lost"), ("w1", "duplicate_effects")], 0),
    ("W1-big (32 KB) steps/s", ("w1big", "steps_per_s"), 1),
    ("W1-big p95 ms", ("w1big", "p95_ms"), -1),
    ("W1-big WAL bytes/step", ("w1big", "per_step", "wal_bytes"), -1),
    ("W1-big CPU ms/step: whole machine", ("w1big", "per_step", "cpu_machine_ms"), -1),
    ("WA agent turns/s", ("wa", "turns_per_s"), 1),
    ("WA p50 / p95 agent create → complete, ms", [("wa", "p50_ms"), ("wa", "p95_ms")], -1),
    ("WA statements/turn", ("wa", "per_turn", "statements"), -1),
    ("WA commits/turn", ("wa", "per_turn", "commits"), -1),
    ("WA WAL bytes/turn", ("wa", "per_turn", "wal_bytes"), -1),
    ("WA CPU ms/turn: workers", ("wa", "per_turn", "cpu_workers_ms"), -1),
    ("WA CPU ms/turn: PostgreSQL", ("wa", "per_turn", "cpu_postgres_ms"), -1),
    ("WA CPU ms/turn: whole machine", ("wa", "per_turn", "cpu_machine_ms"), -1),
    ("WA lost; tool effects twice; missing; turns asked twice",
     [("wa", "lost"), ("wa", "tool_effects_applied_twice"), ("wa", "tool_effects_missing"),
      ("wa", "turns_asked_twice")], 0),
    ("W2 create → first step, ms p50", ("w2", "create_to_first_step_ms_p50"), -1),
    ("W2 per-step ms (p50 latency ÷ steps)", ("w2", "per_step_ms"), -1),
    ("W2 p95 create → complete, ms", ("w2", "p95_ms"), -1),
    ("W3 in flight at the kill", ("w3", "in_flight_at_kill"), 0),
    ("W3 new workers: start → ready, s", ("w3", "restart_to_ready_s"), 0),
    ("W3 new workers' start → every in-flight task's next step or completion, s (max; p50)",
     [("w3", "failover_max_s"), ("w3", "failover_p50_s")], -1),
    ("W3 in-flight tasks never resumed", ("w3", "in_flight_never_resumed"), 0),
    ("W3 kill → all complete, s", ("w3", "kill_to_all_complete_s"), -1),
    ("W3 lost; duplicate effects", [("w3", "lost"), ("w3", "duplicate_effects")], 0),
    ("W3-one (1 of 2 killed, none started) in flight at the kill", ("w3one", "in_flight_at_kill"), 0),
    ("W3-one kill → every in-flight task's next step or completion, s (max; p50)",
     [("w3one", "failover_max_s"), ("w3one", "failover_p50_s")], -1),
    ("W3-one in-flight tasks never resumed", ("w3one", "in_flight_never_resumed"), 0),
    ("W3-one kill → all complete, s", ("w3one", "kill_to_all_complete_s"), -1),
    ("W3-one lost; duplicate effects", [("w3one", "lost"), ("w3one", "duplicate_effects")], 0),
    ("W4 idle statements/s", ("w4", "per_s", "statements"), -1),
    ("W4 idle commits/s", ("w4", "per_s", "commits"), -1),
    ("W4 idle WAL bytes/s", ("w4", "per_s", "wal_bytes"), -1),
    ("W4 idle Valkey commands/s", ("w4", "per_s", "redis_commands"), -1),
    ("W4 idle CPU ms/s: workers; PostgreSQL", [("w4", "per_s", "cpu_workers_ms"),
                                               ("w4", "per_s", "cpu_postgres_ms")], -1),
]


def _values(runs: list[dict], path: tuple) -> list:
    values = []
    for run in runs:
        for key in path:
            run = run.get(key) if isinstance(run, dict) else None
        if run is not None:
            values.append(run)
    return values


def _cell(runs: list[dict], path: tuple) -> str:
    values = _values(runs, path)
    if not values:
        return "–"
    median = statistics.median(values)
    text = f"{median:,.2f}".rstrip("0").rstrip(".") if isinstance(median, float) else f"{median:,}"
    return text if len(values) == 1 else f"{text} [{min(values):,g}–{max(values):,g}]"


def ratio(ours: list, theirs: list, better: int) -> str:
    """How many times better the runtime is (>1: better), by medians; '–' where it means nothing."""
    if not better or not ours or not theirs:
        return "–"
    a, b = statistics.median(ours), statistics.median(theirs)
    if better > 0:
        return f"{a / b:.2f}×" if b else "–"
    return f"{b / a:.2f}×" if a else ("∞" if b else "–")


def table(results: dict[str, list[dict]]) -> str:
    systems = list(results)
    peers = [name for name in systems if name != "runtime"] if "runtime" in systems else []
    head = ["figure", *systems, *(f"runtime vs {peer}" for peer in peers)]
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for label, paths, better in FIGURES:
        paths = paths if isinstance(paths, list) else [paths]
        cells = ["; ".join(_cell(results[name], path) for path in paths) for name in systems]
        cells += [ratio(_values(results["runtime"], paths[0]), _values(results[peer], paths[0]), better)
                  for peer in peers]
        if any(cell.replace("–", "").strip("; ") for cell in cells[:len(systems)]):
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def machine_facts(services: Services, dbos_python: Path | None) -> dict:
    import psycopg

    with psycopg.connect(services.admin_url("postgres"), autocommit=True) as conn:
        version = conn.execute("SELECT version()").fetchone()[0]
    facts = {"host": " ".join(platform.uname()[:3:2]), "cpus": os.cpu_count(), "python": platform.python_version(),
             "postgresql": version, "valkey": services.valkey.version() if hasattr(services.valkey, "version") else ""}
    try:
        facts["memory_gib"] = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
        facts["cpu_model"] = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                                  if line.startswith("model name"))
    except (OSError, ValueError, StopIteration):
        pass
    if dbos_python:
        facts["dbos"] = subprocess.run([str(dbos_python), "-m", "pip", "freeze"], capture_output=True,
                                       text=True).stdout.split()
    return facts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=200)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--systems", default="runtime,chain,dbos")
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--idle-seconds", type=float, default=60)
    parser.add_argument("--dbos-poll", type=float, default=0.05, help="DBOS's queue polling interval, s")
    parser.add_argument("--wa-agents", type=int, default=50, help="WA: agents created at once")
    parser.add_argument("--wa-turns", type=int, default=10,
                        help="WA: turns per agent (each but the last: a tool call)")
    args = parser.parse_args()
    args.workloads = args.workloads.split(",")
    names = args.systems.split(",")
    unknown = set(names) - {"runtime", "chain", "dbos"} or set(args.workloads) - set(WORKLOADS)
    if unknown:
        parser.error(f"unknown: {', '.join(sorted(unknown))}")
    dbos_python = ensure_dbos_venv() if "dbos" in names else None
    services = Services()
    started = dt.datetime.now(dt.UTC)
    agents = None
    try:
        services.start()
        env = django_env(services)
        if "wa" in args.workloads:
            agents = Agents(services.scratch)
            env.update(agents.env(), RUNTIME_AGENT__MAX_TURNS=str(max(30, args.wa_turns)))
        os.environ.update(env)
        subprocess.run([sys.executable, "manage.py", "migrate", "-v", "0"], cwd=ROOT, env=env, check=True)
        recreate_database(services, TEMPLATE_DB, BENCH_DB)  # every runtime block starts from this copy
        import django

        django.setup()
        import redis

        def meter_for(database: str, broker_db: int) -> Meter:
            return Meter(admin_url=services.meter_url(), database=database, postmaster_pid=services.postmaster_pid(),
                         redis_client=redis.Redis.from_url(services.broker_url(broker_db)),
                         redis_pid=services.valkey_pid())

        systems, meters = [], {}
        for name in names:
            if name == "runtime":
                systems.append(Runtime(services, env, args.workers, args.concurrency))
                meters[name] = meter_for(BENCH_DB, RUNTIME_BROKER_DB)
            elif name == "chain":
                systems.append(Chain(services, env, args.workers, args.concurrency))
                recreate_database(services, CHAIN_DB, "template0")
                meters[name] = meter_for(CHAIN_DB, FLOOR_BROKER_DB)
            else:
                systems.append(Dbos(services, dbos_python, args.workers, args.concurrency, args.dbos_poll))
                meters[name] = meter_for(DBOS_DB, 2)
        meters[names[0]].reset()
        results: dict[str, list[dict]] = {system.name: [] for system in systems}
        for repeat in range(args.repeat):
            for system in systems:
                print(f"[compare] repeat {repeat + 1}/{args.repeat}: {system.name}", file=sys.stderr, flush=True)
                results[system.name].append(run_block(system, meters[system.name], args, agents))
                print(f"[compare] {json.dumps(results[system.name][-1])}", file=sys.stderr, flush=True)
        finished = dt.datetime.now(dt.UTC)
        facts = machine_facts(services, dbos_python)
        print(f"\n{started:%Y-%m-%d %H:%M}–{finished:%H:%M} UTC · {args.tasks} tasks × {args.steps} steps · "
              f"{args.workers} workers × {args.concurrency} in flight · {args.repeat} repeats, interleaved · "
              f"median [min–max]; ratio: how many times better the runtime's median is\n")
        print(table(results))
        print(f"\n{facts['host']} · {facts.get('cpu_model', '')} × {facts['cpus']} · {facts.get('memory_gib')} GiB · "
              f"Python {facts['python']} · {facts['postgresql'].split(' on ')[0]}")
        record = {"started": started.isoformat(timespec="seconds"), "args": vars(args), "machine": facts,
                  "results": results}
        out = ROOT / "var" / "bench-results"
        out.mkdir(parents=True, exist_ok=True)
        (out / f"compare-{started:%Y%m%dT%H%M%S}.json").write_text(json.dumps(record, indent=1))
        print(json.dumps(record))
    finally:
        from django.db import connections

        connections.close_all()
        for system in locals().get("systems", []):
            try:
                system.stop()
            except Exception:  # noqa: BLE001 — already stopped, or never started: the services go next
                pass
        if agents is not None:
            agents.stop()
        services.stop()


if __name__ == "__main__":
    main()
