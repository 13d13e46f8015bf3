"""The task row's per-step columns moved to the end of the row, next to each other.

Every step commit updates the task row in place (a HOT update). PostgreSQL logs such an update as the bytes
between the first and the last byte that changed (the common prefix and suffix of the old and new row are left
out of the WAL record). With `progress` in column 8 and `updated_at` in column 33, every step logged everything
in between: the lease owner, the idempotency key and request fingerprint, the result, the event head hash. With
the columns a step changes placed last, in the order of how often they change (the ones every step changes at the
very end), a step logs only those (figures: docs/performance.md, change 10).

PostgreSQL cannot reorder columns, so each one is added anew at the end, copied, and the old one dropped. The
model does not change (Django names columns, never positions). The copy rewrites every task row once: on a
large table run it in a quiet window.
"""

from django.db import migrations

# Least often changed first: a commit's logged span starts at its first changed column and ends at updated_at.
MOVE_COLUMNS_LAST = """
ALTER TABLE tasks_app_task
    ADD COLUMN recoveries_since_progress__moved smallint,
    ADD COLUMN cost_spent__moved numeric(20, 4),
    ADD COLUMN checkpoint_sequence__moved integer,
    ADD COLUMN checkpoint_at__moved timestamp with time zone,
    ADD COLUMN phase__moved varchar(200),
    ADD COLUMN event_head_hash__moved varchar(64),
    ADD COLUMN event_seq__moved bigint,
    ADD COLUMN progress__moved double precision,
    ADD COLUMN next_step_index__moved integer,
    ADD COLUMN steps_completed__moved integer,
    ADD COLUMN updated_at__moved timestamp with time zone;

UPDATE tasks_app_task
   SET recoveries_since_progress__moved = recoveries_since_progress, cost_spent__moved = cost_spent,
       checkpoint_sequence__moved = checkpoint_sequence, checkpoint_at__moved = checkpoint_at,
       phase__moved = phase, event_head_hash__moved = event_head_hash, event_seq__moved = event_seq,
       progress__moved = progress, next_step_index__moved = next_step_index,
       steps_completed__moved = steps_completed, updated_at__moved = updated_at;

ALTER TABLE tasks_app_task
    DROP COLUMN recoveries_since_progress, DROP COLUMN cost_spent, DROP COLUMN checkpoint_sequence,
    DROP COLUMN checkpoint_at, DROP COLUMN phase, DROP COLUMN event_head_hash, DROP COLUMN event_seq,
    DROP COLUMN progress, DROP COLUMN next_step_index, DROP COLUMN steps_completed, DROP COLUMN updated_at;

ALTER TABLE tasks_app_task RENAME COLUMN recoveries_since_progress__moved TO recoveries_since_progress;
ALTER TABLE tasks_app_task RENAME COLUMN cost_spent__moved TO cost_spent;
ALTER TABLE tasks_app_task RENAME COLUMN checkpoint_sequence__moved TO checkpoint_sequence;
ALTER TABLE tasks_app_task RENAME COLUMN checkpoint_at__moved TO checkpoint_at;
ALTER TABLE tasks_app_task RENAME COLUMN phase__moved TO phase;
ALTER TABLE tasks_app_task RENAME COLUMN event_head_hash__moved TO event_head_hash;
ALTER TABLE tasks_app_task RENAME COLUMN event_seq__moved TO event_seq;
ALTER TABLE tasks_app_task RENAME COLUMN progress__moved TO progress;
ALTER TABLE tasks_app_task RENAME COLUMN next_step_index__moved TO next_step_index;
ALTER TABLE tasks_app_task RENAME COLUMN steps_completed__moved TO steps_completed;
ALTER TABLE tasks_app_task RENAME COLUMN updated_at__moved TO updated_at;

ALTER TABLE tasks_app_task
    ALTER COLUMN recoveries_since_progress SET NOT NULL,
    ALTER COLUMN cost_spent SET NOT NULL,
    ALTER COLUMN phase SET NOT NULL,
    ALTER COLUMN event_head_hash SET NOT NULL,
    ALTER COLUMN event_seq SET NOT NULL,
    ALTER COLUMN progress SET NOT NULL,
    ALTER COLUMN next_step_index SET NOT NULL,
    ALTER COLUMN steps_completed SET NOT NULL,
    ALTER COLUMN updated_at SET NOT NULL,
    ALTER COLUMN updated_at SET DEFAULT statement_timestamp(),
    ADD CONSTRAINT task_progress_0_1 CHECK (progress >= 0.0 AND progress <= 1.0);
"""


class Migration(migrations.Migration):

    dependencies = [
        ("tasks_app", "0009_task_ids_time_ordered"),
    ]

    # Column order is invisible to the model: going back needs nothing.
    operations = [migrations.RunSQL(MOVE_COLUMNS_LAST, migrations.RunSQL.noop)]
