"""A scripted language model behind the OpenAI Chat Completions API, for tests: raw ASGI, no model, no internet.

    python tests/clients/scripted_model.py --port 8768 [--log PATH]
    → http://127.0.0.1:8768/v1 (loopback only), the base URL an OpenAI-compatible client is given

The model endpoints answer the wire format the official `openai` SDK parses:

    POST /v1/chat/completions   stream false → a `chat.completion` object; stream true → SSE lines
                                `data: {chat.completion.chunk}` ending with `data: [DONE]` (with
                                stream_options.include_usage, every chunk has "usage": null and a last chunk with no
                                choices carries the usage)
    GET  /v1/models             one model, "scripted" (any model name is accepted in a request and echoed back)

A test scripts each conversation through the control API:

    POST /_scripts   {"key": "conv-1234", "replies": [REPLY, REPLY, ...]}   → {"key": …, "turns": N}
                     installs (or replaces) the script of one conversation; a malformed script is refused with a 400
    GET  /_requests[?conversation=KEY]   → {"requests": [ENTRY, ...]} (every request, or one conversation's, in order)
    POST /_reset     {} forgets every script and request; {"key": KEY} only that conversation's

Which conversation: the one whose key occurs in the request's FIRST user message (tests put a unique marker in the
agent's goal); the longest key wins when several do. No key there → 400, an OpenAI-style error body
{"error": {"message", "type": "invalid_request_error", "param": null, "code": "unknown_conversation"}}.

Which reply: replies[turn], turn being the number of assistant messages already in the request's `messages`. A
request repeated for the same turn (a retry, a caller that crashed and came back) gets the same reply, and a tool
call the same id, unless the reply says otherwise with `times`/`then`. A turn past the script's end → 400
"script_exhausted".

A REPLY is an object with exactly one of these forms:

    {"content": "text"}
    {"tool_calls": [{"name": "lookup", "arguments": {"key": "a"}, "id": "call_x"?}], "content": "text"?}
                     arguments: an object (sent as its JSON) or a string (sent as it is, valid JSON or not)
    {"content_from": "last_tool_result" | "last_user", "content": "prefix"?}
                     the reply's text is the content of the request's last `tool` (or `user`) message, after the
                     prefix: proof that a tool's result or a person's answer reached the model
    {"error": 429, "retry_after": 1?, "message": "..."?}
                     that HTTP status (400…599) with an OpenAI-style error body, and a Retry-After header if given
                     (seconds; a fraction is sent as it is, which the SDK reads)

and any of these options:

    "times": K, "then": REPLY   this reply answers the first K requests for the turn (K defaults to 1), `then` the
                                ones after (it may have its own times/then): {"error": 429, "retry_after": 1,
                                "times": 2, "then": {"content": "ok"}} is "429 twice, then the answer"
    "chunks": N                 stream the content, and each tool call's arguments, in N pieces (default 2)
    "chunk_delay_ms": MS        sleep between two streamed pieces, so a caller sees deltas before the reply ends
    "delay_ms": MS              sleep before answering at all (time to SIGKILL the caller mid-call)
    "hang_up_after_chunks": N   streamed only: send N chunks, then drop the connection (no finish, no [DONE])
    "usage": {"prompt_tokens": P, "completion_tokens": C}   else counted roughly, in words
    "finish_reason": "length"   else "tool_calls" with tool calls, "stop" without

An ENTRY (the request log; also one JSON line per request in --log, default standard output), written when the
request arrives: {"conversation": KEY or null, "turn": N or null, "attempt": how many requests this turn has had
counting this one, "status": the HTTP status answered, "reply": "content" | "tool_calls" | "error", "model", "stream",
"messages": as sent, "tools": the names of the functions offered, "sdk_retry_count": the SDK's x-stainless-retry-count
header (null without), "authorization": the bearer token sent (null without), "at": ISO time}.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import math
import sys
import time
import uuid
from datetime import datetime, timezone
from typing import Any
from urllib.parse import parse_qs

import uvicorn

MODEL = "scripted"
FORMS = ("content", "tool_calls", "content_from", "error")
OPTIONS = {"times", "then", "chunks", "chunk_delay_ms", "delay_ms", "hang_up_after_chunks", "usage", "finish_reason",
           "retry_after", "message"}
FINISH_REASONS = ("stop", "length", "tool_calls", "content_filter")
ERROR_TYPES = {400: "invalid_request_error", 401: "invalid_request_error", 403: "invalid_request_error",
               404: "invalid_request_error", 429: "rate_limit_exceeded"}


class ScriptError(ValueError):
    """A script the control API refuses: the message says what is wrong and where."""


class ModelError(Exception):
    """An OpenAI-style error answer (status, message, code)."""

    def __init__(self, status: int, message: str, code: str, headers: list | None = None):
        super().__init__(message)
        self.status, self.message, self.code, self.headers = status, message, code, headers or []


def validate_reply(reply: Any, where: str) -> None:
    if not isinstance(reply, dict):
        raise ScriptError(f"{where}: a reply is an object, not {type(reply).__name__}")
    unknown = set(reply) - set(FORMS) - OPTIONS
    if unknown:
        raise ScriptError(f"{where}: unknown field(s) {sorted(unknown)}; forms {list(FORMS)}, options "
                          f"{sorted(OPTIONS)}")
    forms = [form for form in ("tool_calls", "content_from", "error") if form in reply] or (
        ["content"] if "content" in reply else [])
    if len(forms) != 1:
        raise ScriptError(f"{where}: a reply has exactly one of content, tool_calls, content_from, error "
                          f"(content may go with tool_calls or content_from); this one has {forms or 'none'}")
    if "content" in reply and not isinstance(reply["content"], str):
        raise ScriptError(f"{where}: content is a string")
    if "tool_calls" in reply:
        calls = reply["tool_calls"]
        if not isinstance(calls, list) or not calls:
            raise ScriptError(f"{where}: tool_calls is a non-empty list")
        for number, call in enumerate(calls):
            if not isinstance(call, dict) or not isinstance(call.get("name"), str) or set(call) - {
                    "name", "arguments", "id"}:
                raise ScriptError(f"{where}: tool_calls[{number}] is {{\"name\": str, \"arguments\": object or "
                                  f"string, \"id\": str (optional)}}")
            if not isinstance(call.get("arguments", {}), dict | str):
                raise ScriptError(f"{where}: tool_calls[{number}].arguments is an object or a string")
    if "content_from" in reply and reply["content_from"] not in ("last_tool_result", "last_user"):
        raise ScriptError(f"{where}: content_from is \"last_tool_result\" or \"last_user\"")
    if "error" in reply and not (isinstance(reply["error"], int) and 400 <= reply["error"] <= 599):
        raise ScriptError(f"{where}: error is an HTTP status, 400…599")
    for name in ("chunks", "chunk_delay_ms", "delay_ms", "hang_up_after_chunks", "times"):
        if name in reply and not (isinstance(reply[name], int | float) and reply[name] >= 0):
            raise ScriptError(f"{where}: {name} is a number ≥ 0")
    if reply.get("chunks") == 0 or reply.get("times") == 0:
        raise ScriptError(f"{where}: chunks and times are at least 1")
    if "retry_after" in reply and not (isinstance(reply["retry_after"], int | float) and reply["retry_after"] >= 0):
        raise ScriptError(f"{where}: retry_after is a number of seconds")
    if "finish_reason" in reply and reply["finish_reason"] not in FINISH_REASONS:
        raise ScriptError(f"{where}: finish_reason is one of {list(FINISH_REASONS)}")
    usage = reply.get("usage")
    if usage is not None and not (isinstance(usage, dict) and set(usage) <= {"prompt_tokens", "completion_tokens"}
                                  and all(isinstance(value, int) for value in usage.values())):
        raise ScriptError(f"{where}: usage is {{\"prompt_tokens\": int, \"completion_tokens\": int}}")
    if "times" in reply and "then" not in reply:
        raise ScriptError(f"{where}: times says how often this reply answers before `then` does; give then")
    if "then" in reply:
        validate_reply(reply["then"], f"{where}.then")


def reply_for_attempt(reply: dict[str, Any], attempt: int) -> dict[str, Any]:
    """The reply that answers the attempt-th request (1-based) for a turn: follows times/then."""
    while "then" in reply:
        times = int(reply.get("times", 1))
        if attempt <= times:
            return reply
        attempt -= times
        reply = reply["then"]
    return reply


def text_of(content: Any) -> str:
    """A message's content as text: a string, or the text parts of a list of content parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return ""


def words(text: str) -> int:
    return len(text.split())


def pieces(text: str, count: int) -> list[str]:
    """text cut into `count` pieces of about equal length (fewer when it is shorter), none empty."""
    if not text:
        return []
    count = max(1, min(int(count), len(text)))
    size = math.ceil(len(text) / count)
    return [text[start:start + size] for start in range(0, len(text), size)]


class ScriptedModel:
    def __init__(self, log_path: str | None):
        self.log = open(log_path, "a", encoding="utf-8") if log_path else sys.stdout
        self.scripts: dict[str, list[dict[str, Any]]] = {}
        self.entries: list[dict[str, Any]] = []
        self.attempts: dict[tuple[str, int], int] = {}

    # ---- ASGI ----

    async def __call__(self, scope, receive, send):
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        if scope["type"] != "http":
            return
        method, path = scope["method"], scope["path"].rstrip("/")
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        try:
            if (method, path) == ("POST", "/v1/chat/completions"):
                return await self.chat_completions(scope, body, send)
            if (method, path) == ("GET", "/v1/models"):
                return await respond(send, 200, {"object": "list", "data": [
                    {"id": MODEL, "object": "model", "created": 0, "owned_by": "scripted-model"}]})
            if (method, path) == ("POST", "/_scripts"):
                return await self.install(send, body)
            if (method, path) == ("GET", "/_requests"):
                query = parse_qs(scope.get("query_string", b"").decode())
                key = (query.get("conversation") or [None])[0]
                return await respond(send, 200, {"requests": [
                    entry for entry in self.entries if key is None or entry["conversation"] == key]})
            if (method, path) == ("POST", "/_reset"):
                return await self.reset(send, body)
            raise ModelError(404, f"no such endpoint: {method} {scope['path']}", "unknown_url")
        except ModelError as error:
            return await respond_error(send, error)

    # ---- the control API ----

    async def install(self, send, body: bytes) -> None:
        try:
            request = json.loads(body or b"null")
            if not isinstance(request, dict) or not isinstance(request.get("key"), str) or not request["key"]:
                raise ScriptError("the body is {\"key\": a non-empty string, \"replies\": [reply, ...]}")
            replies = request.get("replies")
            if not isinstance(replies, list):
                raise ScriptError("replies is a list, one reply per turn")
            for turn, reply in enumerate(replies):
                validate_reply(reply, f"replies[{turn}]")
        except (ValueError, ScriptError) as error:
            raise ModelError(400, f"script refused: {error}", "invalid_script") from None
        key = request["key"]
        self.scripts[key] = replies
        for counted in [counted for counted in self.attempts if counted[0] == key]:
            del self.attempts[counted]  # a replaced script starts its turns' attempts afresh
        await respond(send, 200, {"key": key, "turns": len(replies)})

    async def reset(self, send, body: bytes) -> None:
        try:
            request = json.loads(body or b"{}")
        except ValueError:
            raise ModelError(400, "the body is {} or {\"key\": KEY}", "invalid_request") from None
        key = request.get("key") if isinstance(request, dict) else None
        if key is None:
            self.scripts.clear()
            self.entries.clear()
            self.attempts.clear()
        else:
            self.scripts.pop(key, None)
            self.entries = [entry for entry in self.entries if entry["conversation"] != key]
            self.attempts = {counted: number for counted, number in self.attempts.items() if counted[0] != key}
        await respond(send, 200, {"reset": key or "everything"})

    # ---- the model ----

    def conversation_of(self, messages: list) -> str | None:
        first_user = next((message for message in messages
                           if isinstance(message, dict) and message.get("role") == "user"), None)
        text = text_of(first_user.get("content")) if first_user else ""
        found = [key for key in self.scripts if key in text]
        return max(found, key=len) if found else None

    async def chat_completions(self, scope, body: bytes, send) -> None:
        headers = {name.decode().lower(): value.decode() for name, value in scope["headers"]}
        try:
            request = json.loads(body)
        except ValueError:
            request = None
        request = request if isinstance(request, dict) else {}
        messages = request.get("messages")
        entry: dict[str, Any] = {
            "conversation": None, "turn": None, "attempt": None, "status": None, "reply": None,
            "model": request.get("model"), "stream": bool(request.get("stream")), "messages": messages,
            "tools": [(tool.get("function") or {}).get("name") for tool in request.get("tools") or []
                      if isinstance(tool, dict)],
            "sdk_retry_count": headers.get("x-stainless-retry-count"),
            "authorization": headers["authorization"].removeprefix("Bearer ") if "authorization" in headers else None,
            "at": datetime.now(timezone.utc).isoformat(),
        }
        # Everything up to the log line runs without an await: two requests for one turn arriving together each
        # count their attempt in turn, and the log keeps the order they were counted in.
        reply: dict[str, Any] = {}
        try:
            if not isinstance(messages, list) or not messages:
                raise ModelError(400, "the request has no messages (a non-empty list)", "invalid_request")
            key = self.conversation_of(messages)
            if key is None:
                first_user = next((message.get("content") for message in messages
                                   if isinstance(message, dict) and message.get("role") == "user"), None)
                raise ModelError(400, "no scripted conversation: no installed script's key occurs in the first user "
                                 f"message ({text_of(first_user)[:200]!r}); install one with POST /_scripts",
                                 "unknown_conversation")
            turn = sum(1 for message in messages if isinstance(message, dict) and message.get("role") == "assistant")
            attempt = self.attempts[key, turn] = self.attempts.get((key, turn), 0) + 1
            entry.update(conversation=key, turn=turn, attempt=attempt)
            script = self.scripts[key]
            if turn >= len(script):
                raise ModelError(400, f"conversation {key!r} has {len(script)} scripted repl"
                                 f"{'y' if len(script) == 1 else 'ies'}, none for turn {turn} (turn = the number "
                                 "of assistant messages in the request)", "script_exhausted")
            reply = reply_for_attempt(script[turn], attempt)
            answer = self.answer(reply, messages, key, turn)
        except ModelError as error:
            entry.update(status=error.status, reply="error")
            self.record(entry)
            if reply.get("delay_ms"):
                await asyncio.sleep(reply["delay_ms"] / 1000)
            return await respond_error(send, error)
        entry.update(status=200, reply="tool_calls" if answer["tool_calls"] else "content")
        self.record(entry)
        if reply.get("delay_ms"):
            await asyncio.sleep(reply["delay_ms"] / 1000)
        model = entry["model"] or MODEL
        if entry["stream"]:
            include_usage = bool((request.get("stream_options") or {}).get("include_usage"))
            return await self.stream(send, reply, answer, model, include_usage)
        message: dict[str, Any] = {"role": "assistant", "content": answer["content"], "refusal": None,
                                   "annotations": []}
        if answer["tool_calls"]:
            message["tool_calls"] = [{"id": call["id"], "type": "function", "function": {
                "name": call["name"], "arguments": call["arguments"]}} for call in answer["tool_calls"]]
        await respond(send, 200, {
            "id": answer["id"], "object": "chat.completion", "created": answer["created"], "model": model,
            "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": answer["finish_reason"]}],
            "usage": answer["usage"], "service_tier": "default", "system_fingerprint": "fp_scripted"})

    def answer(self, reply: dict[str, Any], messages: list, key: str, turn: int) -> dict[str, Any]:
        """What a reply says for this request: content, tool calls (ids stable per conversation and turn), usage."""
        if "error" in reply:
            status = reply["error"]
            retry_after = reply.get("retry_after")
            headers = [(b"retry-after", (f"{retry_after:g}" if isinstance(retry_after, float) else str(retry_after))
                        .encode())] if retry_after is not None else []
            raise ModelError(status, reply.get("message") or f"scripted error {status} for conversation {key!r} "
                             f"turn {turn}", "rate_limit_exceeded" if status == 429 else f"scripted_{status}",
                             headers)
        content = reply.get("content")
        if "content_from" in reply:
            role = "tool" if reply["content_from"] == "last_tool_result" else "user"
            source = next((message for message in reversed(messages)
                           if isinstance(message, dict) and message.get("role") == role), None)
            if source is None:
                raise ModelError(400, f"conversation {key!r} turn {turn} echoes the last {role} message, and the "
                                 f"request has none", "nothing_to_echo")
            content = (content or "") + text_of(source.get("content"))
        tool_calls = [{
            "id": call.get("id") or "call_" + hashlib.sha256(f"{key}\0{turn}\0{number}".encode()).hexdigest()[:24],
            "name": call["name"],
            "arguments": call["arguments"] if isinstance(call.get("arguments"), str)
            else json.dumps(call.get("arguments", {}), separators=(",", ":")),
        } for number, call in enumerate(reply.get("tool_calls") or [])]
        usage = dict(reply.get("usage") or {})
        usage.setdefault("prompt_tokens", max(1, sum(words(text_of(message.get("content")))
                                                     for message in messages if isinstance(message, dict))))
        usage.setdefault("completion_tokens", max(1, words(content or "") + sum(
            1 + words(call["arguments"].replace(",", " ")) for call in tool_calls)))
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        return {"id": f"chatcmpl-{uuid.uuid4().hex}", "created": int(time.time()), "content": content,
                "tool_calls": tool_calls, "usage": usage,
                "finish_reason": reply.get("finish_reason") or ("tool_calls" if tool_calls else "stop")}

    async def stream(self, send, reply: dict[str, Any], answer: dict[str, Any], model: str,
                     include_usage: bool) -> None:
        count = reply.get("chunks", 2)
        delay = reply.get("chunk_delay_ms", 0) / 1000
        hang_up_after = reply.get("hang_up_after_chunks")

        def chunk(delta: dict[str, Any] | None, finish_reason: str | None = None, usage=None) -> dict[str, Any]:
            body: dict[str, Any] = {
                "id": answer["id"], "object": "chat.completion.chunk", "created": answer["created"], "model": model,
                "service_tier": "default", "system_fingerprint": "fp_scripted",
                "choices": [] if delta is None else [
                    {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}]}
            if include_usage:
                body["usage"] = usage
            return body

        # The chunks as the API sends them: the role first (with the first content piece, or with the first tool
        # call's id and name and empty arguments), then each piece alone, then an empty delta with the finish reason.
        parts: list[tuple[dict[str, Any], bool]] = []  # (delta, a piece of the text: a pause before it)
        texts = pieces(answer["content"] or "", count)
        parts.append(({"role": "assistant", "content": "" if answer["content"] is not None or not answer[
            "tool_calls"] else None, "refusal": None}, False))
        parts += [({"content": text}, True) for text in texts]
        for index, call in enumerate(answer["tool_calls"]):
            parts.append(({"tool_calls": [{"index": index, "id": call["id"], "type": "function",
                                           "function": {"name": call["name"], "arguments": ""}}]}, False))
            parts += [({"tool_calls": [{"index": index, "function": {"arguments": text}}]}, True)
                      for text in pieces(call["arguments"], count)]
        events = [chunk(delta) for delta, _ in parts] + [chunk({}, answer["finish_reason"])]
        if include_usage:
            events.append(chunk(None, usage=answer["usage"]))
        is_piece = [streamed for _, streamed in parts] + [False] * (len(events) - len(parts))

        await send({"type": "http.response.start", "status": 200, "headers": [
            (b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache"),
            (b"x-request-id", answer["id"].encode())]})
        piece_sent = False
        for number, (event, piece) in enumerate(zip(events, is_piece)):
            if hang_up_after is not None and number >= hang_up_after:
                # Dropped mid-stream: uvicorn closes the connection without the chunked body's end.
                raise ConnectionAbortedError("scripted hang-up mid-stream")
            if piece and piece_sent and delay:
                await asyncio.sleep(delay)
            piece_sent = piece_sent or piece
            await send({"type": "http.response.body", "body": b"data: " + json.dumps(event).encode() + b"\n\n",
                        "more_body": True})
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})

    def record(self, entry: dict[str, Any]) -> None:
        self.entries.append(entry)
        self.log.write(json.dumps(entry, sort_keys=True) + "\n")
        self.log.flush()


async def respond(send, status: int, body: Any, headers: list | None = None) -> None:
    data = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(data)).encode()), *(headers or [])]})
    await send({"type": "http.response.body", "body": data})


async def respond_error(send, error: ModelError) -> None:
    kind = ERROR_TYPES.get(error.status, "server_error" if error.status >= 500 else "invalid_request_error")
    await respond(send, error.status, {"error": {"message": error.message, "type": kind, "param": None,
                                                 "code": error.code}}, error.headers)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--log", help="append the request log (JSON lines) to this file (default: standard output)")
    args = parser.parse_args(argv)
    uvicorn.run(ScriptedModel(args.log), host="127.0.0.1", port=args.port, log_level="warning",
                timeout_graceful_shutdown=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
