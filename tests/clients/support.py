"""The FastMCP client's own virtualenv (var/venvs/mcp-clients), built from requirements-mcp-clients.txt when missing
or when the pins changed, and a call of tests/clients/fastmcp_driver.py in it."""

from __future__ import annotations

import fcntl
import hashlib
import json
import subprocess
import sys
from pathlib import Path

from tests.embedded_support import ROOT

REQUIREMENTS = ROOT / "requirements-mcp-clients.txt"
VENV = ROOT / "var" / "venvs" / "mcp-clients"
DRIVER = ROOT / "tests" / "clients" / "fastmcp_driver.py"


def installed_marker() -> Path:
    """Written once the venv holds exactly these pins: a change to the requirements file means a new build."""
    digest = hashlib.sha256(REQUIREMENTS.read_bytes()).hexdigest()[:16]
    return VENV / f".installed-{digest}"


def fastmcp_python() -> str:
    """The venv's python, once the venv is built. Builds are serialised by a lock file: the test session starts one
    in the background (conftest.py) and the first FastMCP test waits for it rather than racing it into the venv."""
    python = VENV / "bin" / "python"
    marker = installed_marker()
    VENV.parent.mkdir(parents=True, exist_ok=True)
    with open(VENV.parent / "mcp-clients.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not marker.exists():
            if not python.exists():
                subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
            subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps",
                            "-r", str(REQUIREMENTS)], check=True, timeout=600)  # every package pinned: no resolving
            marker.touch()
    return str(python)


def build_in_background() -> subprocess.Popen | None:
    """Start building the venv now, beside the tests that run before the FastMCP ones (pip waits on the disk and
    the network about as much as it computes), off the critical path of a fresh clone's run (figures:
    docs/performance.md). None when it is already built."""
    if installed_marker().exists():
        return None
    VENV.parent.mkdir(parents=True, exist_ok=True)
    with open(VENV.parent / "mcp-clients-build.log", "w") as log:
        return subprocess.Popen([sys.executable, "-m", "tests.clients.support"], cwd=ROOT, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)  # its pip is stopped with it


def fastmcp(scenario: str, url: str, token: str, *, timeout: float = 120) -> dict:
    done = subprocess.run([fastmcp_python(), str(DRIVER), scenario, url, token], capture_output=True, text=True,
                          timeout=timeout, cwd=str(ROOT / "var"))
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    fastmcp_python()
