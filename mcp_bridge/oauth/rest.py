"""OAuth access tokens (``aro_…``) on the REST API, and so for the CLI and the Python client (tasks_app.client), which
send ``Authorization: Bearer`` as they do with an API token.

Audience (RFC 8707): the authorization server issues a token for this origin's ``/mcp``, its ``/runtime`` (the REST
API), or both, as the client asks (mcp_bridge.oauth.views.resources_of), and a token is valid only at an endpoint
its resource names: one issued for /mcp is a 401 here, one for /runtime a 401 at /mcp (mcp_bridge.oauth.tokens'
lookup checks it for both). The REST API's protected-resource metadata is /.well-known/oauth-protected-resource/runtime
(RFC 9728, one document per resource: mcp_bridge.asgi).

The same access rule as an API token (tasks_app.access.actor_for_token): the token's scopes ∩ its user's role, in the
tenant it was granted in; commands and the audit trail name it ``oauth:<client>``, never the token.

Listed in REST_FRAMEWORK's DEFAULT_AUTHENTICATION_CLASSES after tasks_app's BearerTokenAuthentication, which leaves to
a listed class the tokens that class ``claims_token`` (tasks_app must not import this layer; tests/test_layers.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import exceptions
from rest_framework.authentication import BaseAuthentication, get_authorization_header

from mcp_bridge.oauth.tokens import is_oauth_access_token, oauth_access_lookup
from mcp_bridge.oauth.views import runtime_resource
from tasks_app.models import Tenant
from tasks_app.web.stream_guard import StreamCredential


@dataclass(frozen=True)
class OAuthCredential:
    """``request.auth`` for an OAuth access token: what the access rule reads (tasks_app.access.actor_for_token:
    tenant, user, scopes, actor_name), never the token itself."""

    tenant: Tenant
    user: Any
    scopes: frozenset[str]
    actor_name: str  # "oauth:<client>"
    # What an event stream the token opens re-checks (tasks_app.web.stream_guard.credential_of reads it).
    stream_credential: StreamCredential | None = field(default=None, compare=False, repr=False)


class OAuthAccessTokenAuthentication(BaseAuthentication):
    """``Authorization: Bearer aro_…`` for /runtime/…: one statement (mcp_bridge.oauth.tokens.oauth_access_lookup)
    finds the token by its sha256, unexpired, for this API's resource, its user active and still a member of the
    tenant it was granted in; nothing cached, so a revocation holds at once."""

    @staticmethod
    def claims_token(raw_token: str) -> bool:
        """Whether this class answers for ``raw_token`` (BearerTokenAuthentication leaves it to this class)."""
        return is_oauth_access_token(raw_token)

    def authenticate(self, request):
        parts = get_authorization_header(request).split()
        if len(parts) != 2 or parts[0].lower() != b"bearer":
            return None  # (BearerTokenAuthentication, listed first, has said what is wrong with the header)
        try:
            raw = parts[1].decode("ascii")
        except UnicodeDecodeError:
            return None
        if not is_oauth_access_token(raw):
            return None
        granted = oauth_access_lookup(raw, resource=runtime_resource(request))
        # One message for unknown, expired, revoked and another resource's: nothing to learn about which exist.
        if granted is None:
            raise exceptions.AuthenticationFailed(
                f"Invalid, expired or revoked OAuth token, or one not issued for this API "
                f"(resource {runtime_resource(request)}).")
        request._runtime_tenant = granted.tenant
        return granted.user, OAuthCredential(tenant=granted.tenant, user=granted.user, scopes=granted.scopes,
                                             actor_name=granted.actor, stream_credential=granted.stream_credential)

    def authenticate_header(self, request):
        return 'Bearer realm="runtime"'


class OAuthAccessTokenScheme(OpenApiAuthenticationExtension):
    """Documents OAuth in the OpenAPI schema: the authorization code flow (PKCE S256) of this server's authorization
    server, for a token whose resource is this API."""

    target_class = OAuthAccessTokenAuthentication
    name = "oauth2"

    def get_security_definition(self, auto_schema):
        return {"type": "oauth2",
                "description": "An OAuth 2.1 access token (`aro_…`, sent as `Authorization: Bearer`) issued for this "
                               "API: authorization code with PKCE S256 and `resource` = this origin + `/runtime` "
                               "(RFC 8707; a token for `/mcp` is refused here). The same access rule as an API "
                               "token: the token's scopes and its user's role.",
                "flows": {"authorizationCode": {
                    "authorizationUrl": "/oauth/authorize/", "tokenUrl": "/oauth/token/", "refreshUrl": "/oauth/token/",
                    "scopes": dict(settings.OAUTH2_PROVIDER["SCOPES"])}}}
