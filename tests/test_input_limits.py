"""Input that cannot break anything (issue 37, findings 6 and 8; config.base.json_input): what an attacker sent — JSON
nested 10,000 levels, a lone surrogate escaped in JSON or as raw bytes, bytes that are not UTF-8 — answered 400 on
every body the runtime parses, nothing written; and a value already stored nested far deeper than that (written by
SQL) never breaks a page: the steering history, the audit's commands page and its CSV answer 200, whole."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import time

import pytest
from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.db import connection
from django.test import Client
from oauth2_provider.models import Application

from config.base.canonical import canonical_json, canonical_sha256, nul_paths
from steering_app.models import SteeringCommand
from steering_app.services import steering_submit
from tasks_app.models import Task, TaskEvent
from tasks_app.redaction import redact_json
from tasks_app.services import task_create
from tests.support.mcp import EXT, MODERN, rpc

ATTACK_DEPTH = 10_000
CAP = 64  # RUNTIME_MAX_JSON_DEPTH's default

# The attacker's values, as the bytes of one JSON value placed inside an otherwise valid body.
BAD_VALUES = {
    "10000-deep": (b"[" * ATTACK_DEPTH + b"]" * ATTACK_DEPTH, "json-too-deep"),
    "escaped-lone-surrogate": (b'"a \\ud800 b"', "malformed-json"),
    "raw-surrogate-bytes": (b'"a \xed\xa0\x80 b"', "malformed-json"),  # U+D800 as UTF-8 would encode it
    "invalid-utf8": (b'"a \xff b"', "malformed-json"),
}


MARKER = f"[nested deeper than {CAP} levels: not shown]"  # config.base.json_input.cut_marker(CAP)


def depth_of(value) -> int:
    """How deeply a parsed JSON value nests (counted without recursion)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, level)
            stack.extend((child, level + 1) for child in (item.values() if isinstance(item, dict) else item))
    return deepest


def deep_text(levels: int, leaf: str = '"leaf"') -> str:
    return '{"g":' * levels + leaf + "}" * levels


def deep_value(levels: int, leaf="leaf"):
    value = leaf
    for _ in range(levels):
        value = {"g": value}
    return value


@pytest.mark.parametrize("name", BAD_VALUES)
def test_it_refuses_an_attackers_value_in_a_task_or_a_steering_command_with_400_writing_nothing(api, tenant, name):
    bad, slug = BAD_VALUES[name]
    queued = task_create(tenant=tenant, owner=None, workflow="demo_steps", input={"steps": 1}).task
    events = TaskEvent.objects.count()
    bodies = {
        "/runtime/tasks": b'{"workflow": "demo_steps", "input": {"steps": 1}, "goal": ' + bad + b"}",
        f"/runtime/tasks/{queued.id}/steering": b'{"type": "adjust_goal", "expectedVersion": %d, "payload": '
                                                b'{"goal": ' % queued.state_version + bad + b"}}",
    }
    for path, body in bodies.items():
        response = api.post(path, data=body, content_type="application/json")

        assert response.status_code == 400, (path, response.content[:300])
        assert response["Content-Type"] == "application/problem+json"
        problem = response.json()
        assert problem["type"] == f"/runtime/problems/{slug}" and problem["detail"], problem
    assert Task.objects.count() == 1 and SteeringCommand.objects.count() == 0
    assert TaskEvent.objects.count() == events


def test_it_accepts_a_goal_nested_exactly_to_the_cap_and_refuses_one_level_more(api, tenant):
    queued = task_create(tenant=tenant, owner=None, workflow="demo_steps", input={"steps": 1}).task
    # The body's depth counts its own braces: {"type", "payload": {"goal": G}} is G's depth + 2.
    version = queued.state_version
    at_cap = f'{{"type": "adjust_goal", "expectedVersion": {version}, "payload": {{"goal": {deep_text(CAP - 2)}}}}}'
    over = f'{{"type": "adjust_goal", "expectedVersion": {version}, "payload": {{"goal": {deep_text(CAP - 1)}}}}}'

    refused = api.post(f"/runtime/tasks/{queued.id}/steering", data=over, content_type="application/json")
    accepted = api.post(f"/runtime/tasks/{queued.id}/steering", data=at_cap, content_type="application/json")

    assert refused.status_code == 400 and refused.json()["type"] == "/runtime/problems/json-too-deep"
    assert f"{CAP + 1} levels deep (or more); at most {CAP}" in refused.json()["detail"]
    assert accepted.status_code == 202, accepted.content[:300]
    assert SteeringCommand.objects.get().payload == {"goal": deep_value(CAP - 2)}


def test_it_refuses_an_attackers_client_registration_with_400_registering_nothing(db):
    client = Client()
    for name, (bad, slug) in BAD_VALUES.items():
        body = b'{"redirect_uris": ["http://127.0.0.1:8976/callback"], "token_endpoint_auth_method": "none", ' \
               b'"client_name": ' + bad + b"}"

        response = client.post("/oauth/register/", data=body, content_type="application/json")

        assert response.status_code == 400, (name, response.content[:300])
        assert response.json()["error"] == "invalid_client_metadata", name
    assert Application.objects.count() == 0


@pytest.mark.django_db(transaction=True)
def test_it_answers_an_attackers_value_at_mcp_with_a_json_rpc_error_steering_nothing(web, tenant_token):  # noqa: F811
    tenant, token = tenant_token("acme")
    server = web()
    queued = task_create(tenant=tenant, owner=None, workflow="demo_steps", input={"steps": 1}).task
    meta = json.dumps({"io.modelcontextprotocol/protocolVersion": MODERN,
                       "io.modelcontextprotocol/clientCapabilities": {"extensions": {EXT: {}}}}).encode()
    for name, (bad, _slug) in BAD_VALUES.items():
        body = (b'{"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "steer_task", '
                b'"arguments": {"taskId": "' + str(queued.id).encode() + b'", "action": "adjust_goal", '
                b'"expectedVersion": %d, "goal": ' % queued.state_version + bad + b'}, "_meta": ' + meta + b"}}")

        status, _headers, answer = rpc(server.url("/mcp"), "tools/call", token=token, body=body)

        assert status == 400, (name, status, answer)
        assert answer["error"]["code"] == -32700 and "Parse error" in answer["error"]["message"], (name, answer)
    # A good request afterwards is served, and none of the bad ones steered the task.
    status, _headers, answer = rpc(server.url("/mcp"), "tools/list", token=token)
    assert status == 200 and answer["result"]["tools"]
    assert SteeringCommand.objects.count() == 0
    assert Task.objects.get(id=queued.id).state_version == queued.state_version


def test_it_answers_an_attackers_value_in_an_admin_json_field_with_a_form_error(tenant, admin_client, rf):
    from django.contrib import admin

    from tasks_app.models import Tenant

    task = task_create(tenant=tenant, owner=None, workflow="demo_steps", input={"steps": 1}).task
    deep = "[" * ATTACK_DEPTH + "]" * ATTACK_DEPTH

    page = admin_client.post(f"/admin/tasks_app/task/{task.id}/steer/goal/", {
        "goal": deep, "reason": "attack", "expected_version": task.state_version})
    request = rf.get("/admin/tasks_app/tenant/add/")
    request.user = get_user_model().objects.get(username="admin")
    workflows = admin.site._registry[Tenant].get_form(request)().fields["workflows"]  # a model admin's JSON field

    assert page.status_code == 200 and f"{ATTACK_DEPTH} levels deep (or more); at most {CAP}" in page.content.decode()
    assert SteeringCommand.objects.count() == 0
    for text, why in ((deep, "levels deep"), ('["\\ud800"]', "lone surrogate"), ("[1,", "Enter a valid JSON")):
        with pytest.raises(ValidationError, match=why):
            workflows.clean(text)


# --- values already stored ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("levels", [900, 12_000])  # (12,000: about the most PostgreSQL stores, max_stack_depth 2 MB)
def test_it_shows_a_deep_goal_written_by_sql_on_every_page_that_lists_it(api, tenant, auditor, admin_client,
                                                                         levels):
    """What the attacker left behind: a goal far deeper than the cap, in the command's payload and the task's row (as
    SQL, or a release before the cap, wrote it). Each page answers 200 whole, the goal cut at the cap."""
    task = task_create(tenant=tenant, owner=None, workflow="demo_steps", input={"steps": 1}).task
    command = steering_submit(task=task, command_type="adjust_goal", payload={"goal": "short"}, expected_version=None,
                              reason="deep", requested_by="user:mallory").command
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {SteeringCommand._meta.db_table} SET payload = %s::jsonb WHERE id = %s",
                       [f'{{"goal": {deep_text(levels)}}}', command.id])
        cursor.execute(f"UPDATE {Task._meta.db_table} SET goal = %s::jsonb WHERE id = %s",
                       [deep_text(levels), task.id])

    history = api.get(f"/runtime/tasks/{task.id}/steering")
    page = auditor.get("/admin/audit/commands/", {"task": task.id})
    export = auditor.get("/admin/audit/commands.csv", {"task": task.id})
    snapshot = api.get(f"/runtime/tasks/{task.id}")
    goal_page = admin_client.get(f"/admin/tasks_app/task/{task.id}/steer/goal/")
    task_page = admin_client.get(f"/admin/tasks_app/task/{task.id}/change/")

    assert history.status_code == 200, history.content[:300]
    shown = history.json()["commands"][0]["payload"]
    assert depth_of(shown) == CAP and MARKER in json.dumps(shown)
    assert page.status_code == 200 and page.content.decode().count('class="audit-command"') == 1
    assert export.status_code == 200
    rows = list(csv.DictReader(io.StringIO(b"".join(export.streaming_content).decode())))  # the whole of it
    assert len(rows) == 1 and rows[0]["type"] == "adjust_goal" and MARKER in rows[0]["payload"]
    assert snapshot.status_code == 200
    assert goal_page.status_code == 200 and MARKER in goal_page.content.decode()
    assert task_page.status_code == 200


def test_it_shows_a_value_accepted_at_the_cap_whole_without_a_marker(api, tenant, auditor):
    task = task_create(tenant=tenant, owner=None, workflow="demo_steps", input={"steps": 1}).task
    goal = deep_value(CAP - 2)
    body = json.dumps({"type": "adjust_goal", "expectedVersion": task.state_version, "payload": {"goal": goal}})
    assert api.post(f"/runtime/tasks/{task.id}/steering", data=body, content_type="application/json").status_code \
        == 202

    history = api.get(f"/runtime/tasks/{task.id}/steering")
    export = auditor.get("/admin/audit/commands.csv", {"task": task.id})

    assert history.status_code == 200 and history.json()["commands"][0]["payload"] == {"goal": goal}
    (row,) = csv.DictReader(io.StringIO(b"".join(export.streaming_content).decode()))
    assert json.loads(row["payload"]) == {"goal": goal}


# --- the walks themselves ---------------------------------------------------------------------------------------


def test_it_walks_a_value_100000_levels_deep_without_recursion(settings):
    from config.base.json_input import BoundedJSONRenderer, loads_iterative

    settings.RUNTIME_MAX_JSON_DEPTH = CAP
    value = {"token": "x", "list": [deep_value(100_000, leaf="password=hunter2")]}

    redacted = redact_json(value)
    rendered = BoundedJSONRenderer().render(value)

    assert redacted["token"] == "[redacted]"
    assert depth_of(redacted) == CAP and MARKER in json.dumps(redacted)
    assert depth_of(json.loads(rendered)) == CAP and MARKER.encode() in rendered
    text = canonical_json(value)
    assert text == '{"list":[' + '{"g":' * 100_000 + '"password=hunter2"' + "}" * 100_000 + '],"token":"x"}'
    assert len(canonical_sha256(value)) == 64
    assert nul_paths(deep_value(100_000, leaf="a\x00")) == [".".join(["g"] * 100_000)]
    assert canonical_json(loads_iterative(text.replace(":", ": ").replace(",", ", "))) == text  # (jsonb's spacing)


def test_it_hashes_and_renders_a_lone_surrogate_instead_of_raising():
    from config.base.json_input import BoundedJSONRenderer

    assert canonical_sha256({"goal": "a \ud800"}) != canonical_sha256({"goal": "a \ud801"})
    assert canonical_sha256({"goal": "ü"}) == hashlib.sha256('{"goal":"ü"}'.encode()).hexdigest()  # as before
    assert BoundedJSONRenderer().render({"goal": "a \ud800 ü"}) == b'{"goal":"a \\ud800 \\u00fc"}'


def test_it_reads_json_by_the_rules_and_says_why_it_refuses():
    from config.base.json_input import JsonInputError, loads, nesting_depth

    assert loads(b'{"a": [1, {"b": "\\ud83d\\ude00"}]}') == {"a": [1, {"b": "\U0001F600"}]}  # a pair is fine
    assert loads('"[[[[ in a string ]]"', depth=1) == "[[[[ in a string ]]"  # brackets in strings do not count
    assert nesting_depth('{"a": "}}}{{{", "b": [[]]}') == 3
    refusals = {
        b"[" * 65 + b"]" * 65: "65 levels deep (or more); at most 64",
        b'{"k\\udc00": 1}': "lone surrogate",
        b'"\\ud800"': "lone surrogate",
        b'"\xc3"': "not valid UTF-8 (byte 1)",
        b"[NaN]": "NaN is not a JSON value",
        b"[1,": "Expecting value",
    }
    for raw, why in refusals.items():
        with pytest.raises(JsonInputError) as refused:
            loads(raw, depth=CAP)
        assert why in str(refused.value), (raw, str(refused.value))


# --- values stored deeper than the cap, answered by the MCP bridge and the snapshot edges (issue 37, finding 6) ---


@pytest.mark.django_db(transaction=True)
def test_it_answers_mcp_and_the_snapshot_edges_for_a_task_whose_result_error_and_goal_sql_wrote_12000_deep(
        web, tenant_token):  # noqa: F811
    """What SQL (or a release before the cap) can leave in a task row: a goal, a result and an error 12,000 levels
    deep (about the most PostgreSQL stores). The REST snapshot (answered by the ASGI snapshot edge), MCP tasks/get
    (answered by the poll edge), a steer_task answer (its snapshot), and a 2025-11-25 client's tasks/get and
    tasks/result all answer, the value cut at the cap — before, a 500 / a JSON-RPC internal error, each time."""
    import asyncio

    from mcp.shared.exceptions import MCPError

    from tests.mcp_support import mcp_client

    tenant, token = tenant_token("acme")
    server = web()
    done = task_create(tenant=tenant, owner=None, workflow="demo_steps", input={"steps": 1}).task
    failed = task_create(tenant=tenant, owner=None, workflow="demo_steps", input={"steps": 1}).task
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {Task._meta.db_table} SET status = 'completed', completed_at = now(), "
                       f"result = %s::jsonb, goal = %s::jsonb WHERE id = %s",
                       [deep_text(12_000), deep_text(12_000), done.id])
        cursor.execute(f"UPDATE {Task._meta.db_table} SET status = 'failed', completed_at = now(), "
                       f"error = %s::jsonb WHERE id = %s",
                       [f'{{"message": "boom", "reason": "step_failed", "detail": {deep_text(12_000)}}}', failed.id])
    url = server.url("/mcp")

    for task in (done, failed):
        tid = str(task.id)
        rest = Client().get(f"/runtime/tasks/{tid}", HTTP_AUTHORIZATION=f"Bearer {token}")  # the Django path
        edge = _get_json(server.url(f"/runtime/tasks/{tid}"), token)  # the ASGI snapshot edge
        polled = rpc(url, "tasks/get", {"taskId": tid}, token=token, headers={"Mcp-Name": tid})
        assert rest.status_code == 200, rest.content[:300]
        assert edge[0] == 200, edge
        assert polled[0] == 200 and "result" in polled[2], polled[2] if polled[2] and "error" in polled[2] else polled[0]
        assert MARKER in json.dumps(edge[1]), tid
        # (a failed task's tasks/get carries the error's reason and message, not its detail: nothing to cut)
        assert task is failed or MARKER in json.dumps(polled[2]), tid
    # steer_task answers with the task's snapshot (mcp_bridge.bridge._snapshot)
    steered = rpc(url, "tools/call", {"name": "steer_task", "arguments": {
        "taskId": str(done.id), "action": "pause", "expectedVersion": 0}}, token=token, headers={"Mcp-Name": "steer_task"})
    assert steered[0] == 200 and "result" in steered[2], steered[2]
    assert MARKER in json.dumps(steered[2]["result"]["structuredContent"])

    async def legacy() -> list:
        async with mcp_client(url, token, mode="legacy") as client:
            send = client.session._dispatcher.send_raw_request
            answers = [await send("tasks/get", {"taskId": str(done.id)}, {}),
                       await send("tasks/result", {"taskId": str(done.id)}, {})]
            try:  # a failed task's tasks/result is its error, as a JSON-RPC error: the task's, not an internal one
                await send("tasks/result", {"taskId": str(failed.id)}, {})
            except MCPError as error:
                answers.append(error.error.message)
            return answers

    answers = asyncio.run(legacy())
    assert answers[0]["status"] == "completed" and MARKER in json.dumps(answers[1]), answers[0]
    assert answers[2] == "boom"


def _get_json(url: str, token: str):
    import urllib.error
    import urllib.request

    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, error.read()[:300]


# --- a downstream tool server answering JSON nested 10,000 levels (agents_app.mcp_client) --------------------------

DEEP_TOOL_SERVER = r'''
"""Just enough of a 2025-11-25 MCP tool server, hostile: the first part of the URL path picks what it answers
nested 10,000 levels deep — "call-json" / "call-sse": the tools/call answer (a JSON body / an SSE event), "call-400":
a 400 whose JSON-RPC error nests so, "list": the tools/list answer. It logs each tools/call it receives."""
import argparse, json
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

parser = argparse.ArgumentParser()
parser.add_argument("--port", type=int)
parser.add_argument("--log")
options = parser.parse_args()
DEEP = b"[" * 10000 + b"]" * 10000


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def send(self, payload, status=200, kind="application/json"):
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def do_GET(self):
        self.send(b"", 405)

    do_DELETE = do_GET

    def do_POST(self):
        mode = self.path.strip("/").split("/")[0]
        message = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
        method, ident = message.get("method"), message.get("id")
        if ident is None:
            return self.send(b"", 202)
        i = json.dumps(ident).encode()
        if method == "initialize":
            result = {"protocolVersion": "2025-11-25", "capabilities": {"tools": {}},
                      "serverInfo": {"name": "deep", "version": "1"}}
        elif method == "tools/list":
            if mode == "list":
                return self.send(b'{"jsonrpc":"2.0","id":%s,"result":{"tools":[{"name":"dump","inputSchema":'
                                 b'{"type":"object","x":%s}}]}}' % (i, DEEP))
            result = {"tools": [{"name": "dump", "inputSchema": {"type": "object"},
                                 "annotations": {"readOnlyHint": True}}]}
        elif method == "tools/call":
            with open(options.log, "a") as log:
                log.write(json.dumps({"tool": "dump", "event": "received", "mode": mode}) + "\n")
            answer = b'{"jsonrpc":"2.0","id":%s,"result":{"content":[],"structuredContent":{"a":%s}}}' % (i, DEEP)
            if mode == "call-sse":
                return self.send(b"event: message\ndata: " + answer + b"\n\n", kind="text/event-stream")
            if mode == "call-400":
                return self.send(b'{"jsonrpc":"2.0","id":%s,"error":{"code":-32602,"message":"no","data":%s}}'
                                 % (i, DEEP), status=400)
            return self.send(answer)
        else:
            result = {}
        self.send(json.dumps({"jsonrpc": "2.0", "id": ident, "result": result}).encode())

    def log_message(self, *args):
        pass


server = ThreadingHTTPServer(("127.0.0.1", options.port), Handler)
server.daemon_threads = True
server.serve_forever()
'''


@pytest.mark.django_db(transaction=True)
def test_it_ends_a_tool_call_answered_with_json_10000_deep_cleanly_on_a_real_worker(tenant, workers, tmp_path,
                                                                                   settings):
    """A hostile tool server (a process of its own) answers 10,000 levels deep. On a real worker: the call's answer
    (a JSON body, an SSE event) is an unknown outcome said so, as a cut answer is (the read-only tool is tried
    again, then the task fails saying why); a 400 whose error nests so is the refusal it is; a tool list nested so makes the server
    unusable, said so, nothing called. And a task whose goal SQL wrote 12,000 levels deep is leased and run. No
    step is left without a durable decision (before: RecursionError in the worker, or an unreadable -32700)."""
    from agents_app.models import ToolServer
    from tasks_app.models import TERMINAL_STATUSES
    from tests.engine_support import configure, create_engine_task
    from tests.tool_server_support import running_tool_server

    configure(settings, step_retry={"backoff_seconds": 0, "backoff_max_seconds": 0})
    script = tmp_path / "deep_tool_server.py"
    script.write_text(DEEP_TOOL_SERVER)
    with running_tool_server(tmp_path, script=script) as server:
        base = server.url.removesuffix("/mcp")
        tasks = {}
        for mode in ("call-json", "call-sse", "call-400", "list"):
            ToolServer.objects.create(tenant=tenant, name=mode, protocol="legacy", timeout_seconds=10,
                                      url=f"{base}/{mode}/mcp")
            tasks[mode] = create_engine_task(tenant, "mcp_tool", server=mode, tool="dump", arguments={})
        deep_goal = create_engine_task(tenant, "demo_steps", steps=1)
        with connection.cursor() as cursor:
            cursor.execute(f"UPDATE {Task._meta.db_table} SET goal = %s::jsonb WHERE id = %s",
                           [deep_text(12_000), deep_goal.id])
        ids = [task.id for task in [*tasks.values(), deep_goal]]
        worker = workers("deep-worker", concurrency=2)
        deadline = time.monotonic() + 60
        while Task.objects.filter(id__in=ids).exclude(status__in=TERMINAL_STATUSES).exists():
            assert time.monotonic() < deadline, list(Task.objects.filter(id__in=ids).values_list("status", "error"))
            time.sleep(0.1)
        worker.stop()
        received = {line["mode"] for line in server.calls(event="received")}

    ended = {mode: Task.objects.get(id=task.id) for mode, task in tasks.items()}
    for mode in ("call-json", "call-sse"):  # unknown outcome, said so: the read-only tool tried again, then failed
        error = ended[mode].error or {}
        assert ended[mode].status == "failed" and "nests JSON deeper than 200 levels" in error.get("message", ""), \
            (mode, ended[mode].status, error)
    assert ended["call-400"].status == "failed" and "400" in ended["call-400"].error["message"], ended["call-400"].error
    listed = ended["list"]
    assert listed.status == "failed" and "unusable" in listed.error["message"] \
        and "nests JSON deeper" in listed.error["message"], listed.error
    assert received == {"call-json", "call-sse", "call-400"}  # the unusable server was never called
    assert Task.objects.get(id=deep_goal.id).status == "completed"


def test_it_reads_foreign_json_text_inside_answers_under_the_rules_and_shows_deep_stored_text():
    """JSON *text* inside an accepted message escapes the body's depth check: an MCP client's
    inputResponses[…].content.json and a model's tool-call arguments, 10,000 levels deep, are refused saying why
    (before: RecursionError, a -32603 / a failed step); a model's arguments stored so are shown as text on the task
    page; a stored effect's arguments in an approval question are cut at the cap."""
    from agents_app.selectors import _arguments
    from mcp_bridge import mapping

    deep = "[" * ATTACK_DEPTH + "]" * ATTACK_DEPTH
    with pytest.raises(mapping.BadAnswer, match="not valid JSON text"):
        mapping._unwrapped({"json": deep}, {"type": "array"}, "q1")
    assert mapping._unwrapped({"json": "[[1]]"}, {"type": "array"}, "q1") == [[1]]
    shown, left_out = _arguments(deep)
    assert shown == deep[:2_000] and left_out == len(deep) - 2_000
    question = mapping.input_request({"kind": "approval", "prompt": "Call it?", "name": "approve",
                                      "effect": {"arguments": deep_value(12_000)}}, None)
    assert MARKER in json.dumps(question)
