"""Refuse oversized request bodies before Django reads them, and make bodies of unknown length readable.

Django's ASGI handler reads the whole body (spooling to disk) before any view runs, so a parser-level limit
alone still lets a client make the server swallow gigabytes. This guard answers a declared Content-Length over
RUNTIME_MAX_REQUEST_BYTES with 413 problem details at once.

A body without a Content-Length (``Transfer-Encoding: chunked``, or HTTP/2 without the header) is read here,
up to the limit: Django's ASGIRequest reads exactly Content-Length bytes, so without this it saw such a body as
empty ("workflow: This field is required"), and cutting the stream off mid-way left Django returning without a
response (the server's bare 500). Past the limit the answer is 413 with ``Connection: close`` (the rest of the
upload is never read); within it Django gets the buffered body in one message and a ``content-length`` header
that says its size. Memory stays bounded by the limit plus one chunk.
"""

import json

from config.base.problems import PROBLEM_CONTENT_TYPE, problem_body


class BodyTooLarge(Exception):
    pass


class ClientGone(Exception):
    pass


async def read_body(receive, limit: int) -> bytes:
    """The whole request body, read up to ``limit`` bytes (BodyTooLarge past it: the rest is never read; ClientGone
    if the client disconnects first). Memory stays bounded by the limit plus one chunk."""
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def replaying(body: bytes, receive):
    """An ASGI receive that gives ``body`` in one message, then the real channel (for the client's disconnect)."""
    replayed = False

    async def replay_receive():
        nonlocal replayed
        if not replayed:
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay_receive


class BodySizeLimit:
    def __init__(self, app, *, max_bytes: int):
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = scope.get("headers", [])
        declared = next((value for name, value in headers if name == b"content-length"), None)
        # Transfer-Encoding overrides Content-Length (RFC 9112 §6.3): with it the length is unknown until the end.
        length_unknown = declared is None or any(name == b"transfer-encoding" for name, _ in headers)
        if length_unknown:
            return await self._buffered(scope, receive, send)
        if declared.isdigit() and int(declared) > self.max_bytes:
            return await self._refuse(send)
        received = 0

        async def limited_receive():
            # The server frames the body by its Content-Length, so this never trips with uvicorn; it guards a
            # server that passes more than declared.
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    return {"type": "http.disconnect"}
            return message

        return await self.app(scope, limited_receive, send)

    async def _buffered(self, scope, receive, send):
        try:
            body = await read_body(receive, self.max_bytes)
        except BodyTooLarge:
            return await self._refuse(send)
        except ClientGone:
            # The client went away mid-upload: there is no one to answer. Returning without a response is
            # what the server expects then (uvicorn logs nothing for a disconnected client).
            return None
        if body or any(name == b"transfer-encoding" for name, _ in scope.get("headers", [])):
            # Django sizes the body by this header alone; the transfer coding was the server's business.
            headers = [(name, value) for name, value in scope.get("headers", [])
                       if name not in (b"content-length", b"transfer-encoding")]
            headers.append((b"content-length", str(len(body)).encode()))
            scope = {**scope, "headers": headers}
        # The body once, then the real channel: Django listens on it for the client's disconnect.
        return await self.app(scope, replaying(body, receive), send)

    async def _refuse(self, send):
        body = json.dumps(problem_body(status_code=413, slug="payload-too-large",
                                       detail=f"The request body is larger than {self.max_bytes} bytes.",
                                       limit=self.max_bytes)).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", PROBLEM_CONTENT_TYPE.encode()),
                                (b"content-length", str(len(body)).encode()), (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})
