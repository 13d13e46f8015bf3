"""OAuth access tokens made directly, for tests that need one without the flow (tests/test_oauth.py walks it)."""

from __future__ import annotations

import secrets
from datetime import timedelta

from django.utils import timezone
from oauth2_provider.models import AccessToken, Application

from mcp_bridge.oauth.models import OAuthTenantBinding

CALLBACK = "http://127.0.0.1:8976/callback"  # (nothing listens: the test reads the redirect itself)


def issued_token(user, tenant, resource: list[str], *, application=None, scope="tasks:read tasks:write steer",
                 expires_in=timedelta(hours=1)) -> str:
    """An access token as the token endpoint makes one (hashed, bound to the tenant), made directly: fast."""
    if application is None:
        application = Application.objects.create(name="Desk client", client_type="public", redirect_uris=CALLBACK,
                                                 authorization_grant_type="authorization-code")
    raw = "aro_" + secrets.token_urlsafe(24)
    token = AccessToken(user=user, application=application, scope=scope, resource=resource,
                        expires=timezone.now() + expires_in)
    token._raw_token, token.token = raw, ""
    token.save()
    OAuthTenantBinding.objects.create(access_token=token, tenant=tenant)
    return raw
