from django.apps import AppConfig


class CheckpointsConfig(AppConfig):
    """Checkpoints and the side-effect ledger: everything recovery reads (the durable step engine issue)."""

    name = "checkpoints_app"
    default_auto_field = "django.db.models.BigAutoField"
