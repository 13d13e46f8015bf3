from django.apps import AppConfig


class McpBridgeConfig(AppConfig):
    """The MCP Streamable HTTP endpoint over runtime tasks (the MCP bridge issue)."""

    name = "mcp_bridge"
    default_auto_field = "django.db.models.BigAutoField"
