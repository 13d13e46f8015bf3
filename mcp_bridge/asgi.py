"""The MCP endpoint in the ASGI router: ``/mcp`` and the protected-resource metadata, before Django.

Every request to ``/mcp`` passes this gate, in order, before the official SDK (StreamableHTTPSessionManager,
stateless) sees it:

1. Host must be one of ALLOWED_HOSTS (Django's own matching, ``.example.com`` included) → else 421;
   an Origin, when sent, must be http(s) on an allowed host, or listed in CSRF_TRUSTED_ORIGINS / MCP_ALLOWED_ORIGINS
   → else 403 (DNS rebinding: a page on evil.example must not drive a loopback server).
2. POST only (405 otherwise): in this stateless deployment a GET would open a stream that never ends; and
   ``Content-Type: application/json`` (415 otherwise).
3. The body, at most MCP_MAX_REQUEST_BYTES → else 413, read once and replayed to the SDK.
4. A valid bearer token — an API token, or an OAuth access token issued for this origin's /mcp (RFC 8707) — → else
   401 with ``WWW-Authenticate: Bearer … resource_metadata=…`` (RFC 9728).
5. For tasks/get, tasks/update and tasks/cancel an ``Mcp-Name`` header that differs from ``params.taskId`` is a
   -32020 (the SDK checks the header only for tools/call, prompts/get and resources/read). A *missing* one is
   accepted: FastMCP's stock task client does not send it, the body's taskId is what is acted on, and auth and
   tenant scoping apply the same either way (README, "MCP clients").
6. The method's scope (mcp_bridge.auth.scope_needed) → else 403 insufficient_scope; then, for a request that creates
   or steers a task (mcp_bridge.auth.rate_action), the token's rate limit (config.base.rate_limits) → else 429 with
   Retry-After and a JSON-RPC error (RATE_LIMITED).
7. Without an ``MCP-Protocol-Version`` header, or with one of the handshake era's (the 2025-11-25 path): a message
   that is not a JSON-RPC 2.0 request, notification or response object (jsonrpc, a string method, an object
   params, a string or integer id) is a -32600 naming what is wrong — the SDK answered -32602 with a raw
   validation dump, and dropped an object or boolean id with a 202 as if it were a notification; and
   ``server/discover`` says that it needs the header.

8. A JSON-RPC response whose id is one of mcp_bridge.elicitation's (a client's answer to a question a 2025-11-25
   tasks/result stream asked, on this process or another) is applied here and answered 202 (or 4xx: not ours,
   expired, another principal's; ``tasks:write`` needed): the SDK's stateless transport would drop it.

Then the SDK classifies the message (protocol version, Mcp-Method, _meta, batch, parse errors) and dispatches it to
mcp_bridge.server. Nothing here keeps anything about a client between requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from urllib.parse import urlsplit

from django.conf import settings
from django.db import DatabaseError
from django.http.request import split_domain_port, validate_host
from mcp.shared.exceptions import MCPError
from mcp_types import INTERNAL_ERROR
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from psycopg_pool import PoolTimeout

from config.base.asgi_handler import db_in_thread
from config.base.asgi_limits import BodyTooLarge, ClientGone, read_body, replaying
from config.base.json_input import MALFORMED, JsonInputError, loads
from config.base.problems import problem_type_uri
from config.base.rate_limits import rate_limits_hit
from mcp_bridge import auth, elicitation
from tasks_app import access

logger = logging.getLogger(__name__)

MCP_PATHS = frozenset({"/mcp", "/mcp/"})
# RFC 9728: one document per resource — the MCP endpoint's (also at the bare path), and the REST API's (/runtime,
# whose OAuth tokens mcp_bridge.oauth.rest accepts).
METADATA_PATHS = frozenset({"/.well-known/oauth-protected-resource", "/.well-known/oauth-protected-resource/mcp",
                            "/.well-known/oauth-protected-resource/runtime"})
_TASK_METHODS = frozenset({"tasks/get", "tasks/update", "tasks/cancel"})
MODERN = "2026-07-28"  # the protocol version whose requests carry their version in a header, each
_DEBUG_HOSTS = [".localhost", "127.0.0.1", "[::1]"]
# The JSON-RPC error code of a request refused by a rate limit (HTTP 429 with Retry-After; data: type, limit,
# retryAfterSeconds). The MCP specification names none; this one is in the range JSON-RPC leaves to servers.
RATE_LIMITED = -32029


class DatabaseUnavailable(MCPError):
    """PostgreSQL is away or every pooled connection is busy: the caller may retry shortly (nothing was decided)."""

    def __init__(self):
        super().__init__(INTERNAL_ERROR, "The database is unavailable; retry shortly.", {"retryAfterSeconds": 2})


async def in_thread(function, *args, **kwargs):
    """Run blocking Django work off the event loop; the connection goes back to the pool at once (no request
    holds one while it waits on anything). A database that is away is a retryable error, never an escaped one."""

    try:
        return await db_in_thread(function, *args, **kwargs)
    except (DatabaseError, PoolTimeout) as error:
        logger.warning("MCP database work failed: %s", type(error).__name__)
        raise DatabaseUnavailable from None


def _header(scope, name: bytes) -> str | None:
    for key, value in scope["headers"]:
        if key == name:
            return value.decode("latin-1")
    return None


def _allowed_hosts() -> list[str]:
    return settings.ALLOWED_HOSTS or (_DEBUG_HOSTS if settings.DEBUG else [])


def host_allowed(host: str | None) -> bool:
    if not host:
        return False
    domain, _port = split_domain_port(host)
    return bool(domain) and validate_host(domain, _allowed_hosts())


def origin_allowed(origin: str) -> bool:
    if origin in settings.CSRF_TRUSTED_ORIGINS or origin in settings.MCP_ALLOWED_ORIGINS:
        return True
    parts = urlsplit(origin)
    return parts.scheme in ("http", "https") and host_allowed(parts.netloc)


def _origin_of(scope) -> str:
    scheme = scope.get("scheme", "http")
    return f"{scheme}://{_header(scope, b'host') or 'localhost'}"


async def _respond(send, status: int, body: dict | None, headers: list[tuple[bytes, bytes]] = ()) -> None:
    payload = json.dumps(body).encode() if body is not None else b""
    head = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode()),
            (b"cache-control", b"no-store"), *headers]
    await send({"type": "http.response.start", "status": status, "headers": head})
    await send({"type": "http.response.body", "body": payload})


def _jsonrpc_error(message_id, code: int, message: str, data: dict | None = None) -> dict:
    error = {"code": code, "message": message, **({"data": data} if data is not None else {})}
    return {"jsonrpc": "2.0", "id": message_id, "error": error}


class McpEndpoint:
    """The ASGI app for the MCP paths; ``lifespan`` runs the SDK's session manager for the process's life."""

    def __init__(self, manager, *, max_bytes: int, poll_edge=None):
        self.manager = manager
        self.max_bytes = max_bytes
        self.poll_edge = poll_edge  # mcp_bridge.poll_edge: answers a running task's tasks/get in one statement
        self._stack: contextlib.AsyncExitStack | None = None
        self._started: asyncio.Future | None = None

    @staticmethod
    def owns(path: str) -> bool:
        return path in MCP_PATHS or path in METADATA_PATHS

    # -- lifespan: the SDK needs its task group running before the first request ------------------------------
    async def lifespan(self, scope, receive, send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await self.start()
                except Exception as error:  # noqa: BLE001 (reported to the server, which refuses to start)
                    await send({"type": "lifespan.startup.failed", "message": str(error)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.stop()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def start(self) -> None:
        if self._started is None:
            self._started = asyncio.get_running_loop().create_future()
            self._stack = contextlib.AsyncExitStack()
            try:
                await self._stack.enter_async_context(self.manager.run())
            except BaseException as error:
                self._started.set_exception(error)
                raise
            self._started.set_result(True)
        await asyncio.shield(self._started)

    async def stop(self) -> None:
        if self._stack is not None:
            await self._stack.aclose()

    # -- requests ---------------------------------------------------------------------------------------------
    async def __call__(self, scope, receive, send) -> None:
        if scope["path"] in METADATA_PATHS:
            return await self._metadata(scope, send)
        if not host_allowed(_header(scope, b"host")):
            return await _respond(send, 421, {"error": "misdirected_request",
                                              "error_description": "This Host is not served here (ALLOWED_HOSTS)."})
        origin = _header(scope, b"origin")
        if origin is not None and not origin_allowed(origin):
            return await _respond(send, 403, {"error": "forbidden_origin",
                                              "error_description": f"Origin {origin!r} may not call this endpoint."})
        if scope["method"] != "POST":
            return await _respond(send, 405, _jsonrpc_error(None, -32600, "Send JSON-RPC messages with POST; this "
                                                            "endpoint is stateless and opens no GET stream."),
                                  [(b"allow", b"POST")])
        content_type = (_header(scope, b"content-type") or "").split(";")[0].strip().lower()
        if content_type != "application/json":
            return await _respond(send, 415, _jsonrpc_error(None, -32600, "Send the JSON-RPC message with "
                                                            "Content-Type: application/json."))
        try:
            body = await read_body(receive, self.max_bytes)
        except BodyTooLarge:
            return await _respond(send, 413, _jsonrpc_error(None, -32600, f"The body is larger than "
                                                            f"{self.max_bytes} bytes."))
        except ClientGone:
            return None
        message, refused = _parsed(body)
        if self.poll_edge is not None and await self.poll_edge.answer(scope, message, send):
            return None
        try:
            principal = await self._principal(scope)
        except DatabaseUnavailable:  # the database is away or busy: retry shortly, never a 500
            return await _respond(send, 503, _jsonrpc_error(None, -32603, "The database is unavailable; retry "
                                                            "shortly."), [(b"retry-after", b"2")])
        if principal is None:
            # RFC 6750 §3.1: a request with no credentials gets no error code (only the challenge and where to
            # learn how to authenticate); one whose token is refused gets invalid_token.
            error = "invalid_token" if _header(scope, b"authorization") is not None else None
            body = {"error_description": "Send a valid token as `Authorization: Bearer <token>`: an OAuth access "
                                         "token issued for this endpoint (sign in from your MCP client), or an API "
                                         "token (python3.11 deploy/dev.py manage create_api_token)."}
            return await _respond(send, 401, {"error": error, **body} if error else body,
                                  [(b"www-authenticate", auth.www_authenticate(_origin_of(scope), error=error)
                                    .encode())])
        if refused is not None:  # (after the token check, as the SDK's own -32700 for a body that is not JSON)
            return await _respond(send, 400, _jsonrpc_error(None, -32700, f"Parse error: {refused}"))
        if elicitation.is_answer(message):  # a client's reply to a question of a tasks/result stream (2025-11-25)
            return await self._answer(scope, send, message, principal)
        # (An unknown version is the SDK's to refuse, listing the versions it supports.)
        if _header(scope, b"mcp-protocol-version") in (None, *HANDSHAKE_PROTOCOL_VERSIONS) and message is not None:
            refusal = _refusal_2025(message)
            if refusal is not None:
                return await _respond(send, 400, refusal)
        if isinstance(message, dict):
            refusal = self._refusal(scope, message, principal) or await self._rate_refusal(message, principal)
            if refusal is not None:
                return await _respond(send, *refusal)
        # RFC 9110 §5.5: a field value excludes leading and trailing whitespace (the SDK compares them raw).
        scope = {**scope, "headers": [(name, value.strip(b" \t")) for name, value in scope["headers"]]}
        token = auth.current_principal.set(principal)
        try:
            await self.start()
            await self.manager.handle_request(scope, replaying(body, receive), send)
        finally:
            auth.current_principal.reset(token)

    def _refusal(self, scope, message: dict, principal: auth.Principal):
        method, params = message.get("method"), message.get("params")
        if method in _TASK_METHODS and isinstance(params, dict):
            name = _header(scope, b"mcp-name")
            if name is not None and name.strip(" \t") != str(params.get("taskId")):
                return 400, _jsonrpc_error(message.get("id"), -32020, "The Mcp-Name header must equal "
                                           "params.taskId.", {"header": "Mcp-Name"})
        # The one access rule (tasks_app.access): the token's scopes ∩ its user's role. (A task of another tenant is
        # "not found" later, where the task is read: mcp_bridge.bridge.task_read.)
        action = auth.action_of(method, params)
        if not access.allows(auth.access_of(principal), action):
            needed = access.RULES[action].scope
            header = auth.www_authenticate(_origin_of(scope), error="insufficient_scope", scope=needed)
            why = (f"This token lacks the {needed!r} scope that {method} needs." if needed not in principal.scopes
                   else f"The token's user may not {action.value.replace('_', ' ')}: "
                        f"{access.refusal(auth.access_of(principal), action)}")
            return 403, {"error": "insufficient_scope", "error_description": why}, [
                (b"www-authenticate", header.encode())]
        return None

    async def _rate_refusal(self, message: dict, principal: auth.Principal):
        """429 when the request would create or steer a task over the token's rate (config.base.rate_limits): before
        the SDK dispatches it, so nothing is done. Redis away: let through (the limiter logs it)."""
        action = auth.rate_action(message.get("method"), message.get("params"))
        if action is None:
            return None
        # (the person's bucket, shared with their session and other tokens, and the tenant's: config.base.rate_limits)
        refusal = await asyncio.to_thread(rate_limits_hit, action=action, person=principal.rate_identity,
                                          tenant=principal.tenant)
        if refusal is None:
            return None
        seconds = refusal.retry_after_seconds
        return 429, _jsonrpc_error(message.get("id"), RATE_LIMITED, refusal.message("this token's account"), {
            "type": problem_type_uri("throttled"), "limit": refusal.rate.text, "retryAfterSeconds": seconds}), [
            (b"retry-after", str(seconds).encode())]

    async def _answer(self, scope, send, message: dict, principal: auth.Principal) -> None:
        """Apply the reply here, whichever process asked: the SDK would drop it (its stateless transport awaits no
        reply). 202 once taken (applied, or refused and asked again on the asking stream); 4xx for an id that is
        not ours, expired or another principal's, nothing applied."""
        if not access.allows(auth.access_of(principal), access.Action.ANSWER):
            header = auth.www_authenticate(_origin_of(scope), error="insufficient_scope", scope=auth.WRITE)
            return await _respond(send, 403, {"error": "insufficient_scope", "error_description": "Answering a "
                                              f"task's question needs the {auth.WRITE!r} scope."},
                                  [(b"www-authenticate", header.encode())])
        try:
            status, body = await in_thread(elicitation.answer_receive, principal, message)
        except DatabaseUnavailable:
            return await _respond(send, 503, _jsonrpc_error(None, -32603, "The database is unavailable; send the "
                                                            "answer again shortly."), [(b"retry-after", b"2")])
        await _respond(send, status, body)

    async def _principal(self, scope) -> auth.Principal | None:
        authorization = _header(scope, b"authorization")
        if authorization is None:
            if settings.MCP_CONFORMANCE_FIXTURES and auth.is_loopback(scope.get("client")):
                return await in_thread(auth.fixture_principal)
            return None
        kind, _, raw = authorization.partition(" ")
        raw = raw.strip()
        if kind.lower() != "bearer" or not raw or " " in raw or not raw.isascii():
            return None
        return await in_thread(auth.principal_for_token, raw, resource=f"{_origin_of(scope)}/mcp")

    async def _metadata(self, scope, send) -> None:
        if not host_allowed(_header(scope, b"host")):
            return await _respond(send, 421, {"error": "misdirected_request"})
        if scope["method"] not in ("GET", "HEAD"):
            return await _respond(send, 405, {"error": "method_not_allowed"}, [(b"allow", b"GET")])
        resource_path = "/runtime" if scope["path"].endswith("/runtime") else "/mcp"
        await _respond(send, 200, auth.protected_resource_metadata(_origin_of(scope), resource_path=resource_path))


def _refusal_2025(message) -> dict | None:
    """A JSON-RPC error for a 2025-11-25 (or unversioned) message the SDK would misread, else None."""
    if not isinstance(message, dict):
        return _jsonrpc_error(None, -32600, "Send one JSON-RPC 2.0 message object per request (no batches).")
    message_id = message.get("id")
    valid_id = isinstance(message_id, (str, int)) and not isinstance(message_id, bool)
    if "id" in message and not valid_id:
        return _jsonrpc_error(None, -32600, "`id` must be a string or an integer.")
    if message.get("jsonrpc") != "2.0":
        return _jsonrpc_error(message_id, -32600, '`jsonrpc` must be "2.0".')
    if "result" in message or "error" in message:
        return None  # a response (to a request of ours): the SDK checks the rest
    if not isinstance(message.get("method"), str):
        return _jsonrpc_error(message_id, -32600, "`method` must be a string naming the method.")
    if "params" in message and not isinstance(message["params"], dict):
        return _jsonrpc_error(message_id, -32600, "`params` must be an object.")
    if message["method"] == "server/discover":
        return _jsonrpc_error(message_id, -32600, f"server/discover is a {MODERN} method: send it with the "
                              f"`MCP-Protocol-Version: {MODERN}` header (without it the request is read as 2025-11-25, "
                              f"which begins with initialize).", {"header": "MCP-Protocol-Version"})
    return None


def _parsed(body: bytes) -> tuple[object, JsonInputError | None]:
    """(the message, None); (None, None) for a body that is not JSON (the SDK answers -32700); (None, why) for one
    refused by config.base.json_input's rules — nested past RUNTIME_MAX_JSON_DEPTH, not UTF-8, a lone surrogate — which
    this endpoint answers -32700 itself, before the SDK parses it again: json.loads raised RecursionError on
    10,000 levels here (a 500), and a lone surrogate reached the task's fingerprint (UnicodeEncodeError)."""
    try:
        return loads(body), None
    except JsonInputError as error:
        return None, (None if error.kind == MALFORMED else error)
