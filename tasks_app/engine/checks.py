"""System checks for operators: `manage.py check --database default` warns when recovery is not scheduled."""

from django.core.checks import Warning, register

REAPER_NAME = "runtime: lease reaper"


@register("runtime", deploy=True)
def lease_reaper_scheduled(app_configs, databases=None, **kwargs):
    """Without the reaper, a task whose worker died stays `working` forever: say so loudly."""
    if not databases:
        return []  # needs the database; run with --database default (the dev run and deploys do)
    from django.db import DatabaseError
    from django_celery_beat.models import PeriodicTask

    try:
        reaper = PeriodicTask.objects.filter(name=REAPER_NAME).first()
    except DatabaseError:
        return []  # not migrated yet: migrate creates it
    if reaper is None:
        return [Warning("The lease reaper periodic task is missing: crashed workers' tasks will never recover.",
                        hint=f"Re-create it: python manage.py migrate tasks_app 0003 && python manage.py migrate "
                             f"(or add a periodic task '{REAPER_NAME}' for runtime.reap in admin).",
                        id="runtime.W001")]
    if not reaper.enabled:
        return [Warning("The lease reaper periodic task is disabled: crashed workers' tasks will not recover.",
                        hint="Enable it in admin → Periodic tasks.", id="runtime.W002")]
    return []


@register("runtime", deploy=True)
def audit_signing_key_present(app_configs, **kwargs):
    """Without the seals' key, the beat task that anchors the audit chains fails at every run: say so at start."""
    from pathlib import Path

    from django.conf import settings

    if settings.AUDIT_SIGNING_KEY_GENERATE or Path(settings.AUDIT_SIGNING_KEY_FILE).exists():
        return []
    return [Warning(f"No audit signing key at {settings.AUDIT_SIGNING_KEY_FILE}: the event chains' heads will not be "
                    f"sealed, and verify_events --anchors cannot check them.",
                    hint="python manage.py audit_key --generate, or mount the deployment's key and point "
                         "AUDIT_SIGNING_KEY_FILE at it (docs/audit.md).", id="runtime.W003")]
