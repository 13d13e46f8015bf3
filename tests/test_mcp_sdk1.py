"""2025-11-25 input over MCP (mcp_bridge.elicitation): a task's question asked on the tasks/result stream as an
elicitation, its answer applied by whichever web process receives it. Driven by the official SDK's 1.30 client (its
experimental tasks API, in its own virtualenv: tests/clients) and by raw HTTP across two uvicorn processes, against
real celery workers."""

from __future__ import annotations

import json
import time
import urllib.request
from unittest import mock

import pytest
from django.core import signing

from mcp_bridge import elicitation
from steering_app.models import SteeringCommand
from tasks_app.engine import waits
from tasks_app.models import Task
from tests.clients.support import sdk1
from tests.support.mcp import rpc

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("external_root")]
SHARED_WEB = True  # (tests/conftest.py web: shared web processes; web(private=True) for one of its own)

LEGACY = {"MCP-Protocol-Version": "2025-11-25", "Mcp-Method": None}
NOTE_FORM = {"type": "object", "properties": {"note": {"type": "string", "minLength": 1, "maxLength": 200}},
             "required": ["note"]}


def test_it_answers_an_input_wait_from_the_sdk_1_30_client_through_tasks_result(web, workers,
                                                                                tenant_token):  # noqa: F811
    _tenant, token = tenant_token("acme")
    server = web()
    workers("mcp")
    got = sdk1("input", server.url("/mcp"), token)
    assert got["protocol"] == "2025-11-25"
    first, again = got["asked"]  # its first answer (an empty note) is refused: asked again, saying why
    assert first["message"] == "A note for step 2, please" and first["schema"] == NOTE_FORM
    assert first["related"] == {"taskId": got["taskId"]}
    assert again["message"].startswith("Your answer was not accepted (note:") and "A note for step 2" in again[
        "message"]
    assert got["structured"] == {"steps": 3, "note": "from sdk1"} and got["isError"] is False
    assert got["related"] == {"taskId": got["taskId"]} and got["status"] == "completed"
    command = SteeringCommand.objects.get(task_id=got["taskId"], type="provide_input")
    assert command.requested_by == f"token:{token[:12]}" and command.reason == elicitation.REASON
    assert command.expected_version == command.old_version  # guarded by the version the question was asked at


def test_it_cancels_a_running_task_from_the_sdk_1_30_client(web, workers, tenant_token):  # noqa: F811
    _tenant, token = tenant_token("acme")
    server = web()
    workers("mcp")
    got = sdk1("cancel", server.url("/mcp"), token)
    assert got["status"] == "cancelled" and got["after"] == "cancelled"
    assert "cancelled" in got["ended"]
    task = Task.objects.get(id=got["taskId"])
    assert task.status == "cancelled" and 1 <= task.steps_completed < 300  # it was running when cancelled


def test_it_asks_a_2025_client_only_what_a_flat_form_can_carry():
    where = {"task_id": "0190a000-0000-7000-8000-000000000001", "step_seq": 2, "plan_version": 1}
    note = elicitation.question_for(waits.input_wait(**where, name="note", prompt="A note?", schema={
        **NOTE_FORM, "additionalProperties": False, "properties": {"note": {
            "type": "string", "minLength": 1, "maxLength": 200, "pattern": "^[a-z]+$", "format": "hostname"}}}))
    assert note.params == {"mode": "form", "message": "A note?", "requestedSchema": NOTE_FORM} and note.wrapper is None
    count = elicitation.question_for(waits.input_wait(**where, name="n", prompt="How many?", schema={
        "type": "integer", "minimum": 1, "exclusiveMaximum": 5}))
    assert count.params["requestedSchema"] == {"type": "object", "properties": {"value": {
        "type": "integer", "minimum": 1}}, "required": ["value"]} and count.wrapper == "value"
    survey = waits.parts_wait(**where, name="survey", prompt="Two questions", parts={
        "colour": {"schema": {"type": "string", "enum": ["red", "green"]}, "prompt": "Which colour?"},
        "size": {"schema": {"type": "integer", "minimum": 1}, "prompt": "Which size?"}})
    both = elicitation.question_for(survey)
    assert both.params["requestedSchema"] == {"type": "object", "required": ["colour", "size"], "properties": {
        "colour": {"type": "string", "enum": ["red", "green"], "description": "Which colour?"},
        "size": {"type": "integer", "minimum": 1, "description": "Which size?"}}}
    rest = elicitation.question_for({**survey, "answeredParts": ["colour"]})
    assert rest.parts == ("size",) and list(rest.params["requestedSchema"]["properties"]) == ["size"]
    assert rest.key != both.key  # fewer open parts: the asking stream asks anew
    approval = elicitation.question_for(waits.approval_wait(**where, effect_name="email.send", effect_key="k",
                                                             arguments={"to": "a@example.com"}))
    assert approval.kind == "approval" and approval.params["requestedSchema"]["properties"]["approve"]["type"] == \
        "boolean"
    for schema in ({"type": "object", "properties": {"a": {"type": "object"}}}, {"type": "array"},
                   {"type": "object", "x-mcp-request": {"method": "roots/list", "params": {}}}):
        assert elicitation.question_for(waits.input_wait(**where, name="x", prompt="?", schema=schema)) is None


# -- raw HTTP: the answer POSTed to another process than the one holding the stream ---------------------------------
def _stream(url: str, token: str, task_id: str, message_id: str):
    """A 2025-11-25 tasks/result POST, its SSE frames read as they come."""
    body = json.dumps({"jsonrpc": "2.0", "id": message_id, "method": "tasks/result", "params": {"taskId": task_id}})
    request = urllib.request.Request(url, data=body.encode(), method="POST", headers={
        "Content-Type": "application/json", "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": "2025-11-25", "Authorization": f"Bearer {token}"})
    response = urllib.request.urlopen(request, timeout=60)
    for raw in response:
        line = raw.decode().rstrip("\r\n")
        if line.startswith("data:") and line[5:].strip():
            yield json.loads(line[5:])


def _question(frames) -> dict:
    return next(frame for frame in frames if frame.get("method") == "elicitation/create")


def _reply(url: str, token: str, message_id, result: dict):
    body = json.dumps({"jsonrpc": "2.0", "id": message_id, "result": result}).encode()
    return rpc(url, "", token=token, body=body, headers=LEGACY)


def test_it_applies_an_answer_posted_to_another_web_process_and_refuses_a_forged_one(web, workers,
                                                                                     tenant_token):  # noqa: F811
    _tenant, token = tenant_token("acme")
    _same_tenant, stranger = tenant_token("acme", scopes=("tasks:read", "tasks:write"))
    web_a, web_b = web(), web()
    workers("mcp")
    status, _, created = rpc(web_a.url("/mcp"), "", token=token, headers=LEGACY, body=json.dumps({
        "jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
            "name": "demo_steps", "arguments": {"steps": 3, "ask_at": 1}, "task": {"ttl": 60000}}}).encode())
    assert status == 200, created
    task_id = created["result"]["task"]["taskId"]

    frames = _stream(web_a.url("/mcp"), token, task_id, "result-1")
    asked = _question(frames)
    assert asked["params"]["_meta"] == {"io.modelcontextprotocol/related-task": {"taskId": task_id}}
    assert asked["params"]["requestedSchema"] == NOTE_FORM and asked["params"]["mode"] == "form"
    question_id = asked["id"]
    sealed = signing.loads(question_id.removeprefix(elicitation.ID_PREFIX), salt="mcp_bridge.elicitation")
    assert sealed["t"] == task_id and sealed["v"] == Task.objects.get(id=task_id).state_version

    # Refused, nothing applied: a changed id, an expired one, another principal's question.
    accept = {"action": "accept", "content": {"note": "forged"}}
    tampered = question_id[:-3] + ("AAA" if not question_id.endswith("AAA") else "BBB")
    status, _, body = _reply(web_b.url("/mcp"), token, tampered, accept)
    assert status == 400 and "integrity check" in body["error"]["message"] and body["id"] is None
    with mock.patch("django.core.signing.time.time", return_value=time.time() - 2 * 3600):
        expired = elicitation.ID_PREFIX + signing.dumps(sealed, salt="mcp_bridge.elicitation", compress=True)
    status, _, body = _reply(web_b.url("/mcp"), token, expired, accept)
    assert status == 400 and "expired" in body["error"]["message"]
    status, _, body = _reply(web_b.url("/mcp"), stranger, question_id, accept)
    assert status == 403 and "another principal" in body["error"]["message"]
    assert not SteeringCommand.objects.filter(task_id=task_id).exists()

    # Declined on process B: the wait stays open, and A's tasks/result ends saying so.
    status, _, body = _reply(web_b.url("/mcp"), token, question_id, {"action": "decline"})
    assert status == 202 and body is None
    ended = next(frame for frame in frames if frame.get("id") == "result-1")
    assert ended["error"]["data"] == {"taskId": task_id, "status": "input_required", "elicitation": "decline"}
    assert Task.objects.get(id=task_id).status == "input_required"

    # Asked again on a new tasks/result; answered through B; A's stream goes on to the result.
    frames = _stream(web_a.url("/mcp"), token, task_id, "result-2")
    question_id = _question(frames)["id"]
    status, _, body = _reply(web_b.url("/mcp"), token, question_id, {"action": "accept",
                                                                     "content": {"note": "via web b"}})
    assert status == 202 and body is None
    done = next(frame for frame in frames if frame.get("id") == "result-2")
    assert done["result"]["structuredContent"] == {"steps": 3, "note": "via web b"}
    assert done["result"]["_meta"] == {"io.modelcontextprotocol/related-task": {"taskId": task_id}}
    command = SteeringCommand.objects.get(task_id=task_id)
    assert command.type == "provide_input" and command.payload["value"] == {"note": "via web b"}
    assert command.requested_by == f"token:{token[:12]}" and command.expected_version == sealed["v"]
