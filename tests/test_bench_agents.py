"""The agent-turn benchmark (bench/agent_turns.py) at its smallest: its own PostgreSQL, Valkey, workers, tool server
and scripted model; 2 agents of 2 and of 3 turns, the mcp_tool and bare windows, 3 agents at once for the crowd
check. Every agent must complete with each of its turns asked of the model exactly once and each tool effect applied
once, and the JSON must carry every figure docs/performance.md quotes. (About 15 s on a quiet machine; the figures
themselves are not checked: at this size they are noise.)"""

import json
import os
import subprocess
import sys

import pytest

from tests.embedded_support import ROOT

pytestmark = pytest.mark.slow

COST_FIELDS = {"statements", "commits", "wal_bytes", "wal_records", "tuples_written", "redis_commands",
               "cpu_workers_ms", "cpu_postgres_ms", "cpu_redis_ms", "cpu_tool_server_ms", "cpu_model_ms",
               "cpu_engine_ms", "cpu_total_ms"}
RUN_FIELDS = {"units_per_s", "elapsed_s", "step_ms", "alone", "cost_per_unit", "statements_per_unit", "wal_per_unit",
              "other_jobs_cores", "failed_step_attempts", "tool_calls_applied", "tool_calls_applied_twice",
              "worker_log_errors", "ok"}
AGENT_FIELDS = {"model", "transcript", "step_ms_p50_by_turn", "turns", "agents", "state"}


def test_it_runs_agents_tool_calls_and_bare_effects_and_every_agent_asks_each_turn_once():
    env = dict(os.environ)
    env.pop("DATABASE_URL", None)  # it brings its own PostgreSQL and Valkey, as bench/engine.py does
    env.pop("REDIS_URL", None)
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "agent_turns.py"), "--tasks", "2", "--turns", "2,3",
                           "--repeat", "1", "--settle", "0", "--warm-up", "2", "--alone", "2", "--crowd", "3",
                           "--crowd-turns", "2", "--long-turns", "0", "--workers", "1", "--concurrency", "2"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=180, check=False)

    assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["ok"] is True
    assert set(report["results"]) == {"agents-2", "agents-3", "tools", "bare"}
    for system, (run,) in report["results"].items():
        assert run["completed_tasks"] == run["tasks"] and run["not_completed_tasks"] == 0, (system, run)
        assert RUN_FIELDS <= set(run) and COST_FIELDS <= set(run["cost_per_unit"]), (system, run)
        assert run["failed_step_attempts"] == 0 and run["worker_log_errors"] == [], (system, run)
        assert run["tool_calls_applied"] == run["tool_calls_expected"] and run["tool_calls_applied_twice"] == 0
        assert run["alone"]["units"] >= 2 and run["alone"]["cost_per_unit"]["cpu_engine_ms"] >= 0, (system, run)
    for turns in (2, 3):
        run = report["results"][f"agents-{turns}"][0]
        assert AGENT_FIELDS <= set(run) and run["units"] == 2 * turns
        assert run["model"]["every_turn_asked_once"] and run["model"]["requests"] == 2 * turns, run["model"]
        assert run["model"]["errors_answered"] == 0
        assert run["tool_calls_applied"] == 2 * (turns - 1)  # every turn but the last calls the tool
        assert set(run["step_ms"]) == {"think", "act"} and run["transcript"]["rows_written_per_turn"] > 0
        assert run["transcript"]["cold_load"]["messages"] == 2 * turns + 1  # system, user, then per turn 2 (1 last)
        assert set(run["state"]["delta_bytes_by_turn"]) == {"think", "act"} and run["state"]["delta_bytes_per_turn"]
    assert report["results"]["tools"][0]["units"] == 2 * 2  # tasks × min(turns) mcp_tool calls
    assert report["results"]["bare"][0]["tool_calls_applied"] == 0
    assert set(report["growth"]) >= {"statements", "wal_bytes", "cpu_workers_ms", "transcript_rows_read_per_turn"}
    assert [row["turn"] for row in report["model_calls"]] == [1, 2, 3]
    assert all(row["cpu_ms_p50"] > 0 and row["messages"] == 2 * row["turn"] for row in report["model_calls"])
    crowd = report["crowd"]
    assert crowd["ok"] and crowd["completed_tasks"] == 3 and crowd["model"]["every_turn_asked_once"]
    assert crowd["tool_calls_applied"] == 3 and crowd["tool_calls_applied_twice"] == 0
    assert "| figure | agent turn, T=2 | agent turn, T=3 | mcp_tool call | bare effect |" in done.stdout
    assert "3 agents at once on 1 workers × 2:" in done.stdout
