"""OAuth token formats and the one lookup the MCP endpoint calls for them.

Access tokens begin ``aro_`` and refresh tokens ``arr_`` (API tokens ``art_``), so the endpoint knows which table a
bearer token lives in without a second query. The toolkit stores only their sha256 (COMPLIANT_BCP_RFC9700_TOKEN_STORAGE:
the ``token`` column is left blank), as API tokens are stored.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from dataclasses import dataclass, field
from functools import partial
from typing import Any
from urllib.parse import urlsplit

from django.db.models import F
from django.db.models.functions import Now
from oauth2_provider.oauth2_validators import validate_resource_as_url_prefix

from mcp_bridge.oauth.models import OAuthTenantBinding
from tasks_app.audit.actors import actor_name
from tasks_app.models import TOKEN_SCOPES, Tenant
from tasks_app.web.stream_guard import StreamCredential

ACCESS_PREFIX = "aro_"
REFRESH_PREFIX = "arr_"


def access_token_generator(request: Any, *args: Any, **kwargs: Any) -> str:
    return ACCESS_PREFIX + secrets.token_urlsafe(32)


def refresh_token_generator(request: Any, *args: Any, **kwargs: Any) -> str:
    return REFRESH_PREFIX + secrets.token_urlsafe(32)


def is_oauth_access_token(raw_token: str) -> bool:
    return raw_token.startswith(ACCESS_PREFIX)


@dataclass(frozen=True)
class OAuthAccess:
    """A valid OAuth access token, as a principal needs it: never the token itself."""

    tenant: Tenant
    user: Any
    scopes: frozenset[str]
    actor: str  # "oauth:<client>": the client's host (a metadata-document URL) or the start of its client_id
    # What an open stream re-checks (tasks_app.web.stream_guard): this token, until it expires or is revoked.
    stream_credential: StreamCredential | None = field(default=None, compare=False, repr=False)


def client_actor(client_id: str) -> str:
    """How the audit trail and steering name an OAuth client: never a token, never a name the client chose."""
    if client_id.startswith("https://"):
        return actor_name(oauth_client=urlsplit(client_id).hostname)
    return actor_name(oauth_client=client_id[:12])


def oauth_access_lookup(raw_token: str, *, resource: str) -> OAuthAccess | None:
    """The access token ``raw_token`` as a principal, or None: unknown, expired, revoked (deleted), issued for another
    resource than ``resource`` (RFC 8707: this server's MCP URL), its user inactive or no longer a member of the tenant
    it was granted in, or a token with no tenant (a registration token). One statement; nothing cached, so a
    revocation holds at once."""
    checksum = hashlib.sha256(raw_token.encode()).hexdigest()
    binding = (OAuthTenantBinding.objects
               .select_related("tenant", "access_token__user", "access_token__application")
               .filter(access_token__token_checksum=checksum, access_token__expires__gt=Now(),
                       access_token__user__is_active=True,
                       access_token__user__tenant_membership__tenant=F("tenant"))
               .first())
    if binding is None:
        return None
    token = binding.access_token
    # A token without a resource would be good for any audience: ours always carry one (the authorization endpoint
    # defaults it), so none here is refused as well as a foreign one.
    if not token.resource or not validate_resource_as_url_prefix(resource, token.resource):
        return None
    return OAuthAccess(tenant=binding.tenant, user=token.user,
                       scopes=frozenset(scope for scope in token.scope.split() if scope in TOKEN_SCOPES),
                       actor=client_actor(token.application.client_id if token.application else "unknown"),
                       stream_credential=StreamCredential(key=f"oauth:{checksum}",
                                                          remaining=partial(oauth_access_remaining, checksum),
                                                          expires_at=token.expires.timestamp()))


def oauth_access_remaining(checksum: str) -> float | None:
    """For a stream the token opened (tasks_app.web.stream_guard): the seconds until the access token whose sha256
    is ``checksum`` expires, on the database's clock (≤ 0: expired), while it is otherwise valid — not revoked
    (deleted), its user active and still a member of the tenant it was granted in — else None. One statement, by
    the token's unique checksum."""
    row = (OAuthTenantBinding.objects
           .filter(access_token__token_checksum=checksum, access_token__user__is_active=True,
                   access_token__user__tenant_membership__tenant=F("tenant"))
           .annotate(now=Now()).values_list("access_token__expires", "now").first())
    if row is None:
        return None
    expires, now = row
    return (expires - now).total_seconds()


def expiring_credential(key: str, expires_at: float) -> StreamCredential:
    """A token nothing here can revoke (an external provider's JWT): valid until ``expires_at`` (epoch seconds)."""
    return StreamCredential(key=key, remaining=lambda: expires_at - time.time(), expires_at=expires_at)
