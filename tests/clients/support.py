"""The FastMCP client's own virtualenv (var/venvs/mcp-clients), built from requirements-mcp-clients.txt when missing
or when the pins changed, and a call of tests/clients/fastmcp_driver.py in it."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys

from tests.embedded_support import ROOT

REQUIREMENTS = ROOT / "requirements-mcp-clients.txt"
VENV = ROOT / "var" / "venvs" / "mcp-clients"
DRIVER = ROOT / "tests" / "clients" / "fastmcp_driver.py"


def fastmcp_python() -> str:
    python = VENV / "bin" / "python"
    digest = hashlib.sha256(REQUIREMENTS.read_bytes()).hexdigest()[:16]
    marker = VENV / f".installed-{digest}"
    if not marker.exists():
        if not python.exists():
            subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", "-r",
                        str(REQUIREMENTS)], check=True, timeout=600)
        marker.touch()
    return str(python)


def fastmcp(scenario: str, url: str, token: str, *, timeout: float = 120) -> dict:
    done = subprocess.run([fastmcp_python(), str(DRIVER), scenario, url, token], capture_output=True, text=True,
                          timeout=timeout, cwd=str(ROOT / "var"))
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])
