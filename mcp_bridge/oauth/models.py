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
