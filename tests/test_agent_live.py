"""The agent as its users see it from outside, through real uvicorn and celery worker processes and the scripted
model: the model's text arrives on the task's SSE stream as it is generated, before the turn commits, and is never
stored; an MCP client hands a goal to the agent over /mcp (MCP Tasks) and answers its question with tasks/update."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from django.contrib.auth import get_user_model

from tasks_app.models import Task, TaskEvent, TenantMembership
from tasks_app.services import api_token_create, task_create
from tests.engine_support import configure
from tests.scripted_model_support import unique_key
from tests.support.streams import sse
from tests.tool_server_support import call_as_task, connect, task_get, task_update
from tests.worker_support import wait_for_status

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("external_root"), pytest.mark.slow]


@pytest.fixture
def token(tenant):
    user = get_user_model().objects.create_user("agent-watcher")
    TenantMembership.objects.create(user=user, tenant=tenant)
    return api_token_create(tenant=tenant, user=user, name="agent", scopes=("tasks:read", "tasks:write"))[1]


@pytest.fixture
def model_env(settings, scripted_model) -> dict:
    configure(settings, model={"base_url": scripted_model.url, "name": "scripted-1"})
    return {"RUNTIME_MODEL__BASE_URL": scripted_model.url, "RUNTIME_MODEL__NAME": "scripted-1"}


def test_it_streams_the_models_text_live_before_the_turn_commits_and_stores_none_of_it(tenant, token, web, workers,
                                                                                       scripted_model, model_env):
    key = unique_key("live")
    words = "The answer, word by word, as it is written."
    scripted_model.script(key, [{"content": words, "chunks": 6, "chunk_delay_ms": 250}])
    server = web(**model_env)
    task = task_create(tenant=tenant, owner=None, workflow="agent", input={"goal": key, "servers": []}).task
    arrived: list[tuple[float, str]] = []
    connected, streams = threading.Event(), []
    follower = threading.Thread(target=lambda: streams.append(sse(
        server.port, f"/runtime/tasks/{task.id}/events", token=token, connected=connected,
        on_event=lambda event: arrived.append((time.monotonic(), event["event"])))))
    follower.start()
    assert connected.wait(30)  # subscribed: live-only items published from now on reach it (none is replayed)
    workers("agent-worker", pool="solo", env=model_env)  # (only now: the task's first words are not missed)
    follower.join(60)
    stream, = streams

    types = [event["event"] for event in stream.events]
    deltas = [event for event in stream.events if event["event"] == "llm.delta"]
    assert stream.ended and types[-1] == "terminal"
    assert len(deltas) >= 2 and all("id" not in event for event in deltas)  # live only: no seq, no Last-Event-ID
    assert "".join(event["data"]["data"]["text"] for event in deltas) == words
    assert types.index("llm.delta") < types.index("llm.message")  # before the turn's commit wrote its message
    first_delta = next(at for at, kind in arrived if kind == "llm.delta")
    committed = next(at for at, kind in arrived if kind == "llm.message")
    assert committed - first_delta >= 0.5  # (the text kept coming for a while before the commit)
    assert not TaskEvent.objects.filter(task_id=task.id, type="llm.delta").exists()  # never stored
    assert Task.objects.get(id=task.id).result["answer"] == words


def test_it_runs_an_agent_for_an_mcp_client_and_takes_its_answer_to_the_agents_question_by_tasks_update(
        tenant, token, web, workers, scripted_model, model_env):
    key = unique_key("mcp")
    scripted_model.script(key, [{"tool_calls": [{"name": "ask_human",
                                                 "arguments": {"question": "Which colour?",
                                                               "schema": {"type": "object",
                                                                          "properties": {"colour": {"type": "string"}},
                                                                          "required": ["colour"]}}}]},
                                {"content_from": "last_tool_result", "content": "The person chose: "}])
    server = web(**model_env)
    workers("agent-worker", pool="solo", env=model_env)

    async def scenario():
        async with connect(server.url("/mcp"), token=token, tasks=True) as client:
            created = await call_as_task(client, "agent", {"goal": f"Pick a colour ({key})", "servers": []})
            task_id = created["taskId"]
            deadline = time.monotonic() + 60
            while (state := await task_get(client, task_id))["status"] != "input_required":
                assert time.monotonic() < deadline and state["status"] == "working", state
                await asyncio.sleep(0.2)
            (request_key, request), = state["inputRequests"].items()
            await task_update(client, task_id, {request_key: {"action": "accept", "content": {"colour": "teal"}}})
            while (state := await task_get(client, task_id))["status"] not in ("completed", "failed", "cancelled"):
                assert time.monotonic() < deadline, state
                await asyncio.sleep(0.2)
            return task_id, request, state

    task_id, request, finished = asyncio.run(scenario())

    assert "Which colour?" in request["params"]["message"]
    assert finished["status"] == "completed", finished
    done = wait_for_status(task_id, {"completed"}, seconds=5)
    assert done.result["answer"] == 'The person chose: {"colour": "teal"}'
    assert scripted_model.turn_counts(key) == {0: 1, 1: 1}
