"""The MCP bridge end to end: real uvicorn processes serving /mcp, real `celery worker` processes running the tasks,
driven by the official `mcp` SDK's client (2026-07-28 with the tasks extension, and 2025-11-25) and by raw HTTP for
what a stock client never sends."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import time
import urllib.error
import urllib.request

import pytest

from tasks_app.models import Task, Tenant
from tasks_app.services import task_create
from tests.embedded_support import free_port
from tests.mcp_support import call_tool_as_2025_task, cancel_task, get_task, mcp_client, poll_until, update_task
from tests.support.mcp import EXT, MODERN, rpc
from tests.support.streams import sse
from tests.web_support import call
from tests.worker_support import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("external_root")]
SHARED_WEB = True  # (tests/conftest.py web: shared web processes; web(private=True) for one of its own)

def run(coroutine):
    return asyncio.run(coroutine)


# -- the official client, 2026-07-28 with the tasks extension -----------------------------------------------------
def test_it_runs_a_workflow_tool_as_a_task_polled_to_completion(web, workers, tenant_token):
    tenant, token = tenant_token("acme")
    server = web()
    workers("mcp")

    async def scenario():
        async with mcp_client(server.url("/mcp"), token) as client:
            assert client.protocol_version == MODERN
            assert EXT in (client.server_capabilities.extensions or {})
            tools = {tool.name: tool for tool in (await client.list_tools()).tools}
            assert tools["demo_steps"].input_schema["required"] == ["steps"] and "steer_task" in tools
            assert tools["demo_steps"].annotations.title == "Demo steps"
            assert tools["document_review"].annotations.open_world_hint is True
            created = await client.session.call_tool("demo_steps", {"steps": 3}, allow_claimed=True)
            assert created.result_type == "task" and created.status == "working"
            # durably created before the answer: the row is there
            assert await asyncio.to_thread(lambda: Task.objects.filter(id=created.task_id).exists())
            done = await poll_until(client.session, created.task_id, {"completed", "failed", "cancelled"})
            resolved = await client.call_tool("demo_steps", {"steps": 2})  # the claim resolves it transparently
            return created, done, resolved

    created, done, resolved = run(scenario())
    assert done.status == "completed", done
    assert done.result["structuredContent"] == {"steps": 3} and done.result["isError"] is False
    assert json.loads(resolved.content[0].text) == {"steps": 2}
    task = Task.objects.get(id=created.task_id)
    assert task.tenant_id == tenant.id and task.workflow_name == "demo_steps"


def test_it_goes_input_required_then_completes_after_tasks_update(web, workers, tenant_token):
    _tenant, token = tenant_token("acme")
    server = web()
    workers("mcp")

    async def scenario():
        async with mcp_client(server.url("/mcp"), token) as client:
            created = await client.session.call_tool("demo_steps", {"steps": 3, "ask_parts_at": 1},
                                                     allow_claimed=True)
            waiting = await poll_until(client.session, created.task_id, {"input_required"})
            keys = sorted(waiting.input_requests)
            colour = next(k for k in keys if k.endswith(".colour"))
            size = next(k for k in keys if k.endswith(".size"))
            assert waiting.input_requests[size]["params"]["requestedSchema"]["properties"]["value"]["type"] == "integer"
            # a bad answer is an error, and the task still waits
            with pytest.raises(Exception) as refused:
                await update_task(client.session, created.task_id, {size: {"action": "accept",
                                                                           "content": {"value": 99}}})
            still = await get_task(client.session, created.task_id)
            # one part at a time: the other is still asked for
            await update_task(client.session, created.task_id, {colour: {"action": "accept",
                                                                         "content": {"value": "green"}}})
            partial = await get_task(client.session, created.task_id)
            await update_task(client.session, created.task_id, {size: {"action": "accept",
                                                                       "content": {"value": 4}},
                                                                "unknown-key": {"ignored": True}})
            done = await poll_until(client.session, created.task_id, {"completed", "failed", "cancelled"})
            return refused.value, still, partial, done, size

    refused, still, partial, done, size = run(scenario())
    assert getattr(refused, "error", None) is not None and refused.error.code == -32602
    assert still.status == "input_required" and len(still.input_requests) == 2
    assert partial.status == "input_required" and list(partial.input_requests) == [size]
    assert done.status == "completed" and done.result["structuredContent"]["survey"] == {"colour": "green",
                                                                                         "size": 4}


def test_it_cancels_a_running_task_and_acknowledges_a_cancel_of_a_finished_one(web, workers, tenant_token):
    _tenant, token = tenant_token("acme")
    server = web()
    workers("mcp")

    async def scenario():
        async with mcp_client(server.url("/mcp"), token) as client:
            created = await client.session.call_tool("demo_steps", {"steps": 200, "sleep_ms": 100},
                                                     allow_claimed=True)
            await poll_until(client.session, created.task_id, {"working"})
            await cancel_task(client.session, created.task_id)
            cancelled = await poll_until(client.session, created.task_id, {"cancelled", "completed", "failed"})
            again = await cancel_task(client.session, created.task_id)  # idempotent on a terminal task
            return cancelled, again

    cancelled, again = run(scenario())
    assert cancelled.status == "cancelled"
    assert again is not None


def test_it_answers_synchronously_a_client_without_the_extension(web, workers, tenant_token):
    _tenant, token = tenant_token("acme")
    server = web()
    workers("mcp")

    async def scenario():
        async with mcp_client(server.url("/mcp"), token, tasks=False) as modern, \
                mcp_client(server.url("/mcp"), token, tasks=False, mode="legacy") as legacy:
            return (modern.protocol_version, await modern.call_tool("demo_steps", {"steps": 2}),
                    legacy.protocol_version, await legacy.call_tool("demo_steps", {"steps": 1}))

    modern_version, modern_result, legacy_version, legacy_result = run(scenario())
    assert modern_version == MODERN and legacy_version == "2025-11-25"
    assert modern_result.structured_content == {"steps": 2} and not modern_result.is_error
    assert legacy_result.structured_content == {"steps": 1}


# -- the gate: who may call, and what a malformed request gets -----------------------------------------------------
def test_it_refuses_without_a_token_with_the_protected_resource_metadata(web, tenant_token):
    server = web()
    status, headers, body = rpc(server.url("/mcp"), "tools/list")
    # No credentials: no error code (RFC 6750 §3.1), only the challenge and where to learn how to authenticate.
    assert status == 401 and "error" not in body and "error=" not in headers["www-authenticate"]
    assert headers["www-authenticate"].startswith('Bearer resource_metadata="http://127.0.0.1:')
    metadata_url = headers["www-authenticate"].split('resource_metadata="')[1].rstrip('"')
    with urllib.request.urlopen(metadata_url, timeout=10) as response:
        metadata = json.loads(response.read())
    assert metadata["resource"] == server.url("/mcp") and "tasks:read" in metadata["scopes_supported"]
    # A token that is refused: invalid_token.
    status, headers, body = rpc(server.url("/mcp"), "tools/list", token="art_not-a-token")
    assert status == 401 and body["error"] == "invalid_token"
    assert headers["www-authenticate"].startswith('Bearer error="invalid_token", resource_metadata="http://127.')
    with urllib.request.urlopen(server.url("/.well-known/oauth-protected-resource/runtime"), timeout=10) as response:
        assert json.loads(response.read())["resource"] == server.url("/runtime")  # (the REST API's, RFC 9728)


def test_it_checks_the_scope_of_each_method(web, tenant_token):
    _tenant, read_only = tenant_token("acme", scopes=("tasks:read",))
    server = web()
    status, _, body = rpc(server.url("/mcp"), "tools/list", token=read_only)
    assert status == 200 and any(tool["name"] == "demo_steps" for tool in body["result"]["tools"])
    status, headers, body = rpc(server.url("/mcp"), "tools/call", {"name": "demo_steps", "arguments": {"steps": 1}},
                                token=read_only, headers={"Mcp-Name": "demo_steps"})
    assert status == 403 and body["error"] == "insufficient_scope"
    assert 'scope="tasks:write"' in headers["www-authenticate"]
    assert not Task.objects.exists()


def test_it_refuses_a_foreign_host_and_origin(web, tenant_token):
    _tenant, token = tenant_token("acme")
    server = web()
    assert rpc(server.url("/mcp"), "tools/list", token=token, headers={"Host": "evil.example.com"})[0] == 421
    assert rpc(server.url("/mcp"), "tools/list", token=token,
               headers={"Origin": "http://evil.example.com"})[0] == 403
    assert rpc(server.url("/mcp"), "tools/list", token=token,
               headers={"Origin": server.url("")})[0] == 200


def test_it_gives_another_tenants_task_id_the_answer_of_an_unknown_one(web, workers, tenant_token):
    _acme, acme_token = tenant_token("acme")
    _other, other_token = tenant_token("globex")
    server = web()
    status, _, created = rpc(server.url("/mcp"), "tools/call", {"name": "demo_steps", "arguments": {"steps": 1}},
                             token=acme_token, headers={"Mcp-Name": "demo_steps"})
    task_id = created["result"]["taskId"]
    unknown = "00000000-0000-4000-8000-000000000000"
    answers = [rpc(server.url("/mcp"), method, {"taskId": tid}, token=other_token, headers={"Mcp-Name": tid})
               for method in ("tasks/get", "tasks/cancel") for tid in (task_id, unknown)]
    assert [a[0] for a in answers] == [400] * 4
    assert answers[0][2]["error"] == answers[1][2]["error"] and answers[2][2]["error"] == answers[3][2]["error"]
    assert Task.objects.get(id=task_id).status == "queued"  # the foreign cancel did nothing


@pytest.mark.parametrize("case", ["mismatched_name", "bad_json", "batch", "oversized", "get", "no_method_header",
                                  "tasks_without_extension", "removed_tasks_result", "missing_name_on_tools_call",
                                  "malformed_input_responses", "wrong_content_type"])
def test_it_answers_malformed_requests_with_the_spec_error_codes(web, tenant_token, case):
    _tenant, token = tenant_token("acme")
    server = web(MCP_MAX_REQUEST_BYTES=20_000)
    url = server.url("/mcp")
    tid = "00000000-0000-4000-8000-000000000000"
    if case == "mismatched_name":
        status, _, body = rpc(url, "tasks/get", {"taskId": tid}, token=token, headers={"Mcp-Name": "other"})
        assert (status, body["error"]["code"]) == (400, -32020)
    elif case == "bad_json":
        status, _, body = rpc(url, "tools/list", token=token, body=b"{not json")
        assert (status, body["error"]["code"]) == (400, -32700)
    elif case == "batch":
        status, _, body = rpc(url, "tools/list", token=token, body=b'[{"jsonrpc":"2.0","id":1,"method":"tools/list"}]')
        assert (status, body["error"]["code"]) == (400, -32600)
    elif case == "oversized":
        status, _, body = rpc(url, "tools/list", {"pad": "x" * 30_000}, token=token)
        assert status == 413 and body["error"]["code"] == -32600
    elif case == "get":
        assert rpc(url, "tools/list", token=token, http_method="GET")[0] == 405
    elif case == "no_method_header":
        status, _, body = rpc(url, "tools/list", token=token, headers={"Mcp-Method": None})
        assert (status, body["error"]["code"]) == (400, -32020)
    elif case == "tasks_without_extension":
        status, _, body = rpc(url, "tasks/get", {"taskId": tid}, token=token, headers={"Mcp-Name": tid}, caps={})
        assert body["error"]["code"] == -32021
        assert body["error"]["data"]["requiredCapabilities"]["extensions"] == {EXT: {}}
    elif case == "missing_name_on_tools_call":
        status, _, body = rpc(url, "tools/call", {"name": "demo_steps", "arguments": {"steps": 1}}, token=token)
        assert (status, body["error"]["code"]) == (400, -32020) and not Task.objects.exists()
    elif case == "malformed_input_responses":
        status, _, body = rpc(url, "tasks/update", {"taskId": tid, "inputResponses": "yes"}, token=token,
                              headers={"Mcp-Name": tid})
        assert (status, body["error"]["code"]) == (400, -32602)
    elif case == "wrong_content_type":
        status, _, body = rpc(url, "tools/list", token=token, headers={"Content-Type": "text/plain"})
        assert (status, body["error"]["code"]) == (415, -32600)
    elif case == "removed_tasks_result":
        status, _, body = rpc(url, "tasks/result", {"taskId": tid}, token=token, headers={"Mcp-Name": tid})
        assert (status, body["error"]["code"]) == (404, -32601)


def test_it_answers_a_2025_client_s_invalid_envelope_with_32600_naming_what_is_wrong(web, tenant_token):
    """On the 2025-11-25 path (no 2026 header) the SDK answered -32602 with a raw pydantic dump, and dropped a message
    with an object or boolean id with a 202 as if it were a notification."""
    _tenant, token = tenant_token("acme")
    url = web().url("/mcp")
    cases = [
        ({"jsonrpc": "2.0", "id": 2}, 2, "`method` must be a string"),
        ({"jsonrpc": "2.0", "id": 3, "method": "tools/list", "params": [1, 2]}, 3, "`params` must be an object"),
        ({"jsonrpc": "1.0", "id": 4, "method": "tools/list"}, 4, '`jsonrpc` must be "2.0"'),
        ({"jsonrpc": "2.0", "id": {"a": 1}, "method": "tools/list"}, None, "`id` must be a string or an integer"),
        ({"jsonrpc": "2.0", "id": True, "method": "tools/list"}, None, "`id` must be a string or an integer"),
        ({"jsonrpc": "2.0", "id": 5, "method": "server/discover", "params": {}}, 5, "MCP-Protocol-Version: 2026-07-28"),
    ]
    for version in ("2025-11-25", None):  # after initialize, and the unversioned first request
        for message, message_id, says in cases:
            status, _, body = rpc(url, "x", token=token, body=json.dumps(message).encode(),
                                  headers={"MCP-Protocol-Version": version, "Mcp-Method": None})
            assert (status, body["error"]["code"], body["id"]) == (400, -32600, message_id), (message, body)
            assert says in body["error"]["message"] and "validation error" not in body["error"]["message"]
    # A well-formed 2025 request still goes through.
    status, _, body = rpc(url, "initialize", token=token, headers={"MCP-Protocol-Version": None, "Mcp-Method": None},
                          body=json.dumps({"jsonrpc": "2.0", "id": 9, "method": "initialize", "params": {
                              "protocolVersion": "2025-11-25", "capabilities": {},
                              "clientInfo": {"name": "probe", "version": "1"}}}).encode())
    assert status == 200 and body["result"]["protocolVersion"] == "2025-11-25"


def test_it_keeps_the_rest_api_and_its_snapshot_edge_beside_the_mcp_endpoint(web, tenant_token):
    tenant, token = tenant_token("acme")
    server = web()
    status, _, body = rpc(server.url("/mcp"), "tools/call", {"name": "demo_steps", "arguments": {"steps": 1}},
                          token=token, headers={"Mcp-Name": "demo_steps"})
    task_id = body["result"]["taskId"]
    status, _, snapshot = call(server.url(f"/runtime/tasks/{task_id}"), token)
    assert status == 200 and snapshot["taskId"] == task_id and snapshot["status"] == "working"
    status, _, problem = call(server.url("/mcp/anything"), token)
    assert status == 404


# -- 2025-11-25 tasks (params.task, tasks/get, tasks/result, tasks/list, tasks/cancel) -----------------------------
def test_it_runs_a_task_for_a_2025_client_through_params_task_and_a_blocking_tasks_result(web, workers, tenant_token):
    import mcp.types as types

    _tenant, token = tenant_token("acme")
    server = web()
    workers("mcp")

    async def scenario():
        async with mcp_client(server.url("/mcp"), token, tasks=False, mode="legacy") as client:
            session = client.session
            listed = {tool.name: tool for tool in (await client.list_tools()).tools}
            created = await call_tool_as_2025_task(session, "demo_steps", {"steps": 3, "sleep_ms": 200})
            task_id = created.task.task_id
            polled = await session.send_request(types.GetTaskRequest(
                params=types.GetTaskRequestParams(task_id=task_id)), types.GetTaskResult)
            result = await session.send_request(types.GetTaskPayloadRequest(
                params=types.GetTaskPayloadRequestParams(task_id=task_id)), types.CallToolResult)
            done = await session.send_request(types.GetTaskRequest(
                params=types.GetTaskRequestParams(task_id=task_id)), types.GetTaskResult)
            page = await session.send_request(types.ListTasksRequest(), types.ListTasksResult)
            with pytest.raises(Exception) as finished:
                await session.send_request(types.CancelTaskRequest(
                    params=types.CancelTaskRequestParams(task_id=task_id)), types.CancelTaskResult)
            era = (client.protocol_version, client.server_capabilities.tasks)
            return era, listed, created, polled, result, done, page, finished.value

    era, listed, created, polled, result, done, page, finished = run(scenario())
    assert era[0] == "2025-11-25" and era[1] is not None
    assert listed["demo_steps"].execution.task_support == "optional"
    assert created.task.status == "working" and created.task.ttl
    assert polled.status in ("working", "completed")
    assert result.structured_content == {"steps": 3}
    assert result.meta["io.modelcontextprotocol/related-task"] == {"taskId": created.task.task_id}
    assert done.status == "completed"
    assert created.task.task_id in [task.task_id for task in page.tasks]
    assert finished.error.code == -32602  # a finished task cannot be cancelled in this era


def test_it_cancels_a_2025_task_and_reports_a_tool_error_as_failed(web, workers, tenant_token):
    import mcp.types as types

    _tenant, token = tenant_token("acme")
    server = web()
    workers("mcp")

    async def scenario():
        async with mcp_client(server.url("/mcp"), token, tasks=False, mode="legacy") as client:
            session = client.session
            created = await call_tool_as_2025_task(session, "demo_steps", {"steps": 100, "sleep_ms": 100})
            task_id = created.task.task_id
            await asyncio.to_thread(wait_until, task_id, lambda t: t.steps_completed >= 1)  # running: a worker has it
            cancelling = await session.send_request(types.CancelTaskRequest(
                params=types.CancelTaskRequestParams(task_id=task_id)), types.CancelTaskResult)
            with pytest.raises(Exception) as ended:
                await session.send_request(types.GetTaskPayloadRequest(
                    params=types.GetTaskPayloadRequestParams(task_id=task_id)), types.CallToolResult)
            final = await session.send_request(types.GetTaskRequest(
                params=types.GetTaskRequestParams(task_id=task_id)), types.GetTaskResult)
            return cancelling, ended.value, final

    cancelling, ended, final = run(scenario())
    assert cancelling.status == "cancelled"  # 2025-11-25: the answer is the cancelled task (bounded wait)
    assert final.status == "cancelled" and "cancelled" in ended.error.message


# -- one task seen alike everywhere, from any web process ---------------------------------------------------------
def mcp_call(url, token, name, arguments):
    status, _, body = rpc(url, "tools/call", {"name": name, "arguments": arguments}, token=token,
                          headers={"Mcp-Name": name})
    assert status == 200, body
    return body["result"]


def mcp_task(url, token, task_id):
    status, _, body = rpc(url, "tasks/get", {"taskId": task_id}, token=token, headers={"Mcp-Name": task_id})
    assert status == 200, body
    return body["result"]


def test_it_streams_notifications_tasks_on_another_web_process_to_a_listener_of_its_own_tasks(web, workers,
                                                                                              tenant_token):
    _acme, token = tenant_token("acme")
    _globex, other = tenant_token("globex")
    web_a, web_b = web(), web()
    foreign = mcp_call(web_a.url("/mcp"), other, "demo_steps", {"steps": 1})["taskId"]
    task_id = mcp_call(web_a.url("/mcp"), token, "demo_steps", {"steps": 4, "sleep_ms": 250})["taskId"]
    workers("mcp")
    status, headers, frames = rpc(web_b.url("/mcp"), "subscriptions/listen",
                                  {"notifications": {"taskIds": [task_id, foreign]}}, token=token, message_id="sub-1",
                                  frames=True)
    assert status == 200 and headers["content-type"].startswith("text/event-stream")
    ack, *rest = frames
    assert ack["method"] == "notifications/subscriptions/acknowledged"
    assert ack["params"]["notifications"] == {"taskIds": [task_id]}  # the other tenant's id is not honoured
    notes = [f for f in rest if f.get("method") == "notifications/tasks"]
    assert all(f["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"] == "sub-1" for f in [ack, *notes])
    assert {n["params"]["taskId"] for n in notes} == {task_id}
    assert notes[-1]["params"]["status"] == "completed" and notes[-1]["params"]["result"]["structuredContent"] == {
        "steps": 4}
    assert rest[-1].get("result") is not None  # the stream ends once its tasks are finished


def test_it_reads_steers_and_cancels_through_one_web_process_a_task_created_through_another(web, workers,
                                                                                            tenant_token):
    _tenant, token = tenant_token("acme")
    web_a, web_b = web(), web()
    workers("mcp")
    task_id = mcp_call(web_a.url("/mcp"), token, "demo_steps", {"steps": 300, "sleep_ms": 100})["taskId"]
    assert mcp_task(web_b.url("/mcp"), token, task_id)["taskId"] == task_id
    _, _, snapshot = call(web_b.url(f"/runtime/tasks/{task_id}"), token)
    stale = mcp_call(web_b.url("/mcp"), token, "steer_task", {"taskId": task_id, "action": "pause",
                                                              "expectedVersion": snapshot["stateVersion"] + 5})
    assert stale["isError"] is True and stale["structuredContent"]["error"] == "version_conflict"
    assert stale["structuredContent"]["currentVersion"] == snapshot["stateVersion"]
    paused = mcp_call(web_b.url("/mcp"), token, "steer_task", {"taskId": task_id, "action": "pause",
                                                               "expectedVersion": snapshot["stateVersion"],
                                                               "reason": "look at it"})
    assert paused["isError"] is False and paused["structuredContent"]["stateVersion"] == snapshot["stateVersion"] + 1
    wait_until(task_id, lambda task: task.status == "paused")
    got = mcp_task(web_a.url("/mcp"), token, task_id)
    assert got["status"] == "working" and got["statusMessage"] == "Paused"
    assert got["_meta"]["agent-runtime/snapshot"]["internalStatus"] == "paused"
    assert got["_meta"]["agent-runtime/snapshot"]["stateVersion"] == snapshot["stateVersion"] + 1
    status, _, ack = rpc(web_b.url("/mcp"), "tasks/cancel", {"taskId": task_id}, token=token,
                         headers={"Mcp-Name": task_id})
    assert status == 200 and ack["result"]["resultType"] == "complete"
    wait_until(task_id, lambda task: task.status == "cancelled")
    assert mcp_task(web_a.url("/mcp"), token, task_id)["status"] == "cancelled"


def test_it_shows_one_task_alike_through_rest_sse_the_admin_and_mcp_at_each_step(web, workers, tenant_token,
                                                                                 admin_client):
    _tenant, token = tenant_token("acme")
    server = web()
    workers("mcp")
    task_id = mcp_call(server.url("/mcp"), token, "demo_steps", {"steps": 40, "sleep_ms": 100, "ask_at": 1})["taskId"]

    def surfaces():
        _, _, rest = call(server.url(f"/runtime/tasks/{task_id}"), token)
        stream = sse(server.port, f"/runtime/tasks/{task_id}/events", token=token, stop_after=1)
        snapshot = stream.events[0]["data"]["snapshot"]
        page = admin_client.get(f"/admin/tasks_app/task/{task_id}/change/").content.decode()
        mcp = mcp_task(server.url("/mcp"), token, task_id)
        assert rest["status"] == snapshot["status"] == mcp["status"], (rest, snapshot, mcp)
        assert rest["internalStatus"] == snapshot["internalStatus"]
        assert f'data-status="{rest["internalStatus"]}"' in page
        if rest["status"] != "input_required":
            assert rest["statusMessage"] == mcp["statusMessage"]
        return rest, mcp

    wait_until(task_id, lambda task: task.status == "input_required")
    rest, mcp = surfaces()
    assert rest["status"] == "input_required" and list(mcp["inputRequests"]) == [rest["wait"]["waitId"]]
    rpc(server.url("/mcp"), "tasks/update", {"taskId": task_id, "inputResponses": {
        rest["wait"]["waitId"]: {"action": "accept", "content": {"note": "fine"}}}}, token=token,
        headers={"Mcp-Name": task_id})
    wait_until(task_id, lambda task: task.status == "working" and task.steps_completed >= 3)
    mcp_call(server.url("/mcp"), token, "steer_task", {"taskId": task_id, "action": "pause",
                                                       "expectedVersion": rest["stateVersion"] + 1})
    wait_until(task_id, lambda task: task.status == "paused")
    rest, mcp = surfaces()
    assert (rest["status"], rest["internalStatus"], mcp["statusMessage"]) == ("working", "paused", "Paused")
    mcp_call(server.url("/mcp"), token, "steer_task", {"taskId": task_id, "action": "resume",
                                                       "expectedVersion": rest["stateVersion"]})
    wait_until(task_id, lambda task: task.status == "completed")
    rest, mcp = surfaces()
    assert rest["status"] == "completed" and mcp["result"]["structuredContent"] == rest["result"]
    # fork_task: the same fork as POST …/fork (tasks_app.forks), its refusals tool errors an agent can read
    forked = mcp_call(server.url("/mcp"), token, "fork_task", {"taskId": task_id, "fromStep": 2, "goal": "again"})
    assert forked["isError"] is False
    assert forked["structuredContent"]["snapshot"]["forkedFrom"] == {"taskId": task_id, "fromStep": 2}
    refused = mcp_call(server.url("/mcp"), token, "fork_task", {"taskId": task_id, "fromStep": 99})
    assert refused["isError"] is True and "committed steps" in refused["content"][0]["text"]


# -- artifacts as resources -----------------------------------------------------------------------------------------
def test_it_serves_a_tasks_artifacts_as_resources_linked_from_its_result(web, workers, tenant_token, settings,
                                                                          tmp_path):
    from django.core.management import call_command

    settings.CORPUS_ROOT = tmp_path / "corpus"
    call_command("generate_corpus", "--count", "40", "--name", "c40")
    _acme, token = tenant_token("acme")
    _globex, other = tenant_token("globex")
    server = web(private=True)  # (its MEDIA_ROOT is this test's)
    workers("mcp")
    url = server.url("/mcp")
    task_id = mcp_call(url, token, "document_review", {"corpus": "c40", "batch_size": 20,
                                                       "approve_publication": False})["taskId"]
    wait_until(task_id, lambda task: task.status in ("completed", "failed", "dead_lettered"))
    got = mcp_task(url, token, task_id)
    assert got["status"] == "completed", got
    assert got == mcp_task(server.url("/mcp?via=sdk"), token, task_id)  # the poll edge's answer is the SDK path's
    result = got["result"]
    links = {block["name"]: block for block in result["content"] if block["type"] == "resource_link"}
    assert set(links) == {"report.md", "report.json"}
    report_uri = links["report.md"]["uri"]
    assert report_uri == f"runtime://tasks/{task_id}/artifacts/report.md"
    status, _, read = rpc(url, "resources/read", {"uri": report_uri}, token=token, headers={"Mcp-Name": report_uri})
    assert "result" in read, read
    contents = read["result"]["contents"][0]
    assert status == 200 and contents["mimeType"] == "text/markdown" and contents["text"].startswith("#")
    _, _, listed = rpc(url, "resources/list", token=token)
    assert report_uri in [resource["uri"] for resource in listed["result"]["resources"]]
    _, _, templates = rpc(url, "resources/templates/list", token=token)
    assert "runtime://tasks/{taskId}/artifacts/{name}" in [t["uriTemplate"]
                                                          for t in templates["result"]["resourceTemplates"]]
    status, _, foreign = rpc(url, "resources/read", {"uri": report_uri}, token=other, headers={"Mcp-Name": report_uri})
    assert status == 400 and foreign["error"]["code"] == -32602 and foreign["error"]["data"] == {"uri": report_uri}
    _, _, other_list = rpc(url, "resources/list", token=other)
    assert report_uri not in [resource["uri"] for resource in other_list["result"]["resources"]]


# -- conformance fixture mode ---------------------------------------------------------------------------------------
def test_it_admits_a_tokenless_loopback_caller_as_the_fixture_tenant_only_in_fixture_mode(web, tenant_token):
    _tenant, token = tenant_token("acme")
    plain, fixtures = web(), web(MCP_CONFORMANCE_FIXTURES=1)
    assert rpc(plain.url("/mcp"), "tools/list")[0] == 401
    status, _, listed = rpc(fixtures.url("/mcp"), "tools/list")
    assert status == 200 and {"greet", "slow_compute"} <= {tool["name"] for tool in listed["result"]["tools"]}
    assert rpc(fixtures.url("/mcp"), "tools/list", token="art_not-a-token")[0] == 401  # a header is still checked
    _, _, mine = rpc(fixtures.url("/mcp"), "tools/list", token=token)
    assert "greet" not in {tool["name"] for tool in mine["result"]["tools"]}  # fixtures: the fixture tenant's only
    _, _, refused = rpc(fixtures.url("/mcp"), "tools/call", {"name": "greet", "arguments": {"name": "x"}},
                        token=token, headers={"Mcp-Name": "greet"})
    assert refused["error"]["code"] == -32602


def test_it_never_admits_a_tokenless_caller_from_another_host_even_in_fixture_mode(settings):
    from config.asgi import mcp

    settings.MCP_CONFORMANCE_FIXTURES = True
    settings.ALLOWED_HOSTS = ["runtime.example.com"]
    sent = []

    async def receive():
        return {"type": "http.request", "body": b'{"jsonrpc":"2.0","id":1,"method":"tools/list"}', "more_body": False}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/mcp", "scheme": "http", "client": ("203.0.113.5", 4242),
             "headers": [(b"host", b"runtime.example.com"), (b"content-type", b"application/json")]}
    asyncio.run(mcp(scope, receive, send))
    assert sent[0]["status"] == 401 and b"invalid_token" not in sent[1]["body"]  # (no token sent: RFC 6750 §3.1)


# -- the database away or busy: a retryable answer, never a 500 or an escaped exception -------------------------------
def test_it_answers_503_with_retry_after_when_the_database_cannot_be_reached(web, tenant_token):
    _tenant, token = tenant_token("acme")
    server = web(DATABASE_URL=f"postgres://postgres@127.0.0.1:{free_port()}/nowhere", WEB_DB_POOL_TIMEOUT=1)
    status, headers, body = rpc(server.url("/mcp"), "tools/list", token=token)
    assert status == 503 and headers["retry-after"] == "2" and body["error"]["code"] == -32603


def test_it_answers_a_retryable_error_never_a_500_when_the_database_pool_is_exhausted(web, tenant_token):
    tenant, token = tenant_token("acme")
    # Created here, not through the starved server: its one connection may still be opening (CI once saw the
    # setup call itself refused with a 503, which is the behaviour under test, at the wrong moment).
    task_id = str(task_create(tenant=tenant, owner=None, workflow="demo_steps", input={"steps": 1}).task.id)
    # One connection in each pool (Django's, and the poll edge's async one) and almost no patience; half the polls
    # through the poll edge (which leaves a busy pool to the normal path), half straight to the SDK path.
    server = web(WEB_DB_POOL_MIN=1, WEB_DB_POOL_MAX=1, WEB_DB_POOL_TIMEOUT=0.01, WEB_SNAPSHOT_POOL_MAX=1,
                 WEB_SNAPSHOT_POOL_TIMEOUT=0.001)

    def poll(path):
        return rpc(server.url(path), "tasks/get", {"taskId": task_id}, token=token, headers={"Mcp-Name": task_id})

    for path in ("/mcp", "/mcp?via=sdk"):  # both pools hold their connection before the storm
        deadline = time.monotonic() + 10
        while poll(path)[0] != 200:
            assert time.monotonic() < deadline, f"{path} never answered a lone poll"
            time.sleep(0.1)
    paths = ["/mcp", "/mcp?via=sdk"] * 48
    with concurrent.futures.ThreadPoolExecutor(48) as pool:
        answers = list(pool.map(poll, paths))
    statuses = {status for status, _, _ in answers}
    refused = [body for status, _, body in answers if status == 503 or "error" in (body or {})]
    assert statuses <= {200, 503} and 200 in statuses, statuses
    assert refused, "the pool was never exhausted: the test proves nothing"
    assert all(body["error"]["code"] == -32603 and "retry" in body["error"]["message"] for body in refused), refused
    assert "Traceback" not in server.log.read_text()


# -- the poll edge: a running task's tasks/get answered in one statement, exactly as the SDK path answers it ---------
def test_it_answers_a_poll_at_the_edge_exactly_as_the_sdk_path_at_every_status(web, workers, tenant_token):
    _tenant, token = tenant_token("acme")
    server = web()
    url = server.url("/mcp")
    waiting = mcp_call(url, token, "demo_steps", {"steps": 3, "ask_parts_at": 0})["taskId"]
    failing = mcp_call(url, token, "demo_steps", {"steps": 2, "fail_step": 0})["taskId"]
    queued = mcp_call(url, token, "demo_steps", {"steps": 1})["taskId"]

    def both(task_id):
        answers = [rpc(server.url(path), "tasks/get", {"taskId": task_id}, token=token, headers={"Mcp-Name": task_id},
                       message_id="poll-1") for path in ("/mcp", "/mcp?via=sdk")]
        assert answers[0][0] == answers[1][0] == 200
        assert answers[0][2] == answers[1][2], answers
        return answers[0][2]["result"]

    assert both(queued)["status"] == "working"
    workers("mcp")
    wait_until(waiting, lambda task: task.status == "input_required")
    wait_until(failing, lambda task: task.status in ("failed", "dead_lettered"), seconds=120)
    assert len(both(waiting)["inputRequests"]) == 2
    assert both(failing)["error"]["data"]["taskId"] == failing
    wait_until(queued, lambda task: task.status == "completed")
    assert both(queued)["result"]["structuredContent"] == {"steps": 1}


@pytest.mark.parametrize("change", ["legacy_version", "other_method", "no_extension", "name_mismatch", "extra_param",
                                    "duplicate_header", "bad_client_info", "not_a_uuid", "bool_id", "no_token",
                                    "oauth_token"])
def test_it_leaves_every_poll_that_is_not_exactly_right_to_the_sdk_path(change):
    from mcp_bridge.poll_edge import _poll

    task_id = "01a23089-931b-7b06-a0b1-791563f6f5eb"
    meta = {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {"extensions": {EXT: {}}}}
    message = {"jsonrpc": "2.0", "id": 1, "method": "tasks/get", "params": {"taskId": task_id, "_meta": meta}}
    headers = {b"mcp-protocol-version": b"2026-07-28", b"mcp-method": b"tasks/get", b"mcp-name": task_id.encode(),
               b"authorization": b"Bearer art_x", b"accept": b"application/json, text/event-stream"}
    extra = []

    def scope():
        return {"headers": [*headers.items(), *extra]}

    assert _poll(scope(), message) is not None  # the unchanged request is answered at the edge
    if change == "legacy_version":
        headers[b"mcp-protocol-version"] = b"2025-11-25"
    elif change == "other_method":
        message["method"], headers[b"mcp-method"] = "tasks/cancel", b"tasks/cancel"
    elif change == "no_extension":
        meta["io.modelcontextprotocol/clientCapabilities"] = {}
    elif change == "name_mismatch":
        headers[b"mcp-name"] = b"someone-else"
    elif change == "extra_param":
        message["params"]["cursor"] = "x"
    elif change == "duplicate_header":
        extra.append((b"mcp-method", b"tasks/get"))
    elif change == "bad_client_info":
        meta["io.modelcontextprotocol/clientInfo"] = {"name": 3}
    elif change == "not_a_uuid":
        message["params"]["taskId"], headers[b"mcp-name"] = "nope", b"nope"
    elif change == "bool_id":
        message["id"] = True
    elif change == "no_token":
        del headers[b"authorization"]
    elif change == "oauth_token":  # (not in the API tokens' table: the normal path looks it up, once)
        headers[b"authorization"] = b"Bearer aro_x"
    assert _poll(scope(), message) is None


# -- the workflows a tenant may run -------------------------------------------------------------------------------
def test_it_offers_a_tenant_only_the_workflows_it_may_run_as_tools_and_through_the_api(web, tenant_token):
    tenant, token = tenant_token("acme")
    Tenant.objects.filter(id=tenant.id).update(workflows=["document_review"])
    server = web()
    url = server.url("/mcp")
    _, _, listed = rpc(url, "tools/list", token=token)
    assert {tool["name"] for tool in listed["result"]["tools"]} == {"document_review", "steer_task", "fork_task"}
    _, _, refused = rpc(url, "tools/call", {"name": "demo_steps", "arguments": {"steps": 1}}, token=token,
                        headers={"Mcp-Name": "demo_steps"})
    assert refused["error"] == {"code": -32602, "message": "Unknown tool: demo_steps"}
    status, _, workflows = call(server.url("/runtime/workflows"), token)
    assert status == 200 and [w["name"] for w in workflows] == ["document_review"]
    status, _, problem = call(server.url("/runtime/tasks"), token, method="POST",
                              body={"workflow": "demo_steps", "input": {"steps": 1}})
    assert status == 422 and problem["detail"] == ("There is no workflow named 'demo_steps'. Available: "
                                                   "document_review.")
    assert not Task.objects.exists()


def test_it_pages_a_2025_clients_task_list_with_a_cursor_it_cannot_forge(web, tenant_token):
    import mcp.types as types

    tenant, token = tenant_token("acme")
    other, _ = tenant_token("globex")
    created = {str(task_create(tenant=tenant, owner=None, workflow="demo_steps", input={"steps": 1}).task.id)
               for _ in range(53)}
    task_create(tenant=other, owner=None, workflow="demo_steps", input={"steps": 1})
    server = web()

    async def scenario():
        async with mcp_client(server.url("/mcp"), token, tasks=False, mode="legacy") as client:
            first = await client.session.send_request(types.ListTasksRequest(), types.ListTasksResult)
            second = await client.session.send_request(types.ListTasksRequest(
                params=types.PaginatedRequestParams(cursor=first.next_cursor)), types.ListTasksResult)
            with pytest.raises(Exception) as forged:
                await client.session.send_request(types.ListTasksRequest(
                    params=types.PaginatedRequestParams(cursor=first.next_cursor + "x")), types.ListTasksResult)
            return first, second, forged.value

    first, second, forged = run(scenario())
    assert len(first.tasks) == 50 and len(second.tasks) == 3 and second.next_cursor is None
    assert {task.task_id for task in first.tasks + second.tasks} == created  # all of its own, none of the other's
    assert forged.error.code == -32602


def test_it_warns_a_deployment_that_the_conformance_fixtures_are_on(settings):
    from mcp_bridge.checks import conformance_fixtures_off

    settings.DEBUG = False
    settings.MCP_CONFORMANCE_FIXTURES = False
    assert conformance_fixtures_off(None) == []
    settings.MCP_CONFORMANCE_FIXTURES = True
    assert [warning.id for warning in conformance_fixtures_off(None)] == ["runtime.W010"]


def test_it_reports_a_dead_lettered_task_as_failed_with_its_reason_on_both_poll_paths(web, tenant_token):
    tenant, token = tenant_token("acme")
    task = task_create(tenant=tenant, owner=None, workflow="demo_steps", input={"steps": 2}).task
    Task.objects.filter(id=task.id).update(status="dead_lettered", status_message="Dead-lettered (test)", error={
        "type": "DeadLettered", "reason": "effect_outcome_unknown", "message": "record: outcome unknown"})
    server = web()
    answers = [rpc(server.url(path), "tasks/get", {"taskId": str(task.id)}, token=token,
                   headers={"Mcp-Name": str(task.id)})[2]["result"] for path in ("/mcp", "/mcp?via=sdk")]
    assert answers[0] == answers[1]
    assert answers[0]["status"] == "failed" and answers[0]["statusMessage"] == "Dead-lettered (test)"
    assert answers[0]["error"] == {"code": -32603, "message": "record: outcome unknown", "data": {
        "taskId": str(task.id), "internalStatus": "dead_lettered", "type": "DeadLettered",
        "reason": "effect_outcome_unknown"}}


def test_it_refuses_arguments_the_runtime_cannot_store_with_a_clear_error_not_an_internal_one(web):
    server = web(MCP_CONFORMANCE_FIXTURES=1)  # (greet, a fixture, takes a free-form string)
    status, _, body = rpc(server.url("/mcp"), "tools/call", {"name": "greet", "arguments": {"name": "a\u0000b"}},
                          headers={"Mcp-Name": "greet"})
    assert status == 400 and body["error"]["code"] == -32602, body
    assert "NUL" in body["error"]["message"] and body["error"]["data"]["errors"][0]["field"] == "input.name"
    assert not Task.objects.exists()
