from django.apps import AppConfig


class CheckpointsConfig(AppConfig):
    """Checkpoints and the side-effect ledger: everything recovery reads (the durable step engine issue)."""

    name = "checkpoints_app"
    verbose_name = "Checkpoints and the effect ledger"  # what the admin shows (not the module's name)
    default_auto_field = "django.db.models.BigAutoField"
