"""An agent task's conversation as people read it: on its console page (the goal, the model's answers, each tool call
with its outcome, approvals, questions to people and their answers, the running counters) and through
GET /runtime/tasks/{id}/transcript (tenant-scoped, paged by turn). The agent runs against the scripted model
(tests/clients/scripted_model.py) and the example tool server, driven by the engine in this process as in
tests/test_agent.py; the live text (llm.delta) in task.js is checked in tests/test_console_pages.py."""

from __future__ import annotations

import html
import re

import pytest

from agents_app.models import ToolServer
from agents_app.selectors import task_conversation
from steering_app.services import steering_submit
from tasks_app.models import Step, Task
from tasks_app.services import task_create
from tests.engine_support import drive
from tests.scripted_model_support import unique_key
from tests.tool_server_support import tool_server  # noqa: F401 — the fixture

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("external_root")]

LABELLED_TIME = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC")


@pytest.fixture
def shop(tenant, tool_server):  # noqa: F811
    ToolServer.objects.create(tenant=tenant, name="shop", url=tool_server.url, timeout_seconds=5)
    return tool_server


def agent_task(tenant, goal: str, **create) -> Task:
    return task_create(tenant=tenant, owner=None, workflow="agent", input={"goal": goal}, **create).task


def answer(task_id, command: str, by: str, **payload) -> None:
    task = Task.objects.get(id=task_id)
    steering_submit(task=task, command_type=command, payload={"waitId": task.wait["waitId"], **payload},
                    expected_version=task.state_version, requested_by=by, reason="" if command != "reject" else
                    "not that list")


def conversation_part(html: str) -> str:
    start = html.index('<section class="console-conversation"')
    return html[start:html.index("</section>", start)]


def text_of(page: str) -> str:
    """The page's words as a person reads them: inline tags dropped, the others a space, white space folded."""
    inline = re.sub(r"</?(?:span|code|strong|small|time|a)\b[^>]*>", "", page)
    return html.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", inline)))


# -- the console's task page ------------------------------------------------------------------------------------------
def test_it_shows_the_goal_the_answer_each_tool_call_with_its_outcome_and_the_counters(tenant, model, shop,
                                                                                       admin_client, monkeypatch):
    key = unique_key("page")
    model.script(key, [{"tool_calls": [{"name": "shop__upsert", "arguments": {"key": "colour", "value": "teal",
                                                                              "password": "hunter2"}}],
                        "usage": {"prompt_tokens": 1000, "completion_tokens": 50}},
                       {"content": "The colour is teal now.",
                        "usage": {"prompt_tokens": 1500, "completion_tokens": 20}}])
    task = agent_task(tenant, f"Set the colour to teal ({key})")
    assert drive(task.id)[-1] == "completed"

    page = admin_client.get(f"/admin/tasks_app/task/{task.id}/change/").content.decode()
    shown = conversation_part(page)
    words = text_of(shown)

    assert f"Goal Set the colour to teal ({key})" in words
    assert "Model, turn 2" in words and "The colour is teal now." in words
    # the tool call: which tool, its arguments (redacted), its outcome as the gateway and the ledger record it
    assert 'Calls shop.upsert {"key": "colour", "value": "teal", "password": "[redacted]"}' in words
    assert "hunter2" not in page
    assert re.search(r"ok · \d+ ms · ledger succeeded", words) and f"{task.id}:2:shop.upsert:1" in words
    assert 'What the model read: { "key": "colour", "value": "teal"' in words
    # the running counters: tokens from the task's state, the cost it spent (2 and 8 per million tokens)
    assert "2 model calls · 2500 tokens in · 70 tokens out · cost 0.0056" in words and "model scripted-1" in words
    assert len(LABELLED_TIME.findall(shown)) == 2  # each answer's time, in the console's one format
    # a long conversation: the newest messages, saying how many are left out
    monkeypatch.setattr("agents_app.admin.CONVERSATION_ON_TASK_PAGE", 3)
    newest = text_of(conversation_part(admin_client.get(f"/admin/tasks_app/task/{task.id}/change/")
                                       .content.decode()))
    assert f"2 earlier messages not shown (the API pages through them all: GET /runtime/tasks/{task.id}/transcript)" \
        in newest and "Goal" not in newest and "The colour is teal now." in newest
    # live: re-read with the panel, and the stream's live-only items listened for
    panel = admin_client.get(f"/admin/tasks_app/task/{task.id}/panel/").content.decode()
    assert 'data-live="conversation"' in panel and 'data-live="agent-counters"' in panel
    assert 'data-live-types="llm.delta"' in page and 'data-field="writing"' in page
    assert "llm.message" in re.search(r'data-event-types="([^"]*)"', page).group(1).split()


def test_it_shows_refusals_approvals_and_a_persons_answer_where_the_model_met_them(tenant, model, shop,
                                                                                   admin_client):
    key = unique_key("people")
    model.script(key, [{"tool_calls": [{"name": "shop__drop_tables", "arguments": {}},
                                       {"name": "shop__append", "arguments": {"text": "tea"}}]},
                       {"tool_calls": [{"name": "ask_human", "arguments": {"question": "Which list then?"}}]},
                       {"content_from": "last_tool_result", "content": "Using "}])
    task = agent_task(tenant, f"Add tea ({key})", tool_policy={"requireApproval": ["shop.append"]})

    assert drive(task.id)[-1] == "input_required"  # the append waits for a person
    waiting = text_of(conversation_part(admin_client.get(f"/admin/tasks_app/task/{task.id}/change/")
                                        .content.decode()))
    assert "Waiting for a person's approval — approve or reject it" in waiting
    answer(task.id, "reject", "user:boss")
    assert drive(task.id)[-1] == "input_required"  # the model asks a person
    asking = text_of(conversation_part(admin_client.get(f"/admin/tasks_app/task/{task.id}/change/")
                                       .content.decode()))
    assert "Asks a person: Which list then? waiting for an answer" in asking
    answer(task.id, "provide_input", "user:ops", value="the groceries")
    assert drive(task.id)[-1] == "completed"

    words = text_of(conversation_part(admin_client.get(f"/admin/tasks_app/task/{task.id}/change/").content.decode()))
    assert "Calls shop__drop_tables {} denied: not offered to the model" in words
    assert "What the model read: Not made: there is no tool 'shop__drop_tables'" in words
    assert re.search(r"Calls shop\.append \{\"text\": \"tea\"\} rejected: by user:boss: not that list .*"
                     r"Rejected by user:boss at " + LABELLED_TIME.pattern + ": not that list", words)
    assert "Asks a person: Which list then? answered by user:ops Their answer the groceries" in words
    assert "Model, turn 3" in words and "Using the groceries" in words


def test_it_shows_no_conversation_on_a_task_of_another_workflow(new_task, admin_client):
    task = new_task(steps=1)

    page = admin_client.get(f"/admin/tasks_app/task/{task.id}/change/").content.decode()

    assert "console-conversation" not in page and 'id="console-task"' in page


# -- GET /runtime/tasks/{id}/transcript -----------------------------------------------------------------------------
def test_it_pages_an_agent_tasks_transcript_by_turn_within_its_tenant(tenant, model, shop, api, other_api, new_task):
    key = unique_key("rest")
    model.script(key, [{"tool_calls": [{"name": "shop__upsert", "arguments": {"key": "k", "value": "1"}}]},
                       {"tool_calls": [{"name": "shop__lookup", "arguments": {"key": "k"}}]},
                       {"content": "k is 1."}])
    task = agent_task(tenant, f"Set and read k ({key})")
    assert drive(task.id)[-1] == "completed"
    url = f"/runtime/tasks/{task.id}/transcript"

    first = api.get(url, {"limit": 1}).json()
    second = api.get(first["next"]).json()
    rest = api.get(url, {"afterTurn": second["nextAfterTurn"]}).json()
    whole = api.get(url).json()

    assert [(m["turn"], m["role"], m["kind"]) for m in first["messages"]] == [
        (1, "system", "instructions"), (1, "user", "goal"), (1, "assistant", "answer"), (1, "tool", "tool_result")]
    call = first["messages"][2]["toolCalls"][0]
    assert call["name"] == "shop__upsert" and call["tool"] == "shop.upsert" and call["arguments"] == \
        '{"key": "k", "value": "1"}'
    assert call["outcome"]["status"] == "ok" and call["outcome"]["ledger"] == "succeeded"
    assert call["resultIndex"] == 4 and first["messages"][3]["toolCallId"] == call["id"]
    assert first["nextAfterTurn"] == 1 and second["nextAfterTurn"] == 2 and rest["nextAfterTurn"] is None
    assert [m["turn"] for m in second["messages"]] == [2, 2] and [m["index"] for m in second["messages"]] == [5, 6]
    assert [(m["turn"], m["content"]) for m in rest["messages"]] == [(3, "k is 1.")]
    assert rest["messages"][0]["usage"]["model"] == "scripted-1" and rest["next"] is None
    assert whole["turns"] == 3 and len(whole["messages"]) == 7 and whole["cost"] == str(task_cost(task))
    assert whole["tokensIn"] > 0 and whole["tokensOut"] > 0 and whole["goal"] == f"Set and read k ({key})"
    # the console's window: the newest messages, saying how many were left out
    newest = task_conversation(task=Task.objects.get(id=task.id), last=2)
    assert newest.omitted == 5 and [m["index"] for m in newest.messages] == [6, 7]

    # another tenant's task is not found; a task of another workflow has no transcript; a bad page is a 400
    hidden = other_api.get(url)
    assert hidden.status_code == 404 and hidden["Content-Type"].startswith("application/problem+json")
    plain = api.get(f"/runtime/tasks/{new_task(steps=1).id}/transcript")
    assert plain.status_code == 409 and plain.json()["type"] == "/runtime/problems/not-an-agent-task"
    bad = api.get(url, {"afterTurn": -1, "limit": 51})
    assert bad.status_code == 400 and {e["field"] for e in bad.json()["errors"]} == {"afterTurn", "limit"}


def task_cost(task: Task):
    return Task.objects.values_list("cost_spent", flat=True).get(id=task.id)


def test_it_documents_the_transcript_in_the_openapi_schema(api):
    schema = api.get("/runtime/schema").json()

    operation = schema["paths"]["/runtime/tasks/{task_id}/transcript"]["get"]
    assert operation["operationId"] == "tasks_transcript" and operation["tags"] == ["Agents"]
    assert {parameter["name"] for parameter in operation["parameters"]} >= {"task_id", "afterTurn", "limit"}
    assert {"200", "404", "409"} <= set(operation["responses"])


def test_it_rebuilds_the_state_again_when_a_step_commits_while_it_reads_and_says_when_it_cannot(tenant, model,
                                                                                                   shop):
    """The race: the page read the task row, then a step committed before the checkpoint and deltas were read —
    the history is one step longer than the row says. The row is read again, not the history guessed at. A history
    that does not verify is reported, never shown."""
    key = unique_key("race")
    model.script(key, [{"tool_calls": [{"name": "shop__lookup", "arguments": {"key": "k"}}]}, {"content": "done"}])
    task = agent_task(tenant, f"Look k up ({key})")
    drive(task.id, calls=1, max_steps=1, until_done=False)  # the first think committed
    read_before = Task.objects.get(id=task.id)
    assert drive(task.id)[-1] == "completed"  # two more steps commit after that read

    conversation = task_conversation(task=read_before)

    assert conversation.turns == 2 and [m["kind"] for m in conversation.messages] == [
        "instructions", "goal", "answer", "tool_result", "answer"]
    assert not conversation.unreadable

    Step.objects.filter(task_id=task.id, seq=3).update(delta_sha256="0" * 64)  # (no checkpoint before it)
    broken = task_conversation(task=Task.objects.get(id=task.id))
    assert broken.messages == [] and broken.unreadable.startswith("step_delta_corrupt: step 3 (think)")
