# Every task records the agent identity that started it (tasks_app.access); the export permission for auditors.

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('tasks_app', '0029_audit_anchors_and_purge_only_deletes'),
    ]

    operations = [
        migrations.AlterModelOptions(
            name='task',
            options={'permissions': [('export_task', 'Can export tasks with their audit chain')]},
        ),
        migrations.AddField(
            model_name='task',
            name='agent_identity',
            field=models.CharField(blank=True, default='', max_length=200),
        ),
        migrations.AddField(
            model_name='task',
            name='created_by_token',
            field=models.ForeignKey(blank=True, db_constraint=False, db_index=False, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to='tasks_app.apitoken'),
        ),
    ]
