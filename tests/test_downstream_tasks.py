"""A downstream tool that answers with a task (the MCP Tasks extension, 2026-07-28), waited for durably: the downstream
task's id is the call's result in the ledger, so it is created once; the calling task lets go of its worker and is
handed back at the server's pollInterval to ask how it stands (tasks/get); the downstream result becomes the call's.

The downstream server is this runtime itself (a real uvicorn process serving /mcp, a real worker), seen from another
tenant through a token, exactly as any MCP client sees it."""

from __future__ import annotations

import os
import signal
import time

import pytest
from django.contrib.auth import get_user_model

from agents_app.models import DownstreamTask, ToolServer
from checkpoints_app.models import SideEffect
from config.celery import app
from steering_app.services import steering_submit
from tasks_app.models import Task, TaskEvent, TenantMembership
from tasks_app.services import api_token_create, task_create, tenant_get_or_create
from tests.engine_support import credentials_env, expire_lease
from tests.worker_support import wait_for_status, wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("external_root"), pytest.mark.slow]
SHARED_WEB = True  # (tests/conftest.py web: shared web processes; web(private=True) for one of its own)

KILLS = int(os.environ.get("TOOL_KILLS", "1"))
# The workers may send DOWNSTREAM_TOKEN to the downstream server on loopback for tenant acme (docs/credentials.md).
DOWNSTREAM_GRANT = credentials_env(DOWNSTREAM_TOKEN={"tenants": ["acme"], "hosts": ["127.0.0.1"]})


def downstream_token(slug: str = "downstream") -> tuple:
    tenant = tenant_get_or_create(slug=slug, name=slug)
    user, _ = get_user_model().objects.get_or_create(username=f"{slug}-agent")
    TenantMembership.objects.get_or_create(user=user, tenant=tenant)
    return tenant, api_token_create(tenant=tenant, user=user, name="downstream",
                                    scopes=("tasks:read", "tasks:write"))[1]


def test_it_waits_for_a_downstream_task_without_a_worker_and_takes_its_result(tenant, web, workers):
    other, token = downstream_token()
    server = web()
    workers("both", concurrency=2, env={"DOWNSTREAM_TOKEN": token, **DOWNSTREAM_GRANT})
    ToolServer.objects.create(tenant=tenant, name="self", url=server.url("/mcp"), credential="DOWNSTREAM_TOKEN")
    task = task_create(tenant=tenant, owner=None, workflow="mcp_tool",
                       input={"server": "self", "tool": "demo_steps",
                              "arguments": {"steps": 8, "sleep_ms": 250, "effect": False}}).task

    waiting = wait_until(task.id, lambda t: t.status_message.startswith("Waiting for self.demo_steps"), seconds=60)
    assert waiting.lease_owner is None  # no worker holds it while it waits
    done = wait_for_status(task.id, {"completed", "failed", "dead_lettered", "input_required"}, seconds=90)

    downstream = list(Task.objects.filter(tenant=other, workflow_name="demo_steps"))
    assert done.status == "completed", (done.status, done.error, done.status_message)
    assert len(downstream) == 1 and downstream[0].status == "completed"  # created once
    assert done.result["isError"] is False and done.result["structuredContent"] == {"steps": 8}
    handle = SideEffect.objects.get(task_id=task.id).result["_meta"]["io.agentruntime/downstream-task"]
    assert handle["taskId"] == str(downstream[0].id)


def test_it_collects_a_downstream_tasks_result_after_every_worker_was_sigkilled(tenant, web, workers):
    """KILLS times (TOOL_KILLS, default 1; the issue's twenty: TOOL_KILLS=20 python3.11 deploy/dev.py test -n 0
    tests/test_downstream_tasks.py): every worker is SIGKILLed while our task waits for the downstream task (which
    runs on those same workers); the next worker takes both over. Each downstream task is created once, and its
    result is collected."""
    other, token = downstream_token()
    server = web()
    worker = workers("worker-0", concurrency=2, env={"DOWNSTREAM_TOKEN": token, **DOWNSTREAM_GRANT})
    ToolServer.objects.create(tenant=tenant, name="self", url=server.url("/mcp"), credential="DOWNSTREAM_TOKEN")
    for round_ in range(KILLS):
        task = task_create(tenant=tenant, owner=None, workflow="mcp_tool",
                           input={"server": "self", "tool": "demo_steps",
                                  "arguments": {"steps": 12, "sleep_ms": 250, "effect": False}}).task
        wait_until(task.id, lambda t: t.status_message.startswith("Waiting for self.demo_steps"), seconds=60)
        # Killed mid-run, not before its first claim (a hint taken with the worker is re-sent, not recovered).
        deadline = time.monotonic() + 30
        while not Task.objects.filter(tenant=other, workflow_name="demo_steps", lease_owner__isnull=False,
                                      steps_completed__gte=1, status="working").exists():
            assert time.monotonic() < deadline, "the downstream task never started"
            time.sleep(0.05)

        os.killpg(worker.process.pid, signal.SIGKILL)  # the downstream task's worker and our hint, gone at once
        worker.process.wait(timeout=10)
        for leased in Task.objects.filter(lease_owner__isnull=False).values_list("id", flat=True):
            expire_lease(leased)  # time moved instead of waited for: the dead worker's leases run out
        worker = workers(f"worker-{round_ + 1}", concurrency=2, env={"DOWNSTREAM_TOKEN": token, **DOWNSTREAM_GRANT})
        deadline = time.monotonic() + 90
        while Task.objects.get(id=task.id).status not in ("completed", "failed", "dead_lettered"):
            assert time.monotonic() < deadline, Task.objects.get(id=task.id).status_message
            app.send_task("runtime.reap", priority=0)  # as beat would: recovers the lease, re-sends lost hints
            time.sleep(1)

        done = Task.objects.get(id=task.id)
        handle = SideEffect.objects.get(task_id=task.id).result["_meta"]["io.agentruntime/downstream-task"]
        downstream = Task.objects.get(id=handle["taskId"])
        assert done.status == "completed" and done.result["structuredContent"] == {"steps": 12}
        assert downstream.recoveries >= 1 and downstream.status == "completed"  # recovered, its result collected
    assert Task.objects.filter(tenant=other, workflow_name="demo_steps").count() == KILLS  # each created once


def test_it_relays_a_downstream_tasks_question_to_a_person_and_their_answer_back(tenant, web, workers):
    other, token = downstream_token()
    server = web()
    workers("both", concurrency=2, env={"DOWNSTREAM_TOKEN": token, **DOWNSTREAM_GRANT})
    ToolServer.objects.create(tenant=tenant, name="self", url=server.url("/mcp"), credential="DOWNSTREAM_TOKEN")
    task = task_create(tenant=tenant, owner=None, workflow="mcp_tool",
                       input={"server": "self", "tool": "demo_steps",
                              "arguments": {"steps": 4, "sleep_ms": 50, "effect": False, "ask_at": 1}}).task

    asking = wait_for_status(task.id, {"input_required", "completed", "failed", "dead_lettered"}, seconds=60)
    assert asking.status == "input_required" and asking.wait["name"] == "downstream_input", asking.status_message
    downstream = Task.objects.get(tenant=other, workflow_name="demo_steps")
    assert asking.wait["downstream"]["taskId"] == str(downstream.id) and "A note for step" in asking.wait["prompt"]
    steering_submit(task=asking, command_type="provide_input",
                    payload={"waitId": asking.wait["waitId"], "value": {"note": "relayed"}},
                    expected_version=asking.state_version, requested_by="user:ops", reason="answering for them")

    done = wait_for_status(task.id, {"completed", "failed", "dead_lettered"}, seconds=60)
    downstream.refresh_from_db()
    assert done.status == "completed" and downstream.status == "completed"
    assert [answer["value"] for answer in downstream.answers.values()] == [{"note": "relayed"}]
    assert Task.objects.filter(tenant=other).count() == 1  # still the one downstream task


def test_it_cancels_the_downstream_task_when_the_task_waiting_for_it_is_cancelled(tenant, web, workers):
    other, token = downstream_token()
    server = web()
    workers("both", concurrency=2, env={"DOWNSTREAM_TOKEN": token, **DOWNSTREAM_GRANT})
    ToolServer.objects.create(tenant=tenant, name="self", url=server.url("/mcp"), credential="DOWNSTREAM_TOKEN")
    task = task_create(tenant=tenant, owner=None, workflow="mcp_tool",
                       input={"server": "self", "tool": "demo_steps",
                              "arguments": {"steps": 400, "sleep_ms": 100, "effect": False}}).task
    waiting = wait_until(task.id, lambda t: t.status_message.startswith("Waiting for self.demo_steps"), seconds=60)

    steering_submit(task=waiting, command_type="cancel", payload={}, expected_version=waiting.state_version,
                    requested_by="user:ops", reason="not needed any more")
    assert wait_for_status(task.id, {"cancelled"}, seconds=30).status == "cancelled"
    app.send_task("runtime.reap", priority=0)  # as beat would

    downstream = Task.objects.get(tenant=other, workflow_name="demo_steps")
    cancelled = wait_for_status(downstream.id, {"cancelled", "completed"}, seconds=60)
    assert cancelled.status == "cancelled" and cancelled.steps_completed < 400
    assert DownstreamTask.objects.get(task_id=task.id).state == "cancel_sent"


def test_it_creates_one_downstream_task_per_idempotency_key_on_this_runtimes_own_mcp(tenant, web):
    """This runtime as a downstream server honours the key its own client sends: a caller that lost the answer and
    calls again with the same key gets the same task; another key, another task; the same key for other arguments
    is refused."""
    import asyncio

    from agents_app import mcp_client

    other, token = downstream_token()
    server = web()
    url = server.url("/mcp")

    def call(key: str, steps: int) -> dict:
        return asyncio.run(mcp_client.call(url, "demo_steps", {"steps": steps}, token=token, key=key, timeout=10))

    first, again, another = call("k-1", 3), call("k-1", 3), call("k-2", 3)
    with pytest.raises(mcp_client.Refused, match="already used for a different request"):  # (-32602, HTTP 400)
        call("k-1", 4)

    ids = [mcp_client.downstream_task(result)["taskId"] for result in (first, again, another)]
    assert ids[0] == ids[1] != ids[2]
    assert Task.objects.filter(tenant=other, workflow_name="demo_steps").count() == 2


def test_it_waits_for_a_downstream_task_of_a_2025_11_25_server_and_takes_its_result(tenant, web, workers):
    """The same durable wait with the server pinned to the 2025-11-25 era: the call asks for a task (params.task,
    for a tool whose execution.taskSupport allows it), tasks/get tells how it stands, tasks/result gives the
    finished task's CallToolResult."""
    other, token = downstream_token()
    server = web()
    workers("both", concurrency=2, env={"DOWNSTREAM_TOKEN": token, **DOWNSTREAM_GRANT})
    ToolServer.objects.create(tenant=tenant, name="old", url=server.url("/mcp"), credential="DOWNSTREAM_TOKEN",
                              protocol="legacy")
    task = task_create(tenant=tenant, owner=None, workflow="mcp_tool",
                       input={"server": "old", "tool": "demo_steps",
                              "arguments": {"steps": 6, "sleep_ms": 250, "effect": False}}).task

    waiting = wait_until(task.id, lambda t: t.status_message.startswith("Waiting for old.demo_steps"), seconds=60)
    assert waiting.lease_owner is None
    done = wait_for_status(task.id, {"completed", "failed", "dead_lettered", "input_required"}, seconds=90)

    assert done.status == "completed", (done.status, done.error, done.status_message)
    assert done.result["isError"] is False and done.result["structuredContent"] == {"steps": 6}
    handle = SideEffect.objects.get(task_id=task.id).result["_meta"]["io.agentruntime/downstream-task"]
    assert handle["era"] == "2025-11-25"
    assert Task.objects.filter(tenant=other, workflow_name="demo_steps").count() == 1


@pytest.mark.parametrize("expired", [False, True], ids=["answered-in-time", "answered-after-the-request-expired"])
def test_it_relays_a_2025_11_25_downstream_tasks_question_asked_on_tasks_result_and_sends_the_answer_back(
        tenant, web, workers, expired):
    """2025-11-25: a downstream task asks only on the stream of a tasks/result request (an elicitation/create). The
    question is taken from there and the connection let go unanswered; our task waits for a person; their answer, on
    whichever worker, goes back as the JSON-RPC response to that request — which the downstream applies. Expired: the
    downstream no longer takes a response to that request (here its signed id outlived MCP_ELICITATION_ANSWER_SECONDS),
    so the question is taken again — the same question, the same wait: the person's answer is sent, never asked for
    twice."""
    other, token = downstream_token()
    server = web(**({"MCP_ELICITATION_ANSWER_SECONDS": 1} if expired else {}))
    worker = workers("both", concurrency=2, env={"DOWNSTREAM_TOKEN": token, **DOWNSTREAM_GRANT})
    ToolServer.objects.create(tenant=tenant, name="old", url=server.url("/mcp"), credential="DOWNSTREAM_TOKEN",
                              protocol="legacy")
    task = task_create(tenant=tenant, owner=None, workflow="mcp_tool",
                       input={"server": "old", "tool": "demo_steps",
                              "arguments": {"steps": 4, "sleep_ms": 50, "effect": False, "ask_at": 1}}).task

    asking = wait_for_status(task.id, {"input_required", "completed", "failed", "dead_lettered"}, seconds=60)
    assert asking.status == "input_required" and asking.wait["name"] == "downstream_input", asking.status_message
    downstream = Task.objects.get(tenant=other, workflow_name="demo_steps")
    assert asking.wait["downstream"]["taskId"] == str(downstream.id) and "A note for step" in asking.wait["prompt"]
    index = DownstreamTask.objects.get(task_id=task.id)
    assert str(index.question["id"]).startswith("elicit:")  # the request it was asked in, to be answered later
    assert "session" not in str(asking.wait)  # (kept on the index row, never shown)
    if expired:
        time.sleep(2.1)  # (the signature's age is counted in whole seconds)
    steering_submit(task=asking, command_type="provide_input",
                    payload={"waitId": asking.wait["waitId"], "value": asking_value(asking.wait)},
                    expected_version=asking.state_version, requested_by="user:ops", reason="answering for them")

    done = wait_for_status(task.id, {"completed", "failed", "dead_lettered"}, seconds=60)
    downstream.refresh_from_db()
    assert done.status == "completed" and downstream.status == "completed", (done.status, done.status_message)
    assert [answer["value"] for answer in downstream.answers.values()] == [{"note": "relayed in 2025"}]
    assert Task.objects.filter(tenant=other).count() == 1  # still the one downstream task
    index.refresh_from_db()
    assert index.question is None and index.questions_answered == 1
    assert TaskEvent.objects.filter(task_id=task.id, type="input_required").count() == 1  # one person asked, once
    # expired: the answer refused (HTTP 400: the question expired), the question taken again and answered
    assert ("did not take the answer to its question (the answer was not taken: HTTP 400" in worker.log.read_text()) \
        == expired


def asking_value(wait: dict) -> dict:
    """The answer, shaped as the relayed question's form asks it (a 2025-11-25 form is a flat object)."""
    properties = (wait.get("schema") or {}).get("properties") or {}
    return {"note": "relayed in 2025"} if "note" in properties else {"value": {"note": "relayed in 2025"}}
