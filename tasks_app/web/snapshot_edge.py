"""The task snapshot for bearer-token pollers, answered on the event loop: one statement, no thread hop.

Pollers (MCP clients' tasks/get, dashboards) read `GET /runtime/tasks/{id}` about once a second each, so this one
request is most of the web tier's load. Through Django under ASGI it cost many times the CPU it costs here (figures:
docs/performance.md): every sync middleware and the sync view ran on a request thread of their own, reached by a hop
per middleware, plus two ORM queries (the token, then the task) compiled each time. Here an ASGI layer in front of
Django answers it with one prepared statement on an async connection pool (the token, its user and membership, and
the task in the token's tenant, joined) and renders the same snapshot with the same code (selectors.task_snapshot,
DRF's JSON renderer).

Only the success is answered here. Everything else — no bearer token, a session, an OAuth access token (another
table: tasks_app.web.authentication.claimed_elsewhere), an unknown or revoked token,
another tenant's task, a malformed id, a disallowed Host, plain HTTP under SECURE_SSL_REDIRECT — goes on to
Django, which answers it as for any request, so the API has one set of rules for errors. A database that cannot
be reached answers 503 with Retry-After, as the Django path does (config.base.problems). tests/test_web_tier.py
checks the body and headers are the ones the Django view gives.

Revocation is honoured at once: the token is read in the same statement as the task, nothing is cached.
"""

from __future__ import annotations

import logging
import re
import uuid

import psycopg
from django.conf import settings
from django.core.exceptions import DisallowedHost
from django.core.handlers.asgi import ASGIRequest
from django.db import connection
from psycopg_pool import AsyncConnectionPool, PoolTimeout
from psycopg.types.json import set_json_loads

from config.base.json_input import BoundedJSONRenderer, loads_stored_shown
from config.base.problems import DATABASE_BUSY, DATABASE_UNAVAILABLE, PROBLEM_CONTENT_TYPE, problem_body
from tasks_app import selectors
from tasks_app.db import sql
from tasks_app.models import Task
from tasks_app.services import token_hash
from tasks_app.web.authentication import claimed_elsewhere

logger = logging.getLogger(__name__)

_SNAPSHOT_PATH = re.compile(r"^/runtime/tasks/([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})$",
                            re.IGNORECASE)  # uppercase ids are valid, as on the Django path
# The REST API's renderer (config.base.json_input): a value stored deeper than json.dumps walks is shown cut at the cap.
_renderer = BoundedJSONRenderer()


def _response_headers(request: ASGIRequest, body: bytes) -> list[tuple[bytes, bytes]]:
    """What the Django path's response carries: DRF's (content type, Allow) and the security middleware's."""
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
               (b"allow", b"GET, HEAD, OPTIONS")]
    if settings.X_FRAME_OPTIONS:
        headers.append((b"x-frame-options", settings.X_FRAME_OPTIONS.encode()))
    if settings.SECURE_CONTENT_TYPE_NOSNIFF:
        headers.append((b"x-content-type-options", b"nosniff"))
    if settings.SECURE_REFERRER_POLICY:
        headers.append((b"referrer-policy", settings.SECURE_REFERRER_POLICY.encode()))
    if settings.SECURE_CROSS_ORIGIN_OPENER_POLICY:
        headers.append((b"cross-origin-opener-policy", settings.SECURE_CROSS_ORIGIN_OPENER_POLICY.encode()))
    if settings.SECURE_HSTS_SECONDS and request.is_secure():
        value = f"max-age={settings.SECURE_HSTS_SECONDS}"
        if settings.SECURE_HSTS_INCLUDE_SUBDOMAINS:
            value += "; includeSubDomains"
        if settings.SECURE_HSTS_PRELOAD:
            value += "; preload"
        headers.append((b"strict-transport-security", value.encode()))
    return headers


def _bearer_token(scope) -> str | None:
    for name, value in scope["headers"]:
        if name == b"authorization":
            scheme, _, token = value.partition(b" ")
            if scheme.lower() == b"bearer" and token and b" " not in token.strip():
                try:
                    return token.strip().decode("ascii")
                except UnicodeDecodeError:
                    return None
            return None
    return None


class SnapshotEdge:
    """ASGI middleware: answers a bearer-token snapshot read itself when it can, hands everything else on."""

    def __init__(self, app, *, pool_size: int, pool_timeout: float):
        self.app = app
        self.pool_size, self.pool_timeout = pool_size, pool_timeout
        self.pool: AsyncConnectionPool | None = None

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["method"] == "GET" and not scope.get("query_string"):
            match = _SNAPSHOT_PATH.match(scope["path"])
            token = _bearer_token(scope) if match else None
            if token is not None and claimed_elsewhere(token):
                token = None  # (an OAuth token: not in the API tokens' table this statement reads; Django answers)
            if token is not None and await self._answer(scope, send, uuid.UUID(match.group(1)), token):
                return
        await self.app(scope, receive, send)

    async def _answer(self, scope, send, task_id: uuid.UUID, token: str) -> bool:
        request = ASGIRequest(scope, None)
        try:
            request.get_host()  # ALLOWED_HOSTS, as Django checks it
        except DisallowedHost:
            return False
        if settings.SECURE_SSL_REDIRECT and not request.is_secure():
            return False
        try:
            row = await self.read_for_token(task_id, token)
        except Exception as error:  # the database is unreachable or the pool is exhausted: retry shortly
            logger.warning("snapshot read failed: %s", type(error).__name__)
            await self._unavailable(send, busy=isinstance(error, PoolTimeout))
            return True
        if row is None:
            return False
        task = Task(**dict(zip(sql.SNAPSHOT_FIELDS, row)))
        body = _renderer.render(selectors.task_snapshot(task, url_for=request.build_absolute_uri))
        await send({"type": "http.response.start", "status": 200, "headers": _response_headers(request, body)})
        await send({"type": "http.response.body", "body": body})
        return True

    async def read_for_token(self, task_id: uuid.UUID, token: str):
        """The task row (sql.SNAPSHOT_FIELDS) of ``task_id`` for a valid token with tasks:read in its tenant, or None
        (one prepared statement on the async pool; also read by the MCP poll edge, mcp_bridge.poll_edge)."""
        rows = await self.fetch(sql.SNAPSHOT_FOR_TOKEN, {"task_id": task_id, "token_hash": token_hash(token)})
        return rows[0] if rows else None

    async def fetch(self, statement: str, params: dict) -> list[tuple]:
        """The rows of one named statement (tasks_app.db.sql), prepared, on the async pool."""
        if self.pool is None:
            self.pool = await self._open_pool()
        # Connections are not checked when taken (a round trip per request). When the database restarted or
        # ended our sessions, every idle one is dead: the first read fails, the pool drops that connection, the
        # others are checked (and dropped) at once, and the read is tried once more on a live or new one.
        for attempt in (1, 2):
            try:
                async with self.pool.connection(timeout=self.pool_timeout) as conn:
                    cursor = await conn.execute(statement, params, prepare=True)
                    return await cursor.fetchall()
            except PoolTimeout:
                raise  # every connection is busy: another try would only wait again
            except psycopg.OperationalError:
                if attempt == 2:
                    raise
                await self.pool.check()
        return []

    async def _open_pool(self) -> AsyncConnectionPool:
        params = connection.get_connection_params()
        # (prepare_threshold kept: a large one lets prepare=True prepare; None, behind a transaction pooler, does not.)
        for django_only in ("cursor_factory", "context", "server_side_binding"):
            params.pop(django_only, None)
        pool = AsyncConnectionPool(kwargs={**params, "autocommit": True}, min_size=1, max_size=self.pool_size,
                                   timeout=self.pool_timeout, max_idle=300, open=False, name="snapshot-edge",
                                   configure=_configure)
        await pool.open()
        return pool

    async def _unavailable(self, send, *, busy: bool) -> None:
        detail = DATABASE_BUSY if busy else DATABASE_UNAVAILABLE
        body = _renderer.render(problem_body(status_code=503, slug="database-unavailable", detail=detail))
        await send({"type": "http.response.start", "status": 503, "headers": [
            (b"content-type", PROBLEM_CONTENT_TYPE.encode()), (b"content-length", str(len(body)).encode()),
            (b"retry-after", b"2")]})
        await send({"type": "http.response.body", "body": body})


async def _configure(conn) -> None:
    """Each pool connection reads json/jsonb with loads_stored_shown instead of psycopg's plain json.loads: a goal,
    result or error written by SQL deeper than json.loads reads (PostgreSQL keeps 12,000 levels) raised
    RecursionError inside fetchall, answered as "database unavailable" (503) on every poll of that task. This edge
    only shows the row, so such a value comes back cut at the cap (config.base.json_input), as every other reader shows
    it."""
    set_json_loads(loads_stored_shown, conn)
