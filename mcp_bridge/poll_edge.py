"""The poll of MCP clients — a 2026-07-28 ``tasks/get`` of a running task — answered on the event loop with one
statement, as tasks_app.web.snapshot_edge answers the REST snapshot.

An agent polls its task about once a second for as long as it runs, so this one request is most of what MCP clients
cost. Through the SDK it cost several times the web CPU and more statements (bench/web_load.py, "MCP tasks/get";
figures: docs/performance.md): a thread hop and a query for the token, the SDK's classification and models, a
thread hop and an ORM query for the task.
Here the token, its scope and the task in its tenant are one prepared statement on the snapshot edge's async pool
(sql.SNAPSHOT_FOR_TOKEN), and the answer is rendered by the same pure function (mapping.detailed_task).

Only a request that is exactly right is answered here; everything else goes on to the gate and the SDK, which
answer it by the one set of rules: a query string (``/mcp?via=sdk``: the tests compare both paths), another method
or protocol version, headers that disagree with the body, a duplicated routing header, anything unexpected in
params or ``_meta``, no tasks extension declared, an OAuth access token (its table is not the one the statement
reads), an invalid token or one without tasks:read, another tenant's or
an unknown task, a database error. A completed task costs a second statement, its artifact events (its result
links them), read once at the end of a poll.
"""

from __future__ import annotations

import json
import logging
import uuid

from mcp_types import ClientCapabilities, Implementation
from pydantic import ValidationError

from config.base.json_input import dumps_bounded
from mcp_bridge import bridge, mapping
from mcp_bridge.oauth.external import is_external_token
from mcp_bridge.oauth.tokens import is_oauth_access_token
from tasks_app import selectors
from tasks_app.db import sql
from tasks_app.models import Task, TaskStatus

logger = logging.getLogger(__name__)

MODERN = "2026-07-28"
_ROUTING = (b"mcp-protocol-version", b"mcp-method", b"mcp-name")
_META_KEYS = {"io.modelcontextprotocol/protocolVersion", "io.modelcontextprotocol/clientCapabilities",
              "io.modelcontextprotocol/clientInfo"}
SERVER_INFO_META = "io.modelcontextprotocol/serverInfo"


class PollEdge:
    def __init__(self, snapshot_edge, *, server_info: dict, retention_days):
        self.snapshot_edge = snapshot_edge
        self.server_info = server_info
        self.retention_days = retention_days  # a callable: the setting, read when answering

    async def answer(self, scope, message, send) -> bool:
        """Answer the poll and return True, or return False (untouched) for the normal path to answer. ``message``:
        the parsed body (None if it was not JSON)."""
        if scope.get("query_string"):
            return False
        request = _poll(scope, message)
        if request is None:
            return False
        message_id, task_id, token = request
        try:
            row = await self.snapshot_edge.read_for_token(task_id, token)
        except Exception as error:  # the database is away or busy: the normal path answers that (503 / -32603)
            logger.warning("MCP poll edge read failed: %s", type(error).__name__)
            return False
        if row is None:
            return False
        task = Task(**dict(zip(sql.SNAPSHOT_FIELDS, row)))
        result = None
        if task.status == TaskStatus.COMPLETED:  # (polled once, at the end) its result links its artifacts
            try:
                rows = await self.snapshot_edge.fetch(sql.TASK_ARTIFACT_EVENTS, {"task_id": task.id})
            except Exception as error:
                logger.warning("MCP poll edge read failed: %s", type(error).__name__)
                return False
            result = bridge.tool_result(task, selectors.artifacts_from_events(rows))
        detailed = mapping.detailed_task(task, retention_days=self.retention_days(), result=result)
        detailed["_meta"] = {**detailed.get("_meta", {}), SERVER_INFO_META: self.server_info}
        # (bounded: a result or error stored deeper than json.dumps walks is written cut at the cap, not a 500)
        payload = dumps_bounded({"jsonrpc": "2.0", "id": message_id, "result": {**detailed, "resultType": "complete"}},
                                separators=(",", ":"), ensure_ascii=False, default=str).encode()
        await send({"type": "http.response.start", "status": 200, "headers": [
            (b"content-length", str(len(payload)).encode()), (b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": payload})
        return True


def _poll(scope, message):
    """(message id, task id, bearer token) when this is a well-formed 2026 tasks/get with the extension declared."""
    headers: dict[bytes, bytes] = {}
    for name, value in scope["headers"]:
        if name in _ROUTING or name in (b"authorization", b"accept"):
            if name in headers:
                return None  # a duplicated header: the SDK's rules say what that is
            headers[name] = value.strip(b" \t")
    if headers.get(b"mcp-protocol-version") != MODERN.encode() or headers.get(b"mcp-method") != b"tasks/get":
        return None
    accept = [part.split(b";")[0].strip().lower() for part in headers.get(b"accept", b"").split(b",")]
    if not {b"application/json", b"application/*", b"*/*"} & set(accept):
        return None
    kind, _, token = headers.get(b"authorization", b"").partition(b" ")
    if kind.lower() != b"bearer" or not token or b" " in token.strip():
        return None
    if not isinstance(message, dict) or set(message) != {"jsonrpc", "id", "method", "params"} \
            or message["jsonrpc"] != "2.0" or message["method"] != "tasks/get":
        return None
    message_id, params = message["id"], message["params"]
    if isinstance(message_id, bool) or not isinstance(message_id, int | str):
        return None
    if not isinstance(params, dict) or set(params) != {"taskId", "_meta"} or not isinstance(params["taskId"], str):
        return None
    meta = params["_meta"]
    if not isinstance(meta, dict) or not set(meta) <= _META_KEYS \
            or meta.get("io.modelcontextprotocol/protocolVersion") != MODERN:
        return None
    if b"mcp-name" in headers and headers[b"mcp-name"].decode("latin-1") != params["taskId"]:
        return None
    try:
        capabilities = ClientCapabilities.model_validate(meta.get("io.modelcontextprotocol/clientCapabilities"))
    except ValidationError:
        return None
    if not capabilities.extensions or mapping.EXTENSION not in capabilities.extensions:
        return None
    if "io.modelcontextprotocol/clientInfo" in meta:
        try:
            Implementation.model_validate(meta["io.modelcontextprotocol/clientInfo"])
        except ValidationError:
            return None
    try:
        task_id = uuid.UUID(params["taskId"])
    except ValueError:
        return None
    try:
        raw = token.strip().decode("ascii")
    except UnicodeDecodeError:
        return None
    # An OAuth access token is not in the API tokens' table the edge's statement reads: looking it up there would be
    # a wasted statement before the normal path's own lookup (mcp_bridge.auth.principal_for_token).
    if is_oauth_access_token(raw) or is_external_token(raw):
        return None
    return message_id, task_id, raw
