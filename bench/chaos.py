"""Chaos run: real workers and beat on their own embedded PostgreSQL, while workers are SIGKILLed and
PostgreSQL is crashed (`pg_ctl stop -m immediate`) and restarted, at random moments.

    python3.11 deploy/dev.py chaos [--tasks 30] [--steps 10] [--sleep-ms 50] [--seconds 40] [--seed 1]

Restarted workers are sometimes armed to
kill themselves at one of the engine's fault points. At the end every task must have completed, every effect must have happened exactly once (counted in the
effects log outside the database), and only steps in flight at a crash may have run twice. Prints a JSON
summary; exits 1 when a guarantee was broken. Leases are short (3 s) so recovery happens within the run.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "deploy"))

from embedded import EmbeddedPostgres  # noqa: E402

TERMINAL = ("completed", "failed", "cancelled", "dead_lettered")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Fleet:
    """Two workers and beat, restarted when they die, as a process supervisor would. A restarted worker is
    sometimes armed to SIGKILL itself at one of the engine's named fault points (tasks_app/faults.py)."""

    def __init__(self, env: dict, logs: Path, rng: random.Random, steps: int):
        self.env, self.logs, self.rng, self.steps = env, logs, rng, steps
        self.processes: dict[str, subprocess.Popen] = {}
        self.restarts = 0
        self.armed = Counter()

    def faults_for(self, name: str) -> str:
        if name == "beat" or self.rng.random() > 0.4:
            return ""
        point = self.rng.choice(["after_effect_before_commit", "after_commit_before_chain", "during_lease_renewal"])
        self.armed[point] += 1
        if point == "during_lease_renewal":
            return f"{point}:kill"
        return f"{point}:kill@step_seq={self.rng.randint(2, self.steps)}"

    def command(self, name: str) -> list[str]:
        if name == "beat":
            return [sys.executable, "-m", "celery", "-A", "config", "beat", "--loglevel", "WARNING", "--pidfile=",
                    "--scheduler", "django_celery_beat.schedulers:DatabaseScheduler"]
        return [sys.executable, "-m", "celery", "-A", "config", "worker", "-n", f"{name}@%h", "--pool", "prefork",
                "--concurrency", "2", "--loglevel", "WARNING", "--without-gossip", "--without-mingle",
                "--without-heartbeat"]

    def start(self, name: str, faults: str = "") -> None:
        log = (self.logs / f"{name}.log").open("a")
        env = {**self.env, "RUNTIME_FAULT_POINTS": faults}
        self.processes[name] = subprocess.Popen(self.command(name), cwd=ROOT, env=env, stdout=log,
                                                stderr=subprocess.STDOUT, start_new_session=True)

    def kill(self, name: str) -> None:
        process = self.processes[name]
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.wait()

    def keep_alive(self) -> None:
        for name, process in list(self.processes.items()):
            if process.poll() is not None:
                self.restarts += 1
                self.start(name, self.faults_for(name))

    def stop(self) -> None:
        for name in list(self.processes):
            self.kill(name)


def run(tasks: int, steps: int, sleep_ms: int, seconds: float, seed: int) -> dict:
    import psycopg

    rng = random.Random(seed)
    scratch = Path(tempfile.mkdtemp(prefix="chaos-", dir=ROOT / "var"))
    os.chmod(scratch, 0o755)
    pg = EmbeddedPostgres(scratch, free_port(), "chaos")
    env = dict(os.environ)
    env.update(DATABASE_URL=pg.url, EXTERNAL_ROOT=str(scratch / "external"), MEDIA_ROOT=str(scratch / "media"),
               RUNTIME_LEASE_SECONDS="3", RUNTIME_HEARTBEAT_SECONDS="1", RUNTIME_REAPER_INTERVAL_SECONDS="1",
               RUNTIME_REDISPATCH_AFTER_SECONDS="5", RUNTIME_MAX_RECOVERIES="50", RUNTIME_SLICE_SECONDS="0.5",
               DB_CONN_MAX_AGE="0", LOG_LEVEL="WARNING")
    fleet = Fleet(env, scratch, rng, steps)
    actions = Counter()
    try:
        pg.start()
        pg.ensure_database()
        subprocess.run([sys.executable, "manage.py", "migrate", "-v", "0"], cwd=ROOT, env=env, check=True)
        created = subprocess.run(
            [sys.executable, "manage.py", "create_tasks", "--workflow", "demo_steps", "--count", str(tasks),
             "--input", json.dumps({"steps": steps, "sleep_ms": sleep_ms}), "--tenant", "chaos"],
            cwd=ROOT, env=env, check=True, capture_output=True, text=True)
        task_ids = created.stdout.split()
        for name in ("worker1", "worker2", "beat"):
            fleet.start(name)
        deadline = time.monotonic() + seconds
        next_fault = time.monotonic() + rng.uniform(1.0, 3.0)
        statuses: dict[str, int] = {}
        while time.monotonic() < deadline:
            try:
                with psycopg.connect(pg.url, connect_timeout=2) as conn:
                    statuses = dict(conn.execute("SELECT status, count(*) FROM tasks_app_task GROUP BY status"))
            except psycopg.OperationalError:
                pass
            if sum(statuses.get(s, 0) for s in TERMINAL) == tasks:
                break
            if time.monotonic() >= next_fault:
                # Faults stop after 60% of the time so the system can show it converges.
                if time.monotonic() < deadline - 0.4 * seconds:
                    action = rng.choice(["kill_worker", "kill_worker", "restart_postgres"])
                    if action == "kill_worker":
                        victim = rng.choice(["worker1", "worker2"])
                        fleet.kill(victim)
                    else:
                        subprocess.run([str(pg.bin_dir / "pg_ctl"), "stop", "-D", str(pg.pgdata), "-m", "immediate"],
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                       **({"user": pg.account.pw_uid, "group": pg.account.pw_gid}
                                          if pg.account else {}))
                        time.sleep(rng.uniform(0.2, 1.0))
                        pg.start()
                    actions[action] += 1
                next_fault = time.monotonic() + rng.uniform(1.0, 3.0)
            fleet.keep_alive()
            time.sleep(0.2)
        fleet.stop()
        with psycopg.connect(pg.url) as conn:
            statuses = dict(conn.execute("SELECT status, count(*) FROM tasks_app_task GROUP BY status"))
            recoveries = conn.execute("SELECT coalesce(sum(recoveries), 0) FROM tasks_app_task").fetchone()[0]
            committed = dict(conn.execute("SELECT task_id::text, count(*) FROM tasks_app_step "
                                          "WHERE status = 'committed' GROUP BY task_id"))
        effects_log = scratch / "external" / "demo_effects.log"
        executions_log = scratch / "external" / "demo_executions.log"
        effect_keys = effects_log.read_text().split() if effects_log.exists() else []
        executions = Counter(tuple(line.split()[:2]) for line in
                             (executions_log.read_text().splitlines() if executions_log.exists() else []))
        duplicate_effects = sum(n - 1 for n in Counter(effect_keys).values() if n > 1)
        missing_effects = tasks * steps - len(set(effect_keys))
        reruns = sum(n - 1 for n in executions.values() if n > 1)
        result = {
            "tasks": tasks, "steps": steps, "statuses": statuses, "faults": dict(actions),
            "process_restarts": fleet.restarts, "armed_fault_points": dict(fleet.armed), "recoveries": recoveries,
            "committed_steps": sum(committed.values()), "effects": len(effect_keys),
            "duplicate_effects": duplicate_effects, "missing_effects": missing_effects,
            "re_executed_steps": reruns, "task_ids": len(task_ids),
        }
        result["ok"] = (statuses.get("completed", 0) == tasks and duplicate_effects == 0 and missing_effects == 0
                        and sum(committed.values()) == tasks * steps)
        return result
    finally:
        fleet.stop()
        pg.stop()
        if os.environ.get("CHAOS_KEEP") != "1":
            shutil.rmtree(scratch, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=30)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--sleep-ms", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=40)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    result = run(args.tasks, args.steps, args.sleep_ms, args.seconds, args.seed)
    print(json.dumps(result))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
