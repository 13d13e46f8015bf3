from django.apps import AppConfig


class AgentsAppConfig(AppConfig):
    """The agent layer (docs/architecture.md §11): downstream MCP tool servers, the policy gateway in front of every
    tool call, durable tool calls through the ledger; the agent loop comes next."""

    name = "agents_app"
    verbose_name = "Agents and tools"
    default_auto_field = "django.db.models.BigAutoField"
