"""Never ask whether an effect happened while its call can still land (issue 38, Build 2, the first "Must show").

The outside run, as a test: a task calls the example tool server's non-idempotent `append` on a real `celery worker`;
the server logs `received` and applies it DELAY_MS later (its delay_ms knob); the worker is SIGKILLed in between.
Before issue 38 the recovered task asked a person at once ("Did reports.append:1 happen?"); the operator checked the
server, saw nothing (it had not landed yet), answered not_applied, and the runtime called append again: applied twice.
Now the task waits without a worker until the call's deadline (sent at + the timeout it was sent with + the margin,
on the database's clock) and only then asks — by when the first call has landed, so the operator who checks sees it.

The operator here does what the issue's operator did: the moment the question appears they read the server's own
log and answer what it shows — not_applied when no `applied` line is there yet.
"""

from __future__ import annotations

import os
import signal
import time

import pytest
from django.db import connection

from agents_app.gateway.call import NOT_SENT_TRIES, TIMEOUT_GRACE_SECONDS
from agents_app.models import ToolServer
from config.celery import app
from steering_app.services import steering_submit
from tasks_app.models import Task
from tasks_app.services import task_create
from checkpoints_app.models import SideEffect
from tests.engine_support import create_engine_task, drive, effect_deadlines_pass, expire_lease
from tests.tool_server_support import tool_server  # noqa: F401 — the fixture
from tests.worker_support import wait_for_status

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("external_root"), pytest.mark.slow]

SERVER_TIMEOUT = 2  # the server's timeout_seconds: the gateway's bound on the call is 2 × 3 tries + 5 s grace
MARGIN = 1  # effects.unknown_outcome_margin_seconds, for the workers
DELAY_MS = 5000  # the server applies the append 5 s after it received it: before the deadline (12 s), long after
#                  the recovered task would have asked before issue 38
WORKER_ENV = {"RUNTIME_EFFECTS__UNKNOWN_OUTCOME_MARGIN_SECONDS": str(MARGIN)}


def db_now():
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        return cursor.fetchone()[0]


def effect_started_at(task_id, key: str):
    with connection.cursor() as cursor:  # (raw: the test runs unchanged on the code before the deadline existed)
        cursor.execute("SELECT started_at FROM checkpoints_app_sideeffect WHERE task_id = %s AND key = %s",
                       [task_id, key])
        return cursor.fetchone()[0]


def test_it_asks_whether_an_effect_happened_only_after_its_call_can_no_longer_land(tenant, workers,
                                                                                  tool_server):  # noqa: F811
    ToolServer.objects.create(tenant=tenant, name="reports", url=tool_server.url, timeout_seconds=SERVER_TIMEOUT)
    worker = workers("deadline-worker-0", pool="solo", env=WORKER_ENV)
    task = task_create(tenant=tenant, owner=None, workflow="mcp_tool",
                       input={"server": "reports", "tool": "append",
                              "arguments": {"text": "a line", "delay_ms": DELAY_MS}}).task
    key = f"{task.id}:1:reports.append:1"
    tool_server.wait_for_call(seconds=30, event="received", idempotency_key_meta=key)
    os.killpg(worker.process.pid, signal.SIGKILL)  # mid-call: on the wire, the server applies it after its sleep
    worker.process.wait(timeout=10)
    sent_at = effect_started_at(task.id, key)
    bound = SERVER_TIMEOUT * NOT_SENT_TRIES + TIMEOUT_GRACE_SECONDS + MARGIN  # seconds after sending it may land
    workers("deadline-worker-1", pool="solo", env=WORKER_ENV)
    expire_lease(task.id)
    app.send_task("runtime.reap", priority=0)

    # Poll the database: no question while the call can still land; the question once its deadline has passed.
    give_up = time.monotonic() + bound + 60
    while True:
        now = db_now()
        task = Task.objects.get(id=task.id)
        if task.status == "input_required":
            break
        assert task.status in ("recovering", "queued", "working"), (task.status, task.error)
        assert time.monotonic() < give_up, f"no question {bound + 60} s after the call was sent ({task.status})"
        time.sleep(0.1)
    asked_after = (now - sent_at).total_seconds()
    question = task.wait
    assert question["name"] == "effect_outcome" and question["effect"]["key"] == key

    # The operator checks the server at once and answers what its log shows (not_applied: nothing there yet).
    landed = tool_server.calls(event="applied", idempotency_key_meta=key)
    value = {"outcome": "applied", "result": landed[0].get("result")} if landed else {"outcome": "not_applied"}
    steering_submit(task=task, command_type="provide_input", payload={"waitId": question["waitId"], "value": value},
                    expected_version=task.state_version, requested_by="user:ops", reason="checked the server's log")
    task = wait_for_status(task.id, {"completed", "failed", "dead_lettered"}, seconds=60)
    if value["outcome"] == "not_applied":
        time.sleep(DELAY_MS / 1000)  # (the first call lands by now: counted below)
    applied = tool_server.calls(event="applied", idempotency_key_meta=key)
    assert len(applied) == 1, (f"applied {len(applied)} times: asked {asked_after:.1f} s after the call was sent, "
                               f"answered {value['outcome']}")  # the server's own log: once
    assert len(tool_server.calls(event="received", idempotency_key_meta=key)) == 1  # never called twice
    assert asked_after >= bound, f"asked {asked_after:.1f} s after the call was sent; it could land until {bound} s"
    assert task.status == "completed", task.error

    # The question said when the call was sent, why its outcome is unknown and that its deadline has passed; the
    # ledger row keeps its deadline (on the database's clock) and why.
    # (worker_died; timed_out only if the kill came after the client's own 2 s timeout on a loaded machine)
    assert question["effect"]["unknownWhy"] in ("worker_died", "timed_out")
    assert question["effect"]["sentAt"] and question["effect"]["deadline"]
    assert "has passed, so it can no longer land" in question["prompt"]
    assert ("its worker stopped mid-call" in question["prompt"]
            or question["effect"]["unknownWhy"] == "timed_out"), question["prompt"]
    with connection.cursor() as cursor:
        cursor.execute("SELECT EXTRACT(EPOCH FROM deadline - started_at)::float8, unknown_why "
                       "FROM checkpoints_app_sideeffect WHERE task_id = %s AND key = %s", [task.id, key])
        recorded_bound, why = cursor.fetchone()
    assert recorded_bound == pytest.approx(bound)
    assert why == question["effect"]["unknownWhy"]


def test_it_parks_the_question_until_the_deadline_has_passed_on_the_database_clock(tenant, tool_server):  # noqa: F811
    """In process, the decision alone: a row left `started` by a worker that died mid-call, its deadline an hour away
    on the database's clock — the step parks (no worker held, no question, no call); once the deadline has passed
    (time moved, not waited for) the person is asked, told why and that the deadline passed; never called again."""
    ToolServer.objects.create(tenant=tenant, name="shop", url=tool_server.url, timeout_seconds=2)
    task = create_engine_task(tenant, "mcp_tool", server="shop", tool="append", arguments={"text": "once"})
    key = f"{task.id}:1:shop.append:1"
    SideEffect.objects.create(task_id=task.id, step_seq=1, key=key, name="shop.append:1", status="started",
                              attempts=1, lease_epoch=0)
    with connection.cursor() as cursor:
        cursor.execute("UPDATE checkpoints_app_sideeffect SET deadline = now() + interval '1 hour' WHERE key = %s",
                       [key])

    assert drive(task.id, calls=1, until_done=False) == ["parked"]
    task.refresh_from_db()
    assert task.wait is None and "deadline" in task.status_message and "may still land" in task.status_message
    assert SideEffect.objects.get(task_id=task.id, key=key).status == "started"  # (not yet decided either way)

    effect_deadlines_pass(task.id)
    assert drive(task.id)[-1] == "input_required"
    task.refresh_from_db()
    effect = task.wait["effect"]
    assert task.wait["name"] == "effect_outcome" and effect["key"] == key and effect["unknownWhy"] == "worker_died"
    assert effect["sentAt"] and effect["deadline"] and "its worker stopped mid-call" in task.wait["prompt"]
    assert "has passed, so it can no longer land" in task.wait["prompt"]
    row = SideEffect.objects.get(task_id=task.id, key=key)
    assert row.status == "unknown" and row.unknown_why == "worker_died"
    assert tool_server.calls(tool="append") == []  # never called again blindly

    # Answered "applied" with no result (the form's result is optional): the call's step goes on with a stand-in
    # CallToolResult saying so — seen from outside: it failed the task with AttributeError ('NoneType' .get).
    steering_submit(task=task, command_type="provide_input",
                    payload={"waitId": task.wait["waitId"], "value": {"outcome": "applied"}},
                    expected_version=task.state_version, requested_by="user:ops", reason="the server's log has it")
    drive(task.id)
    task.refresh_from_db()
    assert task.status == "completed", task.status_message
    assert task.result["isError"] is False and "no result" in task.result["content"][0]["text"]
    assert tool_server.calls(tool="append") == []
