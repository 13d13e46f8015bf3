"""Load benchmark of the HTTP surface: snapshots, lists and creates from many clients while workers are busy.

    python3.11 deploy/dev.py bench --http                      # 1,000 then 1,000,000 stored tasks
    python3.11 deploy/dev.py bench --http --stored 1000 --duration 10    # a quick look

The stack runs on the benchmark's own PostgreSQL and Valkey (as bench/engine.py's): `--web` uvicorn processes
started as the run command starts them (config.asgi, so each has its bounded connection pool), 2 Celery workers
× 4 kept busy by `--busy` demo tasks in flight whose steps each wait `--busy-sleep-ms` (agent steps mostly wait
on tools and models), and this driver. For each number of stored tasks (seeded with `bench/seed_tasks.py`,
terminal tasks with their events, into the token's tenant so lists page over all of them):

- open loop: N clients, each on its own keep-alive connection, polling one task's snapshot once a second at a
  random phase, for `--duration` seconds. Latency is measured from when the request was due, so a stalled
  server cannot hide its queue (no coordinated omission);
- closed loop: `--closed-clients` connections sending back to back, for the snapshot, the list (first page of
  50) and the create: the most requests per second a web process answers;
- overload: `--overload-clients` connections sending list requests back to back, far past what the process
  answers within its pool timeout: it must queue, then refuse with 503 and Retry-After — no 500, no connection
  beyond its pools.

Reported per phase: requests/s, latency p50/p95/p99, errors by status, the most database connections the web
processes held at once (sampled every 0.1 s, as their own role), and the CPU per request of the web processes,
of the whole PostgreSQL server and of this driver, with the web role's statements per request.

The driver is a small asyncio HTTP/1.1 client (a request line, a few headers, Content-Length or chunked
bodies): on a 2-core machine a load tool's own CPU competes with the server, so it does no more per request than
it must. Its CPU is printed with the results (figures: docs/performance.md).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import random
import resource
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "deploy"))

import psutil  # noqa: E402
from dev import web_command  # noqa: E402

from bench.engine import BENCH_DB, Fleet, Services, free_port, pct  # noqa: E402
from bench.stats import process_tree_cpu_s  # noqa: E402

WEB_ROLE = "bench_web"
SNAPSHOT_IDS = 5_000  # snapshot targets: the busy tasks and up to this many stored ones


# -- the driver ---------------------------------------------------------------------------------------------------
class HttpConnection:
    """One keep-alive HTTP/1.1 connection, one request at a time (as a polling client uses one)."""

    def __init__(self, host: str, port: int, token: str):
        self.host, self.port = host, port
        self.headers = (f"Host: {host}:{port}\r\nAuthorization: Bearer {token}\r\n"
                        f"Accept: application/json, text/event-stream\r\n")  # (the MCP endpoint wants both)
        self.reader = self.writer = None

    async def _open(self) -> None:
        self.reader, self.writer = await asyncio.open_connection(self.host, self.port)

    async def request(self, method: str, path: str, body: bytes = b"", headers: str = "") -> int:
        if self.writer is None:
            await self._open()
        head = f"{method} {path} HTTP/1.1\r\n{self.headers}{headers}"
        if body:
            head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        try:
            self.writer.write(head.encode() + b"\r\n" + body)
            return await self._response()
        except (ConnectionError, asyncio.IncompleteReadError):
            self.close()
            return 599  # the connection failed: counted as an error

    async def _response(self) -> int:
        header = await self.reader.readuntil(b"\r\n\r\n")
        lines = header.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        fields = {name.strip().lower(): value.strip() for name, _, value in
                  (line.partition(":") for line in lines[1:] if line)}
        if "content-length" in fields:
            await self.reader.readexactly(int(fields["content-length"]))
        elif fields.get("transfer-encoding", "").lower() == "chunked":
            while True:
                size = int((await self.reader.readuntil(b"\r\n")).split(b";")[0], 16)
                await self.reader.readexactly(size + 2)
                if size == 0:
                    break
        if fields.get("connection", "").lower() == "close":
            self.close()
        return status

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


class Recorder:
    def __init__(self) -> None:
        self.latencies_ms: list[float] = []
        self.statuses: Counter = Counter()

    def add(self, status: int, latency_s: float) -> None:
        self.statuses[status] += 1
        self.latencies_ms.append(latency_s * 1000)

    def summary(self, duration_s: float) -> dict:
        errors = {str(code): n for code, n in sorted(self.statuses.items()) if code >= 400}
        return {"requests": len(self.latencies_ms), "requests_per_s": round(len(self.latencies_ms) / duration_s, 1),
                "p50_ms": round(pct(self.latencies_ms, 0.50), 2), "p95_ms": round(pct(self.latencies_ms, 0.95), 2),
                "p99_ms": round(pct(self.latencies_ms, 0.99), 2), "max_ms": round(max(self.latencies_ms, default=0), 1),
                "errors": errors}


async def open_loop(targets: list[tuple[str, int]], token: str, ids: list[str], clients: int,
                    duration: float) -> Recorder:
    """`clients` pollers, each once a second on its own connection; latency counted from when the poll was due."""
    recorder = Recorder()
    loop = asyncio.get_running_loop()
    start = loop.time() + 1.0  # connections are opened in the first second

    async def poller(n: int) -> None:
        host, port = targets[n % len(targets)]
        connection = HttpConnection(host, port, token)
        path = f"/runtime/tasks/{ids[n % len(ids)]}"
        due = start + random.random()
        while due < start + duration:
            await asyncio.sleep(max(0.0, due - loop.time()))
            status = await connection.request("GET", path)
            recorder.add(status, loop.time() - due)
            due += 1.0
        connection.close()

    await asyncio.gather(*(poller(n) for n in range(clients)))
    return recorder


async def closed_loop(targets: list[tuple[str, int]], token: str, request, clients: int,
                      duration: float) -> Recorder:
    """`clients` connections, each sending its next request as soon as the last one is answered."""
    recorder = Recorder()
    loop = asyncio.get_running_loop()
    end = loop.time() + duration

    async def client(n: int) -> None:
        host, port = targets[n % len(targets)]
        connection = HttpConnection(host, port, token)
        while loop.time() < end:
            method, path, body, *headers = request()
            sent = loop.time()
            status = await connection.request(method, path, body, *headers)
            recorder.add(status, loop.time() - sent)
        connection.close()

    await asyncio.gather(*(client(n) for n in range(clients)))
    return recorder


# -- the stack ----------------------------------------------------------------------------------------------------
class WebProcesses:
    def __init__(self, count: int, env: dict, logs: Path):
        self.ports = [free_port() for _ in range(count)]
        self.env, self.logs, self.processes = env, logs, []

    def start(self) -> None:
        for port in self.ports:
            log = open(self.logs / f"web-{port}.log", "ab")
            self.processes.append(subprocess.Popen(  # as the run command starts them, one process per port
                web_command(sys.executable, "127.0.0.1", port, 1), env=self.env, cwd=ROOT, stdout=log,
                stderr=subprocess.STDOUT))
        import urllib.request

        deadline = time.monotonic() + 60
        for port in self.ports:
            while True:
                try:
                    urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1)
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise SystemExit(f"the web process on {port} did not start: see {self.logs}") from None
                    time.sleep(0.2)

    def cpu_s(self) -> float:
        total = 0.0
        for process in self.processes:
            try:
                times = psutil.Process(process.pid).cpu_times()
                total += times.user + times.system
            except psutil.Error:
                continue
        return total

    def stop(self) -> None:
        for process in self.processes:
            process.terminate()
        for process in self.processes:
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()


class BusyWorkers:
    """2 workers × 4 with `busy` long demo tasks in flight, topped up as they finish."""

    def __init__(self, services: Services, env: dict, tenant, busy: int, sleep_ms: int):
        import redis

        self.fleet = Fleet([sys.executable, "-m", "celery", "-A", "config", "worker"], env, services.scratch,
                           redis.Redis.from_url(env["REDIS_URL"]), count=2, concurrency=4)
        self.tenant, self.busy, self.sleep_ms = tenant, busy, sleep_ms
        self.ids: list[str] = []

    def start(self) -> None:
        from tasks_app.services import task_create

        self.fleet.start()
        for _ in range(self.busy):  # long enough to outlast the run: 100,000 steps of sleep_ms each
            self.ids.append(str(task_create(tenant=self.tenant, owner=None, workflow="demo_steps", input={
                "steps": 100_000, "sleep_ms": self.sleep_ms, "effect": True}).task.id))

    def stop(self) -> None:
        from tasks_app.models import Task

        Task.objects.filter(id__in=self.ids).update(status="cancelled")  # harness clean-up, not the API's cancel
        self.fleet.stop()


class ConnectionSampler(threading.Thread):
    """The most connections the web role held at once, sampled every 0.1 s."""

    def __init__(self, meter_url: str):
        super().__init__(daemon=True)
        import psycopg

        self.conn = psycopg.connect(meter_url, autocommit=True)
        self.peak = 0
        self.running = True

    def run(self) -> None:
        while self.running:
            count = self.conn.execute("SELECT count(*) FROM pg_stat_activity WHERE usename = %s",
                                      [WEB_ROLE]).fetchone()[0]
            self.peak = max(self.peak, count)
            time.sleep(0.1)

    def take_peak(self) -> int:
        peak, self.peak = self.peak, 0
        return peak


def web_statements(meter_conn) -> float:
    return float(meter_conn.execute(
        "SELECT coalesce(sum(calls), 0) FROM pg_stat_statements s JOIN pg_roles r ON r.oid = s.userid "
        "WHERE r.rolname = %s AND s.toplevel", [WEB_ROLE]).fetchone()[0])


def measured(phase, *, web: WebProcesses, sampler: ConnectionSampler, meter_conn, postmaster: psutil.Process,
             duration: float) -> dict:
    sampler.take_peak()
    def counters():
        return (web.cpu_s(), process_tree_cpu_s(postmaster, reaped=True), resource.getrusage(resource.RUSAGE_SELF),
                web_statements(meter_conn))

    before = counters()
    recorder = asyncio.run(phase())
    after = counters()
    result = recorder.summary(duration)
    requests = max(1, result["requests"])
    driver_cpu = (after[2].ru_utime + after[2].ru_stime) - (before[2].ru_utime + before[2].ru_stime)
    result.update(
        peak_web_connections=sampler.take_peak(),
        cpu_ms_per_request_web=round((after[0] - before[0]) * 1000 / requests, 3),
        cpu_ms_per_request_postgres=round((after[1] - before[1]) * 1000 / requests, 3),
        cpu_ms_per_request_driver=round(driver_cpu * 1000 / requests, 3),
        web_statements_per_request=round((after[3] - before[3]) / requests, 2),
    )
    return result


def seed(count: int, tenant_slug: str, observer) -> None:
    from bench.seed_tasks import seed_tasks

    seed_tasks(count=count, tenant=tenant_slug, seed=count, verbose=False)
    for table in ("tasks_app_task", "tasks_app_taskevent", "tasks_app_step"):
        observer.execute(f"VACUUM (FREEZE, ANALYZE) {table}")  # table names are constants


def run_level(args, *, targets, token, ids, web, sampler, meter_conn, postmaster) -> dict:
    def snapshot_request():
        return "GET", f"/runtime/tasks/{random.choice(ids)}", b""

    def list_request():
        return "GET", "/runtime/tasks?limit=50", b""

    create_body = json.dumps({"workflow": "demo_steps", "input": {"steps": 1, "effect": False}}).encode()

    def create_request():
        return "POST", "/runtime/tasks", create_body

    def mcp_tasks_get_request():
        # What an MCP client polling a task sends (2026-07-28, the tasks extension): tasks/get on /mcp.
        task_id = random.choice(ids)
        body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tasks/get", "params": {"taskId": task_id, "_meta": {
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {"extensions": {"io.modelcontextprotocol/tasks": {}}}}}})
        return "POST", "/mcp", body.encode(), (f"MCP-Protocol-Version: 2026-07-28\r\nMcp-Method: tasks/get\r\n"
                                                f"Mcp-Name: {task_id}\r\n")

    common = dict(web=web, sampler=sampler, meter_conn=meter_conn, postmaster=postmaster, duration=args.duration)
    level = {"open_loop": {}, "closed_loop": {}}
    for clients in [int(n) for n in args.clients.split(",")]:
        print(f"[bench] open loop, {clients} clients at 1 Hz", file=sys.stderr, flush=True)
        level["open_loop"][clients] = measured(
            lambda clients=clients: open_loop(targets, token, ids, clients, args.duration), **common)
    for name, request in (("snapshot", snapshot_request), ("MCP tasks/get", mcp_tasks_get_request),
                          ("list", list_request), ("create", create_request)):
        print(f"[bench] closed loop, {name}, {args.closed_clients} connections", file=sys.stderr, flush=True)
        level["closed_loop"][name] = measured(
            lambda request=request: closed_loop(targets, token, request, args.closed_clients, args.duration),
            **common)
    if args.overload_clients:
        # Far more concurrent list requests (the Django path, 8 pooled connections) than a process answers in its
        # pool timeout: what it does then (queue, then 503 with Retry-After) — never a 500, never more connections.
        print(f"[bench] overload, list, {args.overload_clients} connections", file=sys.stderr, flush=True)
        level["closed_loop"][f"list, overload ({args.overload_clients} connections)"] = measured(
            lambda: closed_loop(targets, token, list_request, args.overload_clients, args.duration), **common)
    return level


def table(levels: dict, web_count: int) -> str:
    lines = ["| stored | load | req/s | p50 ms | p95 ms | p99 ms | errors | peak web DB connections | "
             "CPU ms/req web | CPU ms/req PostgreSQL | statements/req | CPU ms/req driver |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for stored, level in levels.items():
        rows = [(f"open loop, {clients} clients × 1 Hz, snapshot", r) for clients, r in level["open_loop"].items()]
        rows += [(f"closed loop, {name}" + (f" (per web process: {r['requests_per_s'] / web_count:,.0f}/s)"
                                            if web_count > 1 else ""), r)
                 for name, r in level["closed_loop"].items()]
        for label, r in rows:
            errors = ", ".join(f"{n}× {code}" for code, n in r["errors"].items()) or "0"
            lines.append(f"| {stored:,} | {label} | {r['requests_per_s']:,} | {r['p50_ms']} | {r['p95_ms']} | "
                         f"{r['p99_ms']} | {errors} | {r['peak_web_connections']} | {r['cpu_ms_per_request_web']} | "
                         f"{r['cpu_ms_per_request_postgres']} | {r['web_statements_per_request']} | "
                         f"{r['cpu_ms_per_request_driver']} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stored", default="1000,1000000", help="stored tasks per level, comma-separated, rising")
    parser.add_argument("--clients", default="50,500", help="open loop: clients polling once a second")
    parser.add_argument("--closed-clients", type=int, default=16, help="closed loop: connections")
    parser.add_argument("--duration", type=float, default=20, help="seconds per phase")
    parser.add_argument("--overload-clients", type=int, default=1000,
                        help="overload: connections sending list requests back to back (0: skip)")
    parser.add_argument("--web", type=int, default=1, help="web processes (uvicorn, one process each)")
    parser.add_argument("--busy", type=int, default=8, help="demo tasks kept in flight on the workers")
    parser.add_argument("--busy-sleep-ms", type=int, default=50, help="what each of their steps waits")
    args = parser.parse_args()
    services = Services()
    started = dt.datetime.now(dt.UTC)
    web = workers = sampler = None
    try:
        services.start()
        import psycopg

        with psycopg.connect(services.admin_url("postgres"), autocommit=True) as conn:
            conn.execute(f"CREATE ROLE {WEB_ROLE} SUPERUSER LOGIN")  # its own role: its statements and connections
        env = dict(os.environ)
        env.update(DATABASE_URL=services.admin_url(BENCH_DB), REDIS_URL=services.broker_url(0),
                   EXTERNAL_ROOT=str(services.scratch / "external"), MEDIA_ROOT=str(services.scratch / "media"),
                   DJANGO_SETTINGS_MODULE="config.settings", DB_CONN_MAX_AGE="600", LOG_LEVEL="WARNING",
                   DEBUG="false", ALLOWED_HOSTS="127.0.0.1,localhost")
        os.environ.update(env)
        subprocess.run([sys.executable, "manage.py", "migrate", "-v", "0"], cwd=ROOT, env=env, check=True)
        import django

        django.setup()
        from django.contrib.auth import get_user_model

        from tasks_app.models import Task, TenantMembership
        from tasks_app.services import api_token_create, tenant_get_or_create

        tenant = tenant_get_or_create(slug="bench")
        user = get_user_model().objects.create_user("bench")
        TenantMembership.objects.create(user=user, tenant=tenant)
        _, token = api_token_create(tenant=tenant, user=user, name="bench")

        # Rate limits off: the bench measures what the server can do, from one token (docs/quotas.md).
        web_env = {**env, "DATABASE_URL": f"postgres://{WEB_ROLE}@127.0.0.1:{services.pg.port}/{BENCH_DB}",
                   "RATE_LIMIT_CREATE": "off", "RATE_LIMIT_STEER": "off",
                   "RATE_LIMIT_TENANT_CREATE": "off", "RATE_LIMIT_TENANT_STEER": "off"}
        web = WebProcesses(args.web, web_env, services.scratch)
        web.start()
        workers = BusyWorkers(services, env, tenant, args.busy, args.busy_sleep_ms)
        workers.start()
        meter_conn = psycopg.connect(services.meter_url(), autocommit=True)
        bench_conn = psycopg.connect(services.admin_url(BENCH_DB), autocommit=True)  # VACUUM after seeding
        sampler = ConnectionSampler(services.meter_url())
        sampler.start()
        postmaster = psutil.Process(services.postmaster_pid())
        targets = [("127.0.0.1", port) for port in web.ports]
        levels, seeded = {}, 0
        for stored in [int(n) for n in args.stored.split(",")]:
            if stored > seeded:
                print(f"[bench] seeding {stored - seeded:,} stored tasks", file=sys.stderr, flush=True)
                seed(stored - seeded, "bench", bench_conn)
                seeded = stored
            ids = workers.ids + [str(i) for i in Task.objects.filter(tenant=tenant).exclude(
                id__in=workers.ids).order_by("?").values_list("id", flat=True)[:SNAPSHOT_IDS]]
            levels[stored] = run_level(args, targets=targets, token=token, ids=ids, web=web, sampler=sampler,
                                       meter_conn=meter_conn, postmaster=postmaster)
        finished = dt.datetime.now(dt.UTC)
        print(f"\n{started:%Y-%m-%d %H:%M}–{finished:%H:%M} UTC · HTTP · {args.web} web process(es) · 2 workers × 4 "
              f"busy with {args.busy} tasks ({args.busy_sleep_ms} ms steps) · {args.duration:g} s per phase · "
              f"closed loop {args.closed_clients} connections\n")
        print(table(levels, args.web))
        print(json.dumps({"scenario": "http", "started": started.isoformat(timespec="seconds"), "args": vars(args),
                          "levels": levels}))
    finally:
        if sampler is not None:
            sampler.running = False
        if workers is not None:
            workers.stop()
        if web is not None:
            web.stop()
        from django.db import connections

        connections.close_all()
        services.stop()


if __name__ == "__main__":
    main()
