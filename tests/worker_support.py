"""Real `celery worker` processes for tests, pointed at the test database and broker."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from django.conf import settings
from django.db import connection

from tasks_app.models import Task

ROOT = Path(__file__).resolve().parent.parent


def test_database_url() -> str:
    db = connection.settings_dict  # after pytest-django's setup: NAME is the test database
    password = f":{db['PASSWORD']}" if db.get("PASSWORD") else ""
    return f"postgres://{db['USER']}{password}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"


class Worker:
    """One `celery -A config worker` process; `faults` arms fault points in it only."""

    def __init__(self, name: str, log_dir: Path, *, pool: str = "prefork", concurrency: int = 1, faults: str = "",
                 env: dict | None = None):
        self.name = name
        self.log = log_dir / f"{name}.log"
        environment = dict(os.environ)
        environment.update(
            DATABASE_URL=test_database_url(), REDIS_URL=settings.REDIS_URL, EXTERNAL_ROOT=str(settings.EXTERNAL_ROOT),
            MEDIA_ROOT=str(settings.MEDIA_ROOT), CORPUS_ROOT=str(settings.CORPUS_ROOT), RUNTIME_FAULT_POINTS=faults,
            DB_CONN_MAX_AGE="0",
        )
        environment.update(env or {})
        self.process = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "config", "worker", "-n", f"{name}@%h", "--pool", pool,
             "--concurrency", str(concurrency), "--loglevel", "INFO", "--without-gossip", "--without-mingle",
             "--without-heartbeat"],
            cwd=ROOT, env=environment, stdout=self.log.open("w"), stderr=subprocess.STDOUT, start_new_session=True,
        )
        self._wait_ready()

    def _wait_ready(self, seconds: float = 60) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"worker {self.name} exited:\n{self.log.read_text()[-3000:]}")
            if " ready." in self.log.read_text():
                return
            time.sleep(0.1)
        raise AssertionError(f"worker {self.name} not ready:\n{self.log.read_text()[-3000:]}")

    def wait_exit(self, seconds: float = 60) -> int:
        return self.process.wait(timeout=seconds)

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)


def wait_for_status(task_id, statuses, seconds: float = 60) -> Task:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        task = Task.objects.get(id=task_id)
        if task.status in statuses:
            return task
        time.sleep(0.1)
    raise AssertionError(f"task {task_id} is {task.status} after {seconds} s, wanted {statuses}")


def wait_until(task_id, predicate, seconds: float = 60) -> Task:
    """The task once ``predicate(task)`` holds, read every 50 ms; AssertionError saying where it stands if not."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        task = Task.objects.get(id=task_id)
        if predicate(task):
            return task
        time.sleep(0.05)
    raise AssertionError(f"task {task_id} is {task.status} at step {task.steps_completed} after {seconds} s")
