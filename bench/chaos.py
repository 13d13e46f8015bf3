"""Chaos run: real workers and beat on their own embedded PostgreSQL and Valkey, while faults hit them at
random moments; then every guarantee is checked and the longest time a task went without progress is reported.

    python3.11 deploy/dev.py chaos [--tasks 12] [--steps 150] [--seconds 90] [--seed 1] [--faults KIND,...]
                                   [--pg-outage-seconds 3] [--valkey-outage-seconds 3] [--no-stall-check]
    (--help lists the batch sizes too)

Faults (all on by default; --faults picks some, --faults '' none), one at a time, in shuffled rounds so that
every selected kind happens early. The first comes 1–2 s after the first committed step; each next one a lease,
a reaper pass and the longest step (plus up to 1 s) after the previous one is over, so a correct engine has
recovered in between and every stall is one fault's doing. They stop after 60% of --seconds so the run can
show it converges; the run ends when every task is terminal or the time is up.
  kill_worker          SIGKILL a worker's process group. A restarted worker is sometimes armed to kill itself
                       at one of the engine's fault points (tasks_app/engine/faults.py).
  postgres_outage      crash PostgreSQL (`pg_ctl stop -m immediate`), keep it down --pg-outage-seconds, start it.
  kill_db_connections  pg_terminate_backend on all, or a random half, of the workers' and beat's connections
                       (heartbeats included), usually while a step longer than the lease is running.
  valkey_outage        stop the run's own Valkey (the broker) for --valkey-outage-seconds and start it again;
                       its AOF keeps the queued messages.

Three batches of demo_steps tasks:
  normal           --tasks tasks of --steps short steps (--sleep-ms).
  long_steps       --long-tasks tasks of --long-steps steps of --long-sleep-ms, longer than the lease: only
                   heartbeats keep the lease alive while they run.
  effect_timeouts  --timeout-tasks tasks whose every effect lands, then answers after 800 ms under a 300 ms
                   timeout: the step gets ToolTimeout with the effect applied, and its retry must reconcile the
                   unknown outcome (as applied), never call the effect again.

At the end every task must have completed, every effect must have happened exactly once (counted in the effects
log outside the database: duplicates and missing ones are failures) and exactly the planned steps committed.

Progress: a thread polls `tasks_app_task` every 0.2 s and keeps, per task, the longest time its steps_completed
stood still while the task was not terminal. The clock starts at the run's first committed step, so worker
start-up is not counted; queueing behind other tasks is. For long_steps tasks one step's duration is subtracted
(a step longer than the lease is progress-free by nature). The summary reports longest_stall_seconds (normal
and effect_timeouts), longest_stall_seconds_beyond_step (long_steps), per batch the task and its window (seconds
since the workers were started, as in fault_timeline), and every task over the bound with the faults in its
window (fault_timeline also lists pool processes killed by armed fault points, from the worker logs, and
processes that exited by themselves). The bound is lease + reaper interval + 5 s (ARCHITECTURE §4: an
infrastructure blip costs at most lease + reaper interval); stall_ok says both stayed within it, and `ok`
requires it unless --no-stall-check.

Prints the JSON summary on one line; exits 1 when a guarantee or the bound was broken. Leases are short (3 s)
so recovery happens within the run. CHAOS_KEEP=1 keeps the scratch folder (worker, beat and server logs).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "deploy"))

from embedded import EmbeddedPostgres, EmbeddedValkey  # noqa: E402

TERMINAL = ("completed", "failed", "cancelled", "dead_lettered")
FAULT_KINDS = ("kill_worker", "postgres_outage", "kill_db_connections", "valkey_outage")

LEASE_SECONDS = 3
HEARTBEAT_SECONDS = 1
REAPER_INTERVAL_SECONDS = 1
# What an infrastructure blip may cost a task: its lease running out, the reaper noticing, plus slack for
# re-dispatch, a slice of queueing and a loaded 2-core machine.
STALL_BOUND_SECONDS = LEASE_SECONDS + REAPER_INTERVAL_SECONDS + 5
POLL_SECONDS = 0.2
# Per worker. Long steps and slow effects hold a slot while they sleep: with enough slots, queueing behind
# them stays well inside the stall bound, so a stall over it is the faults' doing.
WORKER_CONCURRENCY = 4
EFFECT_ANSWER_MS = 800
EFFECT_TIMEOUT_MS = 300
# The tool's own connections: kill_db_connections spares them, so the progress watch keeps seeing.
CHAOS_APPLICATION_NAME = "chaos-tool"
# How a worker logs a pool process that died of SIGKILL: with the whole worker alive, that is an armed fault point.
POOL_PROCESS_KILLED = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}): ERROR/MainProcess\] "
                                 r"Process '[^']+' pid:(\d+) exited with 'signal 9", re.MULTILINE)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def db_connect(url: str, **kwargs):
    import psycopg

    return psycopg.connect(url, application_name=CHAOS_APPLICATION_NAME, autocommit=True, **kwargs)


@dataclass
class Batch:
    """Tasks created with the same demo_steps input; checked and measured together."""

    name: str
    count: int
    steps: int
    input: dict
    # Subtracted from the stall measure: the one step that may legitimately be running through a stall.
    step_allowance_seconds: float = 0.0
    task_ids: list[str] = field(default_factory=list)


class Fleet:
    """Two workers and beat, restarted when they die, as a process supervisor would. A restarted worker is
    sometimes armed to SIGKILL itself at one of the engine's named fault points (tasks_app/engine/faults.py)."""

    def __init__(self, env: dict, logs: Path, rng: random.Random, steps: int, short_step_task_ids: list[str]):
        self.env, self.logs, self.rng, self.steps = env, logs, rng, steps
        self.short_step_task_ids = short_step_task_ids
        self.processes: dict[str, subprocess.Popen] = {}
        self.restarts = Counter()
        self.armed = Counter()
        self.killed: set[str] = set()
        self.own_exits: list[tuple[float, str]] = []  # (time.monotonic(), what): exits nobody caused from outside

    def faults_for(self, name: str) -> str:
        if name == "beat" or self.rng.random() > 0.4:
            return ""
        points = ["after_effect_before_commit", "after_commit_before_chain"]
        if self.short_step_task_ids:
            points.append("during_lease_renewal")
        point = self.rng.choice(points)
        self.armed[point] += 1
        if point == "during_lease_renewal":
            # One short-step task only: unconditioned, every step that outlasts a heartbeat on this worker
            # (each long step) would die, a crash loop rather than a fault the engine should ride out.
            return f"{point}:kill@task_id={self.rng.choice(self.short_step_task_ids)}"
        return f"{point}:kill@step_seq={self.rng.randint(2, self.steps)}"

    def command(self, name: str) -> list[str]:
        if name == "beat":
            return [sys.executable, "-m", "celery", "-A", "config", "beat", "--loglevel", "WARNING", "--pidfile=",
                    "--scheduler", "config.beat:RuntimeScheduler"]
        return [sys.executable, "-m", "celery", "-A", "config", "worker", "-n", f"{name}@%h", "--pool", "prefork",
                "--concurrency", str(WORKER_CONCURRENCY), "--loglevel", "WARNING", "--without-gossip",
                "--without-mingle", "--without-heartbeat"]

    def start(self, name: str, faults: str = "") -> None:
        log = (self.logs / f"{name}.log").open("a")
        env = {**self.env, "RUNTIME_FAULT_POINTS": faults}
        self.processes[name] = subprocess.Popen(self.command(name), cwd=ROOT, env=env, stdout=log,
                                                stderr=subprocess.STDOUT, start_new_session=True)

    def kill(self, name: str) -> None:
        process = self.processes[name]
        self.killed.add(name)
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.wait()

    def keep_alive(self) -> None:
        for name, process in list(self.processes.items()):
            if process.poll() is not None:
                if name not in self.killed:  # e.g. beat giving up on a lost database: worth knowing when
                    self.own_exits.append((time.monotonic(), f"exited_on_its_own {name} code {process.returncode}"))
                self.killed.discard(name)
                self.restarts[name] += 1
                self.start(name, self.faults_for(name))

    def stop(self) -> None:
        for name in list(self.processes):
            self.kill(name)

    def armed_kills(self, origin_wall_clock: float) -> list[tuple[float, str]]:
        """When armed fault points killed a pool process (from the worker logs), in seconds since origin."""
        kills = []
        for name in self.processes:
            log = self.logs / f"{name}.log"
            for match in POOL_PROCESS_KILLED.finditer(log.read_text(errors="replace") if log.exists() else ""):
                at = time.mktime(time.strptime(match[1], "%Y-%m-%d %H:%M:%S")) + int(match[2]) / 1000
                kills.append((round(at - origin_wall_clock, 1), f"armed_fault_point_kill {name} pid {match[3]}"))
        return kills


class ProgressWatch(threading.Thread):
    """Polls the task table every POLL_SECONDS on its own connection (reconnecting after outages) and keeps,
    per task, the longest window in which steps_completed stood still while the task was not terminal."""

    def __init__(self, url: str, task_ids: list[str], origin: float):
        super().__init__(daemon=True, name="progress-watch")
        self.url, self.origin = url, origin
        self.pending = set(task_ids)  # not terminal yet
        self.steps: dict[str, int] = {}
        self.still_since: dict[str, float] = {}
        self.longest: dict[str, tuple[float, float, float]] = {}  # task -> (seconds, from, to), since origin
        self.clock_started: float | None = None
        self.all_terminal = threading.Event()
        self.stopping = threading.Event()

    def run(self) -> None:
        import psycopg

        conn = None
        while not self.stopping.wait(POLL_SECONDS):
            try:
                if conn is None:
                    conn = db_connect(self.url, connect_timeout=1)
                rows = conn.execute("SELECT id::text, status, steps_completed FROM tasks_app_task").fetchall()
            except psycopg.Error:  # PostgreSQL is down: the stall clocks keep running, the next poll reconnects
                if conn is not None:
                    conn.close()
                conn = None
                continue
            self.observe(rows, time.monotonic() - self.origin)
        if conn is not None:
            conn.close()

    def observe(self, rows: list[tuple[str, str, int]], now: float) -> None:
        if self.clock_started is None:
            if not any(steps for _, _, steps in rows):
                return  # workers still starting: not the engine's stall
            self.clock_started = now
            for task_id, _, steps in rows:
                self.steps[task_id], self.still_since[task_id] = steps, now
                self.longest[task_id] = (0.0, now, now)
        for task_id, status, steps in rows:
            if task_id not in self.pending:
                continue
            if steps != self.steps[task_id] or status in TERMINAL:
                self.close_window(task_id, now)
                self.steps[task_id], self.still_since[task_id] = steps, now
            if status in TERMINAL:
                self.pending.discard(task_id)
        if not self.pending:
            self.all_terminal.set()

    def close_window(self, task_id: str, now: float) -> None:
        seconds = now - self.still_since[task_id]
        if seconds > self.longest.get(task_id, (0.0,))[0]:
            self.longest[task_id] = (seconds, self.still_since[task_id], now)

    def finish(self) -> None:
        """Stop polling; a task still not terminal counts as stalled until now."""
        self.stopping.set()
        self.join(timeout=5)
        if self.clock_started is not None:
            now = time.monotonic() - self.origin
            for task_id in self.pending:
                self.close_window(task_id, now)


class FaultInjector:
    """One fault at a time, driven by tick(). Outages end on a later tick rather than in a sleep, so the fleet
    stays supervised while PostgreSQL or Valkey is down."""

    def __init__(self, kinds: list[str], rng: random.Random, fleet: Fleet, pg: EmbeddedPostgres,
                 valkey: EmbeddedValkey, outage_seconds: dict[str, float], long_task_ids: list[str],
                 longest_step_seconds: float, origin: float, until: float):
        self.kinds, self.rng, self.fleet, self.pg, self.valkey = kinds, rng, fleet, pg, valkey
        self.outage_seconds, self.long_task_ids, self.origin, self.until = outage_seconds, long_task_ids, origin, until
        # From the end of one fault to the next: a lease, a reaper pass and a re-run of the longest step. A
        # correct engine has recovered by then, so each stall is one fault's doing and the bound applies to it.
        self.recovery_seconds = LEASE_SECONDS + REAPER_INTERVAL_SECONDS + longest_step_seconds
        self.next_at: float | None = None
        self.round: list[str] = []
        self.counts = Counter()
        self.timeline: list[tuple[float, str]] = []  # (seconds since origin, what happened)
        self.terminated_connections = 0
        self.kills_during_long_steps = 0
        self.outage: tuple[float, str] | None = None  # (ends at, kind)

    def clock(self) -> float:
        return time.monotonic() - self.origin

    def tick(self, fleet_working: bool) -> None:
        """End an outage whose time is up; inject the next fault when it is due."""
        if not self.end_outage() or not self.kinds or not fleet_working:
            return
        if self.next_at is None:  # the first one once the fleet has committed a step, not while it boots
            self.next_at = self.clock() + self.rng.uniform(1.0, 2.0)
        if not self.next_at <= self.clock() < self.until:
            return
        if not self.round:  # every kind once per round, so a short run still sees each one
            self.round = self.rng.sample(self.kinds, len(self.kinds))
        kind = self.round.pop()
        at = self.clock()
        detail = getattr(self, kind)()
        self.counts[kind] += 1
        self.timeline.append((round(at, 1), f"{kind} {detail}"))
        over_at = self.outage[0] if self.outage else self.clock()
        self.next_at = over_at + self.recovery_seconds + self.rng.uniform(0.0, 1.0)

    def kill_worker(self) -> str:
        victim = self.rng.choice(["worker1", "worker2"])
        self.fleet.kill(victim)
        return victim

    def postgres_outage(self) -> str:
        self.pg_crash()
        self.outage = (self.clock() + self.outage_seconds["postgres_outage"], "postgres_outage")
        return f"{self.outage_seconds['postgres_outage']}s"

    def valkey_outage(self) -> str:
        self.valkey.stop()
        self.outage = (self.clock() + self.outage_seconds["valkey_outage"], "valkey_outage")
        return f"{self.outage_seconds['valkey_outage']}s"

    def kill_db_connections(self) -> str:
        import psycopg

        share = self.rng.choice([1.0, 0.5])
        try:
            return self._terminate_backends(share)
        except psycopg.OperationalError as error:  # PostgreSQL still recovering from a crash: count it, go on
            return f"failed: {str(error).strip()[:80]}"

    def _terminate_backends(self, share: float) -> str:
        with db_connect(self.pg.url, connect_timeout=2) as conn:
            pids = [pid for (pid,) in conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid() "
                "AND backend_type = 'client backend' AND application_name <> %s",
                (self.pg.database, CHAOS_APPLICATION_NAME))]
            victims = self.rng.sample(pids, max(1, round(len(pids) * share))) if pids else []
            long_steps_running = conn.execute(
                "SELECT count(*) FROM tasks_app_task WHERE id = ANY(%s::uuid[]) AND status = 'working' "
                "AND lease_owner IS NOT NULL", (self.long_task_ids,)).fetchone()[0]
            terminated = sum(ok for (ok,) in conn.execute(
                "SELECT pg_terminate_backend(pid) FROM unnest(%s::int[]) AS pid", (victims,)))
        self.terminated_connections += terminated
        self.kills_during_long_steps += bool(long_steps_running and terminated)
        return f"{terminated}/{len(pids)} long_steps_running={long_steps_running}"

    def pg_crash(self) -> None:
        subprocess.run([str(self.pg.bin_dir / "pg_ctl"), "stop", "-D", str(self.pg.pgdata), "-m", "immediate"],
                       check=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       **({"user": self.pg.account.pw_uid, "group": self.pg.account.pw_gid} if self.pg.account else {}))

    def end_outage(self, *, now: bool = False) -> bool:
        """Restart what an outage stopped once its time is up (or at once); True when none is going on."""
        if self.outage is None:
            return True
        ends_at, kind = self.outage
        if not now and self.clock() < ends_at:
            return False
        if kind == "postgres_outage":
            self.pg.start()
        else:
            self.valkey.start()
        self.outage = None
        self.timeline.append((round(self.clock(), 1), f"{kind} over"))
        return True


def stall_summary(batch: Batch, watch: ProgressWatch) -> dict:
    worst = max(((watch.longest[t], t) for t in batch.task_ids if t in watch.longest), default=None)
    if worst is None:
        return {"longest_stall_seconds": None}
    (seconds, start, end), task_id = worst
    summary = {"longest_stall_seconds": round(seconds, 1), "task": task_id, "window": [round(start, 1), round(end, 1)]}
    if batch.step_allowance_seconds:
        summary["step_seconds"] = batch.step_allowance_seconds
        summary["longest_stall_seconds_beyond_step"] = round(max(0.0, seconds - batch.step_allowance_seconds), 1)
    return summary


def stalls_over_bound(batches: list[Batch], watch: ProgressWatch, timeline: list[tuple[float, str]]) -> list[dict]:
    """Every task whose stall broke the bound, worst first, with the faults injected during its window."""
    over = []
    for batch in batches:
        for task_id in batch.task_ids:
            seconds, start, end = watch.longest.get(task_id, (0.0, 0.0, 0.0))
            beyond = seconds - batch.step_allowance_seconds
            if beyond > STALL_BOUND_SECONDS:
                over.append({"batch": batch.name, "task": task_id, "seconds": round(beyond, 1),
                             "window": [round(start, 1), round(end, 1)],
                             "faults_in_window": [f"{at} {what}" for at, what in timeline if start - 1 <= at <= end]})
    return sorted(over, key=lambda item: -item["seconds"])


def run(batches: list[Batch], *, seconds: float, seed: int, faults: list[str], pg_outage_seconds: float,
        valkey_outage_seconds: float, stall_check: bool) -> dict:
    scratch = Path(tempfile.mkdtemp(prefix="chaos-", dir=ROOT / "var"))
    os.chmod(scratch, 0o755)
    pg = EmbeddedPostgres(scratch, free_port(), "chaos")
    # Its own broker, not the caller's REDIS_URL: a shared one could not be stopped for a Valkey outage.
    valkey = EmbeddedValkey(scratch, free_port())
    env = dict(os.environ)
    env.update(DATABASE_URL=pg.url, REDIS_URL=valkey.url, EXTERNAL_ROOT=str(scratch / "external"),
               MEDIA_ROOT=str(scratch / "media"), RUNTIME_LEASE_SECONDS=str(LEASE_SECONDS),
               RUNTIME_HEARTBEAT_SECONDS=str(HEARTBEAT_SECONDS),
               RUNTIME_REAPER_INTERVAL_SECONDS=str(REAPER_INTERVAL_SECONDS), RUNTIME_REDISPATCH_AFTER_SECONDS="5",
               RUNTIME_MAX_RECOVERIES="50", RUNTIME_SLICE_SECONDS="0.5", DB_CONN_MAX_AGE="0", LOG_LEVEL="WARNING")
    fleet = injector = watch = None
    try:
        pg.start()
        pg.ensure_database()
        valkey.start()
        subprocess.run([sys.executable, "manage.py", "migrate", "-v", "0"], cwd=ROOT, env=env, check=True)
        for batch in batches:
            if batch.count:
                created = subprocess.run(
                    [sys.executable, "manage.py", "create_tasks", "--workflow", "demo_steps", "--count",
                     str(batch.count), "--input", json.dumps({"steps": batch.steps, **batch.input}),
                     "--tenant", "chaos"], cwd=ROOT, env=env, check=True, stdout=subprocess.PIPE, text=True)
                batch.task_ids = created.stdout.split()
        all_ids = [task_id for batch in batches for task_id in batch.task_ids]
        long_ids = [task_id for batch in batches if batch.step_allowance_seconds for task_id in batch.task_ids]
        fleet = Fleet(env, scratch, random.Random(seed), max(batch.steps for batch in batches),
                      [task_id for task_id in all_ids if task_id not in long_ids])
        origin = time.monotonic()
        for name in ("worker1", "worker2", "beat"):
            fleet.start(name)
        watch = ProgressWatch(pg.url, all_ids, origin)
        watch.start()
        # Faults stop after 60% of the time so the system can show it converges. The injector has its own
        # random sequence, so the order of faults does not depend on how often workers were restarted.
        injector = FaultInjector(faults, random.Random(f"{seed}:faults"), fleet, pg, valkey,
                                 {"postgres_outage": pg_outage_seconds, "valkey_outage": valkey_outage_seconds},
                                 long_ids, max((b.step_allowance_seconds for b in batches if b.count), default=0.0),
                                 origin, until=0.6 * seconds)
        while injector.clock() < seconds and not watch.all_terminal.is_set():
            injector.tick(fleet_working=watch.clock_started is not None)
            fleet.keep_alive()
            time.sleep(POLL_SECONDS)
        elapsed = injector.clock()
        injector.end_outage(now=True)
        watch.finish()
        fleet.stop()
        return summarize(batches, scratch, pg, fleet, injector, watch, elapsed, stall_check)
    finally:
        if fleet is not None:
            fleet.stop()
        if watch is not None:
            watch.stopping.set()
        valkey.stop()
        pg.stop()
        if os.environ.get("CHAOS_KEEP") != "1":
            shutil.rmtree(scratch, ignore_errors=True)


def summarize(batches: list[Batch], scratch: Path, pg: EmbeddedPostgres, fleet: Fleet, injector: FaultInjector,
              watch: ProgressWatch, elapsed: float, stall_check: bool) -> dict:
    with db_connect(pg.url) as conn:
        rows = conn.execute("SELECT id::text, status, recoveries FROM tasks_app_task").fetchall()
        committed = dict(conn.execute("SELECT task_id::text, count(*) FROM tasks_app_step "
                                      "WHERE status = 'committed' GROUP BY task_id"))
        reconciled = dict(conn.execute("SELECT task_id::text, count(*) FROM tasks_app_taskevent WHERE type = 'effect' "
                                       "AND data->>'status' LIKE 'reconciled%' GROUP BY task_id"))
    status_of = {task_id: status for task_id, status, _ in rows}
    effects_log = scratch / "external" / "demo_effects.log"
    executions_log = scratch / "external" / "demo_executions.log"
    effect_counts = Counter(effects_log.read_text().split() if effects_log.exists() else [])
    executions = Counter(tuple(line.split()[:2]) for line in
                         (executions_log.read_text().splitlines() if executions_log.exists() else []))
    result: dict = {"seconds": round(elapsed, 1), "batches": {}}
    duplicate_keys = []
    stalls, stalls_beyond_step = [], []
    for batch in batches:
        ids = set(batch.task_ids)
        # demo_steps' effect key is task:step_seq:effect name (tasks_app.engine.effects.effect_key).
        expected_keys = {f"{task_id}:{seq}:record" for task_id in ids for seq in range(1, batch.steps + 1)}
        duplicates = {key: n for key, n in effect_counts.items() if n > 1 and key in expected_keys}
        duplicate_keys += sorted(duplicates)
        stall = stall_summary(batch, watch)
        if "longest_stall_seconds_beyond_step" in stall:
            stalls_beyond_step.append(stall["longest_stall_seconds_beyond_step"])
        elif stall["longest_stall_seconds"] is not None:
            stalls.append(stall["longest_stall_seconds"])
        result["batches"][batch.name] = {
            "tasks": batch.count, "steps": batch.steps,
            "statuses": dict(Counter(status_of.get(task_id, "missing") for task_id in ids)),
            "committed_steps": sum(committed.get(task_id, 0) for task_id in ids),
            "duplicate_effects": sum(n - 1 for n in duplicates.values()),
            "missing_effects": len(expected_keys - effect_counts.keys()),
            "reconciled_effects": sum(reconciled.get(task_id, 0) for task_id in ids),
            "re_executed_steps": sum(n - 1 for (task_id, _), n in executions.items() if task_id in ids and n > 1),
            **stall,
        }
    per_batch = result["batches"].values()
    expected_steps = sum(batch.count * batch.steps for batch in batches)
    # Armed fault points and processes exiting by themselves strike at moments of their own choosing: put them
    # on the timeline next to the injected faults.
    timeline = sorted(injector.timeline + fleet.armed_kills(time.time() - injector.clock())
                      + [(round(at - injector.origin, 1), what) for at, what in fleet.own_exits])
    over = stalls_over_bound(batches, watch, timeline)
    result.update({
        "statuses": dict(Counter(status_of.values())), "faults": dict(injector.counts),
        "terminated_db_connections": injector.terminated_connections,
        "db_connection_kills_during_long_steps": injector.kills_during_long_steps,
        "process_restarts": dict(fleet.restarts), "armed_fault_points": dict(fleet.armed),
        "recoveries": sum(recoveries for _, _, recoveries in rows),
        "committed_steps": sum(committed.values()), "expected_steps": expected_steps,
        "effects": sum(effect_counts.values()),
        "duplicate_effects": sum(s["duplicate_effects"] for s in per_batch),
        "missing_effects": sum(s["missing_effects"] for s in per_batch),
        "duplicate_effect_keys": duplicate_keys[:10],
        "re_executed_steps": sum(s["re_executed_steps"] for s in per_batch),
        "stall_clock_started_at": None if watch.clock_started is None else round(watch.clock_started, 1),
        "longest_stall_seconds": max(stalls, default=None),
        "longest_stall_seconds_beyond_step": max(stalls_beyond_step, default=None),
        "stall_bound_seconds": STALL_BOUND_SECONDS,
        "stall_ok": not over and watch.clock_started is not None,
        "stall_check": stall_check,
        "stalls_over_bound": over[:10],
        "fault_timeline": [f"{at} {what}" for at, what in timeline],
    })
    total = sum(batch.count for batch in batches)
    result["ok"] = (result["statuses"].get("completed", 0) == total and result["duplicate_effects"] == 0
                    and result["missing_effects"] == 0 and result["committed_steps"] == expected_steps
                    and (result["stall_ok"] or not stall_check))
    return result


def fault_list(text: str) -> list[str]:
    kinds = [kind.strip() for kind in text.split(",") if kind.strip()]
    unknown = sorted(set(kinds) - set(FAULT_KINDS))
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown fault {', '.join(unknown)}; known: {', '.join(FAULT_KINDS)}")
    return kinds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=12, help="tasks in the normal batch")
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--sleep-ms", type=int, default=50)
    parser.add_argument("--long-tasks", type=int, default=2, help="tasks whose steps outlast the lease")
    parser.add_argument("--long-steps", type=int, default=10)
    parser.add_argument("--long-sleep-ms", type=int, default=4000)
    parser.add_argument("--timeout-tasks", type=int, default=4, help="tasks whose effects time out but land")
    parser.add_argument("--timeout-steps", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=90, help="give up after this long (faults: first 60%%)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--faults", type=fault_list, default=list(FAULT_KINDS),
                        help=f"comma-separated, from {','.join(FAULT_KINDS)} (default all; '' for none)")
    parser.add_argument("--pg-outage-seconds", type=float, default=3.0)
    parser.add_argument("--valkey-outage-seconds", type=float, default=3.0)
    parser.add_argument("--no-stall-check", dest="stall_check", action="store_false",
                        help="report the longest stall but do not fail the run on it")
    args = parser.parse_args()
    if args.long_tasks and args.long_sleep_ms <= LEASE_SECONDS * 1000:
        parser.error(f"--long-sleep-ms must be over the lease ({LEASE_SECONDS * 1000} ms)")
    batches = [
        # Created first: the long steps need the most wall time to finish within the run.
        Batch("long_steps", args.long_tasks, args.long_steps, {"sleep_ms": args.long_sleep_ms},
              step_allowance_seconds=args.long_sleep_ms / 1000),
        Batch("effect_timeouts", args.timeout_tasks, args.timeout_steps,
              {"effect_answer_ms": EFFECT_ANSWER_MS, "effect_timeout_ms": EFFECT_TIMEOUT_MS}),
        Batch("normal", args.tasks, args.steps, {"sleep_ms": args.sleep_ms}),
    ]
    result = run(batches, seconds=args.seconds, seed=args.seed, faults=args.faults,
                 pg_outage_seconds=args.pg_outage_seconds, valkey_outage_seconds=args.valkey_outage_seconds,
                 stall_check=args.stall_check)
    print(json.dumps(result))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
