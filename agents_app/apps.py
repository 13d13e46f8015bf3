from django.apps import AppConfig


class AgentsAppConfig(AppConfig):
    """The agent layer (docs/architecture.md §11): downstream MCP tool servers, the policy gateway in front of every
    tool call, durable tool calls through the ledger; the agent loop comes next."""

    name = "agents_app"
    verbose_name = "Agents and tools"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.core import checks

        from agents_app.checks import ungranted_credentials

        checks.register(ungranted_credentials, "runtime", checks.Tags.database)  # W020 (docs/credentials.md)
        # ctx.tool() (tasks_app.engine.context) hands each call to the gateway through this port: tasks_app cannot
        # import the layer above it.
        from agents_app.gateway.call import tool_call
        from agents_app.gateway.downstream import downstream_tasks_release
        from agents_app.selectors import task_tool_server_exists
        from tasks_app.registry import (
            reaper_sweep_register,
            tool_executor_register,
            tool_server_lookup_register,
        )

        tool_executor_register(tool_call)
        tool_server_lookup_register(task_tool_server_exists)  # (a workflow's default server: document_review's)
        reaper_sweep_register("downstream_cancelled", downstream_tasks_release)
