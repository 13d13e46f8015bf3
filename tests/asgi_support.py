"""Drive the real ASGI entry point (config.asgi.application: the body-size middleware, then Django) in-process,
as an ASGI server would, inside the test's database transaction."""

from __future__ import annotations

import asyncio
import json
import os
from contextlib import contextmanager
from dataclasses import dataclass
from unittest import mock

from asgiref.sync import async_to_sync
from django.core import signals
from django.db import close_old_connections


@contextmanager
def keeping_test_connection():
    """As Django's own test client does: keep the test transaction's connection open between requests (Django
    closes connections it thinks are stale when a request starts and ends, which would end the test's
    transaction)."""
    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    try:
        yield
    finally:
        signals.request_started.connect(close_old_connections)
        signals.request_finished.connect(close_old_connections)


def asgi_application():
    # config.asgi sets process-wide environment defaults meant for a web process; keep them out of the
    # subprocesses (workers, servers) that later tests start.
    with mock.patch.dict(os.environ):
        from config.asgi import application
    return application


@dataclass
class AsgiResponse:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self):
        return json.loads(self.body)


def asgi_request(method: str, path: str, *, headers: dict[str, str] | None = None, chunks=(b"",),
                 query: str = "", disconnect: bool = False) -> AsgiResponse | None:
    """Send one request whose body arrives in ``chunks`` (one ``http.request`` message each) and return the
    answer, or None when the application sent nothing. ``disconnect``: the client goes away after the chunks,
    mid-body. Header names as on the wire; async_to_sync runs the views on this thread, in the test's
    transaction."""
    messages = [{"type": "http.request", "body": chunk, "more_body": i < len(chunks) - 1}
                for i, chunk in enumerate(chunks)]
    if disconnect:
        messages[-1]["more_body"] = True
        messages.append({"type": "http.disconnect"})
    sent = []

    async def receive():
        if messages:
            return messages.pop(0)
        await asyncio.Event().wait()  # connected until the answer is complete (Django then stops listening)

    async def send(message):
        sent.append(message)

    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "scheme": "http",
        "path": path, "raw_path": path.encode(), "query_string": query.encode(), "root_path": "",
        "headers": [(b"host", b"testserver"),
                    *((name.lower().encode(), value.encode()) for name, value in (headers or {}).items())],
        "client": ("127.0.0.1", 50000), "server": ("testserver", 80),
    }
    with keeping_test_connection():
        async_to_sync(asgi_application())(scope, receive, send)
    if not sent:
        return None
    start = sent[0]
    assert start["type"] == "http.response.start", sent
    return AsgiResponse(
        status=start["status"],
        headers={name.decode().lower(): value.decode() for name, value in start.get("headers", [])},
        body=b"".join(message.get("body", b"") for message in sent[1:]),
    )
