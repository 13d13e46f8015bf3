"""django-oauth-toolkit's validator, narrowed to what MCP clients need and bound to our tenants.

- Grants: authorization code (PKCE S256, the toolkit's settings enforce it) and refresh; response type ``code`` only.
- Tenants: the consent's grant is bound to the person's tenant (TenantMembership) when it is created; the code's
  tokens inherit the grant's tenant, a refresh's tokens the refresh token's. A person moved to another tenant since
  cannot redeem or refresh (the lookup refuses their tokens too: mcp_bridge.oauth.tokens).
- Audit: a revocation (RFC 7009) is recorded with the revoking client as actor, in the transaction that revokes.
- Redirect URIs: a code goes only to an https URI or http on loopback (mcp_bridge.oauth.redirects), whatever the
  client's registration says — refused without a redirect (the error page), never sent there.
- Use: a client's first token marks it used (OAuthClientUse): a registration never used is deleted after
  oauth.unused_client_hours (mcp_bridge.oauth.cleanup).
Every binding is written in the toolkit's own transaction (save_bearer_token is atomic; the grant's in the consent
view's), so a token never exists without its tenant.
"""

from __future__ import annotations

import hashlib

from django.db import transaction
from oauth2_provider.models import AccessToken, RefreshToken
from oauth2_provider.oauth2_validators import OAuth2Validator
from oauthlib.oauth2.rfc6749 import errors

from mcp_bridge.oauth.models import OAuthClientUse, OAuthTenantBinding
from mcp_bridge.oauth.redirects import redirect_uri_error
from mcp_bridge.oauth.tokens import client_actor
from tasks_app.models import TenantMembership
from tasks_app.services import admin_action_record

_GRANT_TYPES = frozenset({"authorization_code", "refresh_token"})


def member_tenant_id(user) -> int | None:
    """The tenant a person acts in (a person belongs to one), or None."""
    if user is None or not getattr(user, "pk", None):
        return None
    return TenantMembership.objects.filter(user_id=user.pk).values_list("tenant_id", flat=True).first()


class RuntimeOAuth2Validator(OAuth2Validator):
    def validate_grant_type(self, client_id, grant_type, client, request, *args, **kwargs):
        # client_credentials would mint a token for no person; password and implicit are gone in OAuth 2.1.
        return grant_type in _GRANT_TYPES and super().validate_grant_type(
            client_id, grant_type, client, request, *args, **kwargs)

    def validate_response_type(self, client_id, response_type, client, request, *args, **kwargs):
        return response_type == "code" and super().validate_response_type(
            client_id, response_type, client, request, *args, **kwargs)

    # -- redirect URIs: https or loopback only ------------------------------------------------------------------
    def validate_redirect_uri(self, client_id, redirect_uri, request, *args, **kwargs):
        """The toolkit's rule (a URI the client registered), then ours. A refusal is fatal: the person sees the error
        page and nothing is sent to the URI (oauthlib's InvalidRedirectURIError is never redirected)."""
        if not super().validate_redirect_uri(client_id, redirect_uri, request, *args, **kwargs):
            return False
        _refuse_redirect(redirect_uri, request)
        return True

    def get_default_redirect_uri(self, client_id, request, *args, **kwargs):
        """The client's only registered URI when the request names none: held to the same rule."""
        uri = super().get_default_redirect_uri(client_id, request, *args, **kwargs)
        if uri:
            _refuse_redirect(uri, request)
        return uri

    # -- tenants -----------------------------------------------------------------------------------------------
    def _create_authorization_code(self, request, code, expires=None):
        tenant_id = member_tenant_id(request.user)
        if tenant_id is None:  # (the consent view refuses first; this holds if another caller forgets)
            raise errors.AccessDeniedError(description="Your account belongs to no tenant.", request=request)
        grant = super()._create_authorization_code(request, code, expires)
        OAuthTenantBinding.objects.create(grant=grant, tenant_id=tenant_id)
        return grant

    def validate_code(self, client_id, code, client, request, *args, **kwargs):
        if not super().validate_code(client_id, code, client, request, *args, **kwargs):
            return False
        tenant_id = (OAuthTenantBinding.objects.filter(grant__code=code, grant__application=client)
                     .values_list("tenant_id", flat=True).first())
        return self._bind_request(request, tenant_id)

    def validate_refresh_token(self, refresh_token, client, request, *args, **kwargs):
        if not super().validate_refresh_token(refresh_token, client, request, *args, **kwargs):
            return False
        tenant_id = (OAuthTenantBinding.objects.filter(refresh_token=request.refresh_token_instance)
                     .values_list("tenant_id", flat=True).first())
        return self._bind_request(request, tenant_id)

    @staticmethod
    def _bind_request(request, tenant_id: int | None) -> bool:
        """Remember the tenant the tokens about to be made act in; refuse (invalid_grant) a grant or refresh token
        with none, or one whose person is no longer a member of it."""
        if tenant_id is None or member_tenant_id(request.user) != tenant_id:
            return False
        request.runtime_tenant_id = tenant_id
        return True

    def _create_access_token(self, expires, request, token, source_refresh_token=None):
        access_token = super()._create_access_token(expires, request, token, source_refresh_token)
        OAuthTenantBinding.objects.create(access_token=access_token, tenant_id=self._tenant_of(request))
        # The client is in use: never removed as an unused registration. One INSERT … ON CONFLICT DO NOTHING.
        OAuthClientUse.objects.bulk_create([OAuthClientUse(application_id=access_token.application_id)],
                                           ignore_conflicts=True)
        return access_token

    def _create_refresh_token(self, request, refresh_token_code, access_token, previous_refresh_token):
        refresh_token = super()._create_refresh_token(request, refresh_token_code, access_token,
                                                      previous_refresh_token)
        OAuthTenantBinding.objects.create(refresh_token=refresh_token, tenant_id=self._tenant_of(request))
        return refresh_token

    @staticmethod
    def _tenant_of(request) -> int:
        tenant_id = getattr(request, "runtime_tenant_id", None)
        if tenant_id is None:  # only the two grants above make tokens here; anything else is a bug: refuse loudly
            raise errors.InvalidGrantError(description="This grant is bound to no tenant.", request=request)
        return tenant_id

    # -- revocation, recorded ----------------------------------------------------------------------------------
    def revoke_token(self, token, token_type_hint, request, *args, **kwargs):
        """RFC 7009, as the toolkit does it (only the requesting client's tokens; a refresh token's access token
        goes with it), recorded for the audit trail in the same transaction: by the client, naming the binding of
        what was revoked (its tenant)."""
        application_pk = getattr(request.client, "pk", None)
        checksum = hashlib.sha256(token.encode()).hexdigest()
        with transaction.atomic():
            if application_pk is not None:
                bindings = list(OAuthTenantBinding.objects.filter(
                    access_token__in=AccessToken.objects.filter(token_checksum=checksum,
                                                                application_id=application_pk)))
                bindings += OAuthTenantBinding.objects.filter(
                    refresh_token__in=RefreshToken.objects.filter(token_checksum=checksum, revoked__isnull=True,
                                                                  application_id=application_pk))
                for binding in bindings:
                    admin_action_record(actor=client_actor(request.client.client_id), action="oauth_revoke",
                                        obj=binding, message="Revoked through the revocation endpoint (RFC 7009): "
                                        "the token, and its access or refresh token, are refused from now on.")
            super().revoke_token(token, token_type_hint, request, *args, **kwargs)


def _refuse_redirect(uri: str, request) -> None:
    error = redirect_uri_error(uri)
    if error is not None:
        raise errors.InvalidRedirectURIError(description=error[0].upper() + error[1:], request=request)
