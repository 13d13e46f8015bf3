"""An effect carries its recovery rule (issue 38, build 1): how an unknown outcome is decided (`recovery`), where a
person is asked (`asks`) and what they are shown (`about`), recorded when the effect starts. Nullable, added at the
end of the row: no rewrite of the table; a row written before keeps null and is decided as `person`.
"""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("checkpoints_app", "0004_sideeffect_deadline"),
    ]

    operations = [
        migrations.AddField(
            model_name="sideeffect",
            name="recovery",
            field=models.CharField(blank=True, max_length=20, null=True),
        ),
        migrations.AddField(
            model_name="sideeffect",
            name="asks",
            field=models.BooleanField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="sideeffect",
            name="about",
            field=models.JSONField(blank=True, null=True),
        ),
    ]
