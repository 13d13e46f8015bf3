"""What a downstream MCP tool call (ctx.tool) costs over a bare ctx.effect, interleaved in one run.

    python3.11 deploy/dev.py bench --tools [--tasks 20] [--steps 20] [--repeat 3] [--systems bare,effects,tools]
                                           [--micro 200] [--settle 10.5]

On the benchmark's own PostgreSQL 18 and Valkey in a scratch folder, with 2 workers × 4 prefork processes, as
bench/engine.py runs them (its Services and Fleet), three workflows of identical steps (bench/tool_workflows), one
call per step:

- bare: ctx.effect whose function returns at once (the ledger's floor);
- effects: ctx.effect whose function POSTs to a trivial local HTTP server (bench/http_endpoint.py, uvicorn as the
  tool server) on a fresh connection: the ledger and one network round trip;
- tools: ctx.tool("bench", "upsert", …) against examples/tool_server.py through the gateway
  (agents_app.gateway.call.tool_call).

Per repeat and system, after a warm-up: `tasks` × `steps` created at once while the workers run, then one task of
`steps` alone (the unloaded latency). Per call: calls/s (first create → last completion, the database's clock),
the step's duration p50/p95 (Step.started_at → finished_at: the ledger's commits, the call and the step's commit),
statements, commits, WAL and tuples (bench/stats.py), Valkey commands, and CPU by process group — the workers, the
whole PostgreSQL server (exited backends too), the called server (tool server or HTTP endpoint), Valkey. The table
is median [min–max] over the repeats; the ratios are of medians of the same run. The statements and the WAL of the
last repeat's window are listed per system (pg_stat_statements is reset at the start of every window).

`--micro N` (0: skip) then times the parts of one tool call in this process, N times each, against the same
servers: the SDK call as the gateway makes it and its phases (a fresh event loop, the HTTP client and its SSL
context, the negotiation round trip, tools/list, tools/call), the same with the negotiated version pinned (no
discovery round trip), pinned with one SSL context per process, and on one session kept open, the effect's plain
HTTP POST, and each check of the gateway (the database reads, the policy,
the host check, the arguments' schema, the Redis limits, the effect's thread hand-off). Figures: docs/performance.md.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import platform
import signal
import ssl
import statistics
import subprocess
import sys
import time
import types
import urllib.error
import urllib.request
import uuid
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "deploy"))

import psutil  # noqa: E402

from bench.engine import BENCH_DB, RUNTIME_BROKER_DB, Fleet, Services, django_env, free_port, pct  # noqa: E402
from bench.stats import Counters, Meter, process_tree_cpu_s  # noqa: E402

WORKFLOWS = {"bare": "bench_bare", "effects": "bench_effects", "tools": "bench_tools"}
TOOL_SERVER = "bench"  # bench/tool_workflows/workflows.py calls it by this name
TENANT = "bench"
WARM_UP_TASKS, WARM_UP_STEPS = 16, 2  # every prefork child imports, connects and makes its first call before
TERMINAL = ["completed", "failed", "dead_lettered", "cancelled"]


class Remote:
    """A server process the steps call (the tool server or the HTTP endpoint), on a free port of 127.0.0.1."""

    def __init__(self, name: str, command: list[str], scratch: Path, path: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}{path}"
        self.output = scratch / f"{name}.out"
        self.process = subprocess.Popen([*command, "--port", str(self.port)], cwd=ROOT, stdout=self.output.open("w"),
                                        stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 30
        while True:
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"{name} did not start: {self.output.read_text()[-2000:]}")
            try:
                urllib.request.urlopen(self.url, timeout=2).close()
                break
            except urllib.error.HTTPError:
                break  # any HTTP answer means it serves
            except OSError:
                time.sleep(0.05)
        self.psutil = psutil.Process(self.process.pid)

    def cpu_s(self) -> float:
        return process_tree_cpu_s(self.psutil, reaped=False)

    def stop(self) -> None:
        try:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(timeout=10)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


class Bench:
    """The tenant, its tool server row and policy, the workers, the two called servers, and one run per system."""

    def __init__(self, services: Services, env: dict, meter: Meter, *, workers: int, concurrency: int, settle: float,
                 endpoint: bool = True):
        import psycopg
        import redis

        from agents_app.models import TenantToolPolicy, ToolServer
        from agents_app.services import tool_server_add
        from tasks_app.services import tenant_get_or_create

        self.services, self.meter, self.settle_s = services, meter, settle
        self.observer = psycopg.connect(services.meter_url(BENCH_DB), autocommit=True)
        self.tool_log = services.scratch / "tool-server.calls.jsonl"
        self.tool_server = Remote("tool-server", [sys.executable, str(ROOT / "examples" / "tool_server.py"), "--log",
                                                  str(self.tool_log)], services.scratch, "/mcp")
        self.endpoint = Remote("http-endpoint", [sys.executable, str(ROOT / "bench" / "http_endpoint.py")],
                               services.scratch, "/effect") if endpoint else None
        # The called servers whose CPU each window counts (cost key cpu_<name>_ms); a subclass may add its own.
        self.remotes: dict[str, Remote] = {"tool_server": self.tool_server,
                                           **({"endpoint": self.endpoint} if endpoint else {})}
        self.tenant = tenant_get_or_create(slug=TENANT)
        # A tenant with a policy of its own (the costlier read: both layers decide, and its hosts narrow the
        # deployment's), the server's limits high enough never to refuse a call of the benchmark.
        TenantToolPolicy.objects.update_or_create(tenant=self.tenant, defaults={
            "allow": [f"{TOOL_SERVER}.*"], "allowed_hosts": ["127.0.0.1"]})
        self.server = tool_server_add(tenant_slug=TENANT, name=TOOL_SERVER, url=self.tool_server.url, actor="bench",
                                      timeout_seconds=30)
        ToolServer.objects.filter(id=self.server.id).update(max_concurrent_calls=workers * concurrency,
                                                            rate_per_minute=10_000)
        self.server.refresh_from_db()
        self.redis = redis.Redis.from_url(services.broker_url(RUNTIME_BROKER_DB))
        self.fleet = Fleet([sys.executable, "-m", "celery", "-A", "config", "worker"], env, services.scratch,
                           self.redis, count=workers, concurrency=concurrency)

    # -- tasks ------------------------------------------------------------------------------------------------------
    def create(self, system: str, n: int, steps: int) -> list:
        from tasks_app.services import task_create

        payload = {"steps": steps, **({"url": self.endpoint.url} if system == "effects" else {})}
        return [task_create(tenant=self.tenant, owner=None, workflow=WORKFLOWS[system], input=payload).task.id
                for _ in range(n)]

    def wait(self, ids: list, timeout: float = 900) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.observer.execute("SELECT count(*) FROM tasks_app_task WHERE id = ANY(%s) AND NOT status = "
                                         "ANY(%s)", [ids, TERMINAL]).fetchone()[0]:
                return
            time.sleep(0.05)
        raise SystemExit("benchmark tasks did not finish in time")

    def outcome(self, ids: list) -> dict:
        """The tasks' statuses and times, their committed steps' durations (all, and by step name with the plan
        position), the attempts that failed, and the gateway's own timing of each call."""
        rows = self.observer.execute("SELECT status, created_at, completed_at FROM tasks_app_task WHERE id = ANY(%s)",
                                     [ids]).fetchall()
        steps = self.observer.execute(
            "SELECT extract(epoch FROM finished_at - started_at) * 1000, attempt, name, step_index FROM tasks_app_step "
            "WHERE task_id = ANY(%s) AND status = 'committed'", [ids]).fetchall()
        failed_steps = self.observer.execute("SELECT count(*) FROM tasks_app_step WHERE task_id = ANY(%s) AND status "
                                             "<> 'committed'", [ids]).fetchone()[0]
        done = [row for row in rows if row[0] == "completed"]
        # The gateway's own timing of each call it made (tool.result: the Redis slot and the SDK call, in the worker).
        call_ms = [float(ms) for (ms,) in self.observer.execute(
            "SELECT (data->>'ms')::float FROM tasks_app_taskevent WHERE task_id = ANY(%s) AND type = 'tool.result'",
            [ids]).fetchall()]
        by_name: dict[str, list[float]] = {}
        for ms, _attempt, name, _index in steps:
            by_name.setdefault(name, []).append(float(ms))
        return {"call_ms": sorted(call_ms), "completed": len(done), "not_completed": len(rows) - len(done),
                "statuses": dict(Counter(row[0] for row in rows)),
                "elapsed_s": (max(row[2] for row in done) - min(row[1] for row in rows)).total_seconds()
                if done else float("nan"),
                "step_ms": sorted(float(ms) for ms, *_ in steps),
                "retried_steps": sum(1 for _, attempt, *_ in steps if attempt > 1),
                "step_ms_by_name": {name: sorted(values) for name, values in by_name.items()},
                "steps": [(name, index, float(ms)) for ms, _attempt, name, index in steps],
                "failed_steps": failed_steps}

    def settle(self) -> None:
        time.sleep(self.settle_s)

    # -- one measured window ----------------------------------------------------------------------------------------
    def tools_fresh(self) -> None:
        """The tool list read now (no re-read inside a window) and the limits' rate window emptied (it holds only the
        next window's calls)."""
        from agents_app import limits
        from agents_app.services import tool_server_check

        tool_server_check(server=self.server)
        self.redis.delete(*limits.limit_keys(self.server))

    def remote_cpu_s(self) -> dict[str, float]:
        return {name: remote.cpu_s() for name, remote in self.remotes.items()}

    def window(self, create, units: int) -> dict:
        """Run create() (it makes the tasks and returns their ids) between two snapshots, each after `settle`
        seconds, and wait for the tasks: their ids, the window's counters, its cost per unit (bench/stats.py's, and
        cpu_<name>_ms of each called server), the tool server's applied keys in it, and its statements and WAL per
        unit. pg_stat_statements is reset at the start (its totals are differences anyway)."""
        applied_before = len(self.applied_keys())
        self.meter.worker_pids = self.fleet.pids
        self.settle()
        self.meter.reset()
        before, remote_before = self.meter.snapshot(), self.remote_cpu_s()
        ids = create()
        self.wait(ids)
        self.settle()
        after, remote_after = self.meter.snapshot(), self.remote_cpu_s()
        counters: Counters = after - before
        cost = counters.per(units)
        for name in self.remotes:
            cost[f"cpu_{name}_ms"] = round((remote_after[name] - remote_before[name]) * 1000 / units, 3)
        return {
            "ids": ids, "counters": counters, "cost": cost, "applied": self.applied_keys()[applied_before:],
            "statements": [(round(c / units, 3), toplevel, round(exec_ms, 3), q[:160])
                           for c, toplevel, exec_ms, _plan, q in self.meter.top_statements(limit=40)],
            "wal": [(relation, kind, round(records, 3), round(size, 1))
                    for relation, kind, records, size in self.meter.wal_by_relation(counters, units=units, limit=20)],
        }

    def run(self, system: str, tasks: int, steps: int) -> dict:
        self.wait(self.create(system, WARM_UP_TASKS, WARM_UP_STEPS))
        if system == "tools":
            self.tools_fresh()
        calls = tasks * steps
        window = self.window(lambda: self.create(system, tasks, steps), calls)
        result = self.outcome(window["ids"])
        cost = window["cost"]
        cost["cpu_called_server_ms"] = round(cost["cpu_tool_server_ms"] + cost["cpu_endpoint_ms"], 3)
        cost["cpu_total_ms"] = round(sum(cost[name] for name in ("cpu_workers_ms", "cpu_postgres_ms",
                                                                 "cpu_redis_ms", "cpu_called_server_ms")), 3)
        applied = window["applied"]
        alone = self.create(system, 1, steps)  # unloaded: one task, nothing else running
        self.wait(alone)
        unloaded = self.outcome(alone)
        return {
            "calls": calls, "completed_tasks": result["completed"], "not_completed_tasks": result["not_completed"],
            "retried_steps": result["retried_steps"], "calls_per_s": round(calls / result["elapsed_s"], 1),
            "elapsed_s": round(result["elapsed_s"], 2),
            "step_ms_p50": round(pct(result["step_ms"], 0.5), 2), "step_ms_p95": round(pct(result["step_ms"], 0.95), 2),
            "unloaded_step_ms_p50": round(pct(unloaded["step_ms"], 0.5), 2),
            "unloaded_step_ms_p95": round(pct(unloaded["step_ms"], 0.95), 2),
            # (tools only) the call as the gateway timed it in the worker: the Redis slot and the SDK call
            "tool_call_ms_p50": round(pct(result["call_ms"], 0.5), 2) if result["call_ms"] else None,
            "unloaded_tool_call_ms_p50": round(pct(unloaded["call_ms"], 0.5), 2) if unloaded["call_ms"] else None,
            "tool_calls_applied": len(applied), "tool_calls_applied_twice": len(applied) - len(set(applied)),
            "cost_per_call": cost, "statements_per_call": window["statements"], "wal_per_call": window["wal"],
        }

    def applied_keys(self) -> list[str]:
        """The idempotency keys of the upserts the tool server applied (its call log), in order."""
        if not self.tool_log.exists():
            return []
        lines = [json.loads(line) for line in self.tool_log.read_text().splitlines() if line]
        return [line["idempotency_key_meta"] for line in lines if line["event"] == "applied"]

    def stop(self) -> None:
        self.fleet.stop()
        for remote in self.remotes.values():
            remote.stop()
        self.observer.close()


# -------------------------------------------------------------------------------------------------------------
# The micro-benchmark: one tool call's parts, timed in this process
# -------------------------------------------------------------------------------------------------------------
class Timer:
    """Times `n` runs of an operation: wall ms p50/p95, this process's CPU ms, the called server's CPU ms, and
    Valkey's commands per run (as INFO counts them: a script's inner commands included)."""

    def __init__(self, n: int, redis_client, remote: Remote | None = None):
        self.n, self.redis, self.remote = n, redis_client, remote

    def commands(self) -> int:
        return int(self.redis.info("stats")["total_commands_processed"])

    def __call__(self, label: str, operation, *, warm_up: int = 5, statements: bool = False) -> dict:
        from django.db import connection
        from django.test.utils import CaptureQueriesContext

        for _ in range(warm_up):
            operation()
        counted = None
        if statements:
            with CaptureQueriesContext(connection) as queries:
                operation()
            counted = len(queries.captured_queries)
        walls = []
        commands_before = self.commands()
        cpu_before = time.process_time()
        remote_before = self.remote.cpu_s() if self.remote else 0.0
        for _ in range(self.n):
            started = time.perf_counter()
            operation()
            walls.append((time.perf_counter() - started) * 1000)
        cpu, remote = time.process_time() - cpu_before, (self.remote.cpu_s() - remote_before) if self.remote else None
        commands = self.commands() - commands_before - 1  # (the INFO before it counts)
        row = {"phase": label, "p50_ms": round(pct(walls, 0.5), 3), "p95_ms": round(pct(walls, 0.95), 3),
               "cpu_ms": round(cpu * 1000 / self.n, 3),
               "server_cpu_ms": None if remote is None else round(remote * 1000 / self.n, 3), "statements": counted,
               "valkey_commands": round(commands / self.n, 2)}
        print(f"[bench] micro {row}", file=sys.stderr, flush=True)
        return row


PHASES = ("HTTP client + SDK client made", "entered: transport + negotiation", "tools/list round trip",
          "tools/call round trip", "closed")


def micro(bench: Bench, n: int) -> dict:
    """The parts of one tool call, each timed `n` times in this process against the running servers."""
    import httpx2
    from django.conf import settings
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    from agents_app import limits, mcp_client, policy, selectors
    from agents_app.gateway.call import decide
    from agents_app.gateway.catalogue import (arguments_errors, recorded_result, server_get, task_facts,
                                              tool_calls_made, tool_spec)
    from agents_app.hosts import host_check_for_tenant
    from bench.tool_workflows.workflows import post
    from tasks_app.engine.effects import effect_call
    from tasks_app.redaction import redact_json

    url, server = bench.tool_server.url, bench.server
    arguments = {"key": "k1", "value": "v1"}
    timeout = server.timeout_seconds

    def key() -> str:
        return f"micro:{uuid.uuid4().hex}"  # a new key per call: every upsert applies, as the steps' do

    rows, phases = [], {}
    tool_timer, endpoint_timer = Timer(n, bench.redis, bench.tool_server), Timer(n, bench.redis, bench.endpoint)
    local = Timer(n, bench.redis)

    # The SDK call exactly as the gateway makes it (agents_app.mcp_client: a fresh event loop, HTTP client, SDK
    # client and negotiation per call).
    def sdk_call():
        return mcp_client.run(mcp_client.call(url, "upsert", arguments, token=None, key=key(), timeout=timeout))

    rows.append(tool_timer("MCP call as the gateway makes it (mcp_client.run(call(…)))", sdk_call))
    rows.append(tool_timer("the same in the effect's thread, as a step runs it (effect_call with a timeout)",
                           lambda: effect_call(lambda k: sdk_call(), "k", 95)))

    # The same call taken apart, in variants: what each request costs, and what could be cut.
    async def phased(mode: str, verify, sent: list | None = None) -> tuple[list[float], str]:
        async def record(request):
            try:
                sent.append(json.loads(request.content).get("method"))
            except (ValueError, AttributeError):
                sent.append(f"{request.method} (no JSON body)")

        marks = [time.perf_counter()]
        k = key()
        http = httpx2.AsyncClient(headers=mcp_client._headers(None, k), trust_env=False, follow_redirects=False,
                                  timeout=httpx2.Timeout(timeout, connect=min(timeout, 10)), verify=verify,
                                  event_hooks={"request": [record]} if sent is not None else None)
        client = Client(streamable_http_client(url, http_client=http), mode=mode, read_timeout_seconds=timeout)
        marks.append(time.perf_counter())
        async with http, client:
            marks.append(time.perf_counter())
            # The SDK lists the tools after a call to check its result against the tool's outputSchema (a fresh
            # client has none cached): listed first here, so the two round trips are timed apart.
            await client.session.list_tools()
            marks.append(time.perf_counter())
            await client.call_tool("upsert", arguments, read_timeout_seconds=timeout,
                                   meta={mcp_client.IDEMPOTENCY_META: k})
            marks.append(time.perf_counter())
            version = client.protocol_version
        marks.append(time.perf_counter())
        return [(b - a) * 1000 for a, b in zip(marks, marks[1:])], version

    plain: list[str] = []  # what one call sends, in the gateway's order

    async def record_plain(request):
        plain.append(json.loads(request.content).get("method") if request.content else request.method)

    async def counted_call() -> str:
        http = httpx2.AsyncClient(trust_env=False, timeout=httpx2.Timeout(timeout, connect=10),
                                  event_hooks={"request": [record_plain]})
        async with http, Client(streamable_http_client(url, http_client=http), mode="auto",
                                read_timeout_seconds=timeout) as client:
            await client.call_tool("upsert", arguments, meta={mcp_client.IDEMPOTENCY_META: key()})
            return client.protocol_version

    negotiated = asyncio.run(counted_call())
    shared_ssl = ssl.create_default_context()  # what one SSL context per worker process would be
    variants = [("negotiated per call (auto), a new SSL context per call: as now", "auto", True),
                (f"version pinned ({negotiated}): no server/discover", negotiated, True),
                ("pinned, and one SSL context per process", negotiated, shared_ssl)]
    for label, mode, verify in variants:
        sent: list[str] = []
        try:
            asyncio.run(phased(mode, verify, sent))  # a pin the SDK refuses (a handshake-era version) raises here
        except ValueError as refused:
            phases[label] = {"refused": str(refused)[:200]}
            continue
        split = []

        def one(mode=mode, verify=verify):
            split.append(asyncio.run(phased(mode, verify))[0])

        rows.append(tool_timer(f"MCP call, {label}", one))
        phases[label] = {"requests": sent, **{name: round(statistics.median(part[i] for part in split), 3)
                                              for i, name in enumerate(PHASES)}}

    async def noop():
        return None

    rows.append(local("asyncio.run of nothing (the fresh event loop each call pays)", lambda: asyncio.run(noop())))

    async def client_made_and_closed(verify):
        http = httpx2.AsyncClient(trust_env=False, timeout=httpx2.Timeout(timeout, connect=10), verify=verify)
        await http.aclose()

    rows.append(local("httpx2.AsyncClient made and closed, no request (it builds an SSL context: the CA bundle "
                      "read and parsed)", lambda: asyncio.run(client_made_and_closed(True))))
    rows.append(local("the same given one SSL context made before (verify=context)",
                      lambda: asyncio.run(client_made_and_closed(shared_ssl))))

    async def kept_open(count: int) -> list[float]:
        http = httpx2.AsyncClient(trust_env=False, timeout=httpx2.Timeout(timeout, connect=10))
        times = []
        async with http, Client(streamable_http_client(url, http_client=http), mode="auto",
                                read_timeout_seconds=timeout) as client:
            for _ in range(count):
                started = time.perf_counter()
                await client.call_tool("upsert", arguments, meta={mcp_client.IDEMPOTENCY_META: key()})
                times.append((time.perf_counter() - started) * 1000)
        return times

    cpu_before, remote_before = time.process_time(), bench.tool_server.cpu_s()
    times = asyncio.run(kept_open(n))
    rows.append({"phase": "MCP tools/call on one session kept open (no new loop, client or negotiation)",
                 "p50_ms": round(pct(times, 0.5), 3), "p95_ms": round(pct(times, 0.95), 3),
                 "cpu_ms": round((time.process_time() - cpu_before) * 1000 / n, 3),
                 "server_cpu_ms": round((bench.tool_server.cpu_s() - remote_before) * 1000 / n, 3),
                 "statements": None, "valkey_commands": None})
    print(f"[bench] micro {rows[-1]}", file=sys.stderr, flush=True)

    rows.append(endpoint_timer("the effect's HTTP POST (http.client, fresh connection) to the endpoint",
                               lambda: post(bench.endpoint.url, key(), arguments)))

    # -- the gateway's checks, as tool_call runs them -----------------------------------------------------------
    task_id = bench.create("tools", 1, 1)[0]  # (queued: a worker may run it meanwhile; the reads are the same)
    ctx = types.SimpleNamespace(task_id=task_id, step_seq=1, gateway_cache={})
    facts = task_facts(ctx)
    tenant_policy = selectors.tenant_tool_policy_get(tenant_id=facts["tenant_id"])
    spec = tool_spec(server, "upsert")
    config_policy = settings.RUNTIME.tools

    def uncached_facts():
        ctx.gateway_cache.clear()
        task_facts(ctx)

    checks = [
        ("task facts (tenant, task policy; once per step attempt)", uncached_facts),
        ("server row by name", lambda: server_get(tenant_id=facts["tenant_id"], name=TOOL_SERVER)),
        ("ledger: a result already recorded?", lambda: recorded_result(ctx, "bench.upsert:1")),
        ("tenant policy read", lambda: selectors.tenant_tool_policy_get(tenant_id=facts["tenant_id"])),
        ("calls made by the task (max_calls_per_task)", lambda: tool_calls_made(task_id)),
        ("policy decision (three layers, no I/O)", lambda: policy.tool_decision(
            server=TOOL_SERVER, tool="upsert", config_policy=config_policy, tenant_policy=tenant_policy,
            task_policy=facts.get("tool_policy"), calls_made=3, enabled_tools=server.enabled_tools)),
        ("host check (resolve, every address against both lists)", lambda: host_check_for_tenant(
            server.url, config_policy=config_policy, tenant_policy=tenant_policy)),
        ("tool list fresh? (by the database's clock)", lambda: tool_spec(server, "upsert")),
        ("arguments against the inputSchema (validator built per call)",
         lambda: arguments_errors(spec, arguments)),
        ("arguments redacted for the ledger and events", lambda: redact_json(arguments)),
        ("Redis limits: slot taken and released (script, renewer thread)",
         lambda: limits.slot_acquire(server).release()),
        ("effect's thread hand-off (ctx.effect with a timeout)", lambda: effect_call(lambda k: k, "k", 95)),
    ]
    for label, operation in checks:
        rows.append(local(label, operation, statements=True))
    ctx.gateway_cache.clear()
    rows.append(local("decide() whole: tenant policy, calls made, decision, host check",
                      lambda: decide(ctx, facts, server, "upsert"), statements=True))
    return {"n": n, "negotiated_version": negotiated, "requests_per_call": plain, "rows": rows, "phases": phases}


# -------------------------------------------------------------------------------------------------------------
# Report
# -------------------------------------------------------------------------------------------------------------
FIGURES = [
    ("calls/s (tasks at once on the workers)", ("calls_per_s",), False),
    ("step ms p50 (loaded)", ("step_ms_p50",), True),
    ("step ms p95 (loaded)", ("step_ms_p95",), True),
    ("step ms p50 (one task alone)", ("unloaded_step_ms_p50",), True),
    ("of which the call, as the gateway timed it (one task alone)", ("unloaded_tool_call_ms_p50",), True),
    ("statements/call", ("cost_per_call", "statements"), True),
    ("commits/call", ("cost_per_call", "commits"), True),
    ("WAL bytes/call", ("cost_per_call", "wal_bytes"), True),
    ("WAL records/call", ("cost_per_call", "wal_records"), True),
    ("tuples written/call", ("cost_per_call", "tuples_written"), True),
    ("Valkey commands/call", ("cost_per_call", "redis_commands"), True),
    ("CPU ms/call: workers", ("cost_per_call", "cpu_workers_ms"), True),
    ("CPU ms/call: PostgreSQL (every backend)", ("cost_per_call", "cpu_postgres_ms"), True),
    ("CPU ms/call: the called server", ("cost_per_call", "cpu_called_server_ms"), True),
    ("CPU ms/call: Valkey", ("cost_per_call", "cpu_redis_ms"), True),
    ("CPU ms/call: all", ("cost_per_call", "cpu_total_ms"), True),
]


def _get(run: dict, path: tuple):
    """The figure at path, None where a system has none."""
    for key in path:
        if not isinstance(run, dict) or key not in run:
            return None
        run = run[key]
    return run


def _fmt(value: float) -> str:
    return f"{value:,.2f}".rstrip("0").rstrip(".") if isinstance(value, float) else f"{value:,}"


def table(results: dict[str, list[dict]], figures: list[tuple] | None = None, *,
          ratios: list[tuple[str, str]] | None = None, difference: tuple[str, str] | None = ("tools", "bare"),
          names: dict[str, str] | None = None) -> str:
    """median [min–max] per system; then `difference` (a − b, of the additive figures) and the `ratios` (a / b),
    of the medians of the same run. figures: (label, path in a run's dict, additive?); names: a column's heading
    for a system, where it is not the system's own name."""
    figures = FIGURES if figures is None else figures
    ratios = [(a, b) for a, b in (ratios if ratios is not None else (("tools", "effects"), ("tools", "bare")))
              if a in results and b in results]
    added = difference if difference and all(name in results for name in difference) else None
    label_of = {**{name: name for name in results}, **(names or {})}
    head = ["figure", *(label_of[name] for name in results),
            *([f"{label_of[added[0]]} − {label_of[added[1]]}"] if added else []),
            *(f"{label_of[a]} / {label_of[b]}" for a, b in ratios)]
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for label, path, additive in figures:
        medians, cells = {}, []
        for system in results:
            values = [value for run in results[system] if (value := _get(run, path)) is not None]
            medians[system] = statistics.median(values) if values else None
            cells.append("–" if not values else _fmt(medians[system]) if len(values) == 1 else
                         f"{_fmt(medians[system])} [{_fmt(min(values))}–{_fmt(max(values))}]")
        if added:
            a, b = added
            both = additive and medians[a] is not None and medians[b] is not None
            cells.append(_fmt(round(medians[a] - medians[b], 2)) if both else "–")
        for a, b in ratios:
            cells.append(f"{medians[a] / medians[b]:.2f}×" if medians[a] is not None and medians[b] else "–")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def micro_table(result: dict) -> str:
    lines = ["| phase | p50 ms | p95 ms | CPU ms here | CPU ms called server | statements | Valkey commands |",
             "|---|---|---|---|---|---|---|"]
    for row in result["rows"]:
        lines.append(f"| {row['phase']} | {row['p50_ms']} | {row['p95_ms']} | {row['cpu_ms']} | "
                     f"{'' if row['server_cpu_ms'] is None else row['server_cpu_ms']} | "
                     f"{'' if row['statements'] is None else row['statements']} | "
                     f"{row['valkey_commands'] or ''} |")
    return "\n".join(lines)


def machine() -> dict:
    try:
        model = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                     if line.startswith("model name"))
    except (OSError, StopIteration):
        model = platform.processor()
    return {"cpus": os.cpu_count(), "cpu": model, "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
            "python": platform.python_version(), "kernel": platform.release(), "load_average": os.getloadavg()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=20)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--systems", default="bare,effects,tools", help="of bare, effects, tools; empty: only --micro")
    parser.add_argument("--micro", type=int, default=200, help="times each part of a tool call is timed (0: skip)")
    parser.add_argument("--settle", type=float, default=Meter.SETTLE_SECONDS,
                        help="seconds to wait before each snapshot for PostgreSQL's counters (commits, tuples) to "
                             "settle; statements, WAL and CPU are exact at once (0: for a quick check only)")
    args = parser.parse_args()
    systems = [name for name in args.systems.split(",") if name]
    if unknown := set(systems) - set(WORKFLOWS):
        parser.error(f"unknown systems {sorted(unknown)}: use {', '.join(WORKFLOWS)}")
    services = Services()
    started, facts = dt.datetime.now(dt.UTC), machine()
    bench = None
    try:
        services.start()
        env = django_env(services)
        env["EXTRA_APPS"] = ",".join(filter(None, [env.get("EXTRA_APPS", ""), "bench.tool_workflows"]))
        os.environ.update(env)
        subprocess.run([sys.executable, "manage.py", "migrate", "-v", "0"], cwd=ROOT, env=env, check=True)
        import django

        django.setup()
        import redis

        meter = Meter(admin_url=services.meter_url(), database=BENCH_DB, postmaster_pid=services.postmaster_pid(),
                      redis_client=redis.Redis.from_url(services.broker_url(RUNTIME_BROKER_DB)),
                      redis_pid=services.valkey_pid())
        facts["postgres"] = meter.conn.execute("SHOW server_version").fetchone()[0]
        bench = Bench(services, env, meter, workers=args.workers, concurrency=args.concurrency, settle=args.settle)
        results: dict[str, list[dict]] = {name: [] for name in systems}
        if systems:
            bench.fleet.start()
            for repeat in range(args.repeat):
                for name in systems:
                    print(f"[bench] repeat {repeat + 1}/{args.repeat}: {name}", file=sys.stderr, flush=True)
                    results[name].append(bench.run(name, args.tasks, args.steps))
            bench.fleet.stop()
        micro_result = micro(bench, args.micro) if args.micro else None
        finished = dt.datetime.now(dt.UTC)
        facts["load_average_end"] = os.getloadavg()
        shape = (f"{args.tasks} tasks × {args.steps} steps · {args.workers} workers × {args.concurrency} · "
                 f"{args.repeat} repeats, interleaved · median [min–max]" if systems else "the micro-benchmark only")
        print(f"\n{started:%Y-%m-%d %H:%M}–{finished:%H:%M} UTC · tool calls · {shape} · {facts['cpus']} CPUs "
              f"({facts['cpu']}), {facts['memory_gib']} GiB, PostgreSQL {facts['postgres']}, Python {facts['python']} "
              f"· load average at start "
              f"{' '.join(f'{v:.2f}' for v in facts['load_average'])}\n")
        if systems:
            print(table(results))
            for name in systems:
                last = results[name][-1]
                print(f"\n{name}: statements per call in the last window (calls/call, exec ms, statement)")
                for calls, toplevel, exec_ms, query in last["statements_per_call"]:
                    if calls >= 0.05:
                        print(f"  {calls:7.3f} {exec_ms:8.3f}  {'' if toplevel else '↳ '}{query[:130]}")
                print(f"{name}: WAL per call in the last window, by relation and record kind")
                for relation, kind, records, size in last["wal_per_call"]:
                    if size >= 5:
                        print(f"  {size:8.1f} B {records:6.2f} rec  {relation:<45} {kind}")
        if micro_result:
            sends = ", ".join(micro_result["requests_per_call"])
            print(f"\nOne tool call's parts, {args.micro} times each in one process (protocol "
                  f"{micro_result['negotiated_version']}; one call sends: {sends})\n")
            print(micro_table(micro_result))
            for label, split in micro_result["phases"].items():
                print(f"  phases, {label}: {split}")
        print(json.dumps({"scenario": "tools", "started": started.isoformat(timespec="seconds"),
                          "finished": finished.isoformat(timespec="seconds"), "args": vars(args), "machine": facts,
                          "results": results, "micro": micro_result}))
    finally:
        try:
            if bench is not None:
                bench.stop()
            if "django.db" in sys.modules:
                from django.db import connections

                connections.close_all()
        finally:  # the servers stop however the run ended (a settings error included)
            services.stop()


if __name__ == "__main__":
    main()
