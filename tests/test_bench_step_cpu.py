"""The in-process step benchmark (bench/step_cpu.py, `deploy/dev.py bench --step-cpu`) at its smallest: on a scratch
database of its own, a demo_steps task driven to completion in its process, the CPU and the Python calls per step
reported as JSON. (--against runs the same in another checkout's process: one scratch database more, a whole
migration of CPU the suite does not spend; bench/step_cpu.py's run_in is the only difference.)"""

import json
import os
import subprocess
import sys

import pytest

from tests import worker_support
from tests.embedded_support import ROOT

pytestmark = pytest.mark.django_db  # (for the test database's address: the tool makes a scratch one beside it)


def test_it_measures_cpu_and_calls_per_step_in_one_process():
    env = {**os.environ, "DATABASE_URL": worker_support.test_database_url()}
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "step_cpu.py"), "--steps", "10", "--repeat", "1"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=240, check=False)

    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    row = report["results"]["this"]
    assert set(report["results"]) == {"this"}
    assert row["cpu_ms_per_step_median"] > 0 and len(row["runs"][0]["cpu_ms_per_step"]) == 1, row
    assert 100 < row["calls_per_step"] < 100_000, row  # a step is hundreds of Python calls, not none
    assert "| checkout | CPU ms/step" in done.stdout
