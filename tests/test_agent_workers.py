"""SIGKILL a real `celery worker` running an agent (issue 22's must-show): during a model call, right after the model's
answer committed, during a tool call. Counted from outside: the scripted model's request log (how often each turn
was asked) and the example tool server's call log (what landed). A turn whose answer committed is never asked
again; a model call cut off is asked again (it has no side effect); every tool effect lands once; no task is lost.

In the suite each kill point runs AGENT_KILLS times (default 1):
    AGENT_KILLS=20 python3.11 deploy/dev.py test -n 0 tests/test_agent_workers.py
The dead lease is made to run out (time moved, not waited for) and the reaper sent, as beat would."""

from __future__ import annotations

import os
import signal

import pytest

from agents_app.models import ToolServer
from config.celery import app
from tasks_app.models import Task
from tasks_app.services import task_create
from tests.engine_support import configure, expire_lease
from tests.scripted_model_support import unique_key
from tests.tool_server_support import tool_server  # noqa: F401 — the fixture
from tests.worker_support import wait_for_status

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("external_root"), pytest.mark.slow]

KILLS = int(os.environ.get("AGENT_KILLS", "1"))
FINISHED = {"completed", "failed", "dead_lettered", "input_required", "cancelled"}


def kill_group(worker) -> None:
    os.killpg(worker.process.pid, signal.SIGKILL)
    worker.process.wait(timeout=10)


@pytest.mark.parametrize("when", ["during-the-model-call", "right-after-the-answer-committed",
                                  "during-the-tool-call"])
def test_it_asks_the_model_once_per_committed_turn_and_lands_each_tool_effect_once_when_its_worker_is_sigkilled(
        tenant, workers, scripted_model, tool_server, when, settings):  # noqa: F811
    configure(settings, model={"base_url": scripted_model.url, "name": "scripted-1"})  # (checked at create)
    ToolServer.objects.create(tenant=tenant, name="shop", url=tool_server.url, timeout_seconds=10)
    # One slice for the whole task: a slice that ended after its first step on a slow machine would release the lease
    # with that commit, and the kill right after it would leave no lease to run out (the task would wait for the
    # reaper's sweep of lost hints instead, which this test does not wait for).
    model_env = {"RUNTIME_MODEL__BASE_URL": scripted_model.url, "RUNTIME_MODEL__NAME": "scripted-1",
                 "RUNTIME_SLICE_SECONDS": "60"}
    worker = None
    for round_ in range(KILLS):
        key = unique_key(f"kill-{round_}")
        scripted_model.script(key, [
            {"tool_calls": [{"name": "shop__upsert",
                             "arguments": {"key": key, "value": "v",
                                           "delay_ms": 1500 if when == "during-the-tool-call" else 0}}],
             "delay_ms": 1500 if when == "during-the-model-call" else 0},
            {"content": "done"}])
        faults = "after_commit_before_chain:kill@step_seq=1" if when == "right-after-the-answer-committed" else ""
        worker = workers(f"agent-worker-{round_}", pool="solo", env=model_env, faults=faults)
        task = task_create(tenant=tenant, owner=None, workflow="agent",
                           input={"goal": f"Set {key}", "servers": ["shop"]}).task
        tool_key = f"{task.id}:2:shop.upsert:1"
        if when == "during-the-model-call":
            scripted_model.wait_for_request(key, seconds=30, turn=0)  # the request is in; its answer is 1.5 s off
            kill_group(worker)
        elif when == "during-the-tool-call":
            tool_server.wait_for_call(seconds=30, event="received", idempotency_key_meta=tool_key)
            kill_group(worker)
        else:
            assert worker.wait_exit() == -9  # killed by its own fault point, right after the first commit
            assert Task.objects.get(id=task.id).steps_completed == 1
        worker = workers(f"agent-worker-{round_}-next", pool="solo", env=model_env)
        expire_lease(task.id)
        app.send_task("runtime.reap", priority=0)
        task = wait_for_status(task.id, FINISHED, seconds=60)

        assert task.status == "completed", (task.status, task.error, task.status_message)
        assert task.result["answer"] == "done"
        counts = scripted_model.turn_counts(key)
        # a call cut off is asked again (no side effect); a committed answer never is
        assert counts == ({0: 2, 1: 1} if when == "during-the-model-call" else {0: 1, 1: 1}), counts
        assert len(tool_server.calls(tool="upsert", event="applied", idempotency_key_meta=tool_key)) == 1
        worker.stop()
