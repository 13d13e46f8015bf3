"""The task's W3C trace context (tasks_app.observability.tracing): written once when the task is created, read once per
slice and only while tracing is on; never changed by a step commit. Nullable without a default: ADD COLUMN rewrites no
row, and it comes after every column a step commit changes, so the commit's WAL record does not grow.
"""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('tasks_app', '0026_task_unfinished_status_index'),
    ]

    operations = [
        migrations.AddField(
            model_name='task',
            name='trace_context',
            field=models.JSONField(blank=True, null=True),
        ),
    ]
