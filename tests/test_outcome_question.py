"""Issue 38, build 3: "did this effect happen?" is a question a person can answer well — wherever it is asked (the
console's task page and dead letters, REST, the CLI, MCP inputRequests) it shows what was called (server, tool,
redacted arguments, key), when it was sent, why its outcome is unknown, the tool's annotations and that the deadline
has passed; no answer is chosen for the person; the task page and the dead letters ask it with one form; the
answer's reason is kept in the audit chain."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.db import connection

from agents_app.models import ToolServer
from checkpoints_app.models import SideEffect
from steering_app.models import SteeringCommand
from tasks_app.client.cli import task_text
from tasks_app.client.models import Task as ClientTask
from tasks_app.engine import waits
from tasks_app.models import Task, TaskEvent
from tests import workflows  # noqa: F401 — registers mcp_tool
from tests.engine_support import create_engine_task, drive
from tests.support.mcp import rpc
from tests.support.tasks import snapshot
from tests.tool_server_support import tool_server  # noqa: F401 — the fixture

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("external_root")]
SHARED_WEB = True  # (tests/conftest.py web: one web process for the module)


def db_now():
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        return cursor.fetchone()[0]


def wait_url(task) -> str:
    return f"/admin/tasks_app/task/{task.id}/steer/wait/"


def retry_url(task) -> str:
    return f"/admin/tasks_app/task/{task.id}/retry/"


def outcome_inputs(html: str) -> list[str]:
    """The outcome's answer inputs (radio buttons or a select and its options) as rendered."""
    return re.findall(r'<input[^>]*name="[^"]*(?:outcome|answer_\d+)"[^>]*>', html) + \
        re.findall(r'<select[^>]*name="[^"]*(?:outcome|answer_\d+)"[^>]*>.*?</select>', html, flags=re.S)


def assert_nothing_chosen(html: str) -> None:
    inputs = outcome_inputs(html)
    assert inputs and all('type="radio"' in tag for tag in inputs), inputs  # radio buttons: no browser default
    assert not any("checked" in tag or "selected" in tag for tag in inputs), inputs


def question_task(tenant, tool_server):  # noqa: F811
    """A tool call whose worker died mid-call, its deadline passed: the step asks a person (the gateway's path)."""
    ToolServer.objects.create(tenant=tenant, name="shop", url=tool_server.url, timeout_seconds=5)
    task = create_engine_task(tenant, "mcp_tool", server="shop", tool="append",
                              arguments={"text": "once", "api_key": "sk-live-secret"})
    key = f"{task.id}:1:shop.append:1"
    now = db_now()
    SideEffect.objects.create(task_id=task.id, step_seq=1, key=key, name="shop.append:1", status="started",
                              attempts=1, lease_epoch=0, started_at=now - timedelta(minutes=2),
                              deadline=now - timedelta(minutes=1))
    assert drive(task.id)[-1] == "input_required"
    task.refresh_from_db()
    return task, key


def assert_facts(text: str, key: str) -> None:
    """Each fact, in words, in ``text`` (a page, a prompt, the CLI's lines)."""
    for fact in ("shop", "append", key, "once", "worker stopped mid-call", "worker_died",
                 "readOnlyHint", "idempotentHint", "destructiveHint", "passed"):
        assert fact in text, (fact, text)
    assert "sk-live-secret" not in text


def test_it_shows_the_facts_everywhere_the_question_is_asked_and_chooses_no_answer(tenant, tool_server, web,  # noqa: F811
                                                                                 tenant_token, api, operator):
    task, key = question_task(tenant, tool_server)
    effect = task.wait["effect"]

    # REST: the snapshot's wait carries each fact.
    rest = snapshot(api, task)["wait"]
    assert rest["name"] == "effect_outcome" and rest["effect"]["key"] == key
    assert (rest["effect"]["server"], rest["effect"]["tool"]) == ("shop", "append")
    assert rest["effect"]["annotations"] == {"readOnlyHint": False, "idempotentHint": False, "destructiveHint": False}
    assert rest["effect"]["arguments"]["arguments"] == {"text": "once", "api_key": "[redacted]"}
    assert rest["effect"]["unknownWhy"] == "worker_died" and rest["effect"]["deadlinePassed"] is True
    assert rest["effect"]["sentAt"] and rest["effect"]["deadline"] and rest == task.wait
    assert_facts(rest["prompt"], key)

    # The CLI's printing of the task.
    printed = task_text(ClientTask.from_api(snapshot(api, task)))
    assert_facts(printed, key)
    assert effect["sentAt"] in printed and effect["deadline"] in printed

    # MCP: the inputRequest is a flat form (outcome, optional result) with no default, its message the facts.
    _tenant, token = tenant_token("acme")
    server = web()
    status, _, body = rpc(server.url("/mcp"), "tasks/get", {"taskId": str(task.id)}, token=token,
                          headers={"Mcp-Name": str(task.id)})
    assert status == 200, body
    request = body["result"]["inputRequests"][task.wait["waitId"]]["params"]
    assert_facts(request["message"], key)
    assert request["requestedSchema"]["required"] == ["outcome"]
    assert "default" not in request["requestedSchema"]["properties"]["outcome"]
    assert request["_meta"]["agent-runtime/effect"]["annotations"]["idempotentHint"] is False

    # The console's task page: the facts, radio answers with none chosen, the result optional.
    page = operator.get(wait_url(task)).content.decode()
    assert 'class="module aligned outcome-question"' in page
    assert_facts(page, key)
    assert_nothing_chosen(page)
    assert re.search(r'<textarea[^>]*name="value-result"', page) and \
        not re.search(r'<textarea[^>]*name="value-result"[^>]*required', page)


def test_it_asks_with_one_form_on_the_task_page_and_the_dead_letters_and_keeps_each_reason(tenant, operator):
    task = create_engine_task(tenant, "demo_steps", steps=2)
    key = f"{task.id}:1:charge"
    now = db_now()
    SideEffect.objects.create(task_id=task.id, step_seq=1, key=key, name="charge", status="unknown", attempts=1,
                              lease_epoch=0, started_at=now - timedelta(minutes=2), deadline=now - timedelta(minutes=1),
                              unknown_why="timed_out")
    wait = waits.effect_outcome_wait(task_id=task.id, step_seq=1, plan_version=1, effect_name="charge", effect_key=key,
                                     arguments={"amount": 5},
                                     facts={"sentAt": "2026-01-01T00:00:00+00:00",
                                            "deadline": "2026-01-01T00:01:00+00:00", "why": "timed_out"})
    Task.objects.filter(id=task.id).update(status="input_required", wait=wait)
    task.refresh_from_db()

    on_task_page = operator.get(wait_url(task)).content.decode()
    Task.objects.filter(id=task.id).update(status="dead_lettered", wait=None,
                                           error={"reason": "effect_outcome_unknown"})
    on_dead_letters = operator.get(retry_url(task)).content.decode()

    for page in (on_task_page, on_dead_letters):  # the same form: the same template, facts and answers
        assert 'class="module aligned outcome-question"' in page and "Did charge happen?" in page
        assert "no answer came within its timeout (timed_out)" in page and "passed" in page and key in page
        assert_nothing_chosen(page)
    answers = [re.findall(r'value="(\w+)"', tag) for tag in outcome_inputs(on_task_page)]
    assert answers == [re.findall(r'value="(\w+)"', tag) for tag in outcome_inputs(on_dead_letters)]
    assert [a for [a] in answers] == ["applied", "not_applied", "abandon"]

    # No answer is no answer: the dead letter stays, with nothing decided.
    assert operator.post(retry_url(task), {"reason": "pressed the button"}).status_code == 200
    assert Task.objects.get(id=task.id).status == "dead_lettered"
    # The dead letters' answer and its reason: in the retry's audit event.
    operator.post(retry_url(task), {"answer_0": "not_applied", "reason": "the ledger of the bank has no charge"})
    assert Task.objects.get(id=task.id).status == "recovering"
    assert SideEffect.objects.get(task_id=task.id, key=key).status == "failed"
    retried = TaskEvent.objects.filter(task_id=task.id, data__effects={key: "not_applied"}).get()
    assert retried.data["reason"] == "the ledger of the bank has no charge"

    # The task page's answer and its reason: the steering command's, as every command keeps its own.
    Task.objects.filter(id=task.id).update(status="input_required", wait=wait)
    task.refresh_from_db()
    unanswered = operator.post(wait_url(task), {"wait_id": wait["waitId"], "expected_version": task.state_version,
                                                "reason": "just looking"})
    assert unanswered.status_code == 200 and not SteeringCommand.objects.filter(task_id=task.id).exists()
    operator.post(wait_url(task), {"wait_id": wait["waitId"], "expected_version": task.state_version,
                                   "value-outcome": "applied", "value-result": "", "reason": "the shop shows it"})
    command = SteeringCommand.objects.get(task_id=task.id)
    assert command.type == "provide_input" and command.reason == "the shop shows it"
    assert command.payload["value"] == {"outcome": "applied"}  # the result left out: optional
