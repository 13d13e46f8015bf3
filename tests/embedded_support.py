"""Helpers for tests of the embedded services and the run command (deploy/ is not a package)."""

import os
import shutil
import signal
import socket
import subprocess
import sys
import uuid
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "deploy"))

import embedded  # noqa: E402,F401  (re-exported for the tests)


def process_group_stop(process: subprocess.Popen, *, grace: float = 5) -> None:
    """End a server a test started in a session of its own: SIGTERM to its group, SIGKILL after ``grace`` seconds.
    A process that already exited (a test stopped it itself) is left as it is."""
    if process.poll() is not None:
        return
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def data_folder():
    """A fresh data folder the PostgreSQL server account can reach (pytest's tmp dirs are 0700)."""
    path = ROOT / "var" / f"test-{uuid.uuid4().hex[:8]}"
    path.mkdir(parents=True)
    os.chmod(ROOT / "var", 0o755)
    os.chmod(path, 0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
