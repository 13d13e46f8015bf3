"""Schedule the removal of expired OAuth rows (runtime.oauth_cleanup: django-oauth-toolkit's cleartokens and
clearcimdapplications) hourly, as a django-celery-beat PeriodicTask, visible and editable in the admin (Periodic
tasks → "runtime: clear expired OAuth tokens")."""

from django.db import migrations

CLEANUP_SCHEDULE = "runtime: clear expired OAuth tokens"


def schedule_cleanup(apps, schema_editor):
    IntervalSchedule = apps.get_model("django_celery_beat", "IntervalSchedule")
    PeriodicTask = apps.get_model("django_celery_beat", "PeriodicTask")
    interval, _ = IntervalSchedule.objects.get_or_create(every=3600, period="seconds")
    PeriodicTask.objects.get_or_create(
        name=CLEANUP_SCHEDULE,
        defaults={
            "task": "runtime.oauth_cleanup",
            "interval": interval,
            "description": "Deletes expired OAuth access tokens and grants, refresh tokens idle past "
                           "OAUTH_REFRESH_TOKEN_SECONDS and expired Client ID Metadata Document clients with nothing "
                           "live (django-oauth-toolkit's cleartokens and clearcimdapplications): rows nothing accepts "
                           "any more.",
        },
    )


def unschedule_cleanup(apps, schema_editor):
    apps.get_model("django_celery_beat", "PeriodicTask").objects.filter(name=CLEANUP_SCHEDULE).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("mcp_bridge", "0001_oauth_tenant_binding"),
        ("django_celery_beat", "0019_alter_periodictasks_options"),
    ]
    operations = [migrations.RunPython(schedule_cleanup, unschedule_cleanup)]
