"""Two independent client libraries against real uvicorn and celery workers, each in both protocol eras where it
supports them: the official `mcp` SDK's client (tests/test_mcp_bridge.py drives it in depth) and FastMCP's stock
client with fastmcp-tasks, in its own virtualenv (tests/clients)."""

from __future__ import annotations

import pytest

from tasks_app.models import Task
from tests.clients.support import fastmcp

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("external_root")]
SHARED_WEB = True  # (tests/conftest.py web: shared web processes; web(private=True) for one of its own)


def test_it_runs_a_workflow_as_a_task_with_fastmcp_polled_to_completion(web, workers, tenant_token):  # noqa: F811
    tenant, token = tenant_token("acme")
    server = web()
    workers("mcp")
    got = fastmcp("task", server.url("/mcp"), token)
    assert "demo_steps" in got["tools"] and "steer_task" in got["tools"]
    assert got["first"] in ("working", "completed")
    assert got["result"] == {"isError": False, "structured": {"steps": 3}, "text": ['{"steps": 3}']}
    assert Task.objects.get(id=got["taskId"]).tenant_id == tenant.id


def test_it_answers_a_waiting_task_through_fastmcps_elicitation_handler(web, workers, tenant_token):  # noqa: F811
    _tenant, token = tenant_token("acme")
    server = web()
    workers("mcp")
    got = fastmcp("input", server.url("/mcp"), token)
    assert got["asked"] == ["A note for step 2, please"]
    assert got["result"]["structured"] == {"steps": 3, "note": "from fastmcp"}


def test_it_cancels_a_task_from_fastmcp(web, workers, tenant_token):  # noqa: F811
    _tenant, token = tenant_token("acme")
    server = web()
    workers("mcp")
    got = fastmcp("cancel", server.url("/mcp"), token)
    assert got["status"] == "cancelled" and Task.objects.get(id=got["taskId"]).status == "cancelled"


def test_it_answers_fastmcps_2025_handshake_synchronously(web, workers, tenant_token):  # noqa: F811
    _tenant, token = tenant_token("acme")
    server = web()
    workers("mcp")
    assert fastmcp("legacy", server.url("/mcp"), token)["result"]["structured"] == {"steps": 2}
