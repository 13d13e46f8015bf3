"""The runtime as an MCP client of a downstream tool server: the official `mcp` SDK's Client over Streamable HTTP.

Each operation opens its own connection (the SDK negotiates the era: 2026-07-28 `server/discover`, else the
2025-11-25 `initialize` handshake; PROTOCOL_MODE pins one) and closes it: a tool call is made from a step on
whichever worker runs it, and nothing of a connection is worth keeping across steps or processes.

What matters here is telling apart how a call ended, because the ledger decides on it (docs/tools.md, "Servers that
misbehave"):
- `NotSent`: the request never reached the tool (connection refused, DNS, connect timeout, a 502/503/504 or 429
  from a gateway in front of it, a 401/403/404/405/415 or a redirect): calling again cannot duplicate anything.
- `OutcomeUnknown`: the request was sent and no readable answer came (read timeout, connection dropped, a 500, a 200
  whose body is not JSON, not JSON-RPC or not a tool result, a JSON-RPC internal error): the tool may have run.
  Never called again blindly — the tool's annotations or a person decide (agents_app.gateway.catalogue.tool_recovery).
- `Refused`: the server answered that it would not run it (a JSON-RPC error that means so — method not found,
  invalid params, an unsupported protocol version… — or another 4xx).
- A tool's own failure is a result (`isError: true`), returned like any other.

The SDK's transport turns an HTTP error status or an unreadable body into a JSON-RPC error of its own making
(-32603 "Server returned an error response", -32700 "Failed to parse JSON response", -32600, -32000), which cannot
be told from one the server sent by its code. So the HTTP status of the tools/call request is watched on the wire
(an httpx event hook) and decides first, and of the JSON-RPC codes only those that can only mean a refusal are taken
as one (REFUSAL_CODES); any other error after the call was sent is an unknown outcome — the safe side: an unknown
outcome is decided by the tool's annotations or a person, a refusal would let the call be made again.

Every connection goes through the outbound connector (agents_app.outbound): its address checked where it is opened
against the tenant's policy (`policy=`; default the deployment's tools.allowed_hosts) and dialled as checked, no
redirect followed, each answer cut at tools.max_answer_bytes. A refused address is HostRefused (nothing sent); a
call's answer cut at the cap is AnswerCut (an unknown outcome: the tool may have run); one nested deeper than the SDK's
parser reads (TOO_DEEP_LEVELS) is AnswerTooDeep, the same kind, and a discovery or tools/list answer nested so makes
the server unusable (ServerUnusable: nothing sent, not transient) — docs/input-limits.md.

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
from typing import Any, Literal

import httpx2
import mcp.types as types
from mcp import Client
from mcp.client import ClaimContext, ClientExtension, ResultClaim
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp.types import (
    HEADER_MISMATCH,
    INVALID_PARAMS,
    METHOD_NOT_FOUND,
    PARSE_ERROR,
    MISSING_REQUIRED_CLIENT_CAPABILITY,
    REQUEST_TIMEOUT,
    UNSUPPORTED_PROTOCOL_VERSION,
    URL_ELICITATION_REQUIRED,
)
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import Field

from agents_app import outbound
from config.base import json_input
from tasks_app.observability import tracing

IDEMPOTENCY_META = "io.agentruntime/idempotency-key"
IDEMPOTENCY_HEADER = "Idempotency-Key"
# Answered by something in front of the server before the request was accepted: nothing ran.
NOT_ACCEPTED_STATUSES = {429, 502, 503, 504}
# Answered before any tool is looked at: not authenticated or allowed, no such endpoint, not a POST it takes.
NOT_TAKEN_STATUSES = {401, 403, 404, 405, 415}
# JSON-RPC errors that can only be a server's refusal to act: the SDK never makes these up for an answer it could
# not read (it uses -32700, -32600, -32603 and -32000 for that, which a server may also send: unknown outcome).
REFUSAL_CODES = {METHOD_NOT_FOUND, INVALID_PARAMS, HEADER_MISMATCH, MISSING_REQUIRED_CLIENT_CAPABILITY,
                 UNSUPPORTED_PROTOCOL_VERSION, URL_ELICITATION_REQUIRED}
# The era asked for: "auto" (2026-07-28 by server/discover, else the 2025-11-25 initialize handshake), "legacy"
# (the handshake only) or a 2026-era version adopted without discovery. Per operation by `mode=`; tests pin it here.
PROTOCOL_MODE = "auto"


class ToolCallError(Exception):
    """How a call to a downstream server failed; `detail` is for people and carries no credential."""

    def __init__(self, detail: str):
        super().__init__(detail)
        self.detail = detail


class NotSent(ToolCallError):
    """The request did not reach the tool: calling again cannot duplicate anything. ``transient``: worth waiting for
    (refused connection, 429/502/503/504: a server restarting, overloaded or behind a proxy); not so for what only a
    change of configuration mends (401, 403, 404, 405, 415, a redirect)."""

    def __init__(self, detail: str, *, transient: bool = True):
        super().__init__(detail)
        self.transient = transient


class OutcomeUnknown(ToolCallError):
    """The request was sent and no answer came: the tool may or may not have run. ``why``: timed_out (no answer in
    time), dropped_after_send (the exchange broke off) or answer_unusable (an answer came that cannot be used: the
    exchange is over, nothing more can land) — checkpoints_app.models.UnknownWhy, kept on the ledger row."""

    default_why = "dropped_after_send"

    def __init__(self, detail: str, *, why: str | None = None):
        super().__init__(detail)
        self.why = why or self.default_why


class HostRefused(NotSent):
    """The connection was not opened: the host's address is refused by the policy (agents_app.outbound checks it
    where the socket is opened). Nothing was sent; waiting does not mend it."""

    def __init__(self, detail: str):
        super().__init__(detail, transient=False)


class AnswerCut(OutcomeUnknown):
    """The answer to a call outgrew tools.max_answer_bytes and was cut off: the tool may have run, its result was
    not read."""

    default_why = "answer_unusable"


class AnswerTooDeep(OutcomeUnknown):
    """The answer to a call nests JSON deeper than the client reads (the SDK's parser stops at 200 levels): unreadable,
    like a cut answer — the tool may have run."""

    default_why = "answer_unusable"


class ServerUnusable(NotSent):
    """Before the call (discovery, the tool list): the server answered, but nothing it said can be read (JSON nested
    past what the client reads). Nothing was sent, and waiting mends nothing."""

    def __init__(self, detail: str):
        super().__init__(detail, transient=False)


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


def classify(error: BaseException, *, sent: bool, status: int | None = None, said: str = "",
             error_status: int | None = None) -> ToolCallError:
    """What a failed exchange means for the ledger. `sent`: whether the request that matters (tools/call) may have
    left this process — before it (discovery, listing), every failure is NotSent. `status`: the HTTP status the
    tools/call request was answered with, if an answer's head came; `error_status`: the last error status any
    request of the exchange got (the SDK reports one as a JSON-RPC error of its own)."""
    leaves = _leaves(error)
    for leaf in leaves:
        if isinstance(leaf, ToolCallError):
            return leaf
    if _too_deep(leaves):
        # A hostile or broken server's answer nested thousands of levels: the SDK's parser (pydantic's, bounded)
        # refuses it as a -32700 of its own, and a json.loads of ours would have raised RecursionError. Said so.
        if sent:
            return AnswerTooDeep(f"the answer to the call nests JSON deeper than {TOO_DEEP_LEVELS} levels and cannot "
                                 f"be read; whether the tool ran is not known")
        return ServerUnusable(f"its answer nests JSON deeper than {TOO_DEEP_LEVELS} levels and cannot be read")
    if not sent:
        statuses = [leaf.response.status_code for leaf in leaves if isinstance(leaf, httpx2.HTTPStatusError)]
        statuses += [error_status] if error_status is not None else []
        return NotSent(_before_the_call(leaves, error_status),
                       transient=not any(_configuration_error(s) for s in statuses))
    for leaf in leaves:
        if isinstance(leaf, httpx2.HTTPStatusError):
            status = leaf.response.status_code
    if status is not None and status >= 300:
        return _by_status(status, said)
    for leaf in leaves:  # first: a connection never made, whatever else the SDK raised beside it
        if isinstance(leaf, (httpx2.ConnectError, httpx2.ConnectTimeout, httpx2.PoolTimeout)):
            return NotSent(f"could not connect: {type(leaf).__name__}")
    for leaf in leaves:
        if isinstance(leaf, MCPError):
            code, message = leaf.error.code, _short(leaf.error.message)
            if code == REQUEST_TIMEOUT:
                return OutcomeUnknown(f"no answer in time: {message}", why="timed_out")
            if code in REFUSAL_CODES:
                return Refused(f"the server refused it ({code}): {message}", code)
            return OutcomeUnknown(f"the answer to the call could not be used ({code}): {message}",
                                  why="answer_unusable")
        if isinstance(leaf, httpx2.TimeoutException):
            return OutcomeUnknown(f"the exchange broke off: {type(leaf).__name__}", why="timed_out")
        if isinstance(leaf, httpx2.TransportError):
            return OutcomeUnknown(f"the exchange broke off: {type(leaf).__name__}")
    first = leaves[0]
    return OutcomeUnknown(f"the answer to the call could not be used: {type(first).__name__}: {_short(str(first))}",
                          why="answer_unusable")


# How deep an answer's JSON may nest for the SDK's parser (pydantic-core's JSON parser stops at this many levels,
# with the message matched below); the project's own json.loads of an answer is bounded by config.base.json_input.
TOO_DEEP_LEVELS = 200
_TOO_DEEP_SAID = "recursion limit exceeded"


def _too_deep(leaves: list[BaseException]) -> bool:
    for leaf in leaves:
        if isinstance(leaf, RecursionError):
            return True
        if isinstance(leaf, MCPError) and leaf.error.code == PARSE_ERROR and _TOO_DEEP_SAID in leaf.error.message:
            return True
    return False


def _by_status(status: int, said: str = "") -> ToolCallError:
    """The tools/call request answered with an HTTP error or a redirect (the redirect is not followed); `said`: the
    JSON-RPC error message its body carried, if any."""
    if status < 400 or status in NOT_ACCEPTED_STATUSES or status in NOT_TAKEN_STATUSES:
        return NotSent(f"the server answered HTTP {status}" + (f": {said}" if said else ""),
                       transient=not _configuration_error(status))
    if status < 500:
        return Refused(f"the server refused it: HTTP {status}" + (f": {said}" if said else ""), status)
    return OutcomeUnknown(f"the server answered HTTP {status} after the call was sent", why="answer_unusable")


def _configuration_error(status: int) -> bool:
    """An answer no waiting mends: a redirect (not followed), or not taken (credential, URL, method)."""
    return status < 400 or status in NOT_TAKEN_STATUSES


def _before_the_call(leaves: list[BaseException], error_status: int | None = None) -> str:
    for leaf in leaves:
        if isinstance(leaf, (httpx2.ConnectError, httpx2.ConnectTimeout, httpx2.PoolTimeout)):
            return f"could not connect: {type(leaf).__name__}"
        if isinstance(leaf, httpx2.HTTPStatusError):
            return f"the server answered HTTP {leaf.response.status_code}"
        if isinstance(leaf, MCPError) and error_status is not None:  # (the SDK's own rendering of an HTTP error)
            return f"the server answered HTTP {error_status}"
        if isinstance(leaf, MCPError):
            return f"the server could not be used ({leaf.error.code}): {_short(leaf.error.message)}"
        if isinstance(leaf, (httpx2.TimeoutException, httpx2.TransportError)):
            return f"the exchange broke off before the call: {type(leaf).__name__}"
    return f"{type(leaves[0]).__name__}: {_short(str(leaves[0]))}"


def _short(text: str, limit: int = 200) -> str:
    """A first line, bounded: the SDK's messages can carry a whole validation report (with the server's body)."""
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line[:limit]


class _Wire:
    """What the tools/call request got on the wire: the HTTP status of its answer (an httpx event hook sees it before
    the SDK's transport turns an error status into a JSON-RPC error of its own)."""

    def __init__(self) -> None:
        self.call_request: httpx2.Request | None = None
        self.call_status: int | None = None
        self.call_error: str = ""  # a refused call's JSON-RPC error message, when its body had one
        self.error_status: int | None = None  # the last error status of any request (discovery, listing included)
        self.session_id: str | None = None  # a stateful server's Mcp-Session-Id (a question is answered within it)

    async def on_request(self, request: httpx2.Request) -> None:
        if request.method == "POST" and _rpc_method(request) == "tools/call":
            self.call_request, self.call_status, self.call_error = request, None, ""

    async def on_response(self, response: httpx2.Response) -> None:
        if response.status_code >= 300:
            self.error_status = response.status_code
        self.session_id = response.headers.get("mcp-session-id") or self.session_id
        if self.call_request is not None and response.request is self.call_request:
            self.call_status = response.status_code
            if 400 <= response.status_code < 500:  # (an error body is small, and not a stream)
                try:  # (bounded: a hostile error body nested 10,000 levels raised RecursionError in json.loads)
                    body = json_input.loads(await response.aread())
                    self.call_error = _short(str((body.get("error") or {}).get("message") or ""))
                except (ValueError, AttributeError, httpx2.HTTPError):
                    self.call_error = ""


def _rpc_method(request: httpx2.Request) -> str | None:
    method = request.headers.get("mcp-method")  # 2026-07-28 names it in a header; 2025-11-25 only in the body
    if method:
        return method
    try:
        body = json.loads(request.content)
    except (ValueError, httpx2.RequestNotRead):
        return None
    return body.get("method") if isinstance(body, dict) else None


def _checked_mode(mode: str | None) -> str:
    mode = PROTOCOL_MODE if mode in (None, "auto") else mode  # (a server's own pin wins over the module's)
    if mode not in ("auto", "legacy") and mode not in MODERN_PROTOCOL_VERSIONS:
        raise ValueError(f"protocol mode must be 'auto', 'legacy' or one of {list(MODERN_PROTOCOL_VERSIONS)}; got "
                         f"{mode!r}")
    return mode


# -- the MCP Tasks extension (2026-07-28), as a client: a call the server answers with a task -------------------------
TASKS_EXTENSION = "io.modelcontextprotocol/tasks"
# Where a call answered with a task carries it: the CallToolResult the SDK hands back has no content of its own, and
# this _meta entry holds the downstream task (taskId, status, pollIntervalMs) for the gateway to wait on durably.
DOWNSTREAM_TASK_META = "io.agentruntime/downstream-task"


class DownstreamTask(types.Result):
    result_type: Literal["task"] = Field("task", alias="resultType")
    task_id: str = Field(alias="taskId")
    status: str
    status_message: str | None = Field(None, alias="statusMessage")
    poll_interval_ms: int | None = Field(None, alias="pollIntervalMs")


class DetailedTask(types.Result):
    task_id: str = Field(alias="taskId")
    status: str
    status_message: str | None = Field(None, alias="statusMessage")
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    input_requests: dict[str, Any] | None = Field(None, alias="inputRequests")
    poll_interval_ms: int | None = Field(None, alias="pollIntervalMs")


class TaskIdParams(types.RequestParams):
    task_id: str = Field(alias="taskId")


class GetTaskRequest(types.Request[TaskIdParams, Literal["tasks/get"]]):
    method: Literal["tasks/get"] = "tasks/get"
    params: TaskIdParams
    name_param = "taskId"  # → the Mcp-Name header the extension requires


class CancelTaskRequest(types.Request[TaskIdParams, Literal["tasks/cancel"]]):
    method: Literal["tasks/cancel"] = "tasks/cancel"
    params: TaskIdParams
    name_param = "taskId"


async def _hand_back(created: DownstreamTask, ctx: ClaimContext) -> types.CallToolResult:
    """Not waited for here: the task is handed back (in _meta) for the engine to wait on without a worker."""
    return types.CallToolResult(content=[], _meta={DOWNSTREAM_TASK_META: created.model_dump(by_alias=True,
                                                                                             exclude_none=True)})


class _Tasks(ClientExtension):
    identifier = TASKS_EXTENSION

    def claims(self):
        return [ResultClaim(result_type="task", model=DownstreamTask, resolve=_hand_back)]


def downstream_task(result: dict) -> dict | None:
    """The downstream task a call was answered with ({taskId, status, pollIntervalMs…}), or None."""
    return ((result or {}).get("_meta") or {}).get(DOWNSTREAM_TASK_META)


def _ssl_context():
    return outbound.default_ssl_context()  # (one per process: bench/tool_calls.py measures the cost of more)


def _outcome(error: BaseException, connector: outbound.Connector, *, sent: bool, wire: _Wire) -> ToolCallError:
    """classify, after what the connector saw: a refused address (nothing sent) or an answer cut at its cap — the
    SDK may have swallowed either into an error of its own making."""
    if connector.refused is not None:
        return HostRefused(f"the host is refused: {connector.refused}")
    if connector.cut is not None:
        if sent:
            return AnswerCut(f"{connector.cut}; whether the tool ran is not known")
        return NotSent(str(connector.cut), transient=False)
    return classify(error, sent=sent, status=wire.call_status, said=wire.call_error, error_status=wire.error_status)


async def _with_client(url: str, token: str | None, key: str | None, timeout: float,
                       work: Callable[[Client], Awaitable[Any]], *, sending: Callable[[], bool],
                       mode: str | None, host: str | None = None, elicitation=None,
                       terminate_on_close: bool = True, policy: outbound.Policy | None = None) -> Any:
    """One exchange with a tool server through the outbound connector (agents_app.outbound): every connection's
    address checked by ``policy`` (default: the deployment's tools.allowed_hosts) where it is opened, no redirect,
    each answer capped at tools.max_answer_bytes."""
    mode = _checked_mode(mode)  # (a wrong mode is the caller's error, not the server's: raised as it is)
    wire = _Wire()
    connector = outbound.Connector(policy or outbound.deployment_policy(), kind="tools")
    http = connector.async_client(headers=_headers(token, key, host),
                                  timeout=httpx2.Timeout(timeout, connect=min(timeout, 10)),
                                  event_hooks={"request": [wire.on_request], "response": [wire.on_response]})
    try:
        transport = streamable_http_client(url, http_client=http, terminate_on_close=terminate_on_close)
        async with http, Client(transport, mode=mode, read_timeout_seconds=timeout, extensions=[_Tasks()],
                                elicitation_callback=elicitation) as client:
            client.wire = wire  # (what a caller may need of the exchange: the session id)
            answer = await work(client)
    except Exception as error:  # noqa: BLE001 — every failure is classified; nothing passes unexamined
        raise _outcome(error, connector, sent=sending(), wire=wire) from None
    except BaseExceptionGroup as group:  # (anyio's groups can hold a cancellation: classified the same way)
        raise _outcome(group, connector, sent=sending(), wire=wire) from None
    if connector.cut is not None:  # (an SDK that read on after a cut stream: the answer it made is not the server's)
        raise _outcome(connector.cut, connector, sent=sending(), wire=wire)
    return answer


async def describe(url: str, *, token: str | None, timeout: float = 30, mode: str | None = None,
                   policy: outbound.Policy | None = None) -> ServerDescription:
    """Connect, negotiate (``mode``: see PROTOCOL_MODE), list every tool (all pages)."""

    async def work(client: Client) -> ServerDescription:
        tools, cursor = [], None
        while True:
            page = await client.list_tools(cursor=cursor) if cursor else await client.list_tools()
            tools += [tool.model_dump(by_alias=True, exclude_none=True, mode="json") for tool in page.tools]
            cursor = page.next_cursor
            if not cursor:
                return ServerDescription(protocol_version=client.protocol_version, tools=tools)

    return await _with_client(url, token, None, timeout, work, sending=lambda: False, mode=mode, policy=policy)


LEGACY_VERSION = "2025-11-25"
LEGACY_TASK_TTL_MS = 24 * 3600 * 1000  # how long a 2025-11-25 server should keep a task we wait for


async def _legacy_task_call(client: Client, tool: str, arguments: dict, key: str) -> dict:
    """tools/call with params.task on a 2025-11-25 connection: the task, handed back like a 2026 one. The SDK 2.x
    client has no task-augmented call (1.x's experimental.call_tool_as_task was removed) and checks a tools/call
    result as a CallToolResult, so this one request goes through the session's raw JSON-RPC send."""
    raw = await client.session._dispatcher.send_raw_request(
        "tools/call", {"name": tool, "arguments": arguments, "task": {"ttl": LEGACY_TASK_TTL_MS},
                       "_meta": {IDEMPOTENCY_META: key}}, {})
    created = types.CreateTaskResult.model_validate(raw).task
    handle = {"resultType": "task", "taskId": created.task_id, "status": created.status,
              "pollIntervalMs": created.poll_interval, "era": LEGACY_VERSION}
    return {"content": [], "_meta": {DOWNSTREAM_TASK_META: {k: v for k, v in handle.items() if v is not None}}}


async def call(url: str, tool: str, arguments: dict, *, token: str | None, key: str, timeout: float,
               mode: str | None = None, host: str | None = None, as_task: bool = False,
               policy: outbound.Policy | None = None) -> dict:
    """tools/call with the idempotency key; the CallToolResult as JSON (isError included), or a ToolCallError.
    ``mode``: the era (see PROTOCOL_MODE). ``host``: the Host header when `url` names a checked address.
    ``as_task``: the tool runs as a task where it can (its execution.taskSupport): on 2026-07-28 the server decides
    (this client declares the tasks extension); on 2025-11-25 the call asks for one (params.task)."""
    state = {"calling": False}

    async def work(client: Client) -> dict:
        state["calling"] = True  # from here on the request may be on the wire
        if as_task and client.protocol_version == LEGACY_VERSION:
            return await _legacy_task_call(client, tool, arguments, key)
        # The SDK checks a result against the tool's outputSchema, listing the tools first when this connection has
        # not (a tools/list round trip after every call: each call is a connection of its own), and refuses a call
        # answered with a task (no structuredContent) — though the call ran and created it. The result of a call
        # that ran is the ledger's to record, whatever its shape; so the check is switched off for this tool (the
        # session's schema cache, where None means "no outputSchema"). mcp is pinned: this private name is checked
        # by tests/test_example_task_tool.py's task tool with an outputSchema.
        client.session._tool_output_schemas[tool] = None
        # (the SDK's client span under ours puts its own traceparent in _meta too: SEP-414)
        result = await client.call_tool(tool, arguments, read_timeout_seconds=timeout,
                                        meta={IDEMPOTENCY_META: key, **tracing.meta_carrier()})
        tracing.tool_answered(span, protocol_version=client.protocol_version, session_id=client.wire.session_id,
                              is_error=bool(result.is_error))
        return result.model_dump(by_alias=True, exclude_none=True, mode="json")

    with tracing.tool_call_span(tool, url=url, key=key) as span:  # (None while tracing is off)
        return await _with_client(url, token, key, timeout, work, sending=lambda: state["calling"], mode=mode,
                                  host=host, policy=policy)


async def _legacy_task_get(client: Client, task_id: str) -> dict:
    """2025-11-25: tasks/get has the status only; a finished task's CallToolResult (or its error) comes from
    tasks/result, which answers at once then. Shaped like the 2026 DetailedTask."""
    task = await client.session.send_request(types.GetTaskRequest(params=types.GetTaskRequestParams(taskId=task_id)),
                                             types.GetTaskResult)
    answer = {"taskId": task.task_id, "status": task.status, "statusMessage": task.status_message,
              "pollIntervalMs": task.poll_interval}
    if task.status in ("completed", "failed"):
        try:
            raw = await client.session._dispatcher.send_raw_request("tasks/result", {"taskId": task_id}, {})
            answer["result"] = {k: v for k, v in raw.items() if k != "_meta"} if isinstance(raw, dict) else raw
            answer["status"] = "completed"  # (a tool error is a result with isError: failed in this era)
        except MCPError as error:  # the task's failure, as the server reports it
            answer["error"] = {"code": error.error.code, "message": error.error.message}
            answer["status"] = "failed"
    return {k: v for k, v in answer.items() if v is not None}


async def task_get(url: str, task_id: str, *, token: str | None, timeout: float, mode: str | None = None,
                   host: str | None = None, policy: outbound.Policy | None = None) -> dict:
    """tasks/get of a downstream task (DetailedTask as JSON: status, result or error, inputRequests, pollIntervalMs).
    Safe to repeat: any failure is NotSent or OutcomeUnknown, and either way the caller asks again later."""

    async def work(client: Client) -> dict:
        if client.protocol_version == LEGACY_VERSION:
            return await _legacy_task_get(client, task_id)
        answer = await client.session.send_request(GetTaskRequest(params=TaskIdParams(taskId=task_id)), DetailedTask)
        return answer.model_dump(by_alias=True, exclude_none=True, mode="json")

    return await _with_client(url, token, None, timeout, work, sending=lambda: True, mode=mode, host=host,
                              policy=policy)


class TaskUpdateParams(TaskIdParams):
    input_responses: dict[str, Any] = Field(alias="inputResponses")


class UpdateTaskRequest(types.Request[TaskUpdateParams, Literal["tasks/update"]]):
    method: Literal["tasks/update"] = "tasks/update"
    params: TaskUpdateParams
    name_param = "taskId"


async def task_update(url: str, task_id: str, responses: dict, *, token: str | None, timeout: float,
                      mode: str | None = None, host: str | None = None, policy: outbound.Policy | None = None) -> None:
    """tasks/update: answers to a downstream task's input requests ({key: {"action": "accept", "content": …}})."""

    async def work(client: Client) -> None:
        await client.session.send_request(UpdateTaskRequest(params=TaskUpdateParams(taskId=task_id,
                                                                               inputResponses=responses)),
                                          types.Result)

    await _with_client(url, token, None, timeout, work, sending=lambda: True, mode=mode, host=host, policy=policy)


async def task_cancel(url: str, task_id: str, *, token: str | None, timeout: float, mode: str | None = None,
                      host: str | None = None, policy: outbound.Policy | None = None) -> None:
    async def work(client: Client) -> None:
        if client.protocol_version == LEGACY_VERSION:
            await client.session.send_request(
                types.CancelTaskRequest(params=types.CancelTaskRequestParams(taskId=task_id)), types.Result)
            return
        await client.session.send_request(CancelTaskRequest(params=TaskIdParams(taskId=task_id)), types.Result)

    await _with_client(url, token, None, timeout, work, sending=lambda: True, mode=mode, host=host, policy=policy)


# -- a 2025-11-25 downstream task's question --------------------------------------------------------------------------
# In that era a task that needs input says `input_required` in tasks/get, and asks its question only on the stream of a
# tasks/result request (an elicitation/create the client answers with a JSON-RPC response, POSTed). A person answers
# hours later, on whichever worker: the question is taken (its request id, its params, the session if the server keeps
# one) and the connection let go unanswered; the answer goes back later as that JSON-RPC response (legacy_answer).
QUESTION_WINDOW_SECONDS = 10  # how long tasks/result is listened to for the question, once it says input_required


async def legacy_question(url: str, task_id: str, *, token: str | None, timeout: float,
                          host: str | None = None, policy: outbound.Policy | None = None) -> dict:
    """tasks/result on a 2025-11-25 connection, until the task asks something or finishes: {"question": {"id",
    "params", "session"}} (not answered), {"result": CallToolResult} / {"error": {code, message}} (it finished), or
    {} (nothing within QUESTION_WINDOW_SECONDS). Any failure: NotSent/OutcomeUnknown — asking is safe to repeat."""
    found: dict = {}
    asked = asyncio.Event()

    async def on_question(context, params) -> types.ElicitResult:
        found["question"] = {"id": context.request_id,
                             "params": params.model_dump(by_alias=True, exclude_none=True, mode="json")}
        asked.set()
        await asyncio.Event().wait()  # never answered from here: this connection is let go (a person answers later)
        raise AssertionError("unreachable")

    async def work(client: Client) -> dict:
        async def finished() -> None:
            try:
                raw = await client.session._dispatcher.send_raw_request("tasks/result", {"taskId": task_id}, {})
                found["result"] = {k: v for k, v in raw.items() if k != "_meta"} if isinstance(raw, dict) else raw
            except MCPError as error:
                found["error"] = {"code": error.error.code, "message": error.error.message}
            asked.set()

        waiting = asyncio.ensure_future(finished())
        try:
            await asyncio.wait_for(asked.wait(), QUESTION_WINDOW_SECONDS)
        except TimeoutError:
            pass
        finally:
            waiting.cancel()
        if "question" in found:
            found["question"]["session"] = client.wire.session_id
        return found

    # terminate_on_close off: a stateful server must keep the session the question was asked in until it is answered
    return await _with_client(url, token, None, timeout, work, sending=lambda: True, mode="legacy", host=host,
                              elicitation=on_question, terminate_on_close=False, policy=policy)


async def legacy_answer(url: str, request_id: Any, result: dict, *, session: str | None, token: str | None,
                        timeout: float, host: str | None = None, policy: outbound.Policy | None = None) -> None:
    """The JSON-RPC response to a question a 2025-11-25 downstream task asked (legacy_question), POSTed on its own, in
    the session it was asked in. Accepted (2xx): None. Refused (the request is unknown there now: expired, its session
    gone, answered already): Refused; not reached: NotSent."""
    headers = {**_headers(token, None, host), "Content-Type": "application/json",
               "Accept": "application/json, text/event-stream", "MCP-Protocol-Version": LEGACY_VERSION}
    if session:
        headers["Mcp-Session-Id"] = session
    body = {"jsonrpc": "2.0", "id": request_id, "result": result}
    connector = outbound.Connector(policy or outbound.deployment_policy(), kind="tools")
    try:
        async with connector.async_client(timeout=httpx2.Timeout(timeout, connect=min(timeout, 10))) as http:
            response = await http.post(url, json=body, headers=headers)
    except (httpx2.ConnectError, httpx2.ConnectTimeout, httpx2.PoolTimeout) as error:
        if connector.refused is not None:
            raise HostRefused(f"the host is refused: {connector.refused}") from None
        raise NotSent(f"could not connect: {type(error).__name__}") from None
    except httpx2.HTTPError as error:
        raise OutcomeUnknown(f"the exchange broke off: {type(error).__name__}") from None
    if response.status_code >= 300:  # (the status, never the body: the server's words are not relayed)
        raise Refused(f"the answer was not taken: HTTP {response.status_code}", response.status_code)


def run(awaitable: Awaitable[Any]) -> Any:
    """Run one client operation from synchronous code (a step, a management command): a loop of its own."""
    return asyncio.run(awaitable)
