from django.apps import AppConfig


class SteeringConfig(AppConfig):
    """Steering commands: a persistent queue applied at safe points (ARCHITECTURE §6)."""

    name = "steering_app"
    verbose_name = "Steering"  # what the admin shows (not the module's name)
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # The engine does not import steering: steering registers itself with the engine's safe-point hook.
        from steering_app.application import steering_safe_point
        from tasks_app.engine.safepoints import safe_point_handler_register

        safe_point_handler_register(steering_safe_point)
