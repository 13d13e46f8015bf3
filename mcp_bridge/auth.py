"""Who an MCP request acts as: a bearer token's tenant, user and scopes (ARCHITECTURE §9).

The same tokens as the REST API (tasks_app.ApiToken, checked by the same statement, sql.TOKEN_AUTH: unknown,
revoked, an inactive user or one moved to another tenant are all "invalid"), and the OAuth access tokens of MCP
clients (``aro_…``, mcp_bridge.oauth.tokens: also refused when issued for another resource than this server's /mcp,
RFC 8707), or, configured instead, an external OpenID Connect provider's JWT access tokens (mcp_bridge.oauth.external),
read on every request: nothing about a client is kept in process memory, so any web process answers any
request and a revocation holds at once (an external JWT holds until it expires: its provider is not asked).

Scopes per method (a token lacking one gets 403 insufficient_scope, RFC 6750 §3.1):
- ``tasks:read``: discovery, lists, tasks/get, resources/read, subscriptions/listen, prompts, completions;
- ``tasks:write``: tools/call of a workflow, tasks/update (answers), tasks/cancel;
- ``steer``: the steer_task tool.

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

from mcp_bridge.oauth.external import external_access_lookup, is_external_token
from mcp_bridge.oauth.tokens import is_oauth_access_token, oauth_access_lookup
from tasks_app import access
from tasks_app.audit.actors import actor_name
from tasks_app.models import TOKEN_SCOPES, Tenant
from tasks_app.services import tenant_get_or_create, tenant_membership_ensure
from tasks_app.web.authentication import token_lookup
from tasks_app.web.stream_guard import StreamCredential, api_token_credential

READ, WRITE, STEER = "tasks:read", "tasks:write", "steer"
FIXTURE_TENANT = "mcp-conformance"
STEER_TOOL = "steer_task"
FORK_TOOL = "fork_task"


@dataclass(frozen=True)
class Principal:
    tenant: Tenant
    user: Any
    scopes: frozenset[str]
    # who steering commands and the audit trail name: "token:<prefix>", "oauth:<client>" (never the token itself)
    actor: str
    fixture: bool = field(default=False)  # the conformance fixture tenant (fixture workflows are visible to it)
    # Who this is to the one access rule (tasks_app.access): the token's scopes ∩ its user's role.
    access: access.Actor | None = field(default=None, compare=False)
    # Whose person bucket a request counts in (config.base.rate_limits): "user-<id>" (one per person, across their tokens
    # and session), never a token.
    rate_identity: str = field(default="")
    # What a stream this request opens re-checks (tasks_app.web.stream_guard): the token, never its value; None for
    # the conformance fixture principal (no token).
    credential: StreamCredential | None = field(default=None, compare=False, repr=False)


# The request's principal, set by the endpoint (mcp_bridge.asgi) before the SDK dispatches: the handlers run in
# tasks spawned from the request's own, which copy it.
current_principal: contextvars.ContextVar[Principal] = contextvars.ContextVar("mcp_principal")


_METHOD_ACTIONS = {"tasks/update": access.Action.ANSWER, "tasks/cancel": access.Action.CANCEL}
_TOOL_ACTIONS = {STEER_TOOL: access.Action.STEER, FORK_TOOL: access.Action.FORK}


def action_of(method: Any, params: Any) -> access.Action:
    """What a JSON-RPC method does, for the access rule: a tools/call starts a task (or steers, or forks one),
    tasks/update answers, tasks/cancel cancels; every other method reads."""
    if method == "tools/call":
        name = params.get("name") if isinstance(params, dict) else None
        return _TOOL_ACTIONS.get(name, access.Action.CREATE_TASK)
    return _METHOD_ACTIONS.get(method, access.Action.READ_TASK)


def scope_needed(method: Any, params: Any) -> str:
    """The scope a JSON-RPC method needs (tasks_app.access.RULES); a tools/call of steer_task needs ``steer``."""
    return access.RULES[action_of(method, params)].scope


def access_of(principal: Principal) -> access.Actor:
    """The principal's actor for the access rule; a principal made without one (no role read) is held to its
    scopes, as a member in no role is (tasks_app.access)."""
    return principal.access or access.Actor(name=principal.actor, tenant=principal.tenant, permissions=frozenset(),
                                            scopes=principal.scopes, user=principal.user)


def rate_action(method: Any, params: Any) -> str | None:
    """Which rate limit a JSON-RPC request counts against (config.base.rate_limits), as the REST API's: "create" for a
    tools/call that starts a task (a workflow's, fork_task), "steer" for steer_task, a foreground call's next round
    (its requestState answers the task's question), tasks/update and tasks/cancel; None for the rest."""
    if method == "tools/call" and isinstance(params, dict):
        return "steer" if params.get("name") == STEER_TOOL or params.get("requestState") is not None else "create"
    return "steer" if method in ("tasks/update", "tasks/cancel") else None


def principal_for_token(raw_token: str, *, resource: str) -> Principal | None:
    """The token's principal, or None for an unknown, revoked or otherwise invalid one (one statement). ``resource``:
    this server's MCP URL, the audience an OAuth access token must have been issued for."""
    if is_oauth_access_token(raw_token) or is_external_token(raw_token):
        lookup = oauth_access_lookup if is_oauth_access_token(raw_token) else external_access_lookup
        granted = lookup(raw_token, resource=resource)
        if granted is None:
            return None
        # The one access rule holds an OAuth token as it holds an API token: its scopes ∩ its user's role.
        return Principal(tenant=granted.tenant, user=granted.user, scopes=granted.scopes, actor=granted.actor,
                         fixture=granted.tenant.slug == FIXTURE_TENANT and settings.MCP_CONFORMANCE_FIXTURES,
                         access=access.Actor(name=granted.actor, tenant=granted.tenant, user=granted.user,
                                             permissions=access.permissions_of(granted.user),
                                             scopes=frozenset(granted.scopes)),
                         rate_identity=f"user-{granted.user.pk}",  # (a person's OAuth clients share their limit)
                         credential=granted.stream_credential)
    token = token_lookup(raw_token)
    if token is None:
        return None
    return Principal(tenant=token.tenant, user=token.user, scopes=frozenset(token.scopes),
                     actor=actor_name(token=token), rate_identity=f"user-{token.user.pk}",  # (one bucket per person)
                     fixture=token.tenant.slug == FIXTURE_TENANT and settings.MCP_CONFORMANCE_FIXTURES,
                     access=access.actor_for_token(token), credential=api_token_credential(token.id))


def fixture_principal() -> Principal:
    """The conformance runner's principal (fixture mode, loopback, no Authorization header)."""
    tenant = tenant_get_or_create(slug=FIXTURE_TENANT, name="MCP conformance fixtures")
    user, _ = get_user_model().objects.get_or_create(username=FIXTURE_TENANT, defaults={"is_active": True})
    tenant_membership_ensure(user=user, tenant=tenant)
    return Principal(tenant=tenant, user=user, scopes=frozenset(TOKEN_SCOPES), actor=f"mcp:{FIXTURE_TENANT}",
                     fixture=True, rate_identity=f"user-{user.pk}",
                     access=access.Actor(name=f"mcp:{FIXTURE_TENANT}", tenant=tenant, user=user,
                                         permissions=access.permissions_of(user), scopes=frozenset(TOKEN_SCOPES)))


def is_loopback(client: tuple[str, int] | None) -> bool:
    if not client:
        return False
    try:
        return ipaddress.ip_address(client[0]).is_loopback
    except ValueError:
        return False


def protected_resource_metadata(origin: str, *, resource_path: str = "/mcp") -> dict:
    """RFC 9728 metadata for /.well-known/oauth-protected-resource[/mcp] and …/runtime (the REST API): a token is
    valid only at the resource it was issued for (RFC 8707)."""
    return {
        "resource": f"{origin}{resource_path}",
        "authorization_servers": [settings.MCP_AUTHORIZATION_SERVER or origin],
        "scopes_supported": list(TOKEN_SCOPES),
        "bearer_methods_supported": ["header"],
        "resource_name": "Agent Runtime MCP endpoint" if resource_path == "/mcp" else "Agent Runtime REST API",
    }


def www_authenticate(origin: str, *, error: str | None, scope: str | None = None) -> str:
    """The challenge (RFC 6750 §3, RFC 9728 §5.1); ``error`` None for a request that sent no credentials (§3.1:
    no error code then)."""
    params = [f'error="{error}"'] if error else []
    if scope:
        params.append(f'scope="{scope}"')
    params.append(f'resource_metadata="{origin}/.well-known/oauth-protected-resource/mcp"')
    return "Bearer " + ", ".join(params)
