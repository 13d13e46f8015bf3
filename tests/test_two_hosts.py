"""Two hosts on one machine (`deploy/dev.py chaos --hosts`, bench/hosts.py): network namespaces with a web tier and a
worker each against one PostgreSQL and one Valkey; one host is SIGKILLed whole, then — with PgBouncer in transaction
mode in front — partitioned from PostgreSQL only (it still reaches Valkey). Each time its tasks must
commit on the other host within the bound — 2 s after a kill with the default 30 s lease; after a partition, the
server's keepalive time (2 s here) plus the same 2 s; here with slack for a loaded machine — under a new lease (never
the lost host going on under its old one), every effect once, every planned step committed once, every audit chain
whole, and the surviving host's web tier answering every snapshot meanwhile.

Needs root and iproute2 (network namespaces), and Debian's pgbouncer for the last part (.ci/run installs both).
"""

import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.embedded_support import ROOT

pytestmark = pytest.mark.slow


def namespaces_work() -> bool:
    if os.geteuid() != 0 or shutil.which("ip") is None:
        return False
    name = f"rtprobe{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", name], capture_output=True).returncode == 0
    if made:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)
    return made


@pytest.mark.skipif(not namespaces_work(), reason="needs root and network namespaces (ip netns)")
def test_it_moves_a_lost_hosts_tasks_to_the_other_host_within_the_bound_every_effect_once():
    env = dict(os.environ)
    env.pop("DATABASE_URL", None)  # its own PostgreSQL and Valkey, listening where the namespaces reach them
    env.pop("REDIS_URL", None)
    # The partition through PgBouncer (transaction mode), the kill direct: every part of both, in two faults.
    pooled = shutil.which("pgbouncer") or os.path.exists("/usr/sbin/pgbouncer")
    faults = ["--faults", "kill", "--pooler-faults", "partition"] if pooled else ["--faults", "kill,partition"]

    run = subprocess.Popen([sys.executable, str(ROOT / "bench" / "hosts.py"), *faults],
                           cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = run.communicate(timeout=260)  # (under the suite's 300 s per test)
    except subprocess.TimeoutExpired:
        run.terminate()  # its clean-up runs on SIGTERM: namespaces, addresses, servers
        stdout, stderr = run.communicate(timeout=30)
        pytest.fail(f"bench/hosts.py took over 260 s:\n{stdout[-3000:]}\n{stderr[-3000:]}")

    lines = stdout.strip().splitlines()
    assert lines, stderr[-3000:]
    summary = json.loads(lines[-1])
    report = json.dumps(summary)
    runs = {(run["fault"], run["pooler"]): run for run in summary["faults"]}
    expected = {("kill", None), ("partition", "pgbouncer-transaction" if pooled else None)}
    assert set(runs) == expected, report
    for run in runs.values():
        assert run["held_by_h1_at_fault"] >= 1, report
        assert run["taken_over_under_new_lease"] == run["held_by_h1_at_fault"], report  # never h1 under its old one
        # The bound with 1.5 s of slack: the suite runs this beside other tests on two cores. Unloaded, the same
        # command meets the bound itself (docs/performance.md, "Two hosts").
        assert run["takeover_seconds"] is not None and run["takeover_seconds"] <= run["bound_seconds"] + 1.5, report
        assert run["every_task_progressing_seconds"] <= run["bound_seconds"] + 1.5, report
        assert run["h2_snapshots_during_fault"] == {"200": run["tasks"]}, report
        assert run["statuses"] == {"completed": run["tasks"]}, report
        assert run["committed_steps"] == run["expected_steps"], report
        assert run["duplicate_effects"] == 0 and run["missing_effects"] == 0, report
        assert run["holder_gone_recoveries"] >= run["held_by_h1_at_fault"], report  # by liveness, not expiry
        assert run["audit_chains_ok"], report
