from django.apps import AppConfig
from django.utils.module_loading import autodiscover_modules


class TasksConfig(AppConfig):
    name = "tasks_app"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Every installed app may declare workflows in its workflows.py; importing registers them.
        autodiscover_modules("workflows")
        from tasks_app import checks  # noqa: F401  (registers the system checks)
