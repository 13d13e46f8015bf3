"""What an agent turn costs the engine — a model answer and the tool call it asked for — against a plain tool call and a
bare effect, interleaved in one run; then 50 agents at once on 2 workers × 4, checked for exactly-once.

    python3.11 deploy/dev.py bench --agents [--tasks 20] [--turns 5,20] [--repeat 3] [--crowd 50]
                                            [--crowd-turns 10] [--alone 40] [--long-turns 100] [--settle 10.5]

On the benchmark's own PostgreSQL 18 and Valkey in a scratch folder, with 2 workers × 4 prefork processes (bench/
engine.py's Services and Fleet), the example MCP tool server (examples/tool_server.py) and the scripted model
(tests/clients/scripted_model.py, an OpenAI-compatible server answering from a script, at once: no delays, usage
given), per repeat and in turn:

- agents-T, for each T in --turns: `tasks` agents (the built-in `agent` workflow) of T turns created at once. Every
  turn but the last is one model answer asking for one tool call (bench.upsert, a key of its own) — a `think` step
  (one streamed Chat Completions call, its message stored) and an `act` step (the call through the gateway); the last
  turn is a plain answer (a `think` step that ends the plan);
- tools: `tasks` × min(T) built-in `mcp_tool` tasks (one bench.upsert each, through the same gateway);
- bare: `tasks` tasks of min(T) steps of bench_bare (bench/tool_workflows: ctx.effect returning at once).

Each is measured as bench/tool_calls.py measures a system (its Bench.window: a warm-up, the counters settled, a
snapshot, the tasks created at once and waited for, settled again, a snapshot): per unit — an agent turn, a tool
call, a bare effect — statements, commits, WAL, tuples, Valkey commands, CPU by process group (the workers, the whole
PostgreSQL server with its exited backends, Valkey, the tool server, the scripted model), units/s (first create →
last completion, the database's clock), each step's duration p50/p95 by step name; then agents (or tasks) one at a
time until --alone units ran, for the unloaded times and CPU. The other jobs on the machine are measured too (its
whole CPU less the bench's processes'). For the agents also: how often the model was asked for each turn (its
request log), the tool effects the tool server applied (its call log), the transcript's reads and writes
(pg_stat_statements), the size of each request sent to the model, the think/act step times and the state deltas by
turn. The ratios T_max / T_min and
a line through the two say how the cost of a turn grows with the agent's length; a think step's model call (llm.chat)
is also timed in this process at turns 1, each T and --long-turns.

crowd: `--crowd` agents of `--crowd-turns` turns created at once on the same workers: every one completes, no step
attempt fails, the model is asked exactly once per turn of each agent, each tool effect is applied exactly once, no
ERROR in the workers' logs; the drain time (first create → last completion) and the cost per turn. Figures:
docs/performance.md, "An agent turn".
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import time
import urllib.request
import uuid
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "deploy"))

from bench.engine import BENCH_DB, RUNTIME_BROKER_DB, Services, django_env, pct  # noqa: E402
from bench.stats import Meter  # noqa: E402
from bench.tool_calls import TOOL_SERVER, WARM_UP_TASKS, Bench, Remote, machine, table  # noqa: E402

MODEL_SCRIPT = ROOT / "tests" / "clients" / "scripted_model.py"
MODEL_NAME = "bench-scripted"
TOOL = "upsert"
FUNCTION = f"{TOOL_SERVER}__{TOOL}"  # the tool's name as the model is shown it (agents_app.agent.function_name)
TRANSCRIPT_READS = 'SELECT %FROM "agents_app_transcriptmessage"%'
TRANSCRIPT_WRITES = 'INSERT INTO "agents_app_transcriptmessage"%'
COST_FIGURES = ("statements", "commits", "wal_bytes", "wal_records", "tuples_written", "redis_commands")
ENGINE_CPU = ("cpu_workers_ms", "cpu_postgres_ms", "cpu_redis_ms")
ALL_CPU = (*ENGINE_CPU, "cpu_tool_server_ms", "cpu_model_ms")


def start_model(scratch: Path) -> Remote:
    """The scripted model on a free port of 127.0.0.1, its request log in the scratch folder."""
    return Remote("scripted-model", [sys.executable, str(MODEL_SCRIPT), "--log", str(scratch / "model.requests.jsonl")],
                  scratch, "/v1/models")


def model_base_url(model: Remote) -> str:
    return model.url.removesuffix("/models")  # …/v1, the base URL an OpenAI client takes


class AgentBench(Bench):
    """bench/tool_calls.py's Bench (tenant, tool server row and policy, workers, windows) with the scripted model as a
    called server of its own, and the three workloads of this benchmark."""

    def __init__(self, services: Services, env: dict, meter: Meter, model: Remote, *, workers: int, concurrency: int,
                 settle: float, warm_up: int, alone: int):
        super().__init__(services, env, meter, workers=workers, concurrency=concurrency, settle=settle,
                         endpoint=False)
        self.model, self.warm_up_tasks, self.alone_units = model, warm_up, alone
        self.model_base = model.url.removesuffix("/v1/models")
        self.model_log = services.scratch / "model.requests.jsonl"
        self.remotes["model"] = model
        self.worker_logs = services.scratch

    # -- the scripted model ------------------------------------------------------------------------------------------
    def _model_call(self, path: str, body: dict) -> dict:
        request = urllib.request.Request(f"{self.model_base}{path}", data=json.dumps(body).encode(), method="POST",
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read())

    def script(self, turns: int, count: int, label: str) -> list[str]:
        """`count` conversations of `turns` turns installed (the model's earlier scripts and in-memory log forgotten:
        its request log file keeps everything); their keys."""
        self._model_call("/_reset", {})
        keys = [f"{label}-{uuid.uuid4().hex[:12]}" for _ in range(count)]
        for key in keys:
            replies = [{"tool_calls": [{"name": FUNCTION, "arguments": {"key": f"{key}-{turn}", "value": f"v{turn}"}}],
                        "usage": {"prompt_tokens": 400 + 150 * turn, "completion_tokens": 30}}
                       for turn in range(turns - 1)]
            replies.append({"content": "Done: every key is set.",
                            "usage": {"prompt_tokens": 400 + 150 * (turns - 1), "completion_tokens": 10}})
            self._model_call("/_scripts", {"key": key, "replies": replies})
        return keys

    def model_log_size(self) -> int:
        return self.model_log.stat().st_size if self.model_log.exists() else 0

    def model_requests(self, since: int, keys: list[str], turns: int) -> dict:
        """What the model's request log says of these conversations from byte `since` on: every turn asked exactly
        once?, errors answered, and the requests' size (the messages sent, as JSON)."""
        wanted = set(keys)
        with self.model_log.open("rb") as log:
            log.seek(since)
            entries = [json.loads(line) for line in log.read().splitlines() if line.strip()]
        unattributed = sum(1 for entry in entries if entry["conversation"] is None)  # (refused: no key in the goal)
        entries = [entry for entry in entries if entry["conversation"] in wanted]
        counts = Counter((entry["conversation"], entry["turn"]) for entry in entries)
        expected = {(key, turn) for key in keys for turn in range(turns)}
        sizes = [len(json.dumps(entry["messages"])) for entry in entries]
        last = [len(json.dumps(entry["messages"])) for entry in entries if entry["turn"] == turns - 1]
        return {"requests": len(entries), "expected": len(expected),
                "turns_not_asked": len(expected - set(counts)),
                "turns_asked_more_than_once": sum(1 for number in counts.values() if number > 1),
                "turns_not_scripted": len(set(counts) - expected),
                "errors_answered": sum(1 for entry in entries if entry["status"] != 200) + unattributed,
                "every_turn_asked_once": set(counts) == expected and all(n == 1 for n in counts.values()),
                "request_kb_mean": round(statistics.mean(sizes) / 1024, 2) if sizes else None,
                "request_kb_last_turn": round(statistics.mean(last) / 1024, 2) if last else None,
                "messages_mean": round(statistics.mean(len(entry["messages"]) for entry in entries), 1)
                if entries else None}

    # -- the workloads -----------------------------------------------------------------------------------------------
    def create_agents(self, keys: list[str], turns: int) -> list:
        from tasks_app.services import task_create

        return [task_create(tenant=self.tenant, owner=None, workflow="agent",
                            input={"goal": f"Set the bench keys ({key}), then say so.", "servers": [TOOL_SERVER],
                                   "maxTurns": turns}).task.id for key in keys]

    def create_tool_tasks(self, n: int) -> list:
        from tasks_app.services import task_create

        label = uuid.uuid4().hex[:12]
        return [task_create(tenant=self.tenant, owner=None, workflow="mcp_tool",
                            input={"server": TOOL_SERVER, "tool": TOOL,
                                   "arguments": {"key": f"tool-{label}-{number}", "value": "v"}}).task.id
                for number in range(n)]

    def warm_up(self, system: str) -> None:
        """Every prefork child imports, connects and makes its first call of this kind before the window."""
        if not self.warm_up_tasks:
            return
        if system == "bare":
            self.wait(self.create("bare", self.warm_up_tasks, 2))
        elif system == "tools":
            self.wait(self.create_tool_tasks(self.warm_up_tasks))
        else:
            self.wait(self.create_agents(self.script(2, self.warm_up_tasks, "warm-up"), 2))

    def worker_log_sizes(self) -> dict[Path, int]:
        return {path: path.stat().st_size for path in self.worker_logs.glob("*worker*.log")}

    def worker_log_errors(self, since: dict[Path, int]) -> list[str]:
        """Lines of the workers' logs written after `since` that report an error."""
        found = []
        for path in self.worker_logs.glob("*worker*.log"):
            with path.open("rb") as log:
                log.seek(since.get(path, 0))
                found += [line.decode(errors="replace")[:300] for line in log.read().splitlines()
                          if b"ERROR" in line or b"Traceback" in line or b"CRITICAL" in line]
        return found

    def measure(self, units: int, create, *, turns: int | None = None, keys: list[str] | None = None,
                applied_expected: int) -> dict:
        """One window of `units` (turns, calls or effects) and what the runs of every system report."""
        log_at, worker_logs_at = self.model_log_size(), self.worker_log_sizes()
        window = self.window(create, units)
        transcript_reads = self.meter.statements_matching(TRANSCRIPT_READS)  # (before anything else runs)
        transcript_writes = self.meter.statements_matching(TRANSCRIPT_WRITES)
        result = self.outcome(window["ids"])
        cost = window["cost"]
        cost["cpu_engine_ms"] = round(sum(cost[name] for name in ENGINE_CPU), 3)
        cost["cpu_total_ms"] = round(sum(cost[name] for name in ALL_CPU), 3)
        # What no group of the bench used: other jobs on the machine (0 on a quiet one, give or take the kernel's own)
        cost["cpu_other_ms"] = round(cost["cpu_machine_ms"] - cost["cpu_total_ms"] - cost["cpu_driver_ms"], 3)
        applied = window["applied"]
        run = {
            "ids": [str(task_id) for task_id in window["ids"]], "units": units, "tasks": len(window["ids"]),
            "completed_tasks": result["completed"],
            "not_completed_tasks": result["not_completed"], "statuses": result["statuses"],
            "failed_step_attempts": result["failed_steps"], "retried_steps": result["retried_steps"],
            "units_per_s": round(units / result["elapsed_s"], 1), "elapsed_s": round(result["elapsed_s"], 2),
            "step_ms": {name: {"p50": round(pct(values, 0.5), 2), "p95": round(pct(values, 0.95), 2)}
                        for name, values in result["step_ms_by_name"].items()},
            "tool_call_ms_p50": round(pct(result["call_ms"], 0.5), 2) if result["call_ms"] else None,
            "tool_calls_applied": len(applied), "tool_calls_applied_twice": len(applied) - len(set(applied)),
            "tool_calls_expected": applied_expected,
            "worker_log_errors": self.worker_log_errors(worker_logs_at),
            "cost_per_unit": cost, "statements_per_unit": window["statements"], "wal_per_unit": window["wal"],
            # How busy the machine was with other jobs over the window (its settle included), in cores.
            "other_jobs_cores": round(cost["cpu_other_ms"] * units / 1000 / window["counters"].wall_s, 2),
        }
        if keys is not None:
            run["model"] = self.model_requests(log_at, keys, turns)
            run["transcript"] = {
                "reads_per_turn": round(transcript_reads["calls"] / units, 3),
                "rows_read_per_turn": round(transcript_reads["rows"] / units, 3),
                "read_ms_per_turn": round(transcript_reads["exec_ms"] / units, 4),
                "writes_per_turn": round(transcript_writes["calls"] / units, 3),
                "rows_written_per_turn": round(transcript_writes["rows"] / units, 3)}
            by_turn: dict[str, dict[int, list[float]]] = {"think": {}, "act": {}}
            for name, index, ms in result["steps"]:
                by_turn.setdefault(name, {}).setdefault(index // 2 + 1, []).append(ms)
            run["step_ms_p50_by_turn"] = {name: {turn: round(pct(values, 0.5), 2) for turn, values
                                                 in sorted(turns_.items())} for name, turns_ in by_turn.items()}
            run["state"] = self.state_sizes(window["ids"], units)
        return run

    def state_sizes(self, ids: list, units: int) -> dict:
        """What the agents' durable state costs to record: each step's state delta (a top-level key the step set or
        changed in place is written whole), per turn and by turn; the checkpoints' payloads (the whole state)."""
        deltas: dict[str, dict[int, list[int]]] = {}
        total = 0
        for name, index, size in self.observer.execute(
                "SELECT name, step_index, octet_length(state_delta) FROM tasks_app_step WHERE task_id = ANY(%s) AND "
                "status = 'committed'", [ids]).fetchall():
            deltas.setdefault(name, {}).setdefault(index // 2 + 1, []).append(size)
            total += size
        checkpoints = self.observer.execute(
            "SELECT count(*), coalesce(max(octet_length(payload)), 0) FROM checkpoints_app_checkpoint "
            "WHERE task_id = ANY(%s)", [ids]).fetchone()
        return {"delta_bytes_per_turn": round(total / units, 1),
                "delta_bytes_by_turn": {name: {turn: round(statistics.mean(sizes)) for turn, sizes
                                               in sorted(by_turn.items())} for name, by_turn in deltas.items()},
                "checkpoints_kept": checkpoints[0], "checkpoint_bytes_max": checkpoints[1]}

    def alone(self, system: str, turns: int, min_units: int) -> dict:
        """Agents (or tasks) one at a time, nothing else of the bench running, until at least `min_units` units ran:
        ms per unit (create → complete of each, summed), its steps' times, and its cost per unit without contention
        between tasks — CPU, statements and WAL, exact at once (no settle: commits and tuples are left out)."""
        per_task = 1 if system == "tools" else turns
        count = -(-min_units // per_task)
        self.meter.worker_pids = self.fleet.pids
        before, remote_before = self.meter.snapshot(), self.remote_cpu_s()
        ids: list = []
        for _ in range(count):
            if system == "agents":
                ids += self.create_agents(self.script(turns, 1, "alone"), turns)
            elif system == "tools":
                ids += self.create_tool_tasks(1)
            else:
                ids += self.create("bare", 1, turns)
            self.wait(ids[-1:])
        after, remote_after = self.meter.snapshot(), self.remote_cpu_s()
        units = count * per_task
        window = (after - before).per(units)
        result = self.outcome(ids)
        busy_s = self.observer.execute("SELECT extract(epoch FROM sum(completed_at - created_at)) FROM tasks_app_task "
                                       "WHERE id = ANY(%s)", [ids]).fetchone()[0]
        cost = {name: window[name] for name in ("statements", "wal_bytes", *ENGINE_CPU)}
        for name in self.remotes:
            cost[f"cpu_{name}_ms"] = round((remote_after[name] - remote_before[name]) * 1000 / units, 3)
        cost["cpu_engine_ms"] = round(sum(cost[name] for name in ENGINE_CPU), 3)
        return {"tasks": count, "units": units, "unit_ms": round(float(busy_s) * 1000 / units, 2),
                "step_ms_p50": {name: round(pct(values, 0.5), 2) for name, values in result["step_ms_by_name"].items()},
                "cost_per_unit": cost}

    def run_agents(self, tasks: int, turns: int, *, label: str = "agents") -> dict:
        self.warm_up("agents")
        self.tools_fresh()
        keys = self.script(turns, tasks, label)
        run = self.measure(tasks * turns, lambda: self.create_agents(keys, turns), turns=turns, keys=keys,
                           applied_expected=tasks * (turns - 1))
        run["turns"], run["agents"] = turns, tasks
        run["transcript"]["cold_load"] = transcript_cold_load(run.pop("ids")[0])
        run["alone"] = self.alone("agents", turns, self.alone_units)
        run["ok"] = ok(run)
        return run

    def run_tools(self, n: int) -> dict:
        self.warm_up("tools")
        self.tools_fresh()
        run = self.measure(n, lambda: self.create_tool_tasks(n), applied_expected=n)
        del run["ids"]
        run["alone"] = self.alone("tools", 1, self.alone_units)
        run["ok"] = ok(run)
        return run

    def run_bare(self, tasks: int, steps: int) -> dict:
        self.warm_up("bare")
        run = self.measure(tasks * steps, lambda: self.create("bare", tasks, steps), applied_expected=0)
        del run["ids"]
        run["alone"] = self.alone("bare", steps, self.alone_units)
        run["ok"] = ok(run)
        return run

    def model_call_cpu(self, lengths: list[int], times: int = 30) -> list[dict]:
        """What the model call of a think step costs the calling process by the conversation's length: llm.chat (the
        openai SDK, streamed, as the think step makes it) against the scripted model, with the request an agent sends
        at its turn T (instructions, goal, then T − 1 tool calls and their results), `times` times each in this
        process — its CPU ms p50, and the model's."""
        from agents_app import agent, llm

        endpoint = llm.endpoint_get()
        self.server.refresh_from_db()
        spec = next(tool for tool in self.server.tools if tool["name"] == TOOL)
        tools = agent.BUILTIN_TOOLS + [{"type": "function", "function": {
            "name": FUNCTION, "description": spec.get("description") or "", "parameters": spec["inputSchema"]}}]
        rows = []
        for turn in lengths:
            (key,) = self.script(turn, 1, "model-call")
            messages = [{"role": "system", "content": agent.BASE_INSTRUCTIONS},
                        {"role": "user", "content": f"Set the bench keys ({key}), then say so."}]
            for number in range(turn - 1):
                call = {"id": f"call_{number}", "type": "function", "function": {
                    "name": FUNCTION, "arguments": json.dumps({"key": f"{key}-{number}", "value": f"v{number}"})}}
                messages += [{"role": "assistant", "content": None, "tool_calls": [call]},
                             {"role": "tool", "tool_call_id": call["id"], "content": json.dumps(
                                 {"key": f"{key}-{number}", "value": f"v{number}", "applied": True})}]
            llm.chat(endpoint, messages=messages, tools=tools)  # (warm: the client and its connection made)
            cpu, model_before = [], self.model.cpu_s()
            for _ in range(times):
                started = time.process_time()
                llm.chat(endpoint, messages=messages, tools=tools)
                cpu.append((time.process_time() - started) * 1000)
            rows.append({"turn": turn, "messages": len(messages), "request_kib": round(len(json.dumps(
                {"messages": messages, "tools": tools})) / 1024, 2), "cpu_ms_p50": round(pct(cpu, 0.5), 2),
                "model_cpu_ms": round((self.model.cpu_s() - model_before) * 1000 / times, 2)})
            print(f"[bench] model call {rows[-1]}", file=sys.stderr, flush=True)
        return rows


def transcript_cold_load(task_id: str, times: int = 20) -> dict:
    """What a process that has not seen a conversation pays to read it back (a think step after the task moved to
    another worker process): agents_app.transcript.messages_load of one finished agent's every message, its cache
    emptied first, `times` times in this process — ms p50, rows, bytes of the messages as JSON."""
    from agents_app import transcript
    from agents_app.models import TranscriptMessage

    digests = list(TranscriptMessage.objects.filter(task_id=task_id).values_list("digest", flat=True))
    walls = []
    for _ in range(times):
        transcript._cache.clear()
        started = time.perf_counter()
        messages = transcript.messages_load(task_id, digests)
        walls.append((time.perf_counter() - started) * 1000)
    transcript._cache.clear()
    return {"messages": len(digests), "kib": round(len(json.dumps(messages)) / 1024, 2),
            "ms_p50": round(pct(walls, 0.5), 3)}


def ok(run: dict) -> bool:
    """Every task completed, no step attempt failed or ran twice, each tool effect applied once (and only those
    expected), no error in the workers' logs, and — for agents — the model asked exactly once per turn."""
    return (run["completed_tasks"] == run["tasks"] and not run["failed_step_attempts"] and not run["retried_steps"]
            and run["tool_calls_applied"] == run["tool_calls_expected"] and not run["tool_calls_applied_twice"]
            and not run["worker_log_errors"]
            and ("model" not in run or (run["model"]["every_turn_asked_once"] and not run["model"]["errors_answered"])))


# -------------------------------------------------------------------------------------------------------------
# Report
# -------------------------------------------------------------------------------------------------------------
def figures(turns: list[int]) -> list[tuple]:
    """(label, path in a run, additive?) for bench/tool_calls.py's table."""
    rows: list[tuple] = [
        ("units/s (agent turns, tool calls, bare effects; tasks at once)", ("units_per_s",), False),
        ("think step ms p50", ("step_ms", "think", "p50"), False),
        ("think step ms p95", ("step_ms", "think", "p95"), False),
        ("act step ms p50", ("step_ms", "act", "p50"), False),
        ("act step ms p95", ("step_ms", "act", "p95"), False),
        ("call step ms p50 (mcp_tool, bare)", ("step_ms", "call", "p50"), False),
        ("call step ms p95 (mcp_tool, bare)", ("step_ms", "call", "p95"), False),
        ("one task at a time: ms per unit", ("alone", "unit_ms"), False),
        ("one task at a time: think step ms p50", ("alone", "step_ms_p50", "think"), False),
        ("one task at a time: act step ms p50", ("alone", "step_ms_p50", "act"), False),
        ("one task at a time: call step ms p50", ("alone", "step_ms_p50", "call"), False),
        ("one task at a time: CPU ms/unit, workers", ("alone", "cost_per_unit", "cpu_workers_ms"), True),
        ("one task at a time: CPU ms/unit, PostgreSQL", ("alone", "cost_per_unit", "cpu_postgres_ms"), True),
        ("one task at a time: CPU ms/unit, the engine", ("alone", "cost_per_unit", "cpu_engine_ms"), True),
        ("one task at a time: CPU ms/unit, the tool server", ("alone", "cost_per_unit", "cpu_tool_server_ms"), True),
        ("one task at a time: CPU ms/unit, the model", ("alone", "cost_per_unit", "cpu_model_ms"), True),
        ("statements/unit", ("cost_per_unit", "statements"), True),
        ("commits/unit", ("cost_per_unit", "commits"), True),
        ("WAL bytes/unit", ("cost_per_unit", "wal_bytes"), True),
        ("WAL records/unit", ("cost_per_unit", "wal_records"), True),
        ("tuples written/unit", ("cost_per_unit", "tuples_written"), True),
        ("Valkey commands/unit", ("cost_per_unit", "redis_commands"), True),
        ("CPU ms/unit: workers", ("cost_per_unit", "cpu_workers_ms"), True),
        ("CPU ms/unit: PostgreSQL (every backend)", ("cost_per_unit", "cpu_postgres_ms"), True),
        ("CPU ms/unit: Valkey", ("cost_per_unit", "cpu_redis_ms"), True),
        ("CPU ms/unit: the engine (the three above)", ("cost_per_unit", "cpu_engine_ms"), True),
        ("CPU ms/unit: the tool server", ("cost_per_unit", "cpu_tool_server_ms"), True),
        ("CPU ms/unit: the scripted model", ("cost_per_unit", "cpu_model_ms"), True),
        ("CPU ms/unit: all", ("cost_per_unit", "cpu_total_ms"), True),
        ("CPU ms/unit: the bench's driver (creates the tasks, watches them)", ("cost_per_unit", "cpu_driver_ms"),
         True),
        ("CPU ms/unit: other processes on the machine (not the bench's)", ("cost_per_unit", "cpu_other_ms"), True),
        ("other jobs' load over the window, cores", ("other_jobs_cores",), False),
        ("transcript reads/turn (SELECTs)", ("transcript", "reads_per_turn"), True),
        ("transcript rows read/turn", ("transcript", "rows_read_per_turn"), True),
        ("transcript rows written/turn", ("transcript", "rows_written_per_turn"), True),
        ("messages per model request (mean)", ("model", "messages_mean"), True),
        ("model request KiB, mean", ("model", "request_kb_mean"), True),
        ("model request KiB, the last turn's", ("model", "request_kb_last_turn"), True),
        ("a whole transcript read back cold (ms, in the bench's process)", ("transcript", "cold_load", "ms_p50"),
         False),
        ("… its messages", ("transcript", "cold_load", "messages"), False),
    ]
    first, last = min(turns), max(turns)
    rows += [(f"think ms p50 at turn {turn}", ("step_ms_p50_by_turn", "think", turn), False)
             for turn in sorted({1, first, last})]
    rows += [("state delta B per turn (the steps' state_delta)", ("state", "delta_bytes_per_turn"), True)]
    rows += [(f"act step's state delta B at turn {turn}", ("state", "delta_bytes_by_turn", "act", turn), False)
             for turn in sorted({1, first - 1, last - 1})]
    rows += [("largest checkpoint payload B (the whole state)", ("state", "checkpoint_bytes_max"), False)]
    return rows


def report_table(results: dict[str, list[dict]], turns: list[int]) -> str:
    low, high = f"agents-{min(turns)}", f"agents-{max(turns)}"
    names = {**{f"agents-{t}": f"agent turn, T={t}" for t in turns}, "tools": "mcp_tool call",
             "bare": "bare effect"}
    ratios = [*((f"agents-{t}", "tools") for t in turns), (low, "bare"), *([(high, low)] if high != low else [])]
    return table(results, figures(turns), ratios=ratios, difference=None, names=names)


def crowd_summary(run: dict) -> str:
    model = run["model"]
    return "\n".join([
        f"- agents: {run['agents']} × {run['turns']} turns created at once; completed {run['completed_tasks']}, "
        f"statuses {run['statuses']}",
        f"- drain (first create → last completion): {run['elapsed_s']} s, {run['units_per_s']} turns/s",
        f"- step attempts failed: {run['failed_step_attempts']}; steps run again: {run['retried_steps']}",
        f"- the model: {model['requests']} requests for {model['expected']} turns; turns asked more than once "
        f"{model['turns_asked_more_than_once']}, never asked {model['turns_not_asked']}; errors answered "
        f"{model['errors_answered']}",
        f"- tool effects applied: {run['tool_calls_applied']} of {run['tool_calls_expected']}, twice "
        f"{run['tool_calls_applied_twice']}",
        f"- ERROR lines in the workers' logs: {len(run['worker_log_errors'])}",
        f"- per turn: {run['cost_per_unit']['statements']} statements, {run['cost_per_unit']['commits']} commits, "
        f"{run['cost_per_unit']['wal_bytes']:,.0f} WAL B, CPU ms workers {run['cost_per_unit']['cpu_workers_ms']}, "
        f"PostgreSQL {run['cost_per_unit']['cpu_postgres_ms']}, Valkey {run['cost_per_unit']['cpu_redis_ms']}, "
        f"tool server {run['cost_per_unit']['cpu_tool_server_ms']}, model {run['cost_per_unit']['cpu_model_ms']}",
        f"- think / act step ms p50: {run['step_ms']['think']['p50']} / {run['step_ms']['act']['p50']}, p95: "
        f"{run['step_ms']['think']['p95']} / {run['step_ms']['act']['p95']}",
        f"- other jobs on the machine meanwhile: {run['other_jobs_cores']} cores on average",
        f"- all checks passed: {run['ok']}",
    ])


GROWTH_FIGURES = (*COST_FIGURES, *ALL_CPU, "cpu_engine_ms", "cpu_total_ms")


def growth_of(results: dict[str, list[dict]], turns: list[int]) -> dict:
    """Per figure: the medians per turn at the shortest and the longest agents, their ratio, and the line through
    them — cost(T) = fixed + T × marginal: `marginal` what one more turn costs, `fixed` what an agent costs once
    (its create, its first and last turn's extra). Linear by construction: a part that grows with T² (something
    written every turn that grows every turn) only raises the marginal; the state deltas by turn show it directly."""
    if len(turns) < 2:
        return {}
    short, long_ = min(turns), max(turns)
    paths = {**{name: ("cost_per_unit", name) for name in GROWTH_FIGURES},
             "transcript_reads_per_turn": ("transcript", "reads_per_turn"),
             "transcript_rows_read_per_turn": ("transcript", "rows_read_per_turn"),
             "state_delta_bytes_per_turn": ("state", "delta_bytes_per_turn")}
    growth = {}
    for name, (group, key) in paths.items():
        a = statistics.median(run[group][key] for run in results[f"agents-{short}"])
        b = statistics.median(run[group][key] for run in results[f"agents-{long_}"])
        marginal = (long_ * b - short * a) / (long_ - short)
        growth[name] = {"short": a, "long": b, "ratio": round(b / a, 3) if a else None,
                        "marginal": round(marginal, 3), "fixed": round(short * (a - marginal), 3)}
    return growth


def growth_table(growth: dict, turns: list[int]) -> str:
    lines = [f"| per turn | T={min(turns)} | T={max(turns)} | T={max(turns)} / T={min(turns)} | marginal turn | "
             f"fixed per agent |", "|---|---|---|---|---|---|"]
    for name, row in growth.items():
        ratio = "–" if row["ratio"] is None else f"{row['ratio']:.2f}×"
        lines.append(f"| {name} | {row['short']:,.2f} | {row['long']:,.2f} | {ratio} | {row['marginal']:,.2f} | "
                     f"{row['fixed']:,.1f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=20, help="agents per window (and the other windows' tasks)")
    parser.add_argument("--turns", default="5,20", help="turns per agent, one window each, comma-separated")
    parser.add_argument("--tool-tasks", type=int, default=0, help="mcp_tool tasks per window (0: tasks × min(turns))")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--crowd", type=int, default=50, help="agents at once for the exactly-once check (0: skip)")
    parser.add_argument("--crowd-turns", type=int, default=10)
    parser.add_argument("--warm-up", type=int, default=WARM_UP_TASKS, help="tasks run before each window")
    parser.add_argument("--long-turns", type=int, default=100, help="the model call's cost is also timed at this turn, "
                        "beyond the agents run (0: no)")
    parser.add_argument("--alone", type=int, default=40, help="after each window, tasks one at a time until this many "
                        "units (turns, calls, effects) ran: the unloaded figures")
    parser.add_argument("--settle", type=float, default=Meter.SETTLE_SECONDS,
                        help="seconds to wait before each snapshot for PostgreSQL's counters (commits, tuples) to "
                             "settle; statements, WAL and CPU are exact at once (0: for a quick check only)")
    args = parser.parse_args()
    turns = [int(t) for t in args.turns.split(",") if t]
    if not turns or min(turns) < 2 or args.crowd and args.crowd_turns < 2:
        parser.error("an agent of this bench has at least 2 turns (tool calls, then the answer)")
    tool_tasks = args.tool_tasks or args.tasks * min(turns)
    services = Services()
    started, facts = dt.datetime.now(dt.UTC), machine()
    bench = model = None
    try:
        services.start()
        model = start_model(services.scratch)
        env = django_env(services)
        env["EXTRA_APPS"] = ",".join(filter(None, [env.get("EXTRA_APPS", ""), "bench.tool_workflows"]))
        # The workers (and this process, which checks an agent's input at create) get the model from the environment.
        env.update(RUNTIME_MODEL__BASE_URL=model_base_url(model), RUNTIME_MODEL__NAME=MODEL_NAME,
                   RUNTIME_AGENT__MAX_TURNS=str(max(30, *turns, args.crowd_turns)))
        os.environ.update(env)
        subprocess.run([sys.executable, "manage.py", "migrate", "-v", "0"], cwd=ROOT, env=env, check=True)
        import django

        django.setup()
        import redis

        meter = Meter(admin_url=services.meter_url(), database=BENCH_DB, postmaster_pid=services.postmaster_pid(),
                      redis_client=redis.Redis.from_url(services.broker_url(RUNTIME_BROKER_DB)),
                      redis_pid=services.valkey_pid())
        facts["postgres"] = meter.conn.execute("SHOW server_version").fetchone()[0]
        bench = AgentBench(services, env, meter, model, workers=args.workers, concurrency=args.concurrency,
                           settle=args.settle, warm_up=args.warm_up, alone=args.alone)
        model = None  # (the bench stops it now)
        results: dict[str, list[dict]] = {**{f"agents-{t}": [] for t in turns}, "tools": [], "bare": []}
        bench.fleet.start()
        for repeat in range(args.repeat):
            for name in results:
                print(f"[bench] repeat {repeat + 1}/{args.repeat}: {name}", file=sys.stderr, flush=True)
                if name.startswith("agents-"):
                    run = bench.run_agents(args.tasks, int(name.split("-")[1]))
                elif name == "tools":
                    run = bench.run_tools(tool_tasks)
                else:
                    run = bench.run_bare(args.tasks, min(turns))
                results[name].append(run)
                print(f"[bench]   {run['units_per_s']} units/s, ok {run['ok']}, "
                      f"{run['cost_per_unit']['statements']} statements/unit", file=sys.stderr, flush=True)
        crowd = None
        if args.crowd:
            print(f"[bench] crowd: {args.crowd} agents × {args.crowd_turns} turns at once", file=sys.stderr,
                  flush=True)
            crowd = bench.run_agents(args.crowd, args.crowd_turns, label="crowd")
            del crowd["alone"]
        bench.fleet.stop()
        model_calls = bench.model_call_cpu(sorted({1, *turns, *([args.long_turns] if args.long_turns else [])}))
        finished = dt.datetime.now(dt.UTC)
        facts["load_average_end"] = os.getloadavg()
        growth = growth_of(results, turns)
        print(f"\n{started:%Y-%m-%d %H:%M}–{finished:%H:%M} UTC · agent turns · {args.tasks} agents × T turns "
              f"(T = {', '.join(map(str, turns))}), {tool_tasks} mcp_tool tasks, {args.tasks} × {min(turns)} bare "
              f"effects · {args.workers} workers × {args.concurrency} · {args.repeat} repeats, interleaved · median "
              f"[min–max] · {facts['cpus']} CPUs ({facts['cpu']}), {facts['memory_gib']} GiB, PostgreSQL "
              f"{facts['postgres']}, Python {facts['python']} · load average at start "
              f"{' '.join(f'{v:.2f}' for v in facts['load_average'])}, at the end "
              f"{' '.join(f'{v:.2f}' for v in facts['load_average_end'])}\n")
        print(report_table(results, turns))
        if growth:
            print(f"\nHow a turn's cost grows with the agent's length, medians: per turn at T={min(turns)} and "
                  f"T={max(turns)}, and cost(T) ≈ fixed + T × marginal fitted through the two\n")
            print(growth_table(growth, turns))
        last = results[f"agents-{max(turns)}"][-1]
        print(f"\nagents-{max(turns)}: statements per turn in the last window (calls/turn, exec ms, statement)")
        for calls, toplevel, exec_ms, query in last["statements_per_unit"]:
            if calls >= 0.05:
                print(f"  {calls:7.3f} {exec_ms:8.3f}  {'' if toplevel else '↳ '}{query[:130]}")
        print(f"agents-{max(turns)}: WAL per turn in the last window, by relation and record kind")
        for relation, kind, records, size in last["wal_per_unit"]:
            if size >= 5:
                print(f"  {size:8.1f} B {records:6.2f} rec  {relation:<45} {kind}")
        print("\nA think step's model call (llm.chat through the openai SDK) by the turn it is made at, in this "
              "process against the scripted model:\n")
        print("| turn | messages sent | request KiB | CPU ms p50 of the caller | CPU ms of the model |")
        print("|---|---|---|---|---|")
        for row in model_calls:
            print(f"| {row['turn']} | {row['messages']} | {row['request_kib']} | {row['cpu_ms_p50']} | "
                  f"{row['model_cpu_ms']} |")
        if crowd:
            print(f"\n{args.crowd} agents at once on {args.workers} workers × {args.concurrency}:")
            print(crowd_summary(crowd))
        all_ok = all(run["ok"] for runs in results.values() for run in runs) and (crowd is None or crowd["ok"])
        print(json.dumps({"scenario": "agents", "started": started.isoformat(timespec="seconds"),
                          "finished": finished.isoformat(timespec="seconds"), "args": vars(args), "machine": facts,
                          "tool_tasks": tool_tasks, "results": results, "growth": growth, "model_calls": model_calls,
                          "crowd": crowd,
                          "ok": all_ok}))
        if not all_ok:
            sys.exit(1)
    finally:
        try:
            if bench is not None:
                bench.stop()
            if model is not None:
                model.stop()
            if "django.db" in sys.modules:
                from django.db import connections

                connections.close_all()
        finally:  # the servers stop however the run ended (a settings error included)
            services.stop()


if __name__ == "__main__":
    main()
