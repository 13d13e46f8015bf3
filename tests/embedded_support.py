"""Helpers for tests of the embedded services and the run command (deploy/ is not a package)."""

import os
import shutil
import socket
import sys
import uuid
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "deploy"))

import embedded  # noqa: E402,F401  (re-exported for the tests)


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
