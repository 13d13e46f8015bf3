from django.apps import AppConfig
from django.conf import settings
from django.utils.module_loading import autodiscover_modules


class TasksConfig(AppConfig):
    name = "tasks_app"
    verbose_name = "Tasks"  # what the admin shows (not the module's name)
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Every installed app may declare workflows in its workflows.py; importing registers them. The runtime's
        # own examples live in tasks_app.examples (one module a workflow).
        autodiscover_modules("workflows")
        from tasks_app.engine import checks  # noqa: F401  (registers the system checks)
        from tasks_app.examples import demo_steps, document_review  # noqa: F401  (importing registers them)
        from tasks_app.observability import metrics
        from tasks_app.web import console

        metrics.state_reader_register(console.runtime_state)  # what /metrics reads on scrape: the overview's numbers

        # Traces, when the OTEL_* variables ask for them: the web process here (before its ASGI handler loads the
        # middleware the Django instrumentor adds); workers in the processes that run tasks (config/celery.py).
        if settings.RUNTIME_PROCESS == "web":
            from tasks_app.observability import tracing

            tracing.setup(service="agent-runtime-web", web=True)
