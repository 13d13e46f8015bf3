"""An example downstream MCP tool server: what the runtime's durable tool calls are tested against (docs/tools.md).

    python examples/tool_server.py --port 8765 [--host 127.0.0.1] [--log PATH] [--token-env NAME]

Built on the official `mcp` SDK's MCPServer, served over Streamable HTTP at /mcp, stateless, with JSON responses; it
answers both protocol eras (2025-11-25 after `initialize`, 2026-07-28 per request after `server/discover`). Four tools
whose annotations say honestly what calling them again does:

    lookup(key)                      readOnlyHint     the stored value of key
    upsert(key, value, delay_ms=0)   idempotentHint   key = value, applied once per idempotency key
    append(text, delay_ms=0)         (neither)        appends text; every call applies
    fail(message)                    readOnlyHint     answers a tool error result (isError)

The idempotency key is read from `params._meta["io.agentruntime/idempotency-key"]` and from the `Idempotency-Key`
header. State (values, the appended list, the idempotency keys applied) lives in this process's memory only: a
restarted server has forgotten it, the call log is what outlives it.

The call log (--log PATH, else standard output) has one JSON line per tools/call the server receives, written and
flushed before anything is applied, and one more line when it is done: "applied", "replayed" (an upsert answered
from its idempotency key) or "refused" (no effect: bad arguments, an unknown tool, a key reused for other
arguments). Every line has event, call (joins a call's two lines), tool, arguments, idempotency_key_meta,
idempotency_key_header, protocol_version (the era the call came in) and at; the second also has result. Tests count
effects by the "applied" lines.

A received call runs to its end even when its caller goes away mid-call (the handler is shielded from the
cancellation a closed connection causes): the effect lands and only the answer is lost, which is the unknown
outcome the runtime has to decide by the tool's annotations. delay_ms sleeps before applying, to kill a caller then.
"""

from __future__ import annotations

import argparse
import contextvars
import hmac
import json
import os
import sys
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import IO, Annotated, Any

import anyio
import uvicorn
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations
from pydantic import Field

IDEMPOTENCY_META_KEY = "io.agentruntime/idempotency-key"
IDEMPOTENCY_HEADER = "Idempotency-Key"
MCP_PATH = "/mcp"
DelayMs = Annotated[int, Field(ge=0, le=60_000, description="Milliseconds to sleep before applying (for tests).")]


class CallLog:
    """The JSON-lines call log. Each line is flushed as it is written: a test reads it while the server runs, and a
    line must be on disk before the effect it announces is applied (a test that kills the caller then reads it)."""

    def __init__(self, stream: IO[str]):
        self._stream = stream
        self._calls = 0

    def received(self, tool: str, arguments: Any, key_meta: Any, key_header: str | None,
                 protocol_version: str | None = None) -> dict[str, Any]:
        self._calls += 1
        line = {"event": "received", "call": self._calls, "tool": tool, "arguments": arguments,
                "idempotency_key_meta": key_meta, "idempotency_key_header": key_header,
                "protocol_version": protocol_version}
        self._write(line)
        return line

    def done(self, received: dict[str, Any], event: str, result: Any) -> None:
        self._write({**received, "event": event, "result": result})

    def _write(self, line: dict[str, Any]) -> None:
        line["at"] = datetime.now(timezone.utc).isoformat()
        self._stream.write(json.dumps(line, sort_keys=True) + "\n")
        self._stream.flush()


class State:
    """What the tools act on, in this process's memory."""

    def __init__(self) -> None:
        self.values: dict[str, str] = {}
        self.versions: dict[str, int] = {}
        self.appended: list[str] = []
        # idempotency key → (the arguments it was applied with, the result answered then)
        self.applied_keys: dict[str, tuple[dict[str, str], dict[str, Any]]] = {}
        # idempotency key → set when the call holding it is done (see upsert for the race)
        self.in_flight: dict[str, anyio.Event] = {}


# The call's "received" line, set by the middleware for the tool function to complete (same task, so a contextvar).
_received: contextvars.ContextVar[dict[str, Any]] = contextvars.ContextVar("received")
# Whether the tool function wrote the call's second line itself; if not, the middleware writes "refused".
_finished: contextvars.ContextVar[list[bool]] = contextvars.ContextVar("finished")


def build_server(log: CallLog) -> MCPServer:
    state = State()

    async def log_every_tool_call(ctx, call_next):
        """Log each tools/call as it arrives, before the arguments are validated or the tool looked up: a call the
        runtime should never have made (a denied, invented or malformed one) shows in the log as received."""
        if ctx.method != "tools/call":
            return await call_next(ctx)
        params = ctx.params if isinstance(ctx.params, Mapping) else {}
        meta = params.get("_meta") if isinstance(params.get("_meta"), Mapping) else {}
        headers = getattr(ctx.request, "headers", None)
        received = log.received(params.get("name"), params.get("arguments"), meta.get(IDEMPOTENCY_META_KEY),
                                headers.get(IDEMPOTENCY_HEADER) if headers is not None else None,
                                getattr(ctx, "protocol_version", None))
        finished = [False]
        _received.set(received)
        _finished.set(finished)
        # Shielded: a caller killed mid-call closes its connection, and whether that cancels the handler is up to the
        # SDK and the era (2026-07-28 defines cancellation as closing the response stream; mcp 2.3.0's JSON responses
        # did not cancel when tried). A real downstream system finishes the work either way, and the runtime's
        # recovery is about exactly that case: the effect landed, the answer was lost.
        with anyio.CancelScope(shield=True):
            try:
                result = await call_next(ctx)
            except BaseException as error:
                if not finished[0]:
                    log.done(received, "refused", {"error": str(error)})
                raise
            if not finished[0]:
                log.done(received, "refused", result)
            return result

    server = MCPServer("agent-runtime-example-tools", version="1", middleware=[log_every_tool_call],
                       log_level="WARNING",
                       instructions="Example tools for the Agent Runtime's durable tool calls (docs/tools.md).")

    def done(event: str, result: dict[str, Any]) -> dict[str, Any]:
        log.done(_received.get(), event, result)
        _finished.get()[0] = True
        return result

    def idempotency_key(ctx: Context) -> str | None:
        meta = ctx.request_context.meta or {}
        from_meta = meta.get(IDEMPOTENCY_META_KEY)
        from_header = ctx.headers.get(IDEMPOTENCY_HEADER) if ctx.headers is not None else None
        if from_meta is not None and not isinstance(from_meta, str):
            raise ToolError(f"_meta[{IDEMPOTENCY_META_KEY!r}] must be a string")
        if from_meta and from_header and from_meta != from_header:
            raise ToolError(f"the idempotency key in _meta ({from_meta!r}) and the {IDEMPOTENCY_HEADER} header "
                            f"({from_header!r}) differ; send the same key in both, or one of them")
        return from_meta or from_header or None

    @server.tool(annotations=ToolAnnotations(title="Look up a key", read_only_hint=True, open_world_hint=False))
    async def lookup(key: str) -> dict[str, Any]:
        """The value stored for key by upsert, and how many upserts have set it."""
        return done("applied", {"key": key, "found": key in state.values, "value": state.values.get(key),
                                "version": state.versions.get(key, 0)})

    @server.tool(annotations=ToolAnnotations(title="Set a key", read_only_hint=False, destructive_hint=True,
                                             idempotent_hint=True, open_world_hint=False))
    async def upsert(key: str, value: str, ctx: Context, delay_ms: DelayMs = 0) -> dict[str, Any]:
        """Set key = value. A call carrying an idempotency key that was applied before is not applied again: it is
        answered with the first call's result. Without a key every call applies."""
        idempotency = idempotency_key(ctx)
        arguments = {"key": key, "value": value}  # delay_ms is a test knob, not part of what the key stands for
        if idempotency is not None:
            # The race: the caller gives up on a slow call (delay_ms) and retries with the same key while the first
            # is still sleeping; both would find the key unapplied. The second waits for the first to finish.
            while idempotency in state.in_flight:
                await state.in_flight[idempotency].wait()
            if idempotency in state.applied_keys:
                first_arguments, first_result = state.applied_keys[idempotency]
                if first_arguments != arguments:
                    raise ToolError(f"idempotency key {idempotency!r} was applied to other arguments "
                                    f"({first_arguments}); a new call needs a new key")
                return done("replayed", first_result)
            state.in_flight[idempotency] = anyio.Event()
        try:
            await anyio.sleep(delay_ms / 1000)
            previous = state.values.get(key)
            state.values[key] = value
            state.versions[key] = state.versions.get(key, 0) + 1
            result = {"key": key, "value": value, "previous": previous, "version": state.versions[key]}
            if idempotency is not None:
                state.applied_keys[idempotency] = (arguments, result)
            return done("applied", result)
        finally:
            if idempotency is not None:
                state.in_flight.pop(idempotency).set()

    @server.tool(annotations=ToolAnnotations(title="Append a text", read_only_hint=False, destructive_hint=False,
                                             idempotent_hint=False, open_world_hint=False))
    async def append(text: str, delay_ms: DelayMs = 0) -> dict[str, Any]:
        """Append text to the list. Every call applies, with or without an idempotency key: calling it again after
        an unknown outcome may append twice."""
        await anyio.sleep(delay_ms / 1000)
        state.appended.append(text)
        return done("applied", {"index": len(state.appended) - 1, "count": len(state.appended)})

    @server.tool(annotations=ToolAnnotations(title="Fail", read_only_hint=True, open_world_hint=False))
    async def fail(message: str) -> str:
        """Answer a tool error result (isError: true) with message as its text; nothing else happens."""
        done("applied", {"isError": True, "message": message})
        raise ToolError(message)

    return server


class RequireBearer:
    """ASGI wrapper: every HTTP request must carry `Authorization: Bearer <token>`, else 401 with a problem-details
    body. The token is compared in constant time and never logged."""

    def __init__(self, app, token: str):
        self.app = app
        self.expected = f"Bearer {token}".encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(given, self.expected):
                body = json.dumps({"type": "about:blank", "title": "Unauthorized", "status": 401,
                                   "detail": "Send the header Authorization: Bearer <token>, the token being the "
                                             "value of the environment variable named by the server's --token-env."})
                await send({"type": "http.response.start", "status": 401, "headers": [
                    (b"content-type", b"application/problem+json"), (b"www-authenticate", b'Bearer realm="mcp"'),
                    (b"content-length", str(len(body)).encode())]})
                await send({"type": "http.response.body", "body": body.encode()})
                return
        await self.app(scope, receive, send)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], prog="examples/tool_server.py")
    parser.add_argument("--port", type=int, required=True, help="the port to listen on")
    parser.add_argument("--host", default="127.0.0.1", help="the address to listen on (default: loopback only)")
    parser.add_argument("--log", help="append the call log (JSON lines) to this file (default: standard output)")
    parser.add_argument("--token-env", metavar="NAME",
                        help="require Authorization: Bearer <the value of environment variable NAME>")
    return parser.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    token = None
    if args.token_env:
        token = os.environ.get(args.token_env)
        if not token:
            print(f"tool_server: --token-env names {args.token_env!r}, which is not set or empty in the "
                  f"environment; set it to the bearer token callers must send", file=sys.stderr)
            return 2
    if token is None and args.host not in ("127.0.0.1", "localhost", "::1"):
        print(f"tool_server: warning: listening on {args.host} without --token-env: anyone who can reach it can "
              "call its tools", file=sys.stderr)
    stream = open(args.log, "a", encoding="utf-8") if args.log else sys.stdout
    server = build_server(CallLog(stream))
    app = server.streamable_http_app(streamable_http_path=MCP_PATH, stateless_http=True, json_response=True,
                                     host=args.host)
    if token is not None:
        app = RequireBearer(app, token)
    print(f"tool_server: serving MCP on http://{args.host}:{args.port}{MCP_PATH}", file=sys.stderr, flush=True)
    # A short graceful shutdown: a call sleeping in delay_ms must not hold a SIGTERM for up to a minute.
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", timeout_graceful_shutdown=2)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
