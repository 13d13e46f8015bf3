"""The model call on an event loop (agents_app.llm.chat_async): the building block of issue 39's I/O process, where
many model calls are in flight at once without a thread or a worker each (ARCHITECTURE §13). It must be chat()
itself, only awaited: the same reply from the same stream, the same deltas, the same failures said the same way,
through the same outbound connector (a refused address is never connected to). Against the session's scripted
OpenAI-compatible endpoint (tests/clients/scripted_model.py): a real HTTP server, the official SDK on both sides of
the comparison."""

from __future__ import annotations

import asyncio
from datetime import datetime

import pytest

from agents_app import llm, outbound
from tests.scripted_model_support import unique_key

TOOLS = [{"type": "function", "function": {"name": "lookup", "description": "Look a key up.",
                                           "parameters": {"type": "object", "properties": {"key": {"type": "string"}}}}}]


def endpoint_of(model, *, where: outbound.Policy | None = None) -> llm.Endpoint:
    return llm.Endpoint(base_url=model.url, model="scripted-1", credential=None, context_window=8192,
                        timeout_seconds=20, max_retries=0, prices=None,
                        where=where or outbound.Policy(anywhere=True))


def both(endpoint: llm.Endpoint, messages: list[dict], **options) -> tuple[tuple, tuple]:
    """(what chat() gave, what chat_async() gave): the reply without its per-request id, or the failure's type and
    words; each with the deltas it handed over."""
    def outcome(call) -> tuple:
        deltas: list[str] = []
        try:
            reply = call(deltas)
        except llm.ModelError as failed:
            return ("failed", type(failed).__name__, str(failed)), tuple(deltas)
        return ("reply", reply.message, reply.tool_calls, reply.finish_reason, reply.prompt_tokens,
                reply.completion_tokens, reply.response_model), tuple(deltas)

    sync = outcome(lambda deltas: llm.chat(endpoint, messages=messages, on_delta=deltas.append, **options))
    awaited = outcome(lambda deltas: asyncio.run(llm.chat_async(endpoint, messages=messages,
                                                                on_delta=deltas.append, **options)))
    return sync, awaited


def test_it_gives_the_same_reply_and_deltas_on_an_event_loop_as_chat(scripted_model):
    key = unique_key("async-same")
    scripted_model.script(key, [{"tool_calls": [{"name": "lookup", "arguments": {"key": "a"}, "id": "call_1"}],
                                 "content": "Let me look that up.", "chunks": 3,
                                 "usage": {"prompt_tokens": 11, "completion_tokens": 7}}])
    messages = [{"role": "user", "content": f"{key}: what is a?"}]

    sync, awaited = both(endpoint_of(scripted_model), messages, tools=TOOLS)

    assert sync == awaited
    (kind, message, tool_calls, finish, tokens_in, tokens_out, _), deltas = awaited
    assert kind == "reply" and message["content"] == "Let me look that up." and finish == "tool_calls"
    assert tool_calls == [{"id": "call_1", "name": "lookup", "arguments": '{"key":"a"}'}]
    assert (tokens_in, tokens_out) == (11, 7)
    assert len(deltas) == 3 and "".join(deltas) == "Let me look that up."  # streamed, piece by piece
    assert [entry["tools"] for entry in scripted_model.requests(key)] == [["lookup"], ["lookup"]]


@pytest.mark.parametrize("reply, said", [
    ({"error": 400}, "ModelRefused"),  # a request no retry mends
    ({"error": 503}, "ModelUnavailable"),  # past the SDK's retries (none here)
    ({"content": "cut short", "chunks": 4, "hang_up_after_chunks": 1}, "ModelUnavailable"),  # a stream that stops
])
def test_it_fails_on_an_event_loop_as_chat_fails(scripted_model, reply, said):
    key = unique_key("async-fails")
    scripted_model.script(key, [{**reply, "times": 2, "then": {"content": "never asked for"}}])

    sync, awaited = both(endpoint_of(scripted_model), [{"role": "user", "content": f"{key}: hi"}])

    assert sync[0] == awaited[0] and sync[0][:2] == ("failed", said), (sync, awaited)


def test_it_never_connects_to_a_refused_address_on_an_event_loop(scripted_model):
    key = unique_key("async-refused")
    scripted_model.script(key, [{"content": "should not be asked"}])
    nowhere = outbound.Policy(allowed_hosts=("models.example.com",))  # the scripted model is on 127.0.0.1

    sync, awaited = both(endpoint_of(scripted_model, where=nowhere), [{"role": "user", "content": f"{key}: hi"}])

    assert sync[0] == awaited[0] and awaited[0][:2] == ("failed", "ModelRefused") and "was not called" in awaited[0][2]
    assert scripted_model.requests(key) == []  # nothing reached it, from either


def test_it_has_many_model_calls_in_flight_at_once_on_one_loop(scripted_model):
    """Thirty calls whose endpoint takes 1 s each, awaited together on one loop in one thread: all thirty requests
    are at the endpoint before the first answer could have come back (one after the other, the last would arrive
    29 s after the first), and each gets its own conversation's reply."""
    keys = [unique_key(f"async-many-{n}") for n in range(30)]
    for key in keys:
        scripted_model.script(key, [{"content": f"answer for {key}", "delay_ms": 1000}])
    endpoint = endpoint_of(scripted_model)

    async def all_at_once():
        return await asyncio.gather(*(llm.chat_async(endpoint, messages=[{"role": "user", "content": f"{key}: go"}])
                                      for key in keys))

    replies = asyncio.run(all_at_once())

    assert [reply.message["content"] for reply in replies] == [f"answer for {key}" for key in keys]
    arrived = sorted(datetime.fromisoformat(scripted_model.requests(key)[0]["at"]) for key in keys)
    assert (arrived[-1] - arrived[0]).total_seconds() < 1.0, (arrived[0], arrived[-1])
