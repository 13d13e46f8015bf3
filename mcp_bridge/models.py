"""The MCP bridge's tables: the OAuth bindings (mcp_bridge.oauth.models)."""

from mcp_bridge.oauth.models import OAuthTenantBinding  # noqa: F401
