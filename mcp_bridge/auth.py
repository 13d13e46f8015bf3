"""Who an MCP request acts as: a bearer token's tenant, user and scopes (ARCHITECTURE §9).

The same tokens as the REST API (tasks_app.ApiToken, checked by the same statement, sql.TOKEN_AUTH: unknown,
revoked, an inactive user or one moved to another tenant are all "invalid"), read on every request: nothing about a
client is kept in process memory, so any web process answers any request and a revocation holds at once.

Scopes per method (a token lacking one gets 403 insufficient_scope, RFC 6750 §3.1):
- ``tasks:read``: discovery, lists, tasks/get, resources/read, subscriptions/listen, prompts, completions;
- ``tasks:write``: tools/call of a workflow, tasks/update (answers), tasks/cancel;
- ``steer``: the steer_task tool.

Rate limits (config.rate_limits, per token, as for the REST API): creating tasks and steering them (rate_action) over
the limit is refused at the endpoint, before the SDK sees the message: HTTP 429 with Retry-After and a JSON-RPC error
(mcp_bridge.asgi.RATE_LIMITED).

Conformance fixture mode (MCP_CONFORMANCE_FIXTURES=1, never on by default): the official conformance runner sends
no credentials, so a request from loopback *without* an Authorization header acts in the dedicated fixture tenant.
A header that is present is still verified (a bad one is a 401), and a non-loopback peer always needs a token.
"""

from __future__ import annotations

import contextvars
import ipaddress
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model

from tasks_app.models import TOKEN_SCOPES, Tenant
from tasks_app.services import tenant_get_or_create, tenant_membership_ensure
from tasks_app.web.authentication import token_lookup

READ, WRITE, STEER = "tasks:read", "tasks:write", "steer"
FIXTURE_TENANT = "mcp-conformance"
STEER_TOOL = "steer_task"
FORK_TOOL = "fork_task"
_WRITE_METHODS = frozenset({"tools/call", "tasks/update", "tasks/cancel"})


@dataclass(frozen=True)
class Principal:
    tenant: Tenant
    user: Any
    scopes: frozenset[str]
    actor: str  # who steering commands and the audit trail name: "token:<prefix>" (never the token itself)
    fixture: bool = field(default=False)  # the conformance fixture tenant (fixture workflows are visible to it)
    # Whose rate limits a request counts against (config.rate_limits): "token-<id>", never the token itself.
    rate_identity: str = field(default="")


# The request's principal, set by the endpoint (mcp_bridge.asgi) before the SDK dispatches: the handlers run in
# tasks spawned from the request's own, which copy it.
current_principal: contextvars.ContextVar[Principal] = contextvars.ContextVar("mcp_principal")


def scope_needed(method: Any, params: Any) -> str:
    """The scope a JSON-RPC method needs; a tools/call of steer_task needs ``steer``."""
    if method == "tools/call" and isinstance(params, dict) and params.get("name") == STEER_TOOL:
        return STEER
    return WRITE if method in _WRITE_METHODS else READ


def rate_action(method: Any, params: Any) -> str | None:
    """Which rate limit a JSON-RPC request counts against (config.rate_limits), as the REST API's: "create" for a
    tools/call that starts a task (a workflow's, fork_task), "steer" for steer_task, a foreground call's next round
    (its requestState answers the task's question), tasks/update and tasks/cancel; None for the rest."""
    if method == "tools/call" and isinstance(params, dict):
        return "steer" if params.get("name") == STEER_TOOL or params.get("requestState") is not None else "create"
    return "steer" if method in ("tasks/update", "tasks/cancel") else None


def principal_for_token(raw_token: str) -> Principal | None:
    """The token's principal, or None for an unknown, revoked or otherwise invalid one (one statement)."""
    token = token_lookup(raw_token)
    if token is None:
        return None
    return Principal(tenant=token.tenant, user=token.user, scopes=frozenset(token.scopes),
                     actor=f"token:{token.prefix}", rate_identity=f"token-{token.id}",
                     fixture=token.tenant.slug == FIXTURE_TENANT and settings.MCP_CONFORMANCE_FIXTURES)


def fixture_principal() -> Principal:
    """The conformance runner's principal (fixture mode, loopback, no Authorization header)."""
    tenant = tenant_get_or_create(slug=FIXTURE_TENANT, name="MCP conformance fixtures")
    user, _ = get_user_model().objects.get_or_create(username=FIXTURE_TENANT, defaults={"is_active": True})
    tenant_membership_ensure(user=user, tenant=tenant)
    return Principal(tenant=tenant, user=user, scopes=frozenset(TOKEN_SCOPES), actor=f"mcp:{FIXTURE_TENANT}",
                     fixture=True, rate_identity=f"user-{user.pk}")


def is_loopback(client: tuple[str, int] | None) -> bool:
    if not client:
        return False
    try:
        return ipaddress.ip_address(client[0]).is_loopback
    except ValueError:
        return False


def protected_resource_metadata(origin: str) -> dict:
    """RFC 9728 metadata for /.well-known/oauth-protected-resource[/mcp]."""
    return {
        "resource": f"{origin}/mcp",
        "authorization_servers": [settings.MCP_AUTHORIZATION_SERVER or origin],
        "scopes_supported": list(TOKEN_SCOPES),
        "bearer_methods_supported": ["header"],
        "resource_name": "Agent Runtime MCP endpoint",
    }


def www_authenticate(origin: str, *, error: str, scope: str | None = None) -> str:
    value = f'Bearer error="{error}"'
    if scope:
        value += f', scope="{scope}"'
    return value + f', resource_metadata="{origin}/.well-known/oauth-protected-resource/mcp"'
