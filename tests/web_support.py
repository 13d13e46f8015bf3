"""A real uvicorn process serving config.asgi on the test database, started as the run command starts it
(deploy/dev.py web_command), and a JSON call to it."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request

from django.conf import settings

from tests import worker_support
from tests.embedded_support import ROOT, free_port, process_group_stop

_dev = importlib.util.spec_from_file_location("dev_script", ROOT / "deploy" / "dev.py")
dev = importlib.util.module_from_spec(_dev)
_dev.loader.exec_module(dev)


class WebProcess:
    """One uvicorn process serving config.asgi on the test database (rows must be committed to be seen)."""

    def __init__(self, log_dir, *, env: dict | None = None, name: str = "web", port: int | None = None):
        self.port = port or free_port()  # (a port: a restart, where the clients were connected)
        self.log = log_dir / f"{name}-{self.port}.log"
        environment = {**os.environ, "ALLOWED_HOSTS": "127.0.0.1", "DATABASE_URL": worker_support.test_database_url(),
                       "REDIS_URL": settings.REDIS_URL, "MEDIA_ROOT": str(settings.MEDIA_ROOT), **(env or {})}
        environment.pop("DEBUG", None)
        command = dev.web_command(sys.executable, "127.0.0.1", self.port, 1, shutdown_grace_seconds=2)
        self.process = subprocess.Popen(command, cwd=ROOT, env=environment, stdout=self.log.open("w"),
                                        stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 30
        while "Uvicorn running" not in self.log.read_text():
            assert self.process.poll() is None and time.monotonic() < deadline, self.log.read_text()[-3000:]
            time.sleep(0.1)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def stop(self) -> None:
        process_group_stop(self.process, grace=10)


def call(url: str, token: str, *, method: str = "GET", body: dict | None = None) -> tuple[int, dict, dict]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method, headers={
        "Authorization": f"Bearer {token}", "Accept": "application/json",
        **({"Content-Type": "application/json"} if data else {})})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, {k.lower(): v for k, v in response.headers.items()}, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, {k.lower(): v for k, v in error.headers.items()}, json.loads(error.read() or b"null")
