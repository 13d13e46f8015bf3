"""runtime_lease_claim from its one file, tasks_app/db/lease_claim.sql (CONVENTIONS 2).

The function does not change here: the file holds the text 0015 defined, as CREATE OR REPLACE (the function keeps
its oid, and pg_get_functiondef reads the same before and after). From here on the claim changes by an edit of the
file plus a migration like this one that applies it again.

A migration that applies the file pins the sha256 of the function text it was written for (the file without its
leading comment lines), and applies the file only while the file still holds that text. Once the file has moved on,
a later migration pins and applies the newer text; running it here would apply it to this point of the schema's
history, before whatever else the later migration does (and CREATE OR REPLACE refuses a changed result type).
tests/test_lease_claim_sql.py fails when the file's text has no migration pinning it, and when the database's
function is not the file's.
"""

import hashlib
import importlib
from pathlib import Path

from django.db import migrations

LEASE_CLAIM_FILE = Path(__file__).resolve().parent.parent / "db" / "lease_claim.sql"
LEASE_CLAIM_SHA256 = "d848da66e8571f2ee127efe959967c5df42b2a7360d308e4a6873cf839047cd4"


def function_text(path: Path) -> str:
    """The statement the file holds: its text without the leading comment lines (those may change freely)."""
    lines = path.read_text().splitlines(keepends=True)
    while lines and lines[0].startswith("--"):
        lines.pop(0)
    return "".join(lines)


_TEXT = function_text(LEASE_CLAIM_FILE)
_APPLIES = hashlib.sha256(_TEXT.encode()).hexdigest() == LEASE_CLAIM_SHA256
# Back to what 0015 defined (the same text, as this migration changes nothing while it applies).
_PREVIOUS = importlib.import_module("tasks_app.migrations.0015_claim_returns_tenant").CLAIM_FUNCTION.replace(
    "CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1)


class Migration(migrations.Migration):

    dependencies = [
        ("tasks_app", "0019_tenant_workflows"),
    ]

    operations = [
        migrations.RunSQL(_TEXT, _PREVIOUS) if _APPLIES else migrations.RunSQL(migrations.RunSQL.noop),
    ]
