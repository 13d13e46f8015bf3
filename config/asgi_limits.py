"""Refuse oversized request bodies before Django reads them.

Django's ASGI handler reads the whole body (spooling to disk) before any view runs, so a parser-level limit
alone still lets a client make the server swallow gigabytes. This guard answers a declared Content-Length over
RUNTIME_MAX_REQUEST_BYTES with 413 problem details at once, and cuts off a body that streams past the limit
without declaring it (the connection is dropped: there is no clean answer mid-upload).
"""

import json

from config.problems import PROBLEM_CONTENT_TYPE, problem_body


class BodySizeLimit:
    def __init__(self, app, *, max_bytes: int):
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = next((value for name, value in scope.get("headers", []) if name == b"content-length"), None)
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            return await self._refuse(send)
        received = 0

        async def limited_receive():
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    return {"type": "http.disconnect"}
            return message

        return await self.app(scope, limited_receive, send)

    async def _refuse(self, send):
        body = json.dumps(problem_body(status_code=413, slug="payload-too-large",
                                       detail=f"The request body is larger than {self.max_bytes} bytes.",
                                       limit=self.max_bytes)).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", PROBLEM_CONTENT_TYPE.encode()),
                                (b"content-length", str(len(body)).encode()), (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})
