"""A real worker rides out a 3-second broker restart: it reconnects and runs the next task instead of exiting.

The broker is this test's own embedded Valkey, so stopping it disturbs nobody else. A step is running when the
broker goes away, so its run_step message is unacked (task_acks_late): that is what made the worker's
connection clean-up hit AttributeError("'NoneType' object has no attribute 'hostname'") and exit 1 while
remote control was on (see CELERY_WORKER_ENABLE_REMOTE_CONTROL in config/settings/services.py).
"""

import time

import pytest

from tasks_app.models import Task
from tasks_app.services import task_create
from tests.embedded_support import embedded, free_port
from tests.engine_support import executions
from tests.worker_support import Worker, wait_for_status

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

OUTAGE_SECONDS = 3
DONE = {"completed", "failed", "dead_lettered"}


@pytest.fixture
def valkey(tmp_path, broker_down):
    """An embedded Valkey of the test's own; the test process's Celery app sends to it (restored afterwards)."""
    server = embedded.EmbeddedValkey(tmp_path, free_port())
    server.start()
    broker_down(server.url)
    try:
        yield server
    finally:
        server.stop()


def _wait(condition, seconds, what):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def test_a_worker_reconnects_after_a_broker_restart_with_a_step_in_flight(tenant, external_root, valkey, tmp_path):
    worker = Worker("blip", tmp_path, concurrency=2, env={"REDIS_URL": valkey.url})
    try:
        busy = task_create(tenant=tenant, owner=None, workflow="demo_steps",
                           input={"steps": 1, "sleep_ms": 2500}).task
        _wait(lambda: executions(busy.id)[1] == 1, 20, "the first step to start")

        valkey.stop()  # the step is still sleeping: its run_step message is delivered but not acked
        time.sleep(OUTAGE_SECONDS)
        valkey.start()

        task = task_create(tenant=tenant, owner=None, workflow="demo_steps", input={"steps": 2}).task
        _wait(lambda: worker.process.poll() is not None or Task.objects.get(id=task.id).status in DONE, 15,
              "the task sent after the restart to finish")

        log = worker.log.read_text()
        critical = "\n".join(line for line in log.splitlines() if " CRITICAL " in line)
        assert worker.process.poll() is None, (
            f"the worker exited with {worker.process.returncode}: {critical}\n...\n{log[-2000:]}")
        assert not critical, critical
        task = wait_for_status(task.id, DONE, seconds=1)
        assert task.status == "completed" and task.result == {"steps": 2}
        assert executions(task.id) == {1: 1, 2: 1}
        # The step that outlived the broker's connection still committed (a pool process needs no broker).
        assert Task.objects.get(id=busy.id).status == "completed"
    finally:
        worker.stop()
