"""An agent turn as the peers of bench/compare.py's agent workload (WA) make it: the Celery chain (bench/floor.py's
`floor.agent_turn`) and DBOS (bench/peers/dbos_app.py's `agent_workflow`) — what a hand-rolled agent loop on either
does: ask the model with the conversation so far (the official `openai` SDK, Chat Completions, one request), then make
the tool call it asked for (the official `mcp` SDK's client, one connection per call, the idempotency key in `_meta`
and the Idempotency-Key header as the runtime sends it), and append both to the conversation.

Imported by the chain's workers (the project's virtualenv) and DBOS's (var/venv-dbos, which gets the same openai and
mcp pins: bench/peers/requirements-dbos.txt). Environment: AGENT_MODEL_URL (the scripted model's …/v1), AGENT_TOOL_URL
(the example tool server's …/mcp).

The runtime's own agent (agents_app.agent) does more per turn — the policy gateway, the ledger, the transcript, output
screening, a streamed request, steering's safe points — which is what the comparison prices.
"""

from __future__ import annotations

import json
import os

import anyio
import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from openai import OpenAI

SERVER = "bench"  # the tool server's name as the model is shown it: bench__upsert (bench/compare.py scripts that)
IDEMPOTENCY_META = "io.agentruntime/idempotency-key"
MODEL_NAME = "bench-scripted"
TOOLS = [{"type": "function", "function": {
    "name": f"{SERVER}__upsert", "description": "Set key to value.",
    "parameters": {"type": "object", "required": ["key", "value"],
                   "properties": {"key": {"type": "string"}, "value": {"type": "string"}}}}}]

_model: tuple[int, OpenAI] | None = None


def goal(key: str) -> str:
    """The agent's goal: its conversation's key in the first user message (how the scripted model finds its script),
    worded as bench/compare.py words the runtime's agents' goals."""
    return f"Set the bench keys ({key}), then say so."


def first_messages(key: str) -> list[dict]:
    return [{"role": "system", "content": "You are an agent. Use the tools; answer when the goal is reached."},
            {"role": "user", "content": goal(key)}]


def model() -> OpenAI:
    """One client per process (a prefork child must not reuse its parent's connections)."""
    global _model
    if _model is None or _model[0] != os.getpid():
        _model = (os.getpid(), OpenAI(base_url=os.environ["AGENT_MODEL_URL"], api_key="bench", max_retries=3))
    return _model[1]


def ask(messages: list[dict]) -> dict:
    """The model's answer to the conversation so far, as the assistant message to append."""
    answer = model().chat.completions.create(model=MODEL_NAME, messages=messages, tools=TOOLS)
    return answer.choices[0].message.model_dump(exclude_none=True, include={"role", "content", "tool_calls"})


async def _call(tool: str, arguments: dict, key: str) -> str:
    async with httpx2.AsyncClient(headers={"Idempotency-Key": key}, timeout=30) as http, \
            Client(streamable_http_client(os.environ["AGENT_TOOL_URL"], http_client=http)) as client:
        result = await client.call_tool(tool, arguments, meta={IDEMPOTENCY_META: key})
        return json.dumps(result.model_dump(by_alias=True, exclude_none=True, mode="json").get("content", []))


def call_tool(function: str, arguments: str, key: str) -> str:
    """The tool call a model asked for (its function name and JSON arguments), made once; its content as text."""
    return anyio.run(_call, function.removeprefix(f"{SERVER}__"), json.loads(arguments or "{}"), key)


def act(messages: list[dict], answer: dict, key: str) -> bool:
    """Append the answer and each tool call's result (keys `key`:n); False when it asked for none (the last turn)."""
    messages.append(answer)
    calls = answer.get("tool_calls") or []
    for number, call in enumerate(calls, 1):
        content = call_tool(call["function"]["name"], call["function"]["arguments"], f"{key}:{number}")
        messages.append({"role": "tool", "tool_call_id": call["id"], "content": content})
    return bool(calls)
