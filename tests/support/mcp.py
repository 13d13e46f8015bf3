"""The MCP endpoint's wire as a raw HTTP client sends it: what a stock SDK client never sends (tests/mcp_support.py is
the official SDK's client)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

MODERN = "2026-07-28"
EXT = "io.modelcontextprotocol/tasks"


def rpc(url: str, method: str, params: dict | None = None, *, token: str | None = None, headers: dict | None = None,
        body: bytes | None = None, http_method: str = "POST", caps: dict | None = None, message_id=1,
        frames: bool = False):
    """One raw JSON-RPC POST, as the 2026-07-28 wire has it; returns (HTTP status, headers, JSON body or None) —
    the last SSE frame of a stream, or (``frames``) all of them."""
    if body is None:
        params = dict(params or {})
        params.setdefault("_meta", {"io.modelcontextprotocol/protocolVersion": MODERN,
                                    "io.modelcontextprotocol/clientCapabilities": caps if caps is not None else
                                    {"extensions": {EXT: {}}}})
        body = json.dumps({"jsonrpc": "2.0", "id": message_id, "method": method, "params": params}).encode()
    head = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
            "MCP-Protocol-Version": MODERN, "Mcp-Method": method, **(headers or {})}
    if token:
        head["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(url, data=body if http_method == "POST" else None, method=http_method,
                                     headers={k: v for k, v in head.items() if v is not None})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            status, got, raw = response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as error:
        status, got, raw = error.code, dict(error.headers), error.read()
    text = raw.decode()
    got = {k.lower(): v for k, v in got.items()}
    if got.get("content-type", "").startswith("text/event-stream"):
        data = [json.loads(line[5:]) for line in text.splitlines() if line.startswith("data:")]
        payload = data if frames else (data[-1] if data else None)
    else:
        payload = json.loads(text) if text.strip() else None
    return status, got, payload
