"""The audit trail of admin writes (AdminAction), append-only like the events: UPDATE is refused at the database,
whatever code or console tries it (DELETE stays possible, as for TaskEvent, for a deliberate purge by someone with
table rights); and the partial index that lets the audit's actor filter find a person's dead-letter decisions
(status events carrying requestedBy) over every task.
"""

import django.db.models.deletion
import django.db.models.functions.datetime
import tasks_app.ids
from django.db import migrations, models

FORBID_UPDATE = """
CREATE FUNCTION tasks_app_adminaction_forbid_update() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'tasks_app_adminaction is append-only: an admin action''s record is never updated (id %)',
        OLD.id;
END $$;
CREATE TRIGGER tasks_app_adminaction_append_only BEFORE UPDATE ON tasks_app_adminaction
    FOR EACH ROW EXECUTE FUNCTION tasks_app_adminaction_forbid_update();
"""

ALLOW_UPDATE = """
DROP TRIGGER IF EXISTS tasks_app_adminaction_append_only ON tasks_app_adminaction;
DROP FUNCTION IF EXISTS tasks_app_adminaction_forbid_update();
"""


class Migration(migrations.Migration):

    dependencies = [
        ('tasks_app', '0021_status_event_index'),
    ]

    operations = [
        migrations.CreateModel(
            name='AdminAction',
            fields=[
                ('id', models.UUIDField(default=tasks_app.ids.uuid7, editable=False, primary_key=True, serialize=False)),
                ('at', models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
                ('actor', models.CharField(max_length=200)),
                ('action', models.CharField(max_length=64)),
                ('model', models.CharField(max_length=100)),
                ('object_id', models.CharField(max_length=64)),
                ('object_repr', models.CharField(max_length=200)),
                ('message', models.TextField(blank=True)),
            ],
        ),
        migrations.AddIndex(
            model_name='taskevent',
            index=models.Index(condition=models.Q(('type', 'status'), ('data__has_key', 'requestedBy')), fields=['task', 'seq'], name='taskevent_decision_idx'),
        ),
        migrations.AddField(
            model_name='adminaction',
            name='tenant',
            field=models.ForeignKey(blank=True, db_constraint=False, null=True, on_delete=django.db.models.deletion.DO_NOTHING, related_name='+', to='tasks_app.tenant'),
        ),
        migrations.AddIndex(
            model_name='adminaction',
            index=models.Index(fields=['at', 'id'], name='adminaction_at_idx'),
        ),
        migrations.AddConstraint(
            model_name='adminaction',
            constraint=models.CheckConstraint(condition=models.Q(('actor', ''), _negated=True), name='adminaction_actor_named'),
        ),
        migrations.RunSQL(FORBID_UPDATE, ALLOW_UPDATE),
    ]
