"""An external OpenID Connect provider's JWT access tokens at /mcp (configured instead of this server's own
authorization server: config/settings/oauth.py, OAUTH_EXTERNAL_*).

A token is accepted when its signature verifies with a key of the provider's JWKS (fetched by PyJWT's client and
cached: a new `kid` is fetched once, a failing fetch cools down), its algorithm is one of OAUTH_EXTERNAL_ALGORITHMS
(never `none`, never a symmetric one the JWKS could be abused for), its `iss` is the provider, its `aud` this
server's MCP URL (RFC 8707: a token for another resource is refused) and it has not expired. It maps to a principal
by claims: the account named by the user claim (active, existing here: nothing is created from a token), acting in
its tenant — a tenant claim, when present, must name that tenant — with the token's scopes that are ours.
"""

from __future__ import annotations

import functools
import hashlib
import logging

import jwt
from django.conf import settings

from mcp_bridge.oauth.tokens import OAuthAccess, expiring_credential
from tasks_app.audit.actors import actor_name
from tasks_app.models import TOKEN_SCOPES, TenantMembership

logger = logging.getLogger(__name__)


def is_external_token(raw_token: str) -> bool:
    return bool(settings.OAUTH_EXTERNAL_JWKS_URL) and raw_token.count(".") == 2


@functools.lru_cache(maxsize=4)
def _jwks(url: str) -> jwt.PyJWKClient:
    return jwt.PyJWKClient(url, cache_keys=True, lifespan=300, timeout=5)


def _scopes(claims: dict) -> frozenset[str]:
    granted = claims.get("scope", claims.get("scp", ""))
    names = granted.split() if isinstance(granted, str) else granted if isinstance(granted, list) else []
    return frozenset(name for name in names if name in TOKEN_SCOPES)


def external_access_lookup(raw_token: str, *, resource: str) -> OAuthAccess | None:
    """The external provider's access token as a principal, or None (any failure: signature, key, issuer, audience,
    expiry, an unknown or inactive account, another tenant). The reason is logged, never the token."""
    try:
        key = _jwks(settings.OAUTH_EXTERNAL_JWKS_URL).get_signing_key_from_jwt(raw_token).key
        claims = jwt.decode(raw_token, key, algorithms=settings.OAUTH_EXTERNAL_ALGORITHMS,
                            audience=settings.OAUTH_EXTERNAL_AUDIENCE or resource,
                            issuer=settings.OAUTH_EXTERNAL_ISSUER or settings.MCP_AUTHORIZATION_SERVER,
                            options={"require": ["exp", "iss", "aud"]}, leeway=30)
    except jwt.PyJWTError as error:
        logger.info("External access token refused: %s", type(error).__name__)
        return None
    username = claims.get(settings.OAUTH_EXTERNAL_USER_CLAIM)
    if not isinstance(username, str) or not username:
        return None
    membership = (TenantMembership.objects.select_related("tenant", "user")
                  .filter(user__username=username, user__is_active=True).first())
    if membership is None:
        return None
    tenant_claim = claims.get(settings.OAUTH_EXTERNAL_TENANT_CLAIM)
    if tenant_claim is not None and tenant_claim != membership.tenant.slug:
        return None
    client = claims.get("client_id") or claims.get("azp") or "external"
    # Its provider is not asked again: a stream it opens ends at its `exp` (tasks_app.web.stream_guard).
    return OAuthAccess(tenant=membership.tenant, user=membership.user, scopes=_scopes(claims),
                       actor=actor_name(oauth_client=str(client)),
                       stream_credential=expiring_credential(
                           f"jwt:{hashlib.sha256(raw_token.encode()).hexdigest()}", float(claims["exp"])))

