"""A token budget beside the cost budget, and what a task does when a budget is spent (docs/steering.md "Budgets").

- tokens_spent: model tokens (in + out) counted with each step like cost_spent; budget_tokens: the task's limit.
- budget_on_exhausted: "" (the workflow's on_budget_exhausted), "fail" or "wait" (a budget wait in input_required
  until an operator raises the budget with set_budget).
- runtime_lease_claim returns the three, so a slice decides on them without another query: its result columns
  change, so the function is dropped and created again from tasks_app/db/lease_claim.sql (CREATE OR REPLACE refuses
  a changed result type). Like 0020, this migration pins the sha256 of the text it was written for and applies the
  file only while the file still holds it (tests/test_lease_claim_sql.py).

The new columns come after every other column of the row: PostgreSQL appends them, and the step commit's WAL record
(see 0010) covers the bytes from the first changed column to the last. tokens_spent changes only in a step that
counted tokens (a model call), whose call costs far more than the few bytes of JSON columns in between; every other
step leaves it, and the span, as before. ADD COLUMN with a constant default rewrites no row.
"""

import hashlib
import importlib
from pathlib import Path

from django.conf import settings
from django.db import migrations, models

LEASE_CLAIM_FILE = Path(__file__).resolve().parent.parent / "db" / "lease_claim.sql"
LEASE_CLAIM_SHA256 = "a302b82e7be6bfa063ccad103ab7bd1fb76879502f8d3324d7742f5a4e532230"
_DROP = "DROP FUNCTION IF EXISTS runtime_lease_claim(uuid, text, double precision, integer, text[], integer);"

_function_text = importlib.import_module("tasks_app.migrations.0020_lease_claim_from_file").function_text
_TEXT = _function_text(LEASE_CLAIM_FILE)
_APPLIES = hashlib.sha256(_TEXT.encode()).hexdigest() == LEASE_CLAIM_SHA256
# Back to what 0020 applied (0015's text).
_PREVIOUS = importlib.import_module("tasks_app.migrations.0015_claim_returns_tenant").CLAIM_FUNCTION


class Migration(migrations.Migration):

    dependencies = [
        ('tasks_app', '0024_tool_event_index'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        # tokens_spent first: the one of the three a step commit changes, as near the others as it can be.
        migrations.AddField(
            model_name='task',
            name='tokens_spent',
            field=models.BigIntegerField(default=0),
        ),
        migrations.AddField(
            model_name='task',
            name='budget_tokens',
            field=models.BigIntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='task',
            name='budget_on_exhausted',
            field=models.CharField(blank=True, default='', max_length=4),
        ),
        migrations.AddConstraint(
            model_name='task',
            constraint=models.CheckConstraint(condition=models.Q(('budget_on_exhausted__in', ('', 'fail', 'wait'))),
                                              name='task_budget_policy_valid'),
        ),
        migrations.RunSQL(_DROP + _TEXT, _DROP + _PREVIOUS) if _APPLIES else migrations.RunSQL(migrations.RunSQL.noop),
    ]
