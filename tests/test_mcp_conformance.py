"""The official MCP conformance suite (../shared/tools/mcp-conformance, npm @modelcontextprotocol/conformance) against
a real uvicorn process and real celery workers, with the conformance fixtures on (MCP_CONFORMANCE_FIXTURES=1: every
fixture a workflow the workers run).

One run of ``--requirements 2026-07-28``: the 37 scored scenarios of that version, plus the ones it runs but does not
score — the ten tasks-* scenarios of the tasks extension among them. The test asserts the runner's exit status, 0
failed checks in every scenario's checks.json, and that each tasks-* scenario ran and passed (tasks-status-notifications
is the runner's stub: 0 checks)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess

import pytest

from tests.embedded_support import ROOT

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("external_root")]

TOOL = ROOT.parent / "shared" / "tools" / "mcp-conformance"
TASKS_SCENARIOS = ["tasks-lifecycle", "tasks-capability-negotiation", "tasks-wire-fields",
                   "tasks-request-state-removal", "tasks-mrtr-input", "tasks-request-headers",
                   "tasks-dispatch-and-envelope", "tasks-status-notifications", "tasks-required-task-error",
                   "tasks-mrtr-composition"]
OK = {"SUCCESS", "INFO", "SKIPPED"}


def scenario_checks(out_dir) -> dict[str, list[dict]]:
    """{scenario: its checks} from the runner's output folders (server-<scenario>-<timestamp>/checks.json)."""
    found = {}
    for checks in out_dir.glob("*/checks.json"):
        name = re.sub(r"-\d{4}-\d{2}-\d{2}T[\d-]+Z$", "", checks.parent.name.removeprefix("server-"))
        found[name] = json.loads(checks.read_text())
    return found


def runner_installed() -> bool:
    """The tool installs the runner once, with npm, into this cache (its own default)."""
    version = os.environ.get("MCP_CONFORMANCE_VERSION", "0.2.0-alpha.12")
    home = os.environ.get("MCP_CONFORMANCE_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), f"mcp-conformance-{version}")
    return os.path.exists(os.path.join(home, "node_modules", ".bin", "conformance"))


@pytest.mark.skipif(not TOOL.exists(), reason=f"the conformance runner is not at {TOOL} (it comes with ../shared)")
@pytest.mark.skipif(shutil.which("npm") is None and not runner_installed(),
                    reason="npm is needed once to install the conformance runner: apt-get install npm")
def test_it_passes_the_official_conformance_requirements_of_2026_07_28_and_the_tasks_scenarios(web, workers,
                                                                                               tmp_path):
    server = web(MCP_CONFORMANCE_FIXTURES=1)
    workers("conformance-1", env={"MCP_CONFORMANCE_FIXTURES": "1"})
    workers("conformance-2", env={"MCP_CONFORMANCE_FIXTURES": "1"})
    out = tmp_path / "conformance"
    run = subprocess.run([str(TOOL), server.url("/mcp"), "--requirements", "2026-07-28", "-o", str(out)],
                         capture_output=True, text=True, timeout=600)
    summary = run.stdout[-6000:] + run.stderr[-2000:]
    (ROOT / "var").mkdir(exist_ok=True)
    (ROOT / "var" / "conformance-summary.txt").write_text(run.stdout)
    checks = scenario_checks(out)
    failed = {name: [c["id"] for c in found if c["status"] not in OK] for name, found in checks.items()}
    assert {name: ids for name, ids in failed.items() if ids} == {}, summary
    assert run.returncode == 0, summary
    for name in TASKS_SCENARIOS:
        assert name in checks, f"{name} did not run:\n{summary}"
        if name != "tasks-status-notifications":
            assert any(c["status"] == "SUCCESS" for c in checks[name]), name
    assert len(checks) >= 47, sorted(checks)
