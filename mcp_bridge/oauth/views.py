"""The authorization server's pages and endpoints (django-oauth-toolkit's views, narrowed; thin).

- ConsentView (/oauth/authorize/): sign in first (SignInView, the admin's login page's look, for any active person —
  the admin's own refuses non-staff); a person in no tenant gets a page saying so, never a grant; PKCE must be S256;
  `resource` must be this server's MCP URL or its REST API's (RFC 8707: origin + /mcp, origin + /runtime; absent,
  the MCP URL by default; a token is valid only at the endpoint its resource names); the page, in the admin's look,
  names the client (and its document's host), the tenant, the scopes and the resource; an allowed consent is recorded
  for the audit trail in the transaction that creates the grant.
- RegistrationView (/oauth/register/, RFC 7591): authorization code clients only; redirect URIs https or http on
  loopback only (mcp_bridge.oauth.redirects; 400 invalid_redirect_uri); refused while oauth.registration is closed
  (403) and past oauth.registration_rate per client address (429, Retry-After); the registration recorded with the
  actor `oauth-registration` in the transaction that creates the client. A client never issued a token is deleted
  after oauth.unused_client_hours (mcp_bridge.oauth.cleanup). Refusals are problem details (RFC 9457) that also carry
  RFC 7591's `error` and `error_description`, which OAuth clients read.
- The token and revocation endpoints are the toolkit's (revocation recorded by the validator).
"""

from __future__ import annotations

import ipaddress
import json
from urllib.parse import parse_qs, urlsplit

from django.conf import settings
from django.contrib import admin
from django.contrib.auth.views import LoginView
from django.db import transaction
from django.http import HttpResponse, JsonResponse
from django.urls import reverse_lazy
from oauth2_provider.exceptions import OAuthToolkitError
from oauth2_provider.models import get_application_model
from oauth2_provider.views import AuthorizationView
from oauth2_provider.views.dynamic_client_registration import (
    DynamicClientRegistrationManagementView,
    DynamicClientRegistrationView,
)
from oauthlib.oauth2.rfc6749.errors import CustomOAuth2Error, InvalidRequestError

from config.base.json_input import MALFORMED, TOO_DEEP, JsonInputError, loads
from config.base.problems import problem_response
from config.base.rate_limits import rate_limit_hit, rate_parse
from mcp_bridge.oauth.models import OAuthTenantBinding
from mcp_bridge.oauth.redirects import redirect_uris_error
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


def client_address_bucket(request) -> str:
    """Whose registration rate a request counts against: its client address (REMOTE_ADDR: the peer this process
    sees — behind a proxy, the proxy's, unless the proxy sets it), an IPv6 address by its /64 (one host holds a whole
    /64: counting single addresses would let it register without end). Never anything the client chose."""
    raw = request.META.get("REMOTE_ADDR") or "unknown"
    try:
        address = ipaddress.ip_address(raw)
    except ValueError:
        return f"addr-{raw[:64]}"
    if address.version == 6:
        if address.ipv4_mapped is not None:  # (::ffff:a.b.c.d: the IPv4 client it is)
            return f"addr-{address.ipv4_mapped}"
        return f"addr-{ipaddress.ip_network(f'{address}/64', strict=False)}"
    return f"addr-{address}"


def _registration_refused(status: int, slug: str, error: str, detail: str, **extra) -> JsonResponse:
    """A problem details answer (RFC 9457) that an RFC 7591 client reads too (`error`, `error_description`)."""
    response = problem_response(status_code=status, slug=slug, detail=detail, error=error, error_description=detail,
                                **extra)
    response["Cache-Control"] = "no-store"
    return response


def registration_refusal(request) -> JsonResponse | None:
    """Closed (oauth.registration), or over the client address's rate (oauth.registration_rate): the answer, before
    the body is read. Redis away: let through, as every rate limit here (config.base.rate_limits)."""
    policy = settings.RUNTIME.oauth
    if policy.registration != "open":
        return _registration_refused(
            403, "permission-denied", "access_denied",
            "Dynamic client registration is closed on this server (oauth.registration: closed). Use a Client ID "
            "Metadata Document URL as your client_id, or ask an operator to register the client.")
    rate = rate_parse(policy.registration_rate)
    refusal = rate_limit_hit(action="oauth-register", identity=client_address_bucket(request), rate=rate)
    if refusal is None:
        return None
    response = _registration_refused(
        429, "throttled", "slow_down",
        f"Too many client registrations from your address: at most {rate.text.replace('/', ' per ')}. Nothing was "
        f"registered; send it again after {refusal.retry_after_seconds} s (Retry-After).",
        limit=rate.text, retryAfterSeconds=refusal.retry_after_seconds)
    response["Retry-After"] = str(refusal.retry_after_seconds)
    return response


def _metadata_of(request):
    """The registration request's client metadata (JSON), or None when it is not JSON (the toolkit then answers
    invalid_client_metadata)."""
    try:
        return loads(request.body)  # (config.base.json_input: the nesting cap, UTF-8, no lone surrogates)
    except JsonInputError as error:
        # Malformed: the toolkit's answer. Too deep, not UTF-8, a lone surrogate: metadata_refusal answers it, as
        # the toolkit's own json.loads would raise RecursionError (a 500) or pass the surrogate on.
        return None if error.kind == MALFORMED else error


def metadata_refusal(metadata) -> JsonResponse | None:
    """Client metadata this server will not register (RFC 7591 §3.2.2), or None (the toolkit checks the rest)."""
    if isinstance(metadata, JsonInputError):
        return _registration_refused(400, "json-too-deep" if metadata.kind == TOO_DEEP else "malformed-json",
                                     "invalid_client_metadata", str(metadata))
    if not isinstance(metadata, dict):
        return None  # (the toolkit answers malformed metadata)
    grant_types = metadata.get("grant_types", ["authorization_code"])
    if isinstance(grant_types, list) and not set(map(str, grant_types)) <= _REGISTRABLE_GRANTS:
        return JsonResponse({"error": "invalid_client_metadata", "error_description": "Only the "
                             "authorization_code grant (with refresh_token) is supported here."}, status=400)
    error = redirect_uris_error(metadata.get("redirect_uris"))
    if error is not None:
        return _registration_refused(400, "invalid-request", "invalid_redirect_uri", error[0].upper() + error[1:],
                                     errors=[{"field": "redirect_uris", "message": error}])
    return None


class RegistrationView(DynamicClientRegistrationView):
    """RFC 7591 for authorization-code clients whose redirect URIs are https or loopback, while registration is open
    and under the client address's rate; recorded in the transaction that registers."""

    def post(self, request, *args, **kwargs):
        refused = registration_refusal(request)
        if refused is not None:
            return refused
        refused = metadata_refusal(_metadata_of(request))
        if refused is not None:
            return refused
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
        authenticated = self._authenticate_registration_request(request, client_id)
        if isinstance(authenticated, HttpResponse):
            return authenticated  # (before the body says anything: the registration token first, as the toolkit)
        refused = metadata_refusal(_metadata_of(request))
        if refused is not None:
            return refused
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
