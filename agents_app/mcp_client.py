"""The runtime as an MCP client of a downstream tool server: the official `mcp` SDK's Client over Streamable HTTP.

Each operation opens its own connection (the SDK negotiates the era: 2026-07-28 `server/discover`, else the
2025-11-25 `initialize` handshake) and closes it: a tool call is made from a step on whichever worker runs it, and
nothing of a connection is worth keeping across steps or processes.

What matters here is telling apart how a call ended, because the ledger decides on it (docs/tools.md):
- `NotSent`: the request never reached the server (connection refused, DNS, connect timeout, a 502/503/504 or 429
  from a gateway in front of it): calling again cannot duplicate anything.
- `OutcomeUnknown`: the request was sent and no answer came (read timeout, connection dropped, a 500): the tool may
  have run. Never called again blindly — the tool's annotations or a person decide (agents_app.gateway).
- `Refused`: the server answered with a JSON-RPC error (method not found, invalid params…): it did not run the tool.
- A tool's own failure is a result (`isError: true`), returned like any other.

The idempotency key goes in the request's `_meta` under IDEMPOTENCY_META and in an `Idempotency-Key` header, so a
server (or a gateway in front of it) that deduplicates can. The bearer token is passed in, resolved by the caller at
the moment of the call from the credential's name; it is never logged (exceptions carry no headers).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

IDEMPOTENCY_META = "io.agentruntime/idempotency-key"
IDEMPOTENCY_HEADER = "Idempotency-Key"
# Answered by something in front of the server before the request was accepted: nothing ran.
NOT_ACCEPTED_STATUSES = {429, 502, 503, 504}
REQUEST_TIMEOUT = -32001  # the SDK's own "request timed out" (the read timeout of one round)


class ToolCallError(Exception):
    """How a call to a downstream server failed; `detail` is for people and carries no credential."""

    def __init__(self, detail: str):
        super().__init__(detail)
        self.detail = detail


class NotSent(ToolCallError):
    """The request did not reach the tool: calling again cannot duplicate anything."""


class OutcomeUnknown(ToolCallError):
    """The request was sent and no answer came: the tool may or may not have run."""


class Refused(ToolCallError):
    """The server answered with a protocol error: it did not run the tool."""

    def __init__(self, detail: str, code: int):
        super().__init__(detail)
        self.code = code


@dataclass(frozen=True)
class ServerDescription:
    protocol_version: str
    tools: list[dict[str, Any]]  # as tools/list gives them: name, description, inputSchema, annotations, execution

    @property
    def version(self) -> str:
        """A digest of the tool list: a change of any name, schema or annotation is a new version."""
        text = json.dumps(sorted(self.tools, key=lambda tool: tool.get("name", "")), sort_keys=True,
                          separators=(",", ":"), ensure_ascii=False)
        return hashlib.sha256(text.encode()).hexdigest()


def _headers(token: str | None, key: str | None, host: str | None = None) -> dict[str, str]:
    headers = {"Host": host} if host else {}  # (connecting to a checked address: the name the server knows)
    if token:
        headers["Authorization"] = f"Bearer {token}"
    if key:
        headers[IDEMPOTENCY_HEADER] = key
    return headers


def _leaves(error: BaseException) -> list[BaseException]:
    """The SDK raises from task groups: the errors that happened, out of their groups."""
    if isinstance(error, BaseExceptionGroup):
        return [leaf for inner in error.exceptions for leaf in _leaves(inner)]
    return [error]


def classify(error: BaseException, *, sent: bool) -> ToolCallError:
    """What a failed exchange means for the ledger. `sent`: whether the request that matters (tools/call) may have
    left this process — before it (discovery, listing), every failure is NotSent."""
    leaves = _leaves(error)
    for leaf in leaves:
        if isinstance(leaf, ToolCallError):
            return leaf
    for leaf in leaves:
        if isinstance(leaf, (httpx2.ConnectError, httpx2.ConnectTimeout, httpx2.PoolTimeout)):
            return NotSent(f"could not connect: {type(leaf).__name__}")
        if isinstance(leaf, httpx2.HTTPStatusError):
            status = leaf.response.status_code
            if status in NOT_ACCEPTED_STATUSES or not sent or status in (401, 403, 404, 405, 415):
                return NotSent(f"the server answered HTTP {status}")
            return OutcomeUnknown(f"the server answered HTTP {status} after the call was sent")
        if isinstance(leaf, MCPError):
            if leaf.error.code == REQUEST_TIMEOUT:
                return OutcomeUnknown(f"no answer in time: {leaf.error.message}") if sent else \
                    NotSent(f"no answer in time before the call: {leaf.error.message}")
            return Refused(f"the server refused it ({leaf.error.code}): {leaf.error.message}", leaf.error.code)
        if isinstance(leaf, (httpx2.TimeoutException, httpx2.TransportError)):
            return OutcomeUnknown(f"the exchange broke off: {type(leaf).__name__}") if sent else \
                NotSent(f"the exchange broke off before the call: {type(leaf).__name__}")
    first = leaves[0]
    return (OutcomeUnknown if sent else NotSent)(f"{type(first).__name__}: {str(first)[:200]}")


async def _with_client(url: str, token: str | None, key: str | None, timeout: float,
                       work: Callable[[Client], Awaitable[Any]], *, sending: Callable[[], bool],
                       host: str | None = None) -> Any:
    # trust_env off: a proxy from the environment would resolve the name itself, past the host check.
    http = httpx2.AsyncClient(headers=_headers(token, key, host), trust_env=False, follow_redirects=False,
                              timeout=httpx2.Timeout(timeout, connect=min(timeout, 10)))
    try:
        async with http, Client(streamable_http_client(url, http_client=http), mode="auto",
                                read_timeout_seconds=timeout) as client:
            return await work(client)
    except Exception as error:  # noqa: BLE001 — every failure is classified; nothing passes unexamined
        raise classify(error, sent=sending()) from None
    except BaseExceptionGroup as group:  # (anyio's groups can hold a cancellation: classified the same way)
        raise classify(group, sent=sending()) from None


async def describe(url: str, *, token: str | None, timeout: float = 30) -> ServerDescription:
    """Connect, negotiate, list every tool (all pages)."""

    async def work(client: Client) -> ServerDescription:
        tools, cursor = [], None
        while True:
            page = await client.list_tools(cursor=cursor) if cursor else await client.list_tools()
            tools += [tool.model_dump(by_alias=True, exclude_none=True, mode="json") for tool in page.tools]
            cursor = page.next_cursor
            if not cursor:
                return ServerDescription(protocol_version=client.protocol_version, tools=tools)

    return await _with_client(url, token, None, timeout, work, sending=lambda: False)


async def call(url: str, tool: str, arguments: dict, *, token: str | None, key: str, timeout: float,
               host: str | None = None) -> dict:
    """tools/call with the idempotency key; the CallToolResult as JSON (isError included), or a ToolCallError."""
    state = {"calling": False}

    async def work(client: Client) -> dict:
        state["calling"] = True  # from here on the request may be on the wire
        result = await client.call_tool(tool, arguments, read_timeout_seconds=timeout,
                                        meta={IDEMPOTENCY_META: key})
        return result.model_dump(by_alias=True, exclude_none=True, mode="json")

    return await _with_client(url, token, key, timeout, work, sending=lambda: state["calling"], host=host)


def run(awaitable: Awaitable[Any]) -> Any:
    """Run one client operation from synchronous code (a step, a management command): a loop of its own."""
    return asyncio.run(awaitable)
