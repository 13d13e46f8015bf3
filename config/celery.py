"""The Celery application: settings come from Django's (CELERY_* names), tasks from each app's tasks.py."""

import logging
import os

from celery import Celery
from celery.signals import after_setup_logger, after_setup_task_logger

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

app = Celery("agent_runtime")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@after_setup_logger.connect
@after_setup_task_logger.connect
def _redact_worker_logs(logger=None, **kwargs):
    """Celery replaces the root logger's handlers with its own: they get the redaction filter too."""
    from config.logging_redaction import RedactingFilter

    for handler in [*(logger.handlers if logger else []), *logging.getLogger().handlers]:
        if not any(isinstance(existing, RedactingFilter) for existing in handler.filters):
            handler.addFilter(RedactingFilter())
