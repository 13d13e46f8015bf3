"""Schedule the lease reaper: a django-celery-beat PeriodicTask, visible and editable in admin.

Its interval starts at runtime.yaml's reaper_interval_seconds; ops may change it in admin afterwards
(Periodic tasks → "runtime: lease reaper"), and beat picks the change up without a restart.
"""

from django.conf import settings
from django.db import migrations

from tasks_app.engine.checks import REAPER_NAME


def schedule_reaper(apps, schema_editor):
    IntervalSchedule = apps.get_model("django_celery_beat", "IntervalSchedule")
    PeriodicTask = apps.get_model("django_celery_beat", "PeriodicTask")
    every = max(1, int(settings.RUNTIME.reaper_interval_seconds))
    interval, _ = IntervalSchedule.objects.get_or_create(every=every, period="seconds")
    PeriodicTask.objects.get_or_create(
        name=REAPER_NAME,
        defaults={
            "task": "runtime.reap",
            "interval": interval,
            "priority": 0,  # Redis priority 0 is consumed first: recovery must not queue behind steps
            "description": "Recovers tasks whose worker died (expired leases), re-sends lost run_step messages, "
                           "enforces deadlines and purges finished tasks past retention. Keep it enabled.",
        },
    )


def unschedule_reaper(apps, schema_editor):
    apps.get_model("django_celery_beat", "PeriodicTask").objects.filter(name=REAPER_NAME).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("tasks_app", "0003_task_plan_deadline_idx"),
        ("django_celery_beat", "0019_alter_periodictasks_options"),
    ]
    operations = [migrations.RunPython(schedule_reaper, unschedule_reaper)]
