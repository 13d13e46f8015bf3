"""Running the engine's hot statements (tasks_app.db.sql) as prepared statements.

Django's psycopg cursors bind parameters on the client and send the whole text every time, so PostgreSQL parsed
and planned the step commit's multi-CTE statement on every step. These go through a plain psycopg cursor with
``prepare=True`` instead: planned once per connection (psycopg keeps the prepared statement for the connection's
life, keyed by its text and parameter types), then only bound and executed. Errors come out as Django's database
errors, as from any Django cursor, so the engine's handling of a lost database is the same. Parameters are sent
typed (server-side binding), so the statements cast every parameter whose type the context does not fix.
"""

from __future__ import annotations

import time
from typing import Any

import psycopg
from django.db import connection

from config.base.json_input import loads_stored


def prepared_fetchone(statement: str, params: dict[str, Any]) -> tuple | None:
    """Execute ``statement`` prepared on this thread's Django connection and return its first row (or None)."""
    with connection.cursor():  # Django's way in: opens the connection, runs the health check (CONN_HEALTH_CHECKS)
        pass
    started = time.monotonic()
    try:
        with connection.wrap_database_errors, psycopg.Cursor(connection.connection) as cursor:
            cursor.execute(statement, params, prepare=True)
            return cursor.fetchone() if cursor.description else None
    finally:
        if connection.queries_logged:  # DEBUG or CaptureQueriesContext: listed like any Django query
            connection.queries_log.append({"sql": statement.strip(), "time": f"{time.monotonic() - started:.3f}"})


def json_value(value: Any) -> Any:
    """A jsonb column as a raw cursor returns it: Django registers jsonb to load as text (JSONField decodes it).
    Read by config.base.json_input.loads_stored: a goal or input written by SQL deeper than json.loads reads (PostgreSQL
    keeps 12,000 levels) raised RecursionError in the worker's lease, every time the task was claimed."""
    return loads_stored(value) if isinstance(value, str) else value


def connection_close_quietly() -> None:
    """Drop this thread's connection after an error or an interrupt that may have landed inside a database call, so
    the next statement starts on a fresh one."""
    try:
        connection.close()
    except Exception:  # closing a connection the server already dropped may raise; it is gone either way
        pass
