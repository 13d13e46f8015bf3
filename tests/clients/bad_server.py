"""A downstream MCP server that misbehaves on purpose, for tests/test_tool_servers_interop.py: raw ASGI, no MCP library.

    python tests/clients/bad_server.py --port 8767 [--delay SECONDS] [--log PATH]
    → http://127.0.0.1:8767/<MODE>, one MCP endpoint per mode (one process serves a test module)

At each endpoint it answers `server/discover` (2026-07-28) and `tools/list` (lookup readOnly, upsert idempotent,
append neither, as examples/tool_server.py lists them) correctly, so a client finds its tools and sends a call; then
it answers every `tools/call` the way the endpoint's MODE says:

    slow          the right answer, after --delay seconds (longer than the caller waits)
    not-json      200, Content-Type application/json, a body that is not JSON
    not-jsonrpc   200, a JSON object that is not a JSON-RPC message
    wrong-result  200, a JSON-RPC response to the call whose result is not a CallToolResult
    http-500      500 Internal Server Error, a text body
    http-503      503 Service Unavailable with Retry-After, a text body
    refuse        200, a JSON-RPC error -32602 (invalid params): a refusal, nothing run

The call log (--log PATH) has examples/tool_server.py's format, so tests/tool_server_support.py's calls() reads it:
a "received" line per tools/call when it arrives, and in mode slow an "applied" line when the answer is sent.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from datetime import datetime, timezone
from typing import Any

import uvicorn

MODES = ("slow", "not-json", "not-jsonrpc", "wrong-result", "http-500", "http-503", "refuse")
IDEMPOTENCY_META_KEY = "io.agentruntime/idempotency-key"
MODERN = "2026-07-28"


def _tool(name: str, annotations: dict[str, Any], properties: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "description": f"{name} (a misbehaving server's)", "annotations": annotations,
            "inputSchema": {"type": "object", "properties": properties, "required": sorted(properties)}}


TOOLS = [
    _tool("lookup", {"readOnlyHint": True, "openWorldHint": False}, {"key": {"type": "string"}}),
    _tool("upsert", {"readOnlyHint": False, "destructiveHint": True, "idempotentHint": True, "openWorldHint": False},
          {"key": {"type": "string"}, "value": {"type": "string"}}),
    _tool("append", {"readOnlyHint": False, "destructiveHint": False, "idempotentHint": False,
                     "openWorldHint": False}, {"text": {"type": "string"}}),
]


class BadServer:
    def __init__(self, delay: float, log_path: str | None):
        self.delay = delay
        self.log = open(log_path, "a", encoding="utf-8") if log_path else sys.stdout
        self.calls = 0

    def write(self, line: dict[str, Any]) -> None:
        line["at"] = datetime.now(timezone.utc).isoformat()
        self.log.write(json.dumps(line, sort_keys=True) + "\n")
        self.log.flush()

    async def __call__(self, scope, receive, send):
        if scope["type"] == "lifespan":
            while (message := await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        mode = scope["path"].strip("/")
        if scope["method"] != "POST":
            return await self.respond(send, 405, b"POST only", "text/plain")
        if mode not in MODES:
            return await self.respond(send, 404, f"no such endpoint; try one of /{', /'.join(MODES)}".encode(),
                                      "text/plain")
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        try:
            request = json.loads(body)
        except ValueError:
            return await self.respond(send, 400, b"not JSON", "text/plain")
        method, rid, params = request.get("method"), request.get("id"), request.get("params") or {}
        if rid is None:  # a notification
            return await self.respond(send, 202, b"", "text/plain")
        if method == "server/discover":
            return await self.result(send, rid, {"supportedVersions": [MODERN], "capabilities": {"tools": {}},
                                                 "resultType": "complete"})
        if method == "tools/list":
            return await self.result(send, rid, {"tools": TOOLS, "cacheScope": "private", "ttlMs": 0,
                                                 "resultType": "complete"})
        if method != "tools/call":
            return await self.respond(send, 200, json.dumps({"jsonrpc": "2.0", "id": rid, "error": {
                "code": -32601, "message": f"Method not found: {method}"}}).encode())
        self.calls += 1
        headers = dict(scope["headers"])
        received = {"event": "received", "call": self.calls, "tool": params.get("name"),
                    "arguments": params.get("arguments"),
                    "idempotency_key_meta": (params.get("_meta") or {}).get(IDEMPOTENCY_META_KEY),
                    "idempotency_key_header": (headers.get(b"idempotency-key") or b"").decode() or None,
                    "protocol_version": (headers.get(b"mcp-protocol-version") or b"").decode() or None,
                    "mode": mode}
        self.write(received)
        if mode == "slow":
            await asyncio.sleep(self.delay)  # the caller has given up by now; the answer goes nowhere
            result = {"content": [{"type": "text", "text": "done, late"}], "isError": False,
                      "resultType": "complete"}
            self.write({**received, "event": "applied", "result": result})
            return await self.result(send, rid, result)
        if mode == "not-json":
            return await self.respond(send, 200, b"<html><body>Welcome to nginx!</body></html>")
        if mode == "not-jsonrpc":
            return await self.respond(send, 200, json.dumps({"status": "ok", "id": rid}).encode())
        if mode == "wrong-result":
            return await self.result(send, rid, {"content": "done", "isError": "perhaps"})
        if mode == "http-500":
            return await self.respond(send, 500, b"Internal Server Error", "text/plain")
        if mode == "refuse":
            return await self.respond(send, 200, json.dumps({"jsonrpc": "2.0", "id": rid, "error": {
                "code": -32602, "message": "Invalid params: this server takes no calls today"}}).encode())
        return await self.respond(send, 503, b"Service Unavailable", "text/plain", [(b"retry-after", b"1")])

    async def result(self, send, rid, result: dict[str, Any]) -> None:
        await self.respond(send, 200, json.dumps({"jsonrpc": "2.0", "id": rid, "result": result}).encode())

    @staticmethod
    async def respond(send, status: int, body: bytes, content_type: str = "application/json",
                      headers: list | None = None) -> None:
        await send({"type": "http.response.start", "status": status, "headers": [
            (b"content-type", content_type.encode()), (b"content-length", str(len(body)).encode()),
            *(headers or [])]})
        await send({"type": "http.response.body", "body": body})


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--delay", type=float, default=5.0, help="mode slow: seconds before answering")
    parser.add_argument("--log", help="append the call log (JSON lines) to this file (default: standard output)")
    args = parser.parse_args(argv)
    uvicorn.run(BadServer(args.delay, args.log), host="127.0.0.1", port=args.port, log_level="warning",
                timeout_graceful_shutdown=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
