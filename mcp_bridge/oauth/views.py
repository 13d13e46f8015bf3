"""The authorization server's pages and endpoints (django-oauth-toolkit's views, narrowed; thin).

- ConsentView (/oauth/authorize/): sign in first (SignInView, the admin's login page's look, for any active person —
  the admin's own refuses non-staff); a person in no tenant gets a page saying so, never a grant; PKCE must be S256;
  `resource` must be this server's MCP URL or its REST API's (RFC 8707: origin + /mcp, origin + /runtime; absent,
  the MCP URL by default; a token is valid only at the endpoint its resource names); the page, in the admin's look,
  names the client (and its document's host), the tenant, the scopes and the resource; an allowed consent is recorded
  for the audit trail in the transaction that creates the grant.
- RegistrationView (/oauth/register/, RFC 7591): authorization code clients only; the registration recorded with the
  actor `oauth-registration` in the transaction that creates the client.
- The token and revocation endpoints are the toolkit's (revocation recorded by the validator).
"""

from __future__ import annotations

import json
from urllib.parse import parse_qs, urlsplit

from django.contrib import admin
from django.contrib.auth.views import LoginView
from django.db import transaction
from django.http import JsonResponse
from django.urls import reverse_lazy
from oauth2_provider.exceptions import OAuthToolkitError
from oauth2_provider.models import get_application_model
from oauth2_provider.views import AuthorizationView
from oauth2_provider.views.dynamic_client_registration import (
    DynamicClientRegistrationManagementView,
    DynamicClientRegistrationView,
)
from oauthlib.oauth2.rfc6749.errors import CustomOAuth2Error, InvalidRequestError

from mcp_bridge.oauth.models import OAuthTenantBinding
from mcp_bridge.oauth.tokens import client_actor
from mcp_bridge.oauth.validators import member_tenant_id
from tasks_app.models import Tenant
from tasks_app.services import admin_action_record

_REGISTRABLE_GRANTS = frozenset({"authorization_code", "refresh_token"})


def mcp_resource(request) -> str:
    """This server's MCP URL, the default resource of its tokens (what /.well-known/oauth-protected-resource names:
    the request's own origin, as mcp_bridge.asgi derives it)."""
    return f"{request.scheme}://{request.get_host()}/mcp"


def runtime_resource(request) -> str:
    """This server's REST API (/runtime/…: the CLI, the Python client), the other resource a token may be for
    (/.well-known/oauth-protected-resource/runtime)."""
    return f"{request.scheme}://{request.get_host()}/runtime"


def resources_of(request) -> tuple[str, str]:
    """The resources this server issues tokens for (RFC 8707): a token is valid only at the one(s) it names."""
    return mcp_resource(request), runtime_resource(request)


def _canonical(uri: str) -> tuple | None:
    parts = urlsplit(uri)
    if not parts.scheme or not parts.hostname or parts.username or parts.password or "#" in uri or parts.query:
        return None
    try:
        port = parts.port or {"http": 80, "https": 443}.get(parts.scheme.lower())
    except ValueError:
        return None
    return parts.scheme.lower(), parts.hostname.lower(), port, parts.path.rstrip("/")


def resource_allowed(request, resource: str) -> bool:
    canonical = _canonical(resource)
    return canonical is not None and canonical in {_canonical(ours) for ours in resources_of(request)}


def _admin_context(request, title: str) -> dict:
    return {**admin.site.each_context(request), "title": title}


class SignInView(LoginView):
    """The admin's login page (its template and look) for anyone with an active account: the consent needs a person,
    not a staff member."""

    template_name = "admin/login.html"

    def get_context_data(self, **kwargs):
        return {**super().get_context_data(**kwargs), **_admin_context(self.request, "Sign in to authorize a client"),
                "app_path": self.request.get_full_path()}


class ConsentView(AuthorizationView):
    template_name = "oauth/consent.html"
    login_url = reverse_lazy("oauth2_provider:login")

    def get(self, request, *args, **kwargs):
        if member_tenant_id(request.user) is None:
            return self._no_tenant()
        if "resource" not in request.GET:  # RFC 8707 lets the server default it: the MCP endpoint (what clients ask)
            request.GET = request.GET.copy()
            request.GET.setlist("resource", [mcp_resource(request)])
        return super().get(request, *args, **kwargs)

    def post(self, request, *args, **kwargs):
        if member_tenant_id(request.user) is None:
            return self._no_tenant()
        return super().post(request, *args, **kwargs)

    def validate_authorization_request(self, request):
        """The toolkit's validation (client, redirect URI, scopes, PKCE present), then ours: S256 only, and the
        resource this server's MCP URL or its REST API's. A failure goes back to the (validated) redirect URI as the
        error."""
        scopes, credentials = super().validate_authorization_request(request)
        state, redirect_uri = credentials.get("state"), credentials.get("redirect_uri")
        if credentials.get("code_challenge_method") != "S256":
            raise OAuthToolkitError(error=InvalidRequestError(
                description='PKCE with code_challenge_method=S256 is required; "plain" is refused.', state=state),
                redirect_uri=redirect_uri)
        for resource in request.GET.getlist("resource"):
            if not resource_allowed(request, resource):
                raise OAuthToolkitError(error=CustomOAuth2Error(
                    error="invalid_target", state=state,
                    description=f"This server issues tokens for {' and '.join(resources_of(request))} only."),
                    redirect_uri=redirect_uri)
        return scopes, credentials

    def get_context_data(self, **kwargs):
        context = super().get_context_data(**kwargs)
        application = kwargs.get("application")
        tenant = Tenant.objects.filter(memberships__user=self.request.user).first()
        client_id = getattr(application, "client_id", "")
        return {**context, **_admin_context(self.request, "Authorize an MCP client"), "tenant": tenant,
                "client_host": urlsplit(client_id).hostname if client_id.startswith("https://") else "",
                "redirect_host": urlsplit(kwargs.get("redirect_uri") or "").netloc,
                "resources": (kwargs.get("resource") or "").split()}

    def render_to_response(self, context, **response_kwargs):
        if "error" in context and "site_header" not in context:  # (the toolkit renders errors with a bare context)
            context = {**context, **_admin_context(self.request, "Authorization refused")}
        return super().render_to_response(context, **response_kwargs)

    def form_valid(self, form):
        """The consent's answer. The hidden fields came back from the browser: PKCE and the resource are checked
        again (a tampered form gets the error page, no redirect), then the toolkit makes the grant and its binding,
        and an allowed consent is recorded in the same transaction."""
        data = form.cleaned_data
        resources = (data.get("resource") or "").split()
        if data.get("code_challenge_method") != "S256" or not resources \
                or not all(resource_allowed(self.request, resource) for resource in resources):
            return self.render_to_response({"error": InvalidRequestError(
                description="The authorization form was altered: PKCE S256 and this server's resource are "
                            "required.")}, status=400)
        with transaction.atomic():
            response = super().form_valid(form)
            code = parse_qs(urlsplit(self.success_url or "").query).get("code")
            if code:
                binding = OAuthTenantBinding.objects.select_related("grant__application").get(grant__code=code[0])
                application = binding.grant.application
                admin_action_record(
                    actor=f"user:{self.request.user.username}", action="oauth_authorize", obj=binding,
                    message=f"Authorized the OAuth client {client_actor(application.client_id)} "
                            f"({application.name or 'unnamed'}) for the scopes {binding.grant.scope} on "
                            f"{' '.join(binding.grant.resource)}.")
        return response

    def _no_tenant(self):
        context = {**_admin_context(self.request, "Your account belongs to no tenant"),
                   "username": self.request.user.get_username()}
        return self.response_class(request=self.request, template=["oauth/no_tenant.html"], context=context,
                                   status=403)


class RegistrationView(DynamicClientRegistrationView):
    """RFC 7591 for authorization-code clients; recorded in the transaction that registers."""

    def post(self, request, *args, **kwargs):
        try:
            grant_types = json.loads(request.body).get("grant_types", ["authorization_code"])
        except (ValueError, AttributeError):
            grant_types = None  # (the toolkit answers malformed metadata)
        if isinstance(grant_types, list) and not set(map(str, grant_types)) <= _REGISTRABLE_GRANTS:
            return JsonResponse({"error": "invalid_client_metadata", "error_description": "Only the "
                                 "authorization_code grant (with refresh_token) is supported here."}, status=400)
        with transaction.atomic():
            response = super().post(request, *args, **kwargs)
            if response.status_code == 201:
                application = get_application_model().objects.get(client_id=json.loads(response.content)["client_id"])
                admin_action_record(actor="oauth-registration", action="oauth_register", obj=application,
                                    message=f"Registered the OAuth client {client_actor(application.client_id)} "
                                            f"(dynamic client registration, RFC 7591), {application.client_type}.")
        return response


class RegistrationManagementView(DynamicClientRegistrationManagementView):
    """RFC 7592 (read, update, delete a registration with its registration token); writes recorded."""

    def put(self, request, client_id, *args, **kwargs):
        with transaction.atomic():
            response = super().put(request, client_id, *args, **kwargs)
            if response.status_code == 200:
                application = get_application_model().objects.get(client_id=client_id)
                admin_action_record(actor=client_actor(client_id), action="oauth_change_registration",
                                    obj=application, message="Changed its registration (RFC 7592).")
        return response

    def delete(self, request, client_id, *args, **kwargs):
        application = get_application_model().objects.filter(client_id=client_id).first()
        with transaction.atomic():
            response = super().delete(request, client_id, *args, **kwargs)
            if response.status_code == 204 and application is not None:
                admin_action_record(actor=client_actor(client_id), action="oauth_delete_registration",
                                    obj=application, message="Deleted its registration (RFC 7592) and its tokens.")
        return response
