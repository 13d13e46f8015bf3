"""The chaos tool in a short run: workers SIGKILLed and PostgreSQL crashed while tasks run, then every task
must complete with every effect exactly once (bench/chaos.py checks and reports it)."""

import json
import os
import subprocess
import sys

import pytest
from django.conf import settings

from tests.embedded_support import ROOT

pytestmark = pytest.mark.slow


def test_it_completes_every_task_with_effects_exactly_once_under_worker_kills_and_postgres_crashes():
    env = {**os.environ, "REDIS_URL": settings.REDIS_URL.rsplit("/", 1)[0] + "/13"}
    env.pop("DATABASE_URL", None)  # the chaos run brings its own embedded PostgreSQL, which it crashes

    result = subprocess.run([sys.executable, str(ROOT / "bench" / "chaos.py"), "--tasks", "24", "--steps", "8",
                             "--seconds", "45", "--seed", "3"], cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=240)

    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["faults"].get("restart_postgres", 0) >= 1 and summary["faults"].get("kill_worker", 0) >= 1, summary
    assert summary["statuses"] == {"completed": 24}, summary
    assert summary["duplicate_effects"] == 0 and summary["missing_effects"] == 0, summary
    assert summary["committed_steps"] == 24 * 8 and result.returncode == 0
