"""The example tool server's long-running `report` (examples/tool_server.py), which answers with a task, called by the
runtime end to end: an `mcp_tool` task on real workers, the example server a real process registered as a tool server,
in each protocol era. The downstream task is created once (the server's own call log counts it), our task waits for it
without a worker and completes with its result."""

from __future__ import annotations

import pytest

from agents_app import mcp_client
from agents_app.models import DownstreamTask, ToolServer
from checkpoints_app.models import SideEffect
from tasks_app.services import task_create
from tests.tool_server_support import tool_server  # noqa: F401 — the fixture
from tests.worker_support import wait_for_status

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("external_root"), pytest.mark.slow]


def test_it_completes_an_mcp_tool_task_with_the_result_of_the_example_servers_task(tenant, tool_server,  # noqa: F811
                                                                                     workers):
    workers("both", concurrency=2)
    ToolServer.objects.create(tenant=tenant, name="reports", url=tool_server.url, timeout_seconds=10)
    ToolServer.objects.create(tenant=tenant, name="old", url=tool_server.url, timeout_seconds=10, protocol="legacy")
    tasks = {server: task_create(tenant=tenant, owner=None, workflow="mcp_tool",
                                 input={"server": server, "tool": "report",
                                        "arguments": {"title": f"by {server}", "seconds": 1}}).task
             for server in ("reports", "old")}

    done = {server: wait_for_status(task.id, {"completed", "failed", "dead_lettered", "input_required"}, seconds=60)
            for server, task in tasks.items()}

    for server, era in (("reports", "2026-07-28"), ("old", "2025-11-25")):
        task = done[server]
        assert task.status == "completed", (server, task.status, task.error, task.status_message)
        assert task.result["isError"] is False and task.result["structuredContent"] == {
            "title": f"by {server}", "seconds": 1, "answer": None, "report": f"Report 'by {server}', written in 1 s"}
        key = f"{task.id}:1:{server}.report:1"
        [created] = tool_server.calls(event="task_created", idempotency_key_meta=key)  # created exactly once
        assert created["protocol_version"] == era and created["idempotency_key_header"] == key
        assert len(tool_server.calls(event="received", idempotency_key_meta=key)) == 1  # never called again
        assert [line["event"] for line in tool_server.calls(task_id=created["task_id"])] == [
            "task_created", "task_finished"]
        handle = mcp_client.downstream_task(SideEffect.objects.get(task_id=task.id, key=key).result)
        assert handle["taskId"] == created["task_id"]
        assert DownstreamTask.objects.get(task_id=task.id).downstream_id == created["task_id"]
