"""The example tool server again, on a second server library: FastMCP 4.1 (run by the FastMCP virtualenv's python,
var/venvs/mcp-clients, not the project's: see requirements-mcp-clients.txt and tests/clients/support.py).

    python tests/clients/fastmcp_tool_server.py --port 8766 [--log PATH] [--era 2025-11-25|2026-07-28]

The same four tools with the same annotations and behaviour as examples/tool_server.py (docs/tools.md), and the same
call log lines, so tests/tool_server_support.py reads either: lookup (readOnly), upsert (idempotent: applied once per
idempotency key, from `_meta["io.agentruntime/idempotency-key"]` or the `Idempotency-Key` header), append (neither),
fail (a tool error result). Written against FastMCP's own API only (its FastMCP class, middleware, Context and
get_http_headers) as its documentation shows; nothing is adapted to the runtime's client. Streamable HTTP at /mcp,
stateless, JSON responses. FastMCP 4.1 serves on the official SDK 2.3.0's low-level server, so it answers both eras
as that does: 2026-07-28 after `server/discover`, 2025-11-25 after `initialize`. `--era` makes it a server of one era
only, by FastMCP middleware (OneEra): a request of the other era is answered as such a server would answer it.

A received call runs to its end when its caller goes away mid-call (shielded), as in the example server.
"""

from __future__ import annotations

import argparse
import contextvars
import json
import sys
from datetime import datetime, timezone
from typing import IO, Annotated, Any

import anyio
import uvicorn
from fastmcp import Context, FastMCP
from fastmcp.exceptions import ToolError
from fastmcp.server.dependencies import get_http_headers
from fastmcp.server.middleware import Middleware
from mcp.shared.exceptions import MCPError
from mcp.types import METHOD_NOT_FOUND, UNSUPPORTED_PROTOCOL_VERSION, ToolAnnotations
from pydantic import Field

IDEMPOTENCY_META_KEY = "io.agentruntime/idempotency-key"
IDEMPOTENCY_HEADER = "idempotency-key"  # FastMCP gives header names in lower case
MCP_PATH = "/mcp"
LEGACY, MODERN = "2025-11-25", "2026-07-28"
DelayMs = Annotated[int, Field(ge=0, le=60_000, description="Milliseconds to sleep before applying (for tests).")]


class CallLog:
    """The JSON-lines call log, in examples/tool_server.py's format (each line flushed before what it announces)."""

    def __init__(self, stream: IO[str]):
        self._stream = stream
        self._calls = 0

    def received(self, tool: str, arguments: Any, key_meta: Any, key_header: str | None,
                 protocol_version: str | None) -> dict[str, Any]:
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


_received: contextvars.ContextVar[dict[str, Any]] = contextvars.ContextVar("received")
_finished: contextvars.ContextVar[list[bool]] = contextvars.ContextVar("finished")


def _wire_meta(ctx: Context | None) -> dict[str, Any]:
    """The request's raw `_meta` (FastMCP lifts it onto its request context)."""
    request = ctx.request_context if ctx is not None else None
    return dict(request.meta or {}) if request is not None else {}


class LogEveryToolCall(Middleware):
    """Log each tools/call as it arrives, before the tool is looked up or its arguments validated; shield it from the
    cancellation a caller that went away causes (the effect lands, only the answer is lost)."""

    def __init__(self, log: CallLog):
        self.log = log

    async def on_call_tool(self, context, call_next):
        ctx = context.fastmcp_context
        request = ctx.request_context if ctx is not None else None
        received = self.log.received(context.message.name, context.message.arguments,
                                     _wire_meta(ctx).get(IDEMPOTENCY_META_KEY),
                                     get_http_headers().get(IDEMPOTENCY_HEADER),
                                     request.protocol_version if request is not None else None)
        finished = [False]
        _received.set(received)
        _finished.set(finished)
        with anyio.CancelScope(shield=True):
            try:
                result = await call_next(context)
            except BaseException as error:
                if not finished[0]:
                    self.log.done(received, "refused", {"error": str(error)})
                raise
            if not finished[0]:
                self.log.done(received, "refused", {"error": "not applied"})
            return result


class OneEra(Middleware):
    """Serve one protocol era only. A 2025-11-25 server does not know `server/discover` (method not found, as a
    handshake-era server answers an unknown method) nor any request in the 2026-07-28 envelope; a 2026-07-28-only
    server answers `initialize` with -32022 naming the versions it supports, as that era's spec says."""

    def __init__(self, era: str):
        self.era = era

    async def on_request(self, context, call_next):
        request = context.fastmcp_context.request_context if context.fastmcp_context is not None else None
        version = request.protocol_version if request is not None else None
        if context.method == "server/discover" or (version == MODERN and context.method != "initialize"):
            if self.era == LEGACY:
                raise MCPError(code=METHOD_NOT_FOUND, message=f"Method not found: {context.method}")
        elif self.era == MODERN:
            raise MCPError(code=UNSUPPORTED_PROTOCOL_VERSION, message=f"this server speaks {MODERN} only",
                           data={"supported": [MODERN], "requested": version})
        return await call_next(context)


def build_server(log: CallLog, era: str | None = None) -> FastMCP:
    values: dict[str, str] = {}
    versions: dict[str, int] = {}
    appended: list[str] = []
    applied_keys: dict[str, tuple[dict[str, str], dict[str, Any]]] = {}
    in_flight: dict[str, anyio.Event] = {}

    middleware = [OneEra(era)] if era else []
    server = FastMCP("agent-runtime-example-tools-fastmcp", version="1",
                     middleware=[*middleware, LogEveryToolCall(log)],
                     instructions="Example tools for the Agent Runtime's durable tool calls (docs/tools.md), "
                                  "on FastMCP.")

    def done(event: str, result: dict[str, Any]) -> dict[str, Any]:
        log.done(_received.get(), event, result)
        _finished.get()[0] = True
        return result

    def idempotency_key(ctx: Context) -> str | None:
        from_meta = _wire_meta(ctx).get(IDEMPOTENCY_META_KEY)
        from_header = get_http_headers().get(IDEMPOTENCY_HEADER)
        if from_meta is not None and not isinstance(from_meta, str):
            raise ToolError(f"_meta[{IDEMPOTENCY_META_KEY!r}] must be a string")
        if from_meta and from_header and from_meta != from_header:
            raise ToolError(f"the idempotency key in _meta ({from_meta!r}) and the Idempotency-Key header "
                            f"({from_header!r}) differ; send the same key in both, or one of them")
        return from_meta or from_header or None

    @server.tool(annotations=ToolAnnotations(title="Look up a key", readOnlyHint=True, openWorldHint=False))
    async def lookup(key: str) -> dict[str, Any]:
        """The value stored for key by upsert, and how many upserts have set it."""
        return done("applied", {"key": key, "found": key in values, "value": values.get(key),
                                "version": versions.get(key, 0)})

    @server.tool(annotations=ToolAnnotations(title="Set a key", readOnlyHint=False, destructiveHint=True,
                                             idempotentHint=True, openWorldHint=False))
    async def upsert(key: str, value: str, ctx: Context, delay_ms: DelayMs = 0) -> dict[str, Any]:
        """Set key = value. A call carrying an idempotency key that was applied before is not applied again: it is
        answered with the first call's result. Without a key every call applies."""
        idempotency = idempotency_key(ctx)
        arguments = {"key": key, "value": value}
        if idempotency is not None:
            # A retry that arrives while the first call with its key still sleeps waits for it (applied once).
            while idempotency in in_flight:
                await in_flight[idempotency].wait()
            if idempotency in applied_keys:
                first_arguments, first_result = applied_keys[idempotency]
                if first_arguments != arguments:
                    raise ToolError(f"idempotency key {idempotency!r} was applied to other arguments "
                                    f"({first_arguments}); a new call needs a new key")
                return done("replayed", first_result)
            in_flight[idempotency] = anyio.Event()
        try:
            await anyio.sleep(delay_ms / 1000)
            previous = values.get(key)
            values[key] = value
            versions[key] = versions.get(key, 0) + 1
            result = {"key": key, "value": value, "previous": previous, "version": versions[key]}
            if idempotency is not None:
                applied_keys[idempotency] = (arguments, result)
            return done("applied", result)
        finally:
            if idempotency is not None:
                in_flight.pop(idempotency).set()

    @server.tool(annotations=ToolAnnotations(title="Append a text", readOnlyHint=False, destructiveHint=False,
                                             idempotentHint=False, openWorldHint=False))
    async def append(text: str, delay_ms: DelayMs = 0) -> dict[str, Any]:
        """Append text to the list. Every call applies, with or without an idempotency key."""
        await anyio.sleep(delay_ms / 1000)
        appended.append(text)
        return done("applied", {"index": len(appended) - 1, "count": len(appended)})

    @server.tool(annotations=ToolAnnotations(title="Fail", readOnlyHint=True, openWorldHint=False))
    async def fail(message: str) -> str:
        """Answer a tool error result (isError: true) with message as its text; nothing else happens."""
        done("applied", {"isError": True, "message": message})
        raise ToolError(message)

    return server


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--log", help="append the call log (JSON lines) to this file (default: standard output)")
    parser.add_argument("--era", choices=(LEGACY, MODERN), help="serve this protocol era only (default: both)")
    args = parser.parse_args(argv)
    stream = open(args.log, "a", encoding="utf-8") if args.log else sys.stdout
    app = build_server(CallLog(stream), args.era).http_app(path=MCP_PATH, stateless_http=True, json_response=True)
    print(f"fastmcp_tool_server: serving MCP on http://{args.host}:{args.port}{MCP_PATH}", file=sys.stderr,
          flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", timeout_graceful_shutdown=2)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
