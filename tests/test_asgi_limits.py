"""The ASGI entry point refuses oversized bodies before Django reads them (driven as an ASGI server would)."""

import asyncio
import json

from config.asgi_limits import BodySizeLimit


class Recorder:
    def __init__(self):
        self.called_with_body = None

    async def __call__(self, scope, receive, send):
        body = b""
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                self.called_with_body = "disconnected"
                return
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        self.called_with_body = body
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


def _run(app, headers, chunks):
    sent, queue = [], [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1}
                       for i, c in enumerate(chunks)]

    async def receive():
        return queue.pop(0) if queue else {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/runtime/tasks", "headers": headers}
    asyncio.run(app(scope, receive, send))
    return sent


def test_it_answers_a_declared_oversized_body_with_413_without_calling_django():
    inner = Recorder()
    sent = _run(BodySizeLimit(inner, max_bytes=100), [(b"content-length", b"5000")], [b"x" * 5000])

    assert sent[0]["status"] == 413 and inner.called_with_body is None
    assert json.loads(sent[1]["body"])["type"] == "/runtime/problems/payload-too-large"


def test_it_cuts_off_an_undeclared_body_that_streams_past_the_limit():
    inner = Recorder()
    _run(BodySizeLimit(inner, max_bytes=100), [], [b"x" * 60, b"x" * 60, b"x" * 60])

    assert inner.called_with_body == "disconnected"


def test_it_passes_bodies_within_the_limit():
    inner = Recorder()
    sent = _run(BodySizeLimit(inner, max_bytes=100), [(b"content-length", b"50")], [b"y" * 50])

    assert inner.called_with_body == b"y" * 50 and sent[0]["status"] == 200
