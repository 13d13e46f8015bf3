"""System checks of the MCP bridge: `manage.py check --deploy` warns when the conformance fixtures are on, when
loopback metadata documents are fetched, and while anyone may register an OAuth client (registered by the app's
AppConfig.ready, mcp_bridge.apps)."""

from django.conf import settings
from django.core.checks import Tags, Warning, register


@register("runtime", deploy=True)
def conformance_fixtures_off(app_configs, **kwargs):
    """Fixture mode admits token-less loopback requests (as the fixture tenant): never what a deployment wants."""
    if settings.MCP_CONFORMANCE_FIXTURES and not settings.DEBUG:
        return [Warning("MCP_CONFORMANCE_FIXTURES is on: the conformance fixture workflows are loaded and a request "
                        "from loopback without a token acts as the fixture tenant.",
                        hint="Unset MCP_CONFORMANCE_FIXTURES outside a conformance run.", id="runtime.W010")]
    return []


@register("runtime", deploy=True)
def cimd_loopback_off(app_configs, **kwargs):
    """Loopback metadata documents are for tests: a client_id would make this server read its own loopback."""
    if settings.OAUTH_CIMD_ALLOW_LOOPBACK:
        return [Warning("OAUTH_CIMD_ALLOW_LOOPBACK is on: a client_id URL on a loopback host is fetched over plain "
                        "http (server-side request forgery into this machine).",
                        hint="Unset OAUTH_CIMD_ALLOW_LOOPBACK outside tests.", id="runtime.W011")]
    return []


# (Tagged security, as W021 and W004 are: a choice for production, not a misconfiguration the dev run's start check
# — `check --tag runtime --deploy` — should print.)
@register(Tags.security, deploy=True)
def open_client_registration(app_configs, **kwargs):
    """Open dynamic client registration (RFC 7591, what MCP clients expect) lets anyone on the network make clients:
    each is a consent page that names whatever the registrant chose. Bounded here (a rate per address, unused ones
    deleted, redirect URIs https or loopback), but a deployment should choose it knowingly."""
    if not settings.OAUTH2_PROVIDER.get("DCR_ENABLED") or settings.RUNTIME.oauth.registration != "open" \
            or settings.DEBUG:
        return []
    rate = settings.RUNTIME.oauth.registration_rate
    bound = "with NO rate limit (oauth.registration_rate: off)" if rate.strip().lower() == "off" else \
        f"at most {rate} per client address"
    return [Warning(f"OAuth dynamic client registration is open: anyone who reaches /oauth/register/ can register a "
                    f"client, {bound}; a client never issued a token is deleted after "
                    f"{settings.RUNTIME.oauth.unused_client_hours:g} hours.",
                    hint="Set `oauth: registration: closed` in runtime.yaml (RUNTIME_OAUTH__REGISTRATION=closed) when "
                         "your MCP clients use Client ID Metadata Documents or are added by an operator; keep it open "
                         "only if unknown clients must register themselves.", id="mcp_bridge.W012")]
