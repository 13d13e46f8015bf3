"""The client libraries that cannot share the project's virtualenv, each in its own (var/venvs/<name>), built from its
pinned requirements file when missing or when the pins changed, and a call of its driver script in it:
- FastMCP's client with fastmcp-tasks (requirements-mcp-clients.txt, tests/clients/fastmcp_driver.py): it needs
  another redis than ours; its server runs tests/clients/fastmcp_tool_server.py;
- the official SDK's last 1.x, mcp 1.30 (requirements-mcp-sdk1.txt, tests/clients/sdk1_driver.py): its experimental
  2025-11-25 tasks client, which the project's mcp 2.3.0 removed."""

from __future__ import annotations

import fcntl
import hashlib
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from tests.embedded_support import ROOT

VENVS = ROOT / "var" / "venvs"


@dataclass(frozen=True)
class ClientVenv:
    name: str
    requirements: Path
    driver: Path

    @property
    def path(self) -> Path:
        return VENVS / self.name

    def installed_marker(self) -> Path:
        """Written once the venv holds exactly these pins: a change to the requirements file means a new build."""
        digest = hashlib.sha256(self.requirements.read_bytes()).hexdigest()[:16]
        return self.path / f".installed-{digest}"

    def python(self) -> str:
        """The venv's python, once the venv is built. Builds are serialised by a lock file: the test session starts
        one in the background (conftest.py) and the first test that needs it waits for it rather than racing it
        into the venv."""
        python = self.path / "bin" / "python"
        marker = self.installed_marker()
        VENVS.mkdir(parents=True, exist_ok=True)
        with open(VENVS / f"{self.name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not marker.exists():
                uv = Path(sys.executable).parent / "uv"  # (requirements-test.txt: uv, far less CPU than pip)
                if not python.exists():
                    command = [str(uv), "venv", "-q", "--python", sys.executable, str(self.path)] if uv.exists() \
                        else [sys.executable, "-m", "venv", str(self.path)]
                    subprocess.run(command, check=True)
                if uv.exists():
                    subprocess.run([str(uv), "pip", "install", "-q", "--python", str(python), "--no-deps", "-r",
                                    str(self.requirements)], check=True, timeout=600)  # all pinned: no resolving
                else:
                    subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                                    "--no-deps", "-r", str(self.requirements)], check=True, timeout=600)
                marker.touch()
        return str(python)

    def build_in_background(self) -> subprocess.Popen | None:
        """Start building the venv now, beside the tests that run before the ones that need it (pip waits on the
        disk and the network about as much as it computes), off the critical path of a fresh clone's run (figures:
        docs/performance.md). None when it is already built."""
        if self.installed_marker().exists():
            return None
        VENVS.mkdir(parents=True, exist_ok=True)
        with open(VENVS / f"{self.name}-build.log", "w") as log:
            return subprocess.Popen([sys.executable, "-m", "tests.clients.support", self.name], cwd=ROOT, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True)  # its pip is stopped with it

    def run(self, *args: str, timeout: float = 120) -> dict:
        """Run the driver with ``args``; its last line of output is one JSON object."""
        done = subprocess.run([self.python(), str(self.driver), *args], capture_output=True, text=True,
                              timeout=timeout, cwd=str(ROOT / "var"))
        assert done.returncode == 0, done.stderr[-4000:]
        return json.loads(done.stdout.strip().splitlines()[-1])


FASTMCP = ClientVenv("mcp-clients", ROOT / "requirements-mcp-clients.txt", ROOT / "tests" / "clients" /
                     "fastmcp_driver.py")
SDK1 = ClientVenv("mcp-sdk1", ROOT / "requirements-mcp-sdk1.txt", ROOT / "tests" / "clients" / "sdk1_driver.py")
# The test files that use each venv: the session builds a venv in the background when one of them is to run.
USED_BY = {"tests/test_mcp_clients.py": FASTMCP, "tests/test_mcp_sdk1.py": SDK1,
           "tests/test_tool_servers_interop.py": FASTMCP}  # (FastMCP's server there: fastmcp_tool_server.py)


def fastmcp(scenario: str, url: str, token: str, *, timeout: float = 120) -> dict:
    return FASTMCP.run(scenario, url, token, timeout=timeout)


def sdk1(scenario: str, url: str, token: str, *, timeout: float = 120) -> dict:
    return SDK1.run(scenario, url, token, timeout=timeout)


if __name__ == "__main__":
    {venv.name: venv for venv in (FASTMCP, SDK1)}[sys.argv[1]].python()
