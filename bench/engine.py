"""Benchmark the step engine against the floor (a plain Celery chain, no durability), interleaved in one run.

    python3.11 deploy/dev.py bench [--tasks 200] [--steps 20] [--repeat 3] [--systems runtime,chain]
    python3.11 deploy/dev.py bench --scenario crash      # SIGKILL every worker at 40 %, restart, time the drain
    python3.11 deploy/dev.py bench --scenario growth     # per-step cost vs stored tasks and tasks in flight

Both systems run on the benchmark's own PostgreSQL (embedded 18, fsync on, pg_stat_statements with track = all)
and its own Valkey (AOF on), started in a scratch folder under var/ and removed afterwards; 2 workers × 4
processes each (prefork, no gossip/mingle/heartbeat), as in ../shared/reference/baseline-anchors.md. Per
repeat and system:

- W1: `tasks` × `steps` created at once while the workers run; steps/s from the first create to the last
  completion, p50/p95 create→complete, and the server-side cost per step (bench/stats.py);
- W2: 20 tasks one after another (closed loop): create → first step committed, and per-step time;
- backlog: `tasks` created with no worker running (the cost of a create on its own: ms, statements, WAL), then
  the workers start and drain it (steps/s and cost per step of the drain alone).

The runtime's workload is `demo_steps` (one ledger effect per step: an append to a file, as the chain's step
does). The table prints median [min–max] over the repeats; the JSON line has every figure of every run.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "deploy"))

from embedded import EmbeddedPostgres, EmbeddedValkey  # noqa: E402

from bench.stats import Meter  # noqa: E402

BENCH_DB = "bench"
METER_ROLE = "bench_meter"
RUNTIME_BROKER_DB = 0
FLOOR_BROKER_DB = 1
W2_TASKS = 20
CRASH_AT = 0.4
CRASH_RESTART_AFTER_S = 2.0
POSTGRES_OPTIONS = [
    "-c shared_preload_libraries=pg_stat_statements", "-c pg_stat_statements.track=all",
    "-c pg_stat_statements.max=10000", "-c pg_stat_statements.track_utility=on",
    "-c pg_stat_statements.track_planning=on", "-c max_connections=200",
    "-c shared_buffers=256MB", "-c fsync=on", "-c synchronous_commit=on",
]
WORKER_FLAGS = ["--pool", "prefork", "--loglevel", "WARNING", "--without-gossip", "--without-mingle",
                "--without-heartbeat"]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p * (len(ordered) - 1))))] if ordered else float("nan")


class Services:
    """The benchmark's own PostgreSQL and Valkey in a scratch folder (nothing shared with tests or a dev run)."""

    def __init__(self) -> None:
        (ROOT / "var").mkdir(exist_ok=True)  # (a fresh checkout has none yet)
        self.scratch = Path(tempfile.mkdtemp(prefix="bench-", dir=ROOT / "var"))
        os.chmod(self.scratch, 0o755)
        self.pg = EmbeddedPostgres(self.scratch, free_port(), BENCH_DB)
        self.pg.server_options = POSTGRES_OPTIONS
        if os.environ.get("BENCH_AUTO_EXPLAIN"):  # log the plan of every statement slower than this many ms
            self.pg.server_options = [option.replace("=pg_stat_statements", "=pg_stat_statements,auto_explain")
                                      for option in POSTGRES_OPTIONS] + [
                f"-c auto_explain.log_min_duration={os.environ['BENCH_AUTO_EXPLAIN']}",
                "-c auto_explain.log_nested_statements=on"]
        self.valkey = EmbeddedValkey(self.scratch, free_port())

    def start(self) -> None:
        import psycopg

        self.pg.start()
        self.pg.ensure_database()
        self.valkey.start()
        with psycopg.connect(self.admin_url("postgres"), autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            conn.execute(f"CREATE ROLE {METER_ROLE} SUPERUSER LOGIN")

    def admin_url(self, database: str) -> str:
        return f"postgres://postgres@127.0.0.1:{self.pg.port}/{database}"

    def meter_url(self, database: str = "postgres") -> str:
        return f"postgres://{METER_ROLE}@127.0.0.1:{self.pg.port}/{database}"

    def broker_url(self, db: int) -> str:
        return f"redis://127.0.0.1:{self.valkey.port}/{db}"

    def postmaster_pid(self) -> int:
        return int((self.pg.pgdata / "postmaster.pid").read_text().split()[0])

    def valkey_pid(self) -> int:
        return int(self.valkey.pid_file.read_text().strip())

    def stop(self) -> None:
        self.valkey.stop()
        self.pg.stop()
        if not os.environ.get("BENCH_KEEP"):
            shutil.rmtree(self.scratch, ignore_errors=True)


def groups_kill(processes: list[subprocess.Popen]) -> None:
    """SIGKILL each process's whole group (its pool children with it) and reap it."""
    for process in processes:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.wait()


def groups_stop(processes: list[subprocess.Popen], grace: float = 20) -> None:
    """SIGTERM each process's group, wait up to `grace` seconds for each, SIGKILL what is left."""
    for process in processes:
        try:
            os.killpg(process.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    for process in processes:
        try:
            process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


class Fleet:
    """Worker processes of one system, each in its own process group (so a SIGKILL takes its children too)."""

    def __init__(self, command: list[str], env: dict, logs: Path, broker, *, count: int, concurrency: int):
        self.command, self.env, self.logs, self.broker = command, env, logs, broker
        self.count, self.concurrency = count, concurrency
        self.processes: list[subprocess.Popen] = []

    def _consuming(self) -> int:
        # A worker's task consumer is a connection blocked in BRPOP on its broker database.
        db = str(self.broker.connection_pool.connection_kwargs.get("db", 0))
        return sum(1 for client in self.broker.client_list() if client.get("db") == db and client.get("cmd") == "brpop")

    def start(self) -> None:
        for n in range(1, self.count + 1):
            log = (self.logs / f"{self.command[3]}-worker{n}.log").open("a")
            self.processes.append(subprocess.Popen(
                [*self.command, "-n", f"w{n}-{time.monotonic_ns()}@%h", "--concurrency", str(self.concurrency),
                 *WORKER_FLAGS], cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self._consuming() >= self.count:
                return
            if any(process.poll() is not None for process in self.processes):
                break
            time.sleep(0.05)
        self.kill()
        raise SystemExit(f"benchmark workers did not start; see {self.logs}")

    @property
    def pids(self) -> list[int]:
        return [process.pid for process in self.processes]

    def kill(self) -> None:
        groups_kill(self.processes)
        self.processes = []

    def stop(self) -> None:
        groups_stop(self.processes)
        self.processes = []


# -------------------------------------------------------------------------------------------------------------
# The two systems, behind one driver interface: create(n, steps) -> handle, wait(handle), timings(handle)
# -------------------------------------------------------------------------------------------------------------
class RuntimeDriver:
    """This runtime: tasks created through the service the API uses; timings from the database's clock.

    The harness watches for completion on its own connection as the meter's role, every 0.1 s, so its reads are
    left out of the statement counts (its read-only commits still count among the commits, a small share per step:
    docs/performance.md).
    """

    name = "runtime"
    uses_postgres = True
    TERMINAL = ["completed", "failed", "dead_lettered", "cancelled"]
    workflow_input: dict = {}

    def __init__(self, services: Services, env: dict, workers: int, concurrency: int):
        import psycopg
        import redis

        self.observer = psycopg.connect(services.meter_url(BENCH_DB), autocommit=True)
        self.fleet = Fleet([sys.executable, "-m", "celery", "-A", "config", "worker"], env, services.scratch,
                           redis.Redis.from_url(services.broker_url(RUNTIME_BROKER_DB)), count=workers,
                           concurrency=concurrency)
        from tasks_app.services import tenant_get_or_create

        self.tenant = tenant_get_or_create(slug="bench")
        self.create_ms: list[float] = []

    def create(self, n: int, steps: int) -> list:
        from tasks_app.services import task_create

        ids = []
        for _ in range(n):
            started = time.perf_counter()
            ids.append(task_create(tenant=self.tenant, owner=None, workflow="demo_steps",
                                   input={"steps": steps, **self.workflow_input}).task.id)
            self.create_ms.append((time.perf_counter() - started) * 1000)
        return ids

    def wait(self, ids: list, timeout: float = 900) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            unfinished = self.observer.execute(
                "SELECT count(*) FROM tasks_app_task WHERE id = ANY(%s) AND NOT status = ANY(%s)",
                [ids, self.TERMINAL]).fetchone()[0]
            if not unfinished:
                return
            time.sleep(0.1)
        raise SystemExit("benchmark tasks did not finish in time")

    def done_fraction(self, ids: list, steps: int) -> float:
        done = self.observer.execute("SELECT coalesce(sum(steps_completed), 0) FROM tasks_app_task WHERE id = ANY(%s)",
                                     [ids]).fetchone()[0]
        return done / (len(ids) * steps)

    def steps_completed(self, task_id) -> int:
        return self.observer.execute("SELECT steps_completed FROM tasks_app_task WHERE id = %s",
                                     [task_id]).fetchone()[0]

    def timings(self, ids: list) -> dict:
        from tasks_app.examples import demo_steps
        from tasks_app.examples import external as external_files
        from tasks_app.models import Step, Task

        rows = list(Task.objects.filter(id__in=ids).values_list("id", "status", "created_at", "completed_at"))
        first_steps = dict(Step.objects.filter(task_id__in=ids, seq=1).values_list("task_id", "finished_at"))
        done = [r for r in rows if r[1] == "completed"]
        wanted = {str(task_id) for task_id in ids}
        keys = [k for k in external_files.lines(demo_steps.EFFECTS_LOG) if k.split(":")[0] in wanted]
        return {
            "completed": len(done), "lost": len(rows) - len(done),
            "first_created": min(r[2] for r in rows).timestamp(), "last_completed": max(r[3] for r in done).timestamp(),
            "latencies_ms": sorted((r[3] - r[2]).total_seconds() * 1000 for r in done),
            "first_step_ms": sorted((first_steps[r[0]] - r[2]).total_seconds() * 1000 for r in done
                                    if r[0] in first_steps),
            "duplicate_effects": len(keys) - len(set(keys)),
        }


class StateOnlyDriver(RuntimeDriver):
    """This runtime with steps that only compute and write state: no external effect, so no ledger row (what the
    durable engine costs without the execute-once ledger; the baseline anchors' C′)."""

    name = "runtime-state"
    workflow_input = {"effect": False}


class FloorDriver:
    """The floor: bench/floor.py, a chain of plain Celery tasks; timings from its completion hash and effect lines."""

    name = "chain"
    uses_postgres = False

    def __init__(self, services: Services, env: dict, workers: int, concurrency: int):
        import redis

        env = dict(env, FLOOR_BROKER_URL=services.broker_url(FLOOR_BROKER_DB),
                   FLOOR_EFFECTS=str(services.scratch / "floor-effects.log"))
        os.environ.update(FLOOR_BROKER_URL=env["FLOOR_BROKER_URL"], FLOOR_EFFECTS=env["FLOOR_EFFECTS"])
        self.fleet = Fleet([sys.executable, "-m", "celery", "-A", "bench.floor", "worker", "-Q", "floor"], env,
                           services.scratch, redis.Redis.from_url(env["FLOOR_BROKER_URL"]), count=workers,
                           concurrency=concurrency)
        from bench import floor

        self.floor = floor
        floor.reset()
        self.create_ms: list[float] = []

    def create(self, n: int, steps: int) -> dict:
        started = time.perf_counter()
        created = self.floor.create(n, steps)
        self.create_ms.append((time.perf_counter() - started) * 1000 / n)
        return created

    def wait(self, created: dict, timeout: float = 900) -> None:
        self.floor.wait(created, timeout)

    def timings(self, created: dict) -> dict:
        result = self.floor.results(created)
        return {"completed": result["completed"], "lost": result["lost"], "first_created": result["created_first"],
                "last_completed": result["completed_last"], "latencies_ms": result["latencies_ms"],
                "first_step_ms": result["first_step_ms"], "duplicate_effects": result["duplicate_effects"]}


# -------------------------------------------------------------------------------------------------------------
# Phases
# -------------------------------------------------------------------------------------------------------------
def measured(meter: Meter, driver, body):
    """Run body() between two snapshots, each taken once the database's counters are settled (only when the
    system writes to PostgreSQL: the chain does not); returns (body's result, cost counters)."""
    settle = meter.settle if driver.uses_postgres else (lambda: None)
    meter.worker_pids = driver.fleet.pids
    settle()
    before = meter.snapshot()
    result = body()
    meter.worker_pids = driver.fleet.pids
    settle()
    after = meter.snapshot()
    return result, after - before


def run_w1(driver, meter: Meter, tasks: int, steps: int) -> dict:
    def body():
        started = time.perf_counter()
        handle = driver.create(tasks, steps)
        submitted = time.perf_counter() - started
        driver.wait(handle)
        return handle, submitted

    (handle, submitted), cost = measured(meter, driver, body)
    driver.last_w1_window = cost
    t = driver.timings(handle)
    elapsed = t["last_completed"] - t["first_created"]
    return {"steps_per_s": round(t["completed"] * steps / elapsed, 1), "elapsed_s": round(elapsed, 2),
            "submit_s": round(submitted, 2), "p50_ms": round(pct(t["latencies_ms"], 0.5)),
            "p95_ms": round(pct(t["latencies_ms"], 0.95)), "lost": t["lost"],
            "duplicate_effects": t["duplicate_effects"], "cost_per_step": cost.per(tasks * steps)}


def run_w2(driver, steps: int) -> dict:
    latencies, first_steps = [], []
    driver.create_ms.clear()
    for _ in range(W2_TASKS):
        handle = driver.create(1, steps)
        driver.wait(handle, timeout=60)
        t = driver.timings(handle)
        latencies += t["latencies_ms"]
        first_steps += t["first_step_ms"]
    return {"create_ms_p50": round(statistics.median(driver.create_ms), 2),
            "create_to_first_step_ms_p50": round(statistics.median(first_steps), 1),
            "per_step_ms": round(statistics.median(latencies) / steps, 2)}


def run_backlog(driver, meter: Meter, tasks: int, steps: int) -> dict:
    """Create with no worker running (creation cost alone), then start the workers and drain."""
    driver.fleet.stop()
    driver.create_ms.clear()
    handle, create_cost = measured(meter, driver, lambda: driver.create(tasks, steps))
    creation = create_cost.per(tasks)

    def drain():
        driver.fleet.start()
        meter.worker_pids = driver.fleet.pids
        started, start_up_cpu = time.time(), meter.snapshot().cpu_workers_s  # imports, forks: not the drain's
        driver.wait(handle)
        return started, start_up_cpu

    (started, start_up_cpu), cost = measured(meter, driver, drain)
    cost.cpu_workers_s -= start_up_cpu
    t = driver.timings(handle)
    elapsed = t["last_completed"] - started
    return {"create_ms_mean": round(statistics.mean(driver.create_ms), 2), "cost_per_create": creation,
            "drain_steps_per_s": round(t["completed"] * steps / elapsed, 1), "lost": t["lost"],
            "cost_per_step": cost.per(tasks * steps)}


def run_system(driver, meter: Meter, tasks: int, steps: int, phases=("w1", "w2", "backlog")) -> dict:
    driver.fleet.start()
    try:
        driver.wait(driver.create(10, steps))  # warm-up: imports, connections, caches
        out = {}
        if "w1" in phases:
            out["w1"] = run_w1(driver, meter, tasks, steps)
        if "w2" in phases:
            out["w2"] = run_w2(driver, steps)
        if "backlog" in phases:
            out["backlog"] = run_backlog(driver, meter, tasks, steps)
        return out
    finally:
        driver.fleet.stop()


def run_crash(driver: RuntimeDriver, services: Services, env: dict, tasks: int, steps: int) -> dict:
    """SIGKILL every worker when CRASH_AT of the steps are done, start new ones CRASH_RESTART_AFTER_S later with
    beat (the reaper) running, and time the drain against the bound: lease + reaper interval + 5 s."""
    from django.conf import settings

    beat_log = (services.scratch / "beat.log").open("a")
    beat = subprocess.Popen([sys.executable, "-m", "celery", "-A", "config", "beat", "--loglevel", "WARNING",
                             "--pidfile="], cwd=ROOT, env=env, stdout=beat_log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    driver.fleet.start()
    try:
        driver.wait(driver.create(10, steps))
        ids = driver.create(tasks, steps)
        while driver.done_fraction(ids, steps) < CRASH_AT:
            time.sleep(0.01)
        killed_at = time.time()
        driver.fleet.kill()
        done_at_kill = driver.done_fraction(ids, steps)
        time.sleep(CRASH_RESTART_AFTER_S)
        restarted_at = time.time()
        driver.fleet.start()
        driver.wait(ids, timeout=600)
        t = driver.timings(ids)
        bound = settings.RUNTIME.lease_seconds + settings.RUNTIME.reaper_interval_seconds + 5
        drain = t["last_completed"] - restarted_at
        return {"done_at_kill": round(done_at_kill, 3),
                "kill_to_all_complete_s": round(t["last_completed"] - killed_at, 1),
                "restart_to_all_complete_s": round(drain, 1), "bound_s": bound, "within_bound": drain <= bound,
                "lost": t["lost"], "duplicate_effects": t["duplicate_effects"]}
    finally:
        driver.fleet.stop()
        os.killpg(beat.pid, signal.SIGTERM)
        beat.wait(timeout=20)


GROWTH_FIGURES = ("statements", "fk_checks", "commits", "wal_bytes", "wal_records", "tuples_written",
                  "cpu_workers_ms", "cpu_postgres_ms")
LONG_TASK_WINDOW = 5_000


def _growth_row(label: str, steps_per_s: float | None, figures: dict, *, fpi_per_step: float) -> dict:
    return {"case": label, "steps_per_s": steps_per_s, **{name: figures[name] for name in GROWTH_FIGURES},
            "wal_fpi_bytes": round(fpi_per_step, 1)}


def run_long_task(driver: RuntimeDriver, meter: Meter, *, at: list[int], window: int) -> list[dict]:
    """One task of max(at) + window steps on one worker process: the cost per step over `window` steps from each
    position in `at` (e.g. step 10 and step 95,000), from the same run."""
    driver.fleet.concurrency, driver.fleet.count = 1, 1
    driver.fleet.start()
    rows = []
    try:
        (task_id,) = driver.create(1, max(at) + window)
        for position in at:
            while driver.steps_completed(task_id) < position:
                time.sleep(0.05)
            meter.worker_pids = driver.fleet.pids
            before, started = meter.snapshot(), time.monotonic()
            while driver.steps_completed(task_id) < position + window:
                time.sleep(0.05)
            cost = meter.snapshot() - before
            elapsed = time.monotonic() - started
            rows.append(_growth_row(f"one task, steps {position:,}–{position + window:,}",
                                    round(window / elapsed, 1), cost.per(window),
                                    fpi_per_step=meter.wal_full_page_image_bytes(cost) / window))
            print(f"[bench] {rows[-1]}", file=sys.stderr, flush=True)
        driver.wait([task_id], timeout=3600)
    finally:
        driver.fleet.stop()
    return rows


def run_growth(driver: RuntimeDriver, meter: Meter, tasks: int, steps: int, *, stored: list[int],
               in_flight: list[int], long_task_steps: int) -> list[dict]:
    """How the cost per step grows: with the number of tasks stored (seeded terminal tasks with their events),
    with the tasks in flight (2 workers × n/2 processes), and with a task's length."""
    from bench.seed_tasks import seed_tasks

    rows, seeded = [], 0
    for count in stored:
        if count > seeded:
            print(f"[bench] seeding {count - seeded:,} terminal tasks", file=sys.stderr, flush=True)
            seed_tasks(count=count - seeded, tenant="seeded", seed=count, verbose=False)
            seeded = count
            # As a long-lived database has them: visibility map set and rows frozen. Otherwise autovacuum does it
            # during the measurement and its WAL swamps the steps' (figures: docs/performance.md, growth).
            for table in ("tasks_app_task", "tasks_app_taskevent", "tasks_app_step"):
                driver.observer.execute(f"VACUUM (FREEZE, ANALYZE) {table}")  # table names are constants
        for flight in in_flight if count == stored[0] else in_flight[:1]:
            driver.fleet.count, driver.fleet.concurrency = 2, flight // 2
            result = run_system(driver, meter, tasks, steps, phases=("w1",))
            rows.append(_growth_row(f"{count:,} stored, {flight} in flight", result["w1"]["steps_per_s"],
                                    result["w1"]["cost_per_step"],
                                    fpi_per_step=meter.wal_full_page_image_bytes(driver.last_w1_window)
                                    / (tasks * steps)))
            print(f"[bench] {rows[-1]}", file=sys.stderr, flush=True)
        if count == stored[0] and long_task_steps:
            meter.settle()  # let the previous phase's background work (autovacuum, checkpoints) pass
            rows += run_long_task(driver, meter, at=[10, long_task_steps], window=LONG_TASK_WINDOW)
    return rows


def growth_table(rows: list[dict]) -> str:
    head = ["case", "steps/s", "statements", "FK checks", "commits", "WAL B", "WAL records", "tuples written",
            "CPU ms workers", "CPU ms PostgreSQL", "of the WAL: full-page images B"]
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for row in rows:
        lines.append("| " + " | ".join([row["case"], f"{row['steps_per_s']:,}"]
                                       + [f"{row[name]:,.2f}" for name in GROWTH_FIGURES]
                                       + [f"{row['wal_fpi_bytes']:,.0f}"]) + " |")
    return "\n".join(lines)


# -------------------------------------------------------------------------------------------------------------
# Report
# -------------------------------------------------------------------------------------------------------------
FIGURES = [
    ("W1 steps/s", ("w1", "steps_per_s")),
    ("W1 p95 create→complete ms", ("w1", "p95_ms")),
    ("W1 creates, s", ("w1", "submit_s")),
    ("backlog drain steps/s", ("backlog", "drain_steps_per_s")),
    ("create ms (no worker running)", ("backlog", "create_ms_mean")),
    ("W2 create ms p50 (unloaded)", ("w2", "create_ms_p50")),
    ("W2 create → first step ms p50", ("w2", "create_to_first_step_ms_p50")),
    ("W2 per-step ms", ("w2", "per_step_ms")),
    ("statements/step sent", ("w1", "cost_per_step", "statements")),
    ("foreign-key checks/step", ("w1", "cost_per_step", "fk_checks")),
    ("nested statements/step (claim function)", ("w1", "cost_per_step", "nested")),
    ("commits/step", ("w1", "cost_per_step", "commits")),
    ("WAL bytes/step", ("w1", "cost_per_step", "wal_bytes")),
    ("WAL records/step", ("w1", "cost_per_step", "wal_records")),
    ("tuples written/step", ("w1", "cost_per_step", "tuples_written")),
    ("new connections/step", ("w1", "cost_per_step", "new_connections")),
    ("CPU ms/step workers", ("w1", "cost_per_step", "cpu_workers_ms")),
    ("CPU ms/step PostgreSQL", ("w1", "cost_per_step", "cpu_postgres_ms")),
    ("CPU ms/step Valkey", ("w1", "cost_per_step", "cpu_redis_ms")),
    ("Redis commands/step", ("w1", "cost_per_step", "redis_commands")),
    ("backlog drain: statements/step", ("backlog", "cost_per_step", "statements")),
    ("backlog drain: WAL bytes/step", ("backlog", "cost_per_step", "wal_bytes")),
    ("backlog drain: CPU ms/step PostgreSQL", ("backlog", "cost_per_step", "cpu_postgres_ms")),
    ("backlog drain: new connections/step", ("backlog", "cost_per_step", "new_connections")),
    ("per create: statements", ("backlog", "cost_per_create", "statements")),
    ("per create: FK checks", ("backlog", "cost_per_create", "fk_checks")),
    ("per create: WAL bytes", ("backlog", "cost_per_create", "wal_bytes")),
    ("per create: CPU ms PostgreSQL", ("backlog", "cost_per_create", "cpu_postgres_ms")),
    ("lost tasks; duplicate effects", ("w1", "lost"), ("w1", "duplicate_effects")),
]


def _get(run: dict, path: tuple):
    for key in path:
        run = run[key]
    return run


def _cell(runs: list[dict], path: tuple) -> str:
    values = [_get(run, path) for run in runs]
    median = statistics.median(values)
    text = f"{median:,.2f}".rstrip("0").rstrip(".") if isinstance(median, float) else f"{median:,}"
    return text if len(values) == 1 else f"{text} [{min(values):,g}–{max(values):,g}]"


def table(results: dict[str, list[dict]]) -> str:
    systems = list(results)
    lines = ["| figure | " + " | ".join(systems) + " |", "|---" * (len(systems) + 1) + "|"]
    for label, *paths in FIGURES:
        cells = []
        for system in systems:
            try:
                cells.append("; ".join(_cell(results[system], path) for path in paths))
            except (KeyError, TypeError, statistics.StatisticsError):
                cells.append("–")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def django_env(services: Services) -> dict:
    env = dict(os.environ)
    env.update(DATABASE_URL=services.admin_url(BENCH_DB), REDIS_URL=services.broker_url(RUNTIME_BROKER_DB),
               EXTERNAL_ROOT=str(services.scratch / "external"), MEDIA_ROOT=str(services.scratch / "media"),
               DJANGO_SETTINGS_MODULE="config.settings", DB_CONN_MAX_AGE="600", LOG_LEVEL="WARNING")
    return env


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=200)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--systems", default="runtime,chain",
                        help="of runtime, runtime-state (steps without an external effect), chain")
    parser.add_argument("--scenario", choices=["compare", "crash", "growth"], default="compare")
    parser.add_argument("--stored", default="1000,1000000", help="growth: stored tasks, comma-separated")
    parser.add_argument("--in-flight", default="8,64", help="growth: tasks in flight (2 workers × n/2 processes)")
    parser.add_argument("--long-task", type=int, default=95_000,
                        help="growth: one task measured over steps 10–5,010 and N–N+5,000 (0: skip)")
    args = parser.parse_args()
    services = Services()
    started = dt.datetime.now(dt.UTC)
    try:
        services.start()
        env = django_env(services)
        os.environ.update(env)
        subprocess.run([sys.executable, "manage.py", "migrate", "-v", "0"], cwd=ROOT, env=env, check=True)
        import django

        django.setup()
        import redis

        meter = Meter(admin_url=services.meter_url(), database=BENCH_DB, postmaster_pid=services.postmaster_pid(),
                      redis_client=redis.Redis.from_url(services.broker_url(RUNTIME_BROKER_DB)),
                      redis_pid=services.valkey_pid())
        drivers = {"runtime": RuntimeDriver, "runtime-state": StateOnlyDriver, "chain": FloorDriver}
        if args.scenario == "crash":
            driver = RuntimeDriver(services, env, args.workers, args.concurrency)
            runs = []
            for repeat in range(args.repeat):
                runs.append(run_crash(driver, services, env, args.tasks, args.steps))
                print(f"[bench] crash {repeat + 1}/{args.repeat}: {runs[-1]}", file=sys.stderr, flush=True)
            finished = dt.datetime.now(dt.UTC)
            print(f"\n{started:%Y-%m-%d %H:%M}–{finished:%H:%M} UTC · crash · {args.tasks} tasks × {args.steps} "
                  f"steps · {args.workers} workers × {args.concurrency}, all SIGKILLed at {CRASH_AT:.0%} of the "
                  f"steps, new ones {CRASH_RESTART_AFTER_S:g} s later · {args.repeat} runs\n")
            print("| run | restart → all complete, s | bound, s | kill → all complete, s | lost | duplicate effects |")
            print("|---|---|---|---|---|---|")
            for n, run in enumerate(runs, 1):
                print(f"| {n} | {run['restart_to_all_complete_s']} | {run['bound_s']:g} | "
                      f"{run['kill_to_all_complete_s']} | {run['lost']} | {run['duplicate_effects']} |")
            print(json.dumps({"scenario": "crash", "started": started.isoformat(timespec="seconds"), "runs": runs}))
            return
        if args.scenario == "growth":
            rows = run_growth(RuntimeDriver(services, env, args.workers, args.concurrency), meter, args.tasks,
                              args.steps, stored=[int(n) for n in args.stored.split(",")],
                              in_flight=[int(n) for n in args.in_flight.split(",")], long_task_steps=args.long_task)
            finished = dt.datetime.now(dt.UTC)
            print(f"\n{started:%Y-%m-%d %H:%M}–{finished:%H:%M} UTC · growth · W1 {args.tasks} tasks × {args.steps} "
                  f"steps per row; one task's windows of {LONG_TASK_WINDOW:,} steps on 1 process · per step\n")
            print(growth_table(rows))
            print(json.dumps({"scenario": "growth", "started": started.isoformat(timespec="seconds"), "rows": rows}))
            return
        systems = [drivers[name](services, env, args.workers, args.concurrency)
                   for name in args.systems.split(",")]
        results: dict[str, list[dict]] = {system.name: [] for system in systems}
        meter.reset()
        for repeat in range(args.repeat):
            for system in systems:
                print(f"[bench] repeat {repeat + 1}/{args.repeat}: {system.name}", file=sys.stderr, flush=True)
                results[system.name].append(run_system(system, meter, args.tasks, args.steps))
        finished = dt.datetime.now(dt.UTC)
        print(f"\n{started:%Y-%m-%d %H:%M}–{finished:%H:%M} UTC · {args.tasks} tasks × {args.steps} steps · "
              f"{args.workers} workers × {args.concurrency} · {args.repeat} repeats, interleaved · "
              f"median [min–max]\n")
        print(table(results))
        runtime = next((system for system in systems if system.name == "runtime"), None)
        if runtime is not None:
            print("\nWAL of the runtime's last W1, per step, by relation and record kind (a relation's WAL in a "
                  "record shared by several blocks is counted once per record):")
            for relation, kind, records, size in meter.wal_by_relation(runtime.last_w1_window,
                                                                       units=args.tasks * args.steps):
                print(f"  {size:8.1f} B {records:6.2f} rec  {relation:<45} {kind}")
            print("\nThe runtime's statements, by calls per step over the whole run (warm-up included), with their "
                  "mean execution and planning time:")
            steps_run = args.repeat * (2 * args.tasks + W2_TASKS + 10) * args.steps
            print("  calls/step   exec ms  plan ms (per call)  statement")
            for calls, toplevel, exec_ms, plan_ms, query in meter.top_statements():
                print(f"  {calls / steps_run:9.3f} {exec_ms:9.3f} {plan_ms:8.3f}            "
                      f"{'' if toplevel else '↳ '}{query[:120]}")
        print(json.dumps({"started": started.isoformat(timespec="seconds"), "args": vars(args), "results": results}))
    finally:
        from django.db import connections

        connections.close_all()
        services.stop()


if __name__ == "__main__":
    main()
