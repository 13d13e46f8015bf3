"""Drives our /mcp endpoint with FastMCP's stock client (run by the FastMCP virtualenv's python, not the project's:
see requirements-mcp-clients.txt). ``python fastmcp_driver.py SCENARIO URL TOKEN`` prints one JSON object.

Nothing here is adapted to our server: the client is used as its documentation shows — call_tool (tasks are
resolved transparently, input through the elicitation handler), call_tool_task for an explicit handle, mode="legacy"
for the 2025-11-25 handshake."""

import asyncio
import json
import sys

import fastmcp_tasks  # noqa: F401  (registers FastMCP's tasks extension: without it the client never declares it)
from fastmcp import Client
from fastmcp_tasks import call_tool_task


def dump(result) -> dict:
    return {"isError": result.is_error, "structured": result.structured_content,
            "text": [getattr(block, "text", None) for block in result.content]}


async def scenario(name: str, url: str, token: str) -> dict:
    if name == "task":
        async with Client(url, auth=token) as client:
            tools = [tool.name for tool in await client.list_tools()]
            task = await call_tool_task(client, "demo_steps", {"steps": 3})
            first = await task.status()
            result = await task.result()
            return {"tools": tools, "taskId": task.task_id, "first": first.status, "result": dump(result),
                    "protocol": client.initialize_result.protocol_version
                    if getattr(client, "initialize_result", None) else "modern"}
    if name == "input":
        asked = []

        async def answer(message, response_type, params, context):
            asked.append(message)
            return {"note": "from fastmcp"}

        async with Client(url, auth=token, elicitation_handler=answer) as client:
            result = await client.call_tool("demo_steps", {"steps": 3, "ask_at": 1})
            return {"asked": asked, "result": dump(result)}
    if name == "cancel":
        async with Client(url, auth=token) as client:
            task = await call_tool_task(client, "demo_steps", {"steps": 300, "sleep_ms": 100})
            await task.cancel()
            for _ in range(200):
                status = await task.status()
                if status.status in ("cancelled", "completed", "failed"):
                    break
                await asyncio.sleep(0.1)
            return {"taskId": task.task_id, "status": status.status}
    if name == "legacy":
        async with Client(url, auth=token, mode="legacy") as client:
            result = await client.call_tool("demo_steps", {"steps": 2})
            return {"result": dump(result)}
    raise SystemExit(f"unknown scenario {name!r}")


if __name__ == "__main__":
    print(json.dumps(asyncio.run(scenario(*sys.argv[1:4])), default=str))
