"""The chaos soak in its 2-minute version (`deploy/dev.py chaos --soak`, bench/soak.py): people steering over the REST
API, agents, downstream tool calls, steps longer than the lease and effects that time out after landing, while every
fault kind strikes — workers, beat and the web tier SIGKILLed, PostgreSQL crashed, the workers' connections terminated,
Valkey stopped (restarted from its append-only file) and SIGKILLed (restarted without it: every queued message gone),
every queued or unacknowledged message delivered again, the tool server SIGKILLed — then every guarantee is checked.

bench/soak.py checks and reports; this test asserts each guarantee separately, so a failure names the broken one. The
longest stall is reported but not bounded here: faults come 5–6 s apart so that every kind fits in two minutes, and
two of them may stack (`--stall-check` enforces the bound; bench/chaos.py's spaced faults bound it per fault).
"""

import json
import os
import subprocess
import sys

import pytest

from tests.embedded_support import ROOT

pytestmark = pytest.mark.slow

FAULT_KINDS = ("kill_worker", "postgres_outage", "kill_db_connections", "valkey_outage", "kill_beat", "kill_web",
               "valkey_lost", "duplicate_messages", "tool_server_restart")


def test_it_keeps_every_guarantee_while_people_steer_agents_work_and_every_fault_strikes():
    env = dict(os.environ)
    # The soak brings its own embedded PostgreSQL and Valkey, which it crashes and stops.
    env.pop("DATABASE_URL", None)
    env.pop("REDIS_URL", None)

    result = subprocess.run([sys.executable, str(ROOT / "bench" / "soak.py"), "--minutes", "2", "--seed", "1",
                             "--arrive-every", "2"],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)

    lines = result.stdout.strip().splitlines()
    assert lines, result.stderr[-3000:]
    summary = json.loads(lines[-1])
    report = json.dumps(summary)  # a string, so pytest shows all of it (the fault timeline too) on failure
    assert all(summary["faults"].get(kind, 0) >= 1 for kind in FAULT_KINDS), report
    assert summary["not_as_expected_count"] == 0, report  # cancelled ones cancelled, every other completed
    assert summary["demo_duplicate_effects"] == 0 and summary["demo_missing_effects"] == 0, report
    assert summary["tool_duplicate_effects"] == 0, report
    assert summary["tool_effects_applied"] == summary["tool_effects_expected"], report
    assert summary["commands_accepted"] >= 5 and summary["commands_lost"] == 0, report
    assert summary["commands_applied_twice"] == 0 and not summary["commands_given_up"], report
    assert summary["stale_sent"] >= 1 and summary["stale_refused_409"] == summary["stale_sent"], report
    assert summary["audit_chains_ok"], report
    assert summary["longest_stall_seconds"] is not None, report
    assert result.returncode == 0, report
