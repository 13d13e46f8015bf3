"""The claim function in the database is the text of tasks_app/db/lease_claim.sql (CONVENTIONS 2).

The test database is migrated by pytest-django, so what these tests read is what the migrations made.

How runtime_lease_claim is changed: edit tasks_app/db/lease_claim.sql, then add a migration that applies it again —
a copy of tasks_app/migrations/0020_lease_claim_from_file.py with LEASE_CLAIM_SHA256 set to the new text's sha256
(test_it_has_a_migration_for_the_claim_functions_text prints it). An edit of the file without such a migration fails
both tests below: the migrations do not apply a text they did not pin, so the database keeps the old function (and
a database already migrated would never see the edit either).
"""

import hashlib
import importlib
import re
from pathlib import Path

import pytest
from django.db import connection
from django.db.migrations.loader import MigrationLoader

from tasks_app.db import sql

pytestmark = pytest.mark.django_db  # in a transaction: the scratch schema below is rolled back with it

_HEADER = "CREATE OR REPLACE FUNCTION runtime_lease_claim("
_SCRATCH = "lease_claim_file_check"


def function_text() -> str:
    """What the migrations apply and pin: the file without its leading comment lines."""
    lines = Path(sql.LEASE_CLAIM_FUNCTION_PATH).read_text().splitlines(keepends=True)
    while lines and lines[0].startswith("--"):
        lines.pop(0)
    return "".join(lines)


def functiondef(regproc: str) -> str:
    """pg_get_functiondef of the function, with its schema left out of its name (the only part that differs
    between the live function and the file's in the scratch schema)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_get_functiondef(%s::regproc)", [regproc])
        text = cursor.fetchone()[0]
    return re.sub(r"^(CREATE OR REPLACE FUNCTION )\S+?\.(runtime_lease_claim\()", r"\1\2", text)


def test_it_defines_the_claim_function_as_its_file_says():
    """The file's function, created in a scratch schema, reads back from PostgreSQL exactly as the live one does:
    pg_get_functiondef renders both headers the same way (types, spacing, defaults), and keeps each body verbatim,
    so any difference in the body, whitespace included, fails here."""
    text = function_text()
    assert text.startswith(_HEADER), f"lease_claim.sql must start (after its comments) with {_HEADER!r}"
    live = functiondef("runtime_lease_claim")
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE SCHEMA {_SCRATCH}")
        cursor.execute(text.replace(_HEADER, f"CREATE OR REPLACE FUNCTION {_SCRATCH}.runtime_lease_claim(", 1))
    from_file = functiondef(f"{_SCRATCH}.runtime_lease_claim")
    assert live == from_file, (
        "the database's runtime_lease_claim is not the text of tasks_app/db/lease_claim.sql: add a migration that "
        "applies the file (see this module's docstring)")


def test_it_has_a_migration_for_the_claim_functions_text():
    """The newest migration that applies lease_claim.sql pinned the file's current text."""
    loader = MigrationLoader(None, ignore_no_migrations=True)
    pins = sorted((name, getattr(importlib.import_module(migration.__module__), "LEASE_CLAIM_SHA256", None))
                  for (app, name), migration in loader.disk_migrations.items() if app == "tasks_app")
    pinned = [(name, pin) for name, pin in pins if pin is not None]
    assert pinned, "no tasks_app migration applies tasks_app/db/lease_claim.sql"
    name, pin = pinned[-1]
    current = hashlib.sha256(function_text().encode()).hexdigest()
    assert pin == current, (
        f"tasks_app/db/lease_claim.sql changed since migration {name} pinned it: add a migration that applies it "
        f"again with LEASE_CLAIM_SHA256 = {current!r}")


def test_it_takes_the_claim_lock_named_in_sql():
    """The advisory lock the claim serialises on is sql.CLAIM_ADVISORY_LOCK, in the file and in the database."""
    call = f"pg_advisory_xact_lock({sql.CLAIM_ADVISORY_LOCK})"
    assert function_text().count(call) == 1
    assert call in functiondef("runtime_lease_claim")
    assert "CLAIM_ADVISORY_LOCK" in Path(sql.LEASE_CLAIM_FUNCTION_PATH).read_text()  # the file says which it is
