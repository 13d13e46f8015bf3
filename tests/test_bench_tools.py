"""The tool-call benchmark (bench/tool_calls.py) at its smallest: its own PostgreSQL, Valkey, workers, tool server and
HTTP endpoint, 2 tasks × 3 steps of each workflow, the micro-benchmark 3 times each; it must finish every task, make
each tool call once, and print its JSON with every figure docs/performance.md quotes. (About 15 s on a quiet
machine; the figures themselves are not checked: at this size they are noise.)"""

import json
import os
import subprocess
import sys

import pytest

from tests.embedded_support import ROOT

pytestmark = pytest.mark.slow

COST_FIELDS = {"statements", "commits", "wal_bytes", "wal_records", "tuples_written", "redis_commands",
               "cpu_workers_ms", "cpu_postgres_ms", "cpu_redis_ms", "cpu_called_server_ms", "cpu_total_ms"}
RUN_FIELDS = {"calls_per_s", "step_ms_p50", "step_ms_p95", "unloaded_step_ms_p50", "statements_per_call",
              "wal_per_call"}


def test_it_runs_every_system_and_the_micro_bench_and_prints_the_figures_as_json():
    env = dict(os.environ)
    env.pop("DATABASE_URL", None)  # it brings its own PostgreSQL and Valkey, as bench/engine.py does
    env.pop("REDIS_URL", None)
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "tool_calls.py"), "--tasks", "2", "--steps", "3",
                           "--repeat", "1", "--settle", "0", "--micro", "3", "--workers", "1", "--concurrency", "2"],
                          cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=180, check=False)

    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(report["results"]) == {"bare", "effects", "tools"}
    for system, (run,) in report["results"].items():
        assert run["completed_tasks"] == 2 and run["not_completed_tasks"] == 0, (system, run)
        assert RUN_FIELDS <= set(run) and COST_FIELDS <= set(run["cost_per_call"]), (system, run)
        assert run["statements_per_call"] and run["step_ms_p50"] > 0, (system, run)
    tools = report["results"]["tools"][0]
    assert tools["tool_calls_applied"] == 2 * 3 and tools["tool_calls_applied_twice"] == 0
    assert tools["unloaded_tool_call_ms_p50"] > 0  # the gateway's tool.result events carry each call's time
    assert report["results"]["bare"][0]["tool_calls_applied"] == 0  # only bench_tools reaches the tool server
    micro = report["micro"]
    assert micro["requests_per_call"][:2] == ["server/discover", "tools/call"], micro["requests_per_call"]
    assert "tools/list" in micro["requests_per_call"]  # the SDK's check of the result against the outputSchema
    phases = {row["phase"] for row in micro["rows"]}
    assert any(phase.startswith("MCP call as the gateway makes it") for phase in phases)
    assert any(phase.startswith("Redis limits") for phase in phases)
    assert all(row["p50_ms"] >= 0 for row in micro["rows"])
    assert "| figure | bare | effects | tools | tools − bare | tools / effects | tools / bare |" in done.stdout
