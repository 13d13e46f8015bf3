"""Each test process's database, copied from one migrated template instead of migrated four times over.

pytest-django gives each test process (pytest-xdist: gw0, gw1, …) a database of its own and runs every migration in
each — some 60 migrations and the post-migrate signals, ~7 s of CPU a process, all four at once on two cores at the
start of every run. Here the first process to arrive migrates a template database once and each process then copies
it (CREATE DATABASE … TEMPLATE: a file copy inside PostgreSQL, a fraction of a second).

The template is named by a hash of every migration file and the installed Django, so it is made again exactly when
a migration changes (or a branch with other migrations runs against the same server), and the stale ones are
dropped. It is built under another name and renamed only once migrated: a run killed midway leaves no half-migrated
template for the next one. A session-level advisory lock on the maintenance database serialises the processes: the
others wait while the first migrates, then copy. (CREATE DATABASE … TEMPLATE needs no session in the template: only
the builder ever connects to it, and it closes its connection before the copies.)
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import django
import psycopg
from django.apps import apps
from django.conf import settings
from django.db import connection

# pg_advisory_lock key (on the maintenance database "postgres"): one process builds or copies at a time.
TEMPLATE_LOCK = 0x7E57_DB01


def migrations_hash() -> str:
    """sha256 over every installed app's migration files (path and content) and Django's version."""
    digest = hashlib.sha256(django.get_version().encode())
    for config in sorted(apps.get_app_configs(), key=lambda app: app.label):
        folder = Path(config.path) / "migrations"
        for path in sorted(folder.glob("*.py")) if folder.is_dir() else ():
            digest.update(f"{config.label}/{path.name}".encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def _maintenance_connection() -> psycopg.Connection:
    config = connection.settings_dict
    params = {"host": config.get("HOST") or None, "port": config.get("PORT") or None,
              "user": config.get("USER") or None, "password": config.get("PASSWORD") or None, "dbname": "postgres"}
    return psycopg.connect(**{key: value for key, value in params.items() if value}, autocommit=True)


def _quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def test_database_create() -> str:
    """Make this process's test database (pytest-django's name for it, xdist suffix included) as a copy of the
    migrated template, building the template first if no process has; point Django at it. Its name."""
    creation = connection.creation
    test_name = creation._get_test_db_name()
    base = settings.DATABASES["default"]["NAME"]
    template = f"{base}_tpl_{migrations_hash()}"[:63]
    building = f"{template[:54]}_building"
    with _maintenance_connection() as admin:
        admin.execute("SELECT pg_advisory_lock(%s)", [TEMPLATE_LOCK])
        try:
            if admin.execute("SELECT 1 FROM pg_database WHERE datname = %s", [template]).fetchone() is None:
                admin.execute(f"DROP DATABASE IF EXISTS {_quoted(building)}")  # a build that was killed midway
                connection.settings_dict.setdefault("TEST", {})["NAME"] = building
                try:
                    creation.create_test_db(verbosity=0, autoclobber=True, serialize=False)
                finally:
                    connection.settings_dict["TEST"]["NAME"] = test_name
                    connection.close()
                admin.execute(f"ALTER DATABASE {_quoted(building)} RENAME TO {_quoted(template)}")
                # Templates of other migration sets (older commits, other branches): made again when needed.
                stale = admin.execute("SELECT datname FROM pg_database WHERE datname LIKE %s AND datname <> %s",
                                      [f"{base}_tpl_%", template]).fetchall()
                for (name,) in stale:
                    admin.execute(f"DROP DATABASE IF EXISTS {_quoted(name)} WITH (FORCE)")
            admin.execute(f"DROP DATABASE IF EXISTS {_quoted(test_name)} WITH (FORCE)")
            admin.execute(f"CREATE DATABASE {_quoted(test_name)} TEMPLATE {_quoted(template)}")
        finally:
            admin.execute("SELECT pg_advisory_unlock(%s)", [TEMPLATE_LOCK])
    # What create_test_db does once the database exists: every later connection goes to the copy.
    settings.DATABASES["default"]["NAME"] = connection.settings_dict["NAME"] = test_name
    connection.close()
    return test_name


def test_database_drop(name: str) -> None:
    connection.close()
    with _maintenance_connection() as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {_quoted(name)} WITH (FORCE)")
