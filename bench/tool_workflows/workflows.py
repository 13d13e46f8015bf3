"""Three workflows of N identical steps, each step one call, for bench/tool_calls.py (installed only in the
benchmark's processes: EXTRA_APPS=bench.tool_workflows). What differs between them is only what the step calls:

- bench_bare: ctx.effect with a function that returns at once — the ledger's floor (a `started` row committed
  before the call, the result recorded with the step);
- bench_effects: ctx.effect whose function POSTs the key to a trivial local HTTP server (bench/http_endpoint.py)
  on a fresh connection — the ledger plus one network round trip, what a hand-written effect costs;
- bench_tools: ctx.tool("bench", "upsert", …) against examples/tool_server.py — the ledger plus the gateway
  (policy, host check, tool list, arguments, limits) plus an MCP call through the SDK.
"""

from __future__ import annotations

import http.client
import json
from urllib.parse import urlsplit

from tasks_app.registry import Workflow, register, step

TOOL_SERVER = "bench"  # the ToolServer row's name in the bench tenant (bench/tool_calls.py makes it)
STEPS_SCHEMA = {"type": "integer", "minimum": 1, "maximum": 10_000, "description": "How many calls (steps)."}


def post(url: str, key: str, body: dict) -> dict:
    """One POST on a fresh connection (as a hand-written effect makes it), the key as Idempotency-Key."""
    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    try:
        connection.request("POST", parts.path or "/", body=json.dumps(body),
                           headers={"Content-Type": "application/json", "Idempotency-Key": key})
        response = connection.getresponse()
        answer = response.read()
        if response.status != 200:
            raise RuntimeError(f"the endpoint answered HTTP {response.status}")
        return json.loads(answer)
    finally:
        connection.close()


class _Calls(Workflow):
    version = "1"
    mcp_annotations = {"readOnlyHint": False, "destructiveHint": False, "idempotentHint": True,
                       "openWorldHint": False}

    def plan(self, goal, input, state):
        return ["call"] * input["steps"]

    def result(self, state):
        return {"calls": state.get("calls", 0)}


@register
class BenchBare(_Calls):
    name = "bench_bare"
    description = "Benchmark: N steps, each one ctx.effect whose function returns at once (the ledger's floor)."
    input_schema = {"type": "object", "properties": {"steps": STEPS_SCHEMA}, "required": ["steps"],
                    "additionalProperties": False}

    @step
    def call(self, ctx):
        ctx.effect("noop", lambda key: {"key": key})
        ctx.state["calls"] = ctx.state.get("calls", 0) + 1


@register
class BenchEffects(_Calls):
    name = "bench_effects"
    description = "Benchmark: N steps, each one ctx.effect that POSTs to a local HTTP server (one round trip)."
    input_schema = {"type": "object", "properties": {"steps": STEPS_SCHEMA, "url": {"type": "string"}},
                    "required": ["steps", "url"], "additionalProperties": False}

    @step
    def call(self, ctx):
        body = {"key": f"k{ctx.step_index}", "value": f"v{ctx.step_index}"}  # what bench_tools's upsert sends
        ctx.effect("post", lambda key: post(ctx.input["url"], key, body))
        ctx.state["calls"] = ctx.state.get("calls", 0) + 1


@register
class BenchTools(_Calls):
    name = "bench_tools"
    description = "Benchmark: N steps, each one downstream MCP tool call (bench.upsert) through the gateway."
    input_schema = {"type": "object", "properties": {"steps": STEPS_SCHEMA}, "required": ["steps"],
                    "additionalProperties": False}

    @step
    def call(self, ctx):
        result = ctx.tool(TOOL_SERVER, "upsert", {"key": f"k{ctx.step_index}", "value": f"v{ctx.step_index}"})
        if result.get("isError"):
            raise RuntimeError(f"the bench's upsert answered a tool error: {result}")
        ctx.state["calls"] = ctx.state.get("calls", 0) + 1
