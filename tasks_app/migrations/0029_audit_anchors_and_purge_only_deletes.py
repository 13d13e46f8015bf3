"""The audit trail's last two guarantees (docs/audit.md):

- DELETE on the events (TaskEvent), the admin actions' record (AdminAction) and the seals' index (AnchorSeal) is
  refused by a trigger except inside the retention purge's own transaction, which says so with
  ``SET LOCAL runtime.purge = 'on'`` (tasks_app.audit.retention.purge_allowed). A statement-level trigger: it costs
  one check per DELETE statement, none per row, and none at all on the INSERT path every step takes. It guards against
  code and consoles deleting by mistake; anyone with SQL can set the variable too, or disable the trigger — what
  catches that is the next item.
- Anchored chain heads: AnchorSeal (the index of the signed seal files in blob storage), SealedHead (each chain's
  newest sealed head), StorageHold (a purged original's folder kept while a live fork refers to it), and the beat
  schedule of the seal (tasks_app.audit.anchors.anchors_seal, every 5 minutes; editable in admin).
"""

from django.db import migrations, models

SEAL_SCHEDULE = "runtime: seal audit chains"

FORBID = """
CREATE FUNCTION runtime_forbid_delete_outside_purge() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF coalesce(current_setting('runtime.purge', true), '') = 'on' THEN
        RETURN NULL;  -- the retention purge's own transaction (statement-level: the value is ignored)
    END IF;
    RAISE EXCEPTION '% is append-only: its rows are deleted only by the retention purge (tasks_app.audit.retention)',
        TG_TABLE_NAME;
END $$;
CREATE TRIGGER tasks_app_taskevent_purge_only_deletes BEFORE DELETE ON tasks_app_taskevent
    FOR EACH STATEMENT EXECUTE FUNCTION runtime_forbid_delete_outside_purge();
CREATE TRIGGER tasks_app_adminaction_purge_only_deletes BEFORE DELETE ON tasks_app_adminaction
    FOR EACH STATEMENT EXECUTE FUNCTION runtime_forbid_delete_outside_purge();
CREATE TRIGGER tasks_app_anchorseal_purge_only_deletes BEFORE DELETE ON tasks_app_anchorseal
    FOR EACH STATEMENT EXECUTE FUNCTION runtime_forbid_delete_outside_purge();
CREATE FUNCTION tasks_app_anchorseal_forbid_update() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'tasks_app_anchorseal is append-only: a seal''s index row is never updated (seal %)',
        OLD.sequence;
END $$;
CREATE TRIGGER tasks_app_anchorseal_append_only BEFORE UPDATE ON tasks_app_anchorseal
    FOR EACH ROW EXECUTE FUNCTION tasks_app_anchorseal_forbid_update();
"""

ALLOW = """
DROP TRIGGER IF EXISTS tasks_app_taskevent_purge_only_deletes ON tasks_app_taskevent;
DROP TRIGGER IF EXISTS tasks_app_adminaction_purge_only_deletes ON tasks_app_adminaction;
DROP TRIGGER IF EXISTS tasks_app_anchorseal_purge_only_deletes ON tasks_app_anchorseal;
DROP TRIGGER IF EXISTS tasks_app_anchorseal_append_only ON tasks_app_anchorseal;
DROP FUNCTION IF EXISTS runtime_forbid_delete_outside_purge();
DROP FUNCTION IF EXISTS tasks_app_anchorseal_forbid_update();
"""


def schedule_seal(apps, schema_editor):
    IntervalSchedule = apps.get_model("django_celery_beat", "IntervalSchedule")
    PeriodicTask = apps.get_model("django_celery_beat", "PeriodicTask")
    interval, _ = IntervalSchedule.objects.get_or_create(every=300, period="seconds")
    PeriodicTask.objects.get_or_create(
        name=SEAL_SCHEDULE,
        defaults={
            "task": "runtime.audit_seal",
            "interval": interval,
            "description": "Seals the heads of every event chain changed since the last seal into a signed file in "
                           "blob storage (anchors/), so verify_events --anchors detects a chain rewritten inside the "
                           "database. Keep it enabled.",
        },
    )


def unschedule_seal(apps, schema_editor):
    apps.get_model("django_celery_beat", "PeriodicTask").objects.filter(name=SEAL_SCHEDULE).delete()


class Migration(migrations.Migration):

    dependencies = [
        ("tasks_app", "0028_task_lineage"),
        ("django_celery_beat", "0019_alter_periodictasks_options"),
    ]

    operations = [
        migrations.CreateModel(
            name="AnchorSeal",
            fields=[
                ("sequence", models.BigIntegerField(primary_key=True, serialize=False)),
                ("sealed_at", models.DateTimeField()),
                ("hash", models.CharField(max_length=64)),
                ("file", models.CharField(max_length=300)),
                ("heads", models.IntegerField()),
            ],
        ),
        migrations.CreateModel(
            name="SealedHead",
            fields=[
                ("task_id", models.UUIDField(primary_key=True, serialize=False)),
                ("seq", models.BigIntegerField()),
                ("hash", models.CharField(max_length=64)),
                ("seal_sequence", models.BigIntegerField()),
            ],
        ),
        migrations.CreateModel(
            name="StorageHold",
            fields=[
                ("pk", models.CompositePrimaryKey("folder", "task_id", blank=True, editable=False, primary_key=True,
                                                  serialize=False)),
                ("folder", models.CharField(max_length=200)),
                ("task_id", models.UUIDField()),
            ],
        ),
        migrations.RunSQL(FORBID, ALLOW),
        migrations.RunPython(schedule_seal, unschedule_seal),
    ]
