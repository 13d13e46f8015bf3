"""API authentication: bearer tokens (stored hashed) and Django sessions; every request acts in one tenant."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import exceptions
from rest_framework.authentication import BaseAuthentication, SessionAuthentication, get_authorization_header
from rest_framework.permissions import BasePermission
from rest_framework.settings import api_settings

from config.base.rate_limits import person_identity, rate_limits_hit
from tasks_app import access
from tasks_app.audit.actors import actor_name
from tasks_app.db import sql
from tasks_app.db.prepared import json_value, prepared_fetchone
from tasks_app.errors import RateLimited
from tasks_app.models import ApiToken, Tenant, TenantMembership
from tasks_app.services import token_hash


def token_lookup(raw_token: str) -> ApiToken | None:
    """The valid token ``raw_token`` with its user and tenant (one prepared statement, sql.TOKEN_AUTH), or None for an
    unknown, revoked or otherwise invalid one. Shared by the API and the MCP endpoint; nothing is cached, so a
    revocation holds at once."""
    row = prepared_fetchone(sql.TOKEN_AUTH, {"token_hash": token_hash(raw_token)})
    if row is None:
        return None
    token_id, prefix, scopes, rest, permissions = row[0], row[1], row[2], row[3:-1], row[-1]
    users = len(sql.TOKEN_AUTH_USER_FIELDS)
    user = get_user_model()(**dict(zip(sql.TOKEN_AUTH_USER_FIELDS, rest[:users])))
    # Read by the same statement, kept where tasks_app.access.permissions_of looks first.
    user._access_permissions = frozenset(permissions or ())
    tenant_fields = dict(zip(sql.TOKEN_AUTH_TENANT_FIELDS, rest[users:]))
    tenant_fields["workflows"] = json_value(tenant_fields.get("workflows"))  # (jsonb is text on a raw cursor)
    return ApiToken(id=token_id, prefix=prefix, tenant=Tenant(**tenant_fields), user=user, scopes=json_value(scopes))


class BearerTokenAuthentication(BaseAuthentication):
    """``Authorization: Bearer art_…``: one prepared statement (sql.TOKEN_AUTH) finds the token by its sha256 with
    its user and tenant, checks it is not revoked and the user active and still a member; no cache to outlive a
    revocation. Not through the ORM: select_related, compiled per request, cost more CPU than the statement
    (figures: docs/performance.md).

    A bearer token of another kind is left to the configured authentication class that ``claims_token`` it (an
    OAuth access token, ``aro_…``: mcp_bridge.oauth.rest, listed after this one). Only a class that is listed
    claims: without one, such a token is refused here as any unknown token is (fails closed)."""

    keyword = b"bearer"

    def authenticate(self, request):
        parts = get_authorization_header(request).split()
        if parts and parts[0].lower() == b"token":  # DRF's usual scheme: say which one this API uses
            raise exceptions.AuthenticationFailed("Use `Authorization: Bearer <token>`; the `Token` scheme is not "
                                                  "supported.")
        if not parts:
            return None
        if parts[0].lower() != self.keyword:
            if len(parts) == 1:  # a bare token (`Authorization: art_…`), the usual slip: say what to add
                raise exceptions.AuthenticationFailed("The Authorization header needs the `Bearer ` prefix: send "
                                                      "`Authorization: Bearer <token>`.")
            raise exceptions.AuthenticationFailed(f"The {parts[0].decode('ascii', 'replace')!r} scheme is not "
                                                  f"supported: send `Authorization: Bearer <token>`.")
        if len(parts) != 2:
            raise exceptions.AuthenticationFailed("Malformed Authorization header: use `Bearer <token>`.")
        try:
            raw = parts[1].decode("ascii")
        except UnicodeDecodeError:
            raise exceptions.AuthenticationFailed("Malformed token.") from None
        if claimed_elsewhere(raw):
            return None
        token = token_lookup(raw)
        # One message for unknown, revoked and inactive: nothing to learn about which tokens exist.
        if token is None:
            raise exceptions.AuthenticationFailed("Invalid or revoked token.")
        request._runtime_tenant = token.tenant
        return token.user, token

    def authenticate_header(self, request):
        return 'Bearer realm="runtime"'


def claimed_elsewhere(raw_token: str) -> bool:
    """Whether a configured authentication class other than BearerTokenAuthentication answers for this token (an
    OAuth access token's: mcp_bridge.oauth.rest): not one to look up among API tokens."""
    return any(authenticator is not BearerTokenAuthentication and hasattr(authenticator, "claims_token")
               and authenticator.claims_token(raw_token)
               for authenticator in api_settings.DEFAULT_AUTHENTICATION_CLASSES)


def bearer_authenticate(request):
    """(user, credential) for the request's ``Authorization`` header by the configured authentication classes
    (sessions aside: the caller reads those), or None without one; AuthenticationFailed for a bad one. For views
    outside DRF (the event stream) that accept what the REST API accepts."""
    for authenticator in api_settings.DEFAULT_AUTHENTICATION_CLASSES:
        if issubclass(authenticator, SessionAuthentication):
            continue
        found = authenticator().authenticate(request)
        if found is not None:
            return found
    return None


def request_tenant(request):
    """The tenant a request acts in: the token's, or the signed-in user's membership."""
    tenant = getattr(request, "_runtime_tenant", None)
    if tenant is not None:
        return tenant
    try:
        tenant = TenantMembership.objects.select_related("tenant").get(user=request.user).tenant
    except TenantMembership.DoesNotExist:
        return None
    request._runtime_tenant = tenant
    return tenant


# -- the access rule (tasks_app.access) for the REST API: these two classes only call it ----------------------------
# The action of each method: a view names its own (``access_actions``); by default reads read the task, writes create.
_DEFAULT_ACTIONS = {"GET": access.Action.READ_TASK, "HEAD": access.Action.READ_TASK,
                    "OPTIONS": access.Action.READ_TASK}


class IsTenantMember(BasePermission):
    """Authenticated and acting in a tenant (the token's, or the person's membership); views then scope every query
    to ``request.tenant``."""

    message = "Your account belongs to no tenant; ask an operator to add it to one."

    def has_permission(self, request, view) -> bool:
        if not (request.user and request.user.is_authenticated):
            return False
        actor = access.actor_for_request(request)
        if actor.tenant is None:
            return False
        request._runtime_tenant = request.tenant = actor.tenant
        return True


class HasTokenScope(BasePermission):
    """The one access rule (tasks_app.access.access_check) for the view's action (``access_actions`` per method):
    for a view of one task (a ``task_id`` in its URL) the task is read here, in the actor's tenant — another
    tenant's is a 404 before anything else is checked — and kept for the view (``_task_or_404``)."""

    def has_permission(self, request, view) -> bool:
        actor = access.actor_for_request(request)
        action = getattr(view, "access_actions", {}).get(request.method) \
            or _DEFAULT_ACTIONS.get(request.method, access.Action.CREATE_TASK)
        task_id = getattr(view, "kwargs", {}).get("task_id")
        try:
            if task_id is not None:
                request.access_task = access.task_for(actor, action, task_id)
            else:
                access.access_check(actor, action)
        except access.AccessNotFound:
            raise exceptions.NotFound(f"No task {task_id}.") from None
        except access.AccessDenied as denied:
            self.message = denied.detail
            return False
        return True


class BearerTokenScheme(OpenApiAuthenticationExtension):
    """Documents the bearer token in the OpenAPI schema (and the docs page's Authorize button)."""

    target_class = BearerTokenAuthentication
    name = "bearerToken"

    def get_security_definition(self, auto_schema):
        return {"type": "http", "scheme": "bearer",
                "description": "An API token from `python3.11 deploy/dev.py manage create_api_token --tenant T "
                               "--user U` (`art_…`), or an OAuth access token (`aro_…`) issued for this API's "
                               "resource, this origin + `/runtime` (RFC 8707; the authorization server's metadata: "
                               "/.well-known/oauth-authorization-server, this API's: "
                               "/.well-known/oauth-protected-resource/runtime). Both are held to the same access "
                               "rule: the token's scopes and its user's role."}


def requested_by_of(request) -> str:
    """Who a request is, as a command's requested_by: the bearer token's prefix (never the token), an OAuth
    token's client (``oauth:<client>``, never the token), else the session's user. One naming for every actor the
    audit trail shows (its actor filter finds `user:alice`); an interface concern: the services take the name, never
    the request."""
    token = getattr(request, "auth", None)
    if token is not None and getattr(token, "actor_name", ""):
        return token.actor_name  # (an OAuth token's, made by tasks_app.audit.actors.actor_name)
    if token is not None and getattr(token, "prefix", ""):
        return actor_name(token=token)
    return actor_name(user=request.user)


def rate_identity_of(request) -> str:
    """Whose person bucket a request counts in (config.base.rate_limits.person_identity): the account behind it, whether
    it came signed in or with any token of its (API or OAuth) — one bucket per person. Never the token itself."""
    user = getattr(request, "user", None)
    token = getattr(request, "auth", None)
    return person_identity(user if user is not None and user.is_authenticated else None,
                           token_id=getattr(token, "id", None))


def rate_limit_check(request, action: str, *, tenant=None, cost: int = 1) -> None:
    """Count the request (``cost`` times: a bulk action's commands) against its person's ``action`` rate ("create",
    "steer": config.base.rate_limits) — the tenant's own per-person limit when it set one — and the tenant-wide one, or
    raise RateLimited (429, Retry-After). ``tenant``: the tenant acted in (the task's, for staff of no tenant in the
    admin), else the request's. REST views and the admin's forms call it first, before anything is written."""
    tenant = tenant if tenant is not None else getattr(request, "tenant", None) or request_tenant(request)
    refusal = rate_limits_hit(action=action, person=rate_identity_of(request), tenant=tenant, cost=cost)
    if refusal is not None:
        who = "this token's account" if getattr(request, "auth", None) is not None else "your account"
        raise RateLimited(refusal.message(who), wait=refusal.retry_after_seconds, limit=refusal.rate.text,
                          retryAfterSeconds=refusal.retry_after_seconds, bucket=refusal.bucket)
