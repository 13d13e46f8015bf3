"""The scripted model (tests/clients/scripted_model.py) speaks the Chat Completions wire format the official `openai`
SDK parses: these tests drive it with that SDK, as the runtime's model client does, so a test of the agent loop that
scripts it can trust what the loop was sent."""

import json
import threading
import time

import openai
import pytest
from openai import OpenAI

from tests.scripted_model_support import unique_key

TOOLS = [{"type": "function", "function": {
    "name": name, "description": f"{name} a key", "parameters": {
        "type": "object", "properties": {"key": {"type": "string"}, "value": {"type": "string"}},
        "required": ["key"]}}} for name in ("lookup", "upsert")]


def client(model, **options) -> OpenAI:
    return OpenAI(base_url=model.url, api_key="sk-scripted", **{"max_retries": 0, **options})


def goal(key: str) -> list[dict]:
    return [{"role": "system", "content": "You are a careful agent."},
            {"role": "user", "content": f"Look up the customer's plan. (conversation {key})"}]


def test_it_answers_a_scripted_reply_without_streaming(scripted_model):
    key = unique_key("plain")
    scripted_model.script(key, [{"content": "The plan is gold."},
                                {"content": "cut short", "finish_reason": "length",
                                 "usage": {"prompt_tokens": 40, "completion_tokens": 2}}])

    completion = client(scripted_model).chat.completions.create(model="gpt-test", messages=goal(key), tools=TOOLS)
    choice = completion.choices[0]
    assert (choice.message.role, choice.message.content, choice.message.tool_calls) == (
        "assistant", "The plan is gold.", None)
    assert choice.finish_reason == "stop" and completion.model == "gpt-test"
    assert completion.usage.total_tokens == completion.usage.prompt_tokens + completion.usage.completion_tokens > 0

    messages = [*goal(key), {"role": "assistant", "content": "The plan is gold."}, {"role": "user", "content": "?"}]
    second = client(scripted_model).chat.completions.create(model="gpt-test", messages=messages)
    assert second.choices[0].finish_reason == "length"
    assert (second.usage.prompt_tokens, second.usage.completion_tokens, second.usage.total_tokens) == (40, 2, 42)

    first, later = scripted_model.requests(key)
    assert (first["turn"], first["status"], first["stream"], first["model"], first["tools"]) == (
        0, 200, False, "gpt-test", ["lookup", "upsert"])
    assert first["messages"] == goal(key) and first["authorization"] == "sk-scripted"
    assert (later["turn"], later["reply"]) == (1, "content")


def test_it_streams_content_in_pieces_that_arrive_over_time(scripted_model):
    key = unique_key("pieces")
    scripted_model.script(key, [{"content": "one two three four five six", "chunks": 3, "chunk_delay_ms": 300}])

    deltas = []
    stream = client(scripted_model).chat.completions.create(model="gpt-test", messages=goal(key), stream=True)
    for chunk in stream:
        assert chunk.usage is None  # not asked for
        if chunk.choices and chunk.choices[0].delta.content:
            deltas.append((time.monotonic(), chunk.choices[0].delta.content))
        finish = chunk.choices[0].finish_reason if chunk.choices else None
    assert len(deltas) == 3 and "".join(text for _, text in deltas) == "one two three four five six"
    assert deltas[-1][0] - deltas[0][0] >= 0.5  # the first piece was there two pauses before the last
    assert finish == "stop"


def test_it_streams_tool_calls_whose_arguments_the_sdk_reassembles(scripted_model):
    key = unique_key("tools")
    arguments = {"key": "customer-42", "value": "a longer value, to be cut into several pieces"}
    scripted_model.script(key, [{"content": "Let me look.", "chunks": 4, "tool_calls": [
        {"name": "lookup", "arguments": {"key": "customer-42"}}, {"name": "upsert", "arguments": arguments}]}])

    with client(scripted_model).chat.completions.stream(model="gpt-test", messages=goal(key), tools=TOOLS) as stream:
        events = list(stream)
        final = stream.get_final_completion()

    pieces = [(event.index, event.arguments_delta) for event in events
              if event.type == "tool_calls.function.arguments.delta" and event.arguments_delta]
    assert [index for index, _ in pieces] == [0] * 4 + [1] * 4  # each call's arguments came in 4 pieces
    assert json.loads("".join(text for index, text in pieces if index == 1)) == arguments
    done = [(event.name, json.loads(event.arguments)) for event in events
            if event.type == "tool_calls.function.arguments.done"]
    assert done == [("lookup", {"key": "customer-42"}), ("upsert", arguments)]
    message = final.choices[0].message
    assert final.choices[0].finish_reason == "tool_calls" and message.content == "Let me look."
    assert [(call.type, call.function.name, json.loads(call.function.arguments)) for call in message.tool_calls] == [
        ("function", "lookup", {"key": "customer-42"}), ("function", "upsert", arguments)]
    assert all(call.id.startswith("call_") for call in message.tool_calls)
    assert len({call.id for call in message.tool_calls}) == 2
    assert scripted_model.requests(key)[0]["reply"] == "tool_calls"


def test_it_sends_the_usage_in_a_last_chunk_when_asked(scripted_model):
    key = unique_key("usage")
    scripted_model.script(key, [{"content": "short answer", "usage": {"prompt_tokens": 12, "completion_tokens": 3}}])

    chunks = list(client(scripted_model).chat.completions.create(
        model="gpt-test", messages=goal(key), stream=True, stream_options={"include_usage": True}))
    assert all(chunk.usage is None for chunk in chunks[:-1])
    assert chunks[-1].choices == []
    assert (chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens, chunks[-1].usage.total_tokens) == (
        12, 3, 15)
    assert chunks[-2].choices[0].finish_reason == "stop"


def test_it_answers_429_with_retry_after_twice_then_the_reply(scripted_model):
    key = unique_key("limited")
    scripted_model.script(key, [{"error": 429, "retry_after": 1, "times": 2, "then": {"content": "at last"}}])

    started = time.monotonic()
    completion = client(scripted_model, max_retries=2).chat.completions.create(model="gpt-test", messages=goal(key))
    assert completion.choices[0].message.content == "at last"
    assert time.monotonic() - started >= 1.9  # the SDK waited the Retry-After second, twice
    requests = scripted_model.requests(key)
    assert [(entry["status"], entry["attempt"], entry["sdk_retry_count"]) for entry in requests] == [
        (429, 1, "0"), (429, 2, "1"), (200, 3, "2")]
    assert scripted_model.turn_counts(key) == {0: 3}

    # The SDK shows what it was told: a RateLimitError with the OpenAI-style body, when it does not retry.
    again = unique_key("limited")
    scripted_model.script(again, [{"error": 429, "retry_after": 1}])
    with pytest.raises(openai.RateLimitError) as raised:
        client(scripted_model).chat.completions.create(model="gpt-test", messages=goal(again))
    assert raised.value.code == "rate_limit_exceeded" and raised.value.response.headers["retry-after"] == "1"


def test_it_gives_the_same_reply_when_a_turn_is_asked_again(scripted_model):
    key = unique_key("again")
    scripted_model.script(key, [{"tool_calls": [{"name": "lookup", "arguments": {"key": "a"}}]},
                                {"content": "done"}])
    model = client(scripted_model)

    first, retried = [model.chat.completions.create(model="gpt-test", messages=goal(key)) for _ in range(2)]
    assert first.choices[0].message.tool_calls == retried.choices[0].message.tool_calls  # ids included
    call = first.choices[0].message.tool_calls[0]
    with model.chat.completions.stream(model="gpt-test", messages=goal(key)) as stream:
        assert stream.get_final_completion().choices[0].message.tool_calls[0].id == call.id
    after = model.chat.completions.create(model="gpt-test", messages=[
        *goal(key), first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "plan: gold"}])
    assert after.choices[0].message.content == "done"
    assert scripted_model.turn_counts(key) == {0: 3, 1: 1}  # "asked exactly once for turn 1"
    assert scripted_model.requests(key, turn=0, stream=True)[0]["attempt"] == 3


def test_it_echoes_what_the_request_carried(scripted_model):
    key = unique_key("echo")
    scripted_model.script(key, [{"tool_calls": [{"name": "lookup", "arguments": {"key": "a"}}]},
                                {"content_from": "last_tool_result", "content": "The tool said: "},
                                {"content_from": "last_user"}])
    model = client(scripted_model)
    conversation = [*goal(key), {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "plan: gold"}]

    reply = model.chat.completions.create(model="gpt-test", messages=conversation).choices[0].message.content
    assert reply == "The tool said: plan: gold"
    conversation += [{"role": "assistant", "content": reply}, {"role": "user", "content": "Yes, upgrade it."}]
    assert model.chat.completions.create(model="gpt-test", messages=conversation).choices[0].message.content == (
        "Yes, upgrade it.")

    with pytest.raises(openai.BadRequestError) as raised:  # nothing to echo is the script's mistake, said so
        model.chat.completions.create(model="gpt-test", messages=[*goal(key), {"role": "assistant", "content": "x"}])
    assert raised.value.code == "nothing_to_echo"


def test_it_refuses_a_conversation_it_has_no_script_for(scripted_model):
    key = unique_key("scripted")
    scripted_model.script(key, [{"content": "only one turn"}])
    model = client(scripted_model, max_retries=2)

    with pytest.raises(openai.BadRequestError) as raised:
        model.chat.completions.create(model="gpt-test", messages=goal(unique_key("unknown")))
    assert raised.value.status_code == 400 and raised.value.code == "unknown_conversation"
    assert "no scripted conversation" in raised.value.message
    assert scripted_model.requests(None, conversation=None, status=400)  # logged, not retried by the SDK (a 400)

    with pytest.raises(openai.BadRequestError) as raised:
        model.chat.completions.create(model="gpt-test", messages=[*goal(key), {"role": "assistant", "content": "x"}])
    assert raised.value.code == "script_exhausted" and "none for turn 1" in raised.value.message

    with pytest.raises(AssertionError, match="unknown field"):
        scripted_model.script(key, [{"content": "x", "chunk": 3}])


def test_it_delays_an_answer_and_logs_the_request_on_arrival(scripted_model):
    key = unique_key("slow")
    scripted_model.script(key, [{"content": "late", "delay_ms": 600}])
    answers = []
    caller = threading.Thread(target=lambda: answers.append(
        client(scripted_model).chat.completions.create(model="gpt-test", messages=goal(key))))
    caller.start()

    scripted_model.wait_for_request(key, turn=0)
    assert caller.is_alive() and not answers  # the request is in; the answer is not
    caller.join(10)
    assert answers[0].choices[0].message.content == "late"


def test_it_hangs_up_mid_stream_when_scripted_to(scripted_model):
    key = unique_key("hangup")
    scripted_model.script(key, [{"content": "never finished", "chunks": 4, "hang_up_after_chunks": 3}])

    received = []
    with pytest.raises(openai.APIConnectionError):  # what the SDK makes of a stream cut short
        for chunk in client(scripted_model).chat.completions.create(model="gpt-test", messages=goal(key),
                                                                    stream=True):
            received.append(chunk)
    assert 1 <= len(received) <= 3 and all(chunk.choices[0].finish_reason is None for chunk in received)
