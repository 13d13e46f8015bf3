"""TaskEvent is the audit chain: refuse UPDATE at the database, whatever code or console tries it.

DELETE stays possible for the retention purge and task deletion; a removed event breaks the hash chain,
which selectors.task_events_verify reports.
"""

from django.db import migrations

FORBID_UPDATE = """
CREATE FUNCTION tasks_app_taskevent_forbid_update() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'tasks_app_taskevent is append-only: events are never updated (task %, seq %)',
        OLD.task_id, OLD.seq;
END $$;
CREATE TRIGGER tasks_app_taskevent_append_only BEFORE UPDATE ON tasks_app_taskevent
    FOR EACH ROW EXECUTE FUNCTION tasks_app_taskevent_forbid_update();
"""

ALLOW_UPDATE = """
DROP TRIGGER IF EXISTS tasks_app_taskevent_append_only ON tasks_app_taskevent;
DROP FUNCTION IF EXISTS tasks_app_taskevent_forbid_update();
"""


class Migration(migrations.Migration):
    dependencies = [("tasks_app", "0001_initial")]
    operations = [migrations.RunSQL(FORBID_UPDATE, ALLOW_UPDATE)]
