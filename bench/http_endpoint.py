"""A trivial HTTP endpoint for bench/tool_calls.py: what a hand-written effect (bench_effects) POSTs to.

    python bench/http_endpoint.py --port N

Served by the same uvicorn as examples/tool_server.py, so the difference between a tool call and this effect is the
MCP layers (the SDK's client and server, the protocol's round trips) and the gateway, not the HTTP server. Every
POST is answered 200 with {"ok": true, "key": <its Idempotency-Key header>}; nothing is kept.
"""

from __future__ import annotations

import argparse
import json
import sys

import uvicorn


async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    while True:  # read the body to its end, as a real endpoint would
        message = await receive()
        if not message.get("more_body"):
            break
    key = dict(scope["headers"]).get(b"idempotency-key", b"").decode()
    body = json.dumps({"ok": True, "key": key}).encode()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    args = parser.parse_args(argv)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", timeout_graceful_shutdown=2)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
