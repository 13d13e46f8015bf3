"""The tenant an OAuth grant or token acts in.

django-oauth-toolkit binds a token to a user, a client, scopes and the RFC 8707 resource; a person of this runtime also
belongs to exactly one tenant, which an API token records (tasks_app.ApiToken.tenant). This row records it for the
toolkit's rows: written by mcp_bridge.oauth.validators in the transaction that creates the grant or token, deleted
with it (CASCADE). A token without one (the toolkit's RFC 7592 registration tokens) is never a principal.
"""

from django.db import models
from django.db.models import Q
from django.db.models.functions import Now

from tasks_app.models import Tenant


class OAuthTenantBinding(models.Model):
    grant = models.OneToOneField("oauth2_provider.Grant", null=True, blank=True, on_delete=models.CASCADE,
                                 related_name="runtime_binding")
    access_token = models.OneToOneField("oauth2_provider.AccessToken", null=True, blank=True,
                                        on_delete=models.CASCADE, related_name="runtime_binding")
    refresh_token = models.OneToOneField("oauth2_provider.RefreshToken", null=True, blank=True,
                                         on_delete=models.CASCADE, related_name="runtime_binding")
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        constraints = [
            # One row binds one thing: a row naming two would be deleted with either and hide which it was.
            models.CheckConstraint(
                condition=(Q(grant__isnull=False, access_token__isnull=True, refresh_token__isnull=True)
                           | Q(grant__isnull=True, access_token__isnull=False, refresh_token__isnull=True)
                           | Q(grant__isnull=True, access_token__isnull=True, refresh_token__isnull=False)),
                name="oauthtenantbinding_binds_one"),
        ]

    def __str__(self) -> str:
        kind = "grant" if self.grant_id else "access token" if self.access_token_id else "refresh token"
        return f"OAuth {kind} #{self.pk} (tenant {self.tenant_id})"


class OAuthClientUse(models.Model):
    """That a client was issued a token (the first time): written by mcp_bridge.oauth.validators with each access
    token (INSERT … ON CONFLICT DO NOTHING), kept after its tokens expire and are cleared. A dynamically registered
    client without one, older than oauth.unused_client_hours, is a registration nobody used: the OAuth cleanup
    deletes it (mcp_bridge.oauth.cleanup) — open registration must not pile up clients (an attacker kept 30 of 30)."""

    application = models.OneToOneField("oauth2_provider.Application", primary_key=True, on_delete=models.CASCADE,
                                       related_name="runtime_use")
    first_token_at = models.DateTimeField(db_default=Now())

    def __str__(self) -> str:
        return f"OAuth client #{self.application_id} used since {self.first_token_at:%Y-%m-%d}"
