"""An effect's deadline and why its outcome became unknown (issue 38, "never ask while the call can still land").

`deadline`: when the call can no longer land — its start + the timeout it was sent with + the configured margin, on
the database's clock; a person is asked whether it happened only after it. `unknown_why`: worker_died, timed_out or
dropped_after_send, what the question says. Both nullable, added at the end of the row: no rewrite of the table, and
rows written before keep null (no deadline known: asked as before).
"""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("checkpoints_app", "0003_natural_primary_key"),
    ]

    operations = [
        migrations.AddField(
            model_name="sideeffect",
            name="deadline",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="sideeffect",
            name="unknown_why",
            field=models.CharField(blank=True, max_length=20, null=True),
        ),
    ]
