from django.apps import AppConfig


class SteeringConfig(AppConfig):
    """Steering commands: a persistent queue applied at safe points (the steering issue)."""

    name = "steering_app"
    default_auto_field = "django.db.models.BigAutoField"
