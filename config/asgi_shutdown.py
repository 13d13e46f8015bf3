"""End open streams as streams end when the server stops the process, instead of letting the cancellation escape.

uvicorn stops a web process (SIGTERM: a deploy, Ctrl-C) by letting open requests run for
``--timeout-graceful-shutdown`` seconds (WEB_SHUTDOWN_GRACE_SECONDS, deploy/dev.py web_command) and then cancelling
their tasks. An SSE stream, an MCP ``subscriptions/listen`` stream or a blocking 2025 ``tasks/result`` does not end by
itself, so every one still open is cut that way, and the CancelledError escaping the application was logged as
"Exception in ASGI application" with a traceback per stream, on every deploy, while the client saw a truncated
chunked body.

Here, when the server cancels a request whose response has started and not ended, the response is ended the way a
stream ends (the last, empty body message): the client sees an ordinary end of stream and reconnects (an SSE client
resumes from Last-Event-ID; an MCP client polls tasks/get or listens again: the snapshot is the truth). A request
with no response yet, or one already complete, gets the cancellation as it was. Only the server cancels the
request's own task: Django and the MCP SDK cancel their inner tasks on a client disconnect and return.
"""

import asyncio


class EndStreamsOnShutdown:
    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        response = {"started": False, "complete": False}

        async def tracked_send(message):
            if message["type"] == "http.response.start":
                response["started"] = True
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                response["complete"] = True
            await send(message)

        try:
            return await self.app(scope, receive, tracked_send)
        except asyncio.CancelledError:
            if not response["started"] or response["complete"]:
                raise
            # uvicorn does not wait for cancelled tasks: this send runs during its lifespan shutdown, on a
            # transport that is still open (or closed by a client that left: then uvicorn drops the message).
            await send({"type": "http.response.body", "body": b"", "more_body": False})
