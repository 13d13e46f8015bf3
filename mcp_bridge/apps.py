from django.apps import AppConfig


class McpBridgeConfig(AppConfig):
    """The MCP Streamable HTTP endpoint over runtime tasks (the MCP bridge issue)."""

    name = "mcp_bridge"
    verbose_name = "MCP bridge"  # what the admin shows (not the module's name)
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from mcp_bridge import checks  # noqa: F401  (registers the system checks)
