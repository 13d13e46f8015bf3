"""API authentication: bearer tokens (stored hashed) and Django sessions; every request acts in one tenant."""

from __future__ import annotations

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import exceptions
from rest_framework.authentication import BaseAuthentication, get_authorization_header
from rest_framework.permissions import BasePermission

from tasks_app.models import ApiToken, TenantMembership
from tasks_app.services import token_hash


class BearerTokenAuthentication(BaseAuthentication):
    """``Authorization: Bearer art_…``: one indexed lookup by the token's sha256, with its user and tenant."""

    keyword = b"bearer"

    def authenticate(self, request):
        parts = get_authorization_header(request).split()
        if not parts or parts[0].lower() != self.keyword:
            return None
        if len(parts) != 2:
            raise exceptions.AuthenticationFailed("Malformed Authorization header: use `Bearer <token>`.")
        try:
            raw = parts[1].decode("ascii")
        except UnicodeDecodeError:
            raise exceptions.AuthenticationFailed("Malformed token.") from None
        token = (
            ApiToken.objects.select_related("user", "tenant", "user__tenant_membership")
            .filter(token_hash=token_hash(raw), revoked_at__isnull=True)
            .first()
        )
        # One message for unknown, revoked and inactive: nothing to learn about which tokens exist.
        if token is None or not token.user.is_active or not self._still_member(token):
            raise exceptions.AuthenticationFailed("Invalid or revoked token.")
        request._runtime_tenant = token.tenant
        return token.user, token

    @staticmethod
    def _still_member(token: ApiToken) -> bool:
        try:
            return token.user.tenant_membership.tenant_id == token.tenant_id
        except TenantMembership.DoesNotExist:
            return False

    def authenticate_header(self, request):
        return 'Bearer realm="runtime"'


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


class IsTenantMember(BasePermission):
    """Authenticated and belonging to a tenant; views then scope every query to ``request.tenant``."""

    message = "Your account belongs to no tenant; ask an operator to add it to one."

    def has_permission(self, request, view) -> bool:
        if not (request.user and request.user.is_authenticated):
            return False
        tenant = request_tenant(request)
        if tenant is None:
            return False
        request.tenant = tenant
        return True


class BearerTokenScheme(OpenApiAuthenticationExtension):
    """Documents the bearer token in the OpenAPI schema (and the docs page's Authorize button)."""

    target_class = BearerTokenAuthentication
    name = "bearerToken"

    def get_security_definition(self, auto_schema):
        return {"type": "http", "scheme": "bearer",
                "description": "A token from `python manage.py create_api_token --tenant T --user U`."}
