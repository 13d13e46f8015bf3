"""Drives our /mcp endpoint with the official SDK's last 1.x client, mcp 1.30, at 2025-11-25 (run by its own
virtualenv's python: see requirements-mcp-sdk1.txt). ``python sdk1_driver.py SCENARIO URL TOKEN`` prints one JSON
object.

Nothing here is adapted to our server: the client is used as its documentation shows — ClientSession with an
elicitation_callback, and the experimental tasks API (session.experimental.call_tool_as_task, get_task,
get_task_result, cancel_task)."""

import asyncio
import json
import sys
import warnings

import httpx
import mcp.types as types
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import McpError

warnings.simplefilter("ignore")  # session.experimental is deprecated in 1.30 (tasks left the core spec in 2026)


async def scenario(name: str, url: str, token: str) -> dict:
    asked = []

    async def answer(context, params: types.ElicitRequestParams):
        # The first answer is refused (the wait's schema: a note of 1–200 characters), the second accepted.
        asked.append({"message": params.message, "schema": params.requestedSchema,
                      "related": (params.meta.model_dump() if params.meta else {}).get(
                          "io.modelcontextprotocol/related-task")})
        note = "" if len(asked) == 1 else "from sdk1"
        return types.ElicitResult(action="accept", content={"note": note})

    async with httpx.AsyncClient(headers={"Authorization": f"Bearer {token}"},
                                 timeout=httpx.Timeout(60, read=120)) as http, \
            streamable_http_client(url, http_client=http) as (read, write, _session_id), \
            ClientSession(read, write, elicitation_callback=answer) as session:
        initialized = await session.initialize()
        tasks = session.experimental
        if name == "input":
            created = await tasks.call_tool_as_task("demo_steps", {"steps": 3, "ask_at": 1})
            task_id = created.task.taskId
            result = await tasks.get_task_result(task_id, types.CallToolResult)
            final = await tasks.get_task(task_id)
            return {"protocol": initialized.protocolVersion, "taskId": task_id, "asked": asked,
                    "structured": result.structuredContent, "isError": result.isError,
                    "related": (result.meta or {}).get("io.modelcontextprotocol/related-task"),
                    "status": final.status}
        if name == "cancel":
            created = await tasks.call_tool_as_task("demo_steps", {"steps": 300, "sleep_ms": 100})
            task_id = created.task.taskId
            while (await tasks.get_task(task_id)).status != "working":
                await asyncio.sleep(0.1)
            await asyncio.sleep(1.0)  # a worker is running its steps
            cancelled = await tasks.cancel_task(task_id)
            try:
                await tasks.get_task_result(task_id, types.CallToolResult)
                ended = None
            except McpError as error:
                ended = error.error.message
            return {"protocol": initialized.protocolVersion, "taskId": task_id, "status": cancelled.status,
                    "ended": ended, "after": (await tasks.get_task(task_id)).status}
    raise SystemExit(f"unknown scenario {name!r}")


if __name__ == "__main__":
    print(json.dumps(asyncio.run(scenario(*sys.argv[1:4])), default=str))
