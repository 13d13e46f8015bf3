"""What a request's client negotiated: its protocol era, and (2026-07-28, per request) the tasks extension."""

from __future__ import annotations

from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp_types import MISSING_REQUIRED_CLIENT_CAPABILITY
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from mcp_bridge.mapping import EXTENSION


def modern(ctx: ServerRequestContext) -> bool:
    return ctx.protocol_version in MODERN_PROTOCOL_VERSIONS


def declared(ctx: ServerRequestContext) -> bool:
    """Did this request's client declare the tasks extension? (2026-07-28 only: per request, in its _meta.)"""
    capabilities = ctx.session.client_capabilities
    return modern(ctx) and bool(capabilities and capabilities.extensions and EXTENSION in capabilities.extensions)


def extension_required(what: str) -> MCPError:
    return MCPError(MISSING_REQUIRED_CLIENT_CAPABILITY, f"{what} needs the {EXTENSION} extension: declare it in the "
                    "request's _meta clientCapabilities.extensions.",
                    {"requiredCapabilities": {"extensions": {EXTENSION: {}}}})
