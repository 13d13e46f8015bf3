"""Benchmark the step engine: demo_steps 200 tasks × 20 steps on 2 workers × 4 in flight.

    python3.11 deploy/dev.py bench [--tasks 200] [--steps 20] [--repeat 1]

Prints steps/s, SQL statements per step (every statement the workers send, counted in-process) and CPU ms
per step (workers, PostgreSQL), plus latency and a duplicate-effect check, as a table and one JSON line.
Reference on this kind of machine (../shared/reference/baseline-anchors.md): DBOS 3.4 246 steps/s at 4.37
statements/step; a plain Celery chain (no durability) 367 steps/s. Target: ≥ 1.5 × DBOS, ≤ 4 statements/step.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH_DB = "agent_runtime_bench"


def _env(database_url: str, external: Path) -> dict:
    env = dict(os.environ)
    env.update(DATABASE_URL=database_url, EXTERNAL_ROOT=str(external), MEDIA_ROOT=str(external / "media"),
               DJANGO_SETTINGS_MODULE="config.settings", DB_CONN_MAX_AGE="600", LOG_LEVEL="WARNING")
    return env


def _database_url(base: str, name: str) -> str:
    return base.rsplit("/", 1)[0] + "/" + name


def _recreate_database(base_url: str) -> None:
    import psycopg

    with psycopg.connect(_database_url(base_url, "postgres"), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{BENCH_DB}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{BENCH_DB}"')


def _tree_cpu(pids: list[int]) -> float:
    import psutil

    total = 0.0
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            for p in [proc, *proc.children(recursive=True)]:
                times = p.cpu_times()
                total += times.user + times.system
        except psutil.Error:
            continue
    return total


def _postgres_cpu() -> float:
    """CPU seconds of every PostgreSQL process on the machine, the exited ones included: a backend that has exited
    (a connection closed during the run) is no longer listed, but the postmaster, which reaped it, carries its CPU
    in its children's times."""
    import psutil

    total = 0.0
    for proc in psutil.process_iter(["name", "ppid"]):
        if proc.info["name"] in ("postgres", "postmaster"):
            try:
                times = proc.cpu_times()
                total += times.user + times.system
                parent = psutil.Process(proc.info["ppid"]).name() if proc.info["ppid"] else ""
                if parent not in ("postgres", "postmaster"):  # the postmaster: add its reaped backends
                    total += times.children_user + times.children_system
            except psutil.Error:
                continue
    return total


def _consuming_workers(broker) -> int:
    """Connections to our broker database whose last command is BRPOP: a worker's task consumer (one per worker)
    once its event loop runs. The workers log at WARNING, so there is no "ready." line to wait for, and a ping
    would depend on remote control."""
    db = str(broker.connection_pool.connection_kwargs.get("db", 0))
    return sum(1 for client in broker.client_list() if client.get("db") == db and client.get("cmd") == "brpop")


def _start_workers(env: dict, count: int, concurrency: int, logs: Path, broker) -> list[subprocess.Popen]:
    workers = []
    for n in range(1, count + 1):
        log = logs / f"worker{n}.log"
        workers.append(subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "bench.instrumented", "worker", "-n", f"bench{n}@%h", "--pool",
             "prefork", "--concurrency", str(concurrency), "--loglevel", "WARNING", "--without-gossip",
             "--without-mingle", "--without-heartbeat"],
            cwd=ROOT, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and all(worker.poll() is None for worker in workers):
        if _consuming_workers(broker) >= count:
            return workers
        time.sleep(0.1)
    for worker in workers:
        if worker.poll() is None:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait()
    raise SystemExit("benchmark workers did not start; see " + str(logs))


def _wait_done(task_ids, timeout: float = 600) -> None:
    from tasks_app.models import Task

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pending = Task.objects.filter(id__in=task_ids).exclude(status__in=["completed", "failed", "dead_lettered"])
        if not pending.exists():
            return
        time.sleep(0.05)
    raise SystemExit("benchmark tasks did not finish in time")


def _burst(tenant, n: int, steps: int) -> list:
    from tasks_app.services import task_create

    return [task_create(tenant=tenant, owner=None, workflow="demo_steps", input={"steps": steps}).task.id
            for _ in range(n)]


def run(tasks: int, steps: int, workers_count: int, concurrency: int) -> dict:
    import django
    import redis

    base_url = os.environ["DATABASE_URL"]
    _recreate_database(base_url)
    database_url = _database_url(base_url, BENCH_DB)
    scratch = Path(tempfile.mkdtemp(prefix="bench-", dir=ROOT / "var"))
    external = scratch / "external"
    env = _env(database_url, external)
    os.environ.update(env)
    subprocess.run([sys.executable, "manage.py", "migrate", "-v", "0"], cwd=ROOT, env=env, check=True)
    django.setup()
    from django.conf import settings

    from bench.instrumented import COUNTER_KEY, STEPS_KEY
    from tasks_app.examples import demo_steps
    from tasks_app.examples import external as external_files
    from tasks_app.models import Task
    from tasks_app.services import tenant_get_or_create

    broker = redis.Redis.from_url(settings.REDIS_URL)
    broker.flushdb()
    tenant = tenant_get_or_create(slug="bench")
    workers = _start_workers(env, workers_count, concurrency, scratch, broker)
    try:
        _wait_done(_burst(tenant, 10, steps))  # warm-up: imports, connections, prepared caches
        broker.delete(COUNTER_KEY, STEPS_KEY)
        cpu_workers, cpu_pg = _tree_cpu([w.pid for w in workers]), _postgres_cpu()
        started = time.monotonic()
        ids = _burst(tenant, tasks, steps)
        submitted = time.monotonic() - started
        _wait_done(ids)
        cpu_workers, cpu_pg = _tree_cpu([w.pid for w in workers]) - cpu_workers, _postgres_cpu() - cpu_pg
        time.sleep(0.3)  # let the last task_postrun counters land
        statements = int(broker.get(COUNTER_KEY) or 0)
        run_step_calls = int(broker.get(STEPS_KEY) or 0)
        rows = list(Task.objects.filter(id__in=ids).values_list("status", "created_at", "completed_at"))
        done = [r for r in rows if r[0] == "completed"]
        first = min(r[1] for r in rows)
        last = max(r[2] for r in done)
        elapsed = (last - first).total_seconds()
        latencies = sorted((r[2] - r[1]).total_seconds() * 1000 for r in done)
        keys = [k for k in external_files.lines(demo_steps.EFFECTS_LOG) if k.split(":")[0] in {str(i) for i in ids}]
        total_steps = tasks * steps
        return {
            "workload": f"demo_steps {tasks} x {steps}, {workers_count} workers x {concurrency}",
            "completed": len(done), "lost": tasks - len(done),
            "steps_per_s": round(len(done) * steps / elapsed, 1), "elapsed_s": round(elapsed, 2),
            "submit_s": round(submitted, 2),
            "p50_ms": round(statistics.median(latencies)), "p95_ms": round(latencies[int(0.95 * (len(latencies) - 1))]),
            "statements_per_step": round(statements / total_steps, 2),
            "run_step_messages_per_task": round(run_step_calls / tasks, 2),
            "cpu_ms_per_step_workers": round(cpu_workers * 1000 / total_steps, 2),
            "cpu_ms_per_step_postgres": round(cpu_pg * 1000 / total_steps, 2),
            "effects": len(keys), "duplicate_effects": len(keys) - len(set(keys)),
        }
    finally:
        for worker in workers:
            try:
                os.killpg(worker.pid, signal.SIGTERM)
                worker.wait(timeout=20)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                os.killpg(worker.pid, signal.SIGKILL)
        from django.db import connections

        connections.close_all()
        shutil.rmtree(scratch, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=200)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=4)
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    result = run(args.tasks, args.steps, args.workers, args.concurrency)
    width = max(map(len, result))
    for key, value in result.items():
        print(f"{key:<{width}}  {value}")
    print(f"vs DBOS 3.4 (246 steps/s, 4.37 statements/step): {result['steps_per_s'] / 246:.2f}x throughput")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
