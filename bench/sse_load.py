"""Live-stream benchmark: many SSE subscribers on one task while a worker runs it.

    python3.11 deploy/dev.py bench --sse                          # 200 subscribers, 400 steps of 25 ms
    python3.11 deploy/dev.py bench --sse --subscribers 500 --web 2

On the benchmark's own PostgreSQL and Valkey (as bench/engine.py's): `--web` uvicorn processes started as the
run command starts them, one Celery worker, and this driver. The task is created first; `--subscribers`
connections (spread over the web processes) open its stream and get the snapshot; then the worker starts and
runs the task with one progress event per step (progress_event_seconds 0), so every step is an event to deliver.
Each subscriber reads until `terminal`.

Printed: delivery latency from the event's commit (TaskEvent.at, the database's clock; driver and database share
this host's clock) to its arrival at each subscriber, p50/p95/p99/max over every (event, subscriber); events
missing at a subscriber (must be 0); the web processes' CPU per delivered event and their resident memory before,
at most and after; PostgreSQL's CPU over the run (the streams must not read it per event); the driver's own CPU.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "deploy"))

import psutil  # noqa: E402

from bench.engine import BENCH_DB, Fleet, Services, pct  # noqa: E402
from bench.web_load import WebProcesses  # noqa: E402


class Subscriber:
    """One SSE connection: the arrival time of every event, by seq."""

    def __init__(self, host: str, port: int, token: str, task_id: str):
        self.host, self.port, self.token, self.task_id = host, port, token, task_id
        self.arrivals: dict[int, float] = {}
        self.snapshot_seq: int | None = None
        self.connected = asyncio.Event()
        self.ended = False
        self.error: str | None = None

    async def run(self) -> None:
        try:
            reader, writer = await asyncio.open_connection(self.host, self.port)
            writer.write((f"GET /runtime/tasks/{self.task_id}/events HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
                          f"Authorization: Bearer {self.token}\r\nAccept: text/event-stream\r\n\r\n").encode())
            await writer.drain()
            status = await reader.readline()
            if b" 200 " not in status:
                raise RuntimeError(status.decode().strip())
            while (await reader.readline()) not in (b"\r\n", b""):
                pass  # headers
            chunked_body = _Dechunk(reader)
            event: dict = {}
            while True:
                line = await chunked_body.readline()
                if line is None:
                    break
                if line == "":
                    if "id" in event:
                        seq = int(event["id"])
                        if event.get("event") == "task.snapshot":
                            self.snapshot_seq = seq
                            self.connected.set()
                        else:
                            self.arrivals[seq] = time.time()
                        if event.get("event") == "terminal":
                            self.ended = True
                            break
                    event = {}
                elif not line.startswith(":"):
                    name, _, value = line.partition(": ")
                    event[name] = value
            writer.close()
        except Exception as error:  # reported, never hidden
            self.error = f"{type(error).__name__}: {error}"
            self.connected.set()


class _Dechunk:
    """Lines of a chunked HTTP body."""

    def __init__(self, reader: asyncio.StreamReader):
        self.reader, self.buffer = reader, ""

    async def readline(self) -> str | None:
        while "\n" not in self.buffer:
            size_line = await self.reader.readline()
            if not size_line:
                return None
            size = int(size_line.strip() or b"0", 16)
            if size == 0:
                return None
            data = await self.reader.readexactly(size + 2)
            self.buffer += data[:-2].decode()
        line, self.buffer = self.buffer.split("\n", 1)
        return line


class MemorySampler(threading.Thread):
    def __init__(self, pids: list[int]):
        super().__init__(daemon=True)
        self.pids, self.peak, self.running = pids, 0, True

    def rss(self) -> int:
        total = 0
        for pid in self.pids:
            try:
                total += psutil.Process(pid).memory_info().rss
            except psutil.Error:
                pass
        return total

    def run(self) -> None:
        while self.running:
            self.peak = max(self.peak, self.rss())
            time.sleep(0.1)


async def subscribe_all(targets, token: str, task_id: str, count: int) -> tuple[list[Subscriber], list]:
    subscribers = [Subscriber(*targets[i % len(targets)], token, task_id) for i in range(count)]
    tasks = []
    for subscriber in subscribers:  # a few at a time, as clients arrive
        tasks.append(asyncio.create_task(subscriber.run()))
        await asyncio.sleep(0.002)
    await asyncio.wait_for(asyncio.gather(*(s.connected.wait() for s in subscribers)), 60)
    return subscribers, tasks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--subscribers", type=int, default=200)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--sleep-ms", type=int, default=25, help="what each step waits (one event per step)")
    parser.add_argument("--web", type=int, default=1, help="web processes (uvicorn, one process each)")
    args = parser.parse_args()
    services = Services()
    started = dt.datetime.now(dt.UTC)
    web = fleet = sampler = None
    try:
        services.start()
        env = dict(os.environ)
        env.update(DATABASE_URL=services.admin_url(BENCH_DB), REDIS_URL=services.broker_url(0),
                   EXTERNAL_ROOT=str(services.scratch / "external"), MEDIA_ROOT=str(services.scratch / "media"),
                   DJANGO_SETTINGS_MODULE="config.settings", DB_CONN_MAX_AGE="600", LOG_LEVEL="WARNING",
                   DEBUG="false", ALLOWED_HOSTS="127.0.0.1,localhost", RUNTIME_PROGRESS_EVENT_SECONDS="0")
        os.environ.update(env)
        subprocess.run([sys.executable, "manage.py", "migrate", "-v", "0"], cwd=ROOT, env=env, check=True)
        import django

        django.setup()
        import redis
        from django.contrib.auth import get_user_model

        from tasks_app.models import TaskEvent, TenantMembership
        from tasks_app.services import api_token_create, task_create, tenant_get_or_create

        tenant = tenant_get_or_create(slug="bench")
        user = get_user_model().objects.create_user("bench")
        TenantMembership.objects.create(user=user, tenant=tenant)
        _, token = api_token_create(tenant=tenant, user=user, name="bench")
        web = WebProcesses(args.web, env, services.scratch)
        web.start()
        targets = [("127.0.0.1", port) for port in web.ports]
        task = task_create(tenant=tenant, owner=None, workflow="demo_steps",
                           input={"steps": args.steps, "sleep_ms": args.sleep_ms}).task
        web_pids = [process.pid for process in web.processes]
        sampler = MemorySampler(web_pids)
        rss_before = sampler.rss()
        sampler.start()
        postmaster = psutil.Process(services.postmaster_pid())
        from bench.stats import process_tree_cpu_s

        loop = asyncio.new_event_loop()
        subscribers, readers = loop.run_until_complete(subscribe_all(targets, token, str(task.id),
                                                                     args.subscribers))
        rss_connected = sampler.rss()
        web_cpu0, pg_cpu0 = web.cpu_s(), process_tree_cpu_s(postmaster, reaped=True)
        driver0 = resource.getrusage(resource.RUSAGE_SELF)
        run_started = time.monotonic()
        fleet = Fleet([sys.executable, "-m", "celery", "-A", "config", "worker"], env, services.scratch,
                      redis.Redis.from_url(env["REDIS_URL"]), count=1, concurrency=1)
        fleet.start()
        loop.run_until_complete(asyncio.wait_for(asyncio.gather(*readers), args.steps * 2 + 120))
        elapsed = time.monotonic() - run_started
        web_cpu, pg_cpu = web.cpu_s() - web_cpu0, process_tree_cpu_s(postmaster, reaped=True) - pg_cpu0
        driver = resource.getrusage(resource.RUSAGE_SELF)
        driver_cpu = driver.ru_utime + driver.ru_stime - driver0.ru_utime - driver0.ru_stime
        sampler.running = False
        rss_after = sampler.rss()

        committed = {seq: at.timestamp() for seq, at in TaskEvent.objects.filter(
            task=task).values_list("seq", "at")}
        latencies, missing, errors = [], 0, [s.error for s in subscribers if s.error]
        for subscriber in subscribers:
            expected = [seq for seq in committed if seq > (subscriber.snapshot_seq or 0)]
            missing += sum(1 for seq in expected if seq not in subscriber.arrivals)
            latencies += [(subscriber.arrivals[seq] - committed[seq]) * 1000 for seq in expected
                          if seq in subscriber.arrivals]
        delivered = len(latencies)
        latencies.sort()
        finished = dt.datetime.now(dt.UTC)
        result = {
            "subscribers": args.subscribers, "web_processes": args.web, "events": len(committed),
            "delivered": delivered, "missing": missing, "errors": errors[:5], "ended": sum(s.ended for s in
                                                                                           subscribers),
            "elapsed_s": round(elapsed, 1),
            "latency_ms": {"p50": round(pct(latencies, 0.50), 1), "p95": round(pct(latencies, 0.95), 1),
                           "p99": round(pct(latencies, 0.99), 1),
                           "max": round(latencies[-1], 1) if latencies else None},
            "web_cpu_s": round(web_cpu, 2), "web_cpu_us_per_delivery": round(web_cpu / delivered * 1e6, 1)
            if delivered else None,
            "web_rss_mb": {"before": round(rss_before / 2**20, 1), "connected": round(rss_connected / 2**20, 1),
                           "peak": round(sampler.peak / 2**20, 1), "after": round(rss_after / 2**20, 1)},
            "postgres_cpu_s": round(pg_cpu, 2), "driver_cpu_s": round(driver_cpu, 2),
        }
        print(f"\n{started:%Y-%m-%d %H:%M}–{finished:%H:%M} UTC · SSE · {args.subscribers} subscribers on one task · "
              f"{args.web} web process(es) · {args.steps} steps of {args.sleep_ms} ms, one event each\n")
        print(f"  events delivered       {delivered:,} ({len(committed)} events × subscribers; missing {missing}; "
              f"streams ended after terminal {result['ended']}/{args.subscribers})")
        print(f"  commit → client ms     p50 {result['latency_ms']['p50']}  p95 {result['latency_ms']['p95']}  "
              f"p99 {result['latency_ms']['p99']}  max {result['latency_ms']['max']}")
        print(f"  web CPU                {web_cpu:.2f} s ({result['web_cpu_us_per_delivery']} µs per delivered event)")
        print(f"  web memory (RSS)       {result['web_rss_mb']}")
        print(f"  PostgreSQL CPU         {pg_cpu:.2f} s over {elapsed:.1f} s (the worker's commits; streams read none)")
        print(f"  driver CPU             {driver_cpu:.2f} s")
        if errors:
            print(f"  errors                 {errors[:5]}")
        print(json.dumps({"scenario": "sse", "started": started.isoformat(timespec="seconds"), "args": vars(args),
                          "result": result}))
    finally:
        if sampler is not None:
            sampler.running = False
        if fleet is not None:
            fleet.kill()
        if web is not None:
            web.stop()
        from django.db import connections

        connections.close_all()
        services.stop()


if __name__ == "__main__":
    main()
