"""System checks of the MCP bridge: `manage.py check --deploy` warns when the conformance fixtures are on."""

from django.conf import settings
from django.core.checks import Warning, register


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
