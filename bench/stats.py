"""What a benchmark phase cost, counted by the servers themselves: a snapshot before, one after, the difference.

PostgreSQL (the benchmark's own server, started with pg_stat_statements and track = all):
- statements: top-level statements the clients sent (BEGIN/COMMIT included, as a client pays for them);
- fk_checks: the nested `SELECT 1 FROM ONLY … FOR KEY SHARE` statements PostgreSQL's RI triggers run for each
  row written to a table with a foreign key — work the client never sees;
- nested: other nested statements (our plpgsql claim function's inner statements);
- commits, tuples written (inserted + updated + deleted), new sessions (connections opened) of the database;
- WAL bytes (LSN difference) and WAL records (pg_stat_wal), cluster-wide.
CPU: the worker process trees; the whole PostgreSQL server (the postmaster, its live children, and the children
it already reaped — a backend whose connection closed during the phase still counts); the Valkey server; the
benchmark's own process (the driver: it creates the tasks and watches them); and the whole machine (every core's
busy time: what is not idle or waiting for I/O), so that what the groups leave out — other jobs on a shared machine —
shows as the difference.
Redis: commands processed (INFO stats).

Statistics of other backends (commits, tuples, WAL records) reach the shared counters at most once a second
while a backend is busy, and up to 10 s after it goes idle (PostgreSQL 15+, PGSTAT_IDLE_INTERVAL): `settle()`
waits that out before a closing snapshot. pg_stat_statements and the WAL position are exact at once.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, fields

import psutil
import psycopg

# The RI trigger's check, as PostgreSQL writes it (ri_triggers.c) and pg_stat_statements normalizes it:
# SELECT $2 FROM ONLY "public"."t" x WHERE "id" OPERATOR(pg_catalog.=) $1 FOR KEY SHARE OF x. PostgreSQL 18 lists
# it as a top-level statement, so it is told apart by its text, not by the toplevel flag.
_FK_CHECK = "query LIKE 'SELECT %% FROM ONLY %% FOR KEY SHARE OF %%'"
_STATEMENTS = f"""
SELECT coalesce(sum(calls) FILTER (WHERE toplevel AND NOT {_FK_CHECK}), 0),
       coalesce(sum(calls) FILTER (WHERE {_FK_CHECK}), 0),
       coalesce(sum(calls) FILTER (WHERE NOT toplevel AND NOT {_FK_CHECK}), 0)
  FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid
 WHERE d.datname = %(database)s AND s.userid <> (SELECT oid FROM pg_roles WHERE rolname = current_user)
"""

# WAL written between two positions, by record kind, headers included (pg_walinspect).
_WAL_BY_KIND = """
SELECT "resource_manager/record_type", count, record_size + fpi_size
  FROM pg_get_wal_stats(%(start)s::pg_lsn, %(end)s::pg_lsn, true) WHERE count > 0
 ORDER BY 3 DESC LIMIT %(limit)s
"""

# WAL written between two positions, by relation (table or index) and record kind: what each step's rows and
# index entries cost. pg_walinspect (PostgreSQL 16+); block references map to relations by their file node.
_WAL_BY_RELATION = """
SELECT coalesce(c.relname, b.relfilenode::text) AS relation, b.resource_manager || '/' || b.record_type AS kind,
       count(DISTINCT b.start_lsn) AS records, sum(b.block_data_length + coalesce(b.block_fpi_length, 0)) AS bytes
  FROM pg_get_wal_block_info(%(start)s::pg_lsn, %(end)s::pg_lsn) b
  LEFT JOIN pg_class c ON c.relfilenode = b.relfilenode
 GROUP BY 1, 2 ORDER BY bytes DESC NULLS LAST LIMIT %(limit)s
"""

_DATABASE = """
SELECT xact_commit, tup_inserted + tup_updated + tup_deleted, sessions
  FROM pg_stat_database WHERE datname = %(database)s
"""

_WAL = "SELECT pg_current_wal_lsn() - '0/0'::pg_lsn, wal_records, pg_current_wal_lsn()::text FROM pg_stat_wal"


@dataclass
class Counters:
    statements: float = 0
    fk_checks: float = 0
    nested: float = 0
    commits: float = 0
    tuples_written: float = 0
    new_connections: float = 0
    wal_bytes: float = 0
    wal_records: float = 0
    cpu_workers_s: float = 0
    cpu_postgres_s: float = 0
    cpu_redis_s: float = 0
    cpu_driver_s: float = 0
    cpu_machine_s: float = 0
    redis_commands: float = 0
    wall_s: float = 0
    wal_lsn: str = "0/0"

    def __sub__(self, other: Counters) -> Counters:
        difference = Counters(**{f.name: getattr(self, f.name) - getattr(other, f.name) for f in fields(self)
                                 if f.name != "wal_lsn"})
        difference.wal_lsn = f"{other.wal_lsn}..{self.wal_lsn}"
        return difference

    def per(self, units: float) -> dict:
        """Per step (or per task): counts as they are, CPU in milliseconds."""
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name.startswith("cpu_"):
                out[f.name.replace("_s", "_ms")] = round(value * 1000 / units, 3)
            elif f.name not in ("wall_s", "wal_lsn"):
                out[f.name] = round(value / units, 3)
        return out


def process_tree_cpu_s(process: psutil.Process, *, reaped: bool) -> float:
    """CPU seconds of a process and its live children; with ``reaped``, also of the children it already reaped (the
    postmaster reaps every backend that exited)."""
    total = 0.0
    try:
        times = process.cpu_times()
        total += times.user + times.system
        if reaped:  # what the process's exited children used (the postmaster reaps every backend)
            total += times.children_user + times.children_system
        children = process.children(recursive=True)
    except psutil.Error:
        return total
    for child in children:
        try:
            times = child.cpu_times()
            total += times.user + times.system
        except psutil.Error:
            continue
    return total


def machine_busy_s() -> float:
    """Every core's busy time since boot, in seconds: user (guests' included), nice, system and interrupts — not idle,
    I/O wait, or steal (time the host gave another guest)."""
    times = psutil.cpu_times()
    return times.user + times.nice + times.system + getattr(times, "irq", 0.0) + getattr(times, "softirq", 0.0)


class Meter:
    """Reads the counters of one benchmark database, its PostgreSQL server and its Valkey.

    The meter's own queries run as a separate role and in the `postgres` database, so they are left out of the
    statement counts (pg_stat_statements is filtered by the benchmark database and by role).
    """

    def __init__(self, *, admin_url: str, database: str, postmaster_pid: int, redis_client, redis_pid: int):
        self.conn = psycopg.connect(admin_url, autocommit=True)
        self.database = database
        self.postmaster = psutil.Process(postmaster_pid)
        self.redis = redis_client
        self.redis_process = psutil.Process(redis_pid)
        self.worker_pids: list[int] = []
        self.has_statements = bool(self.conn.execute(
            "SELECT 1 FROM pg_extension WHERE extname = 'pg_stat_statements'").fetchone())

    def reset(self) -> None:
        if self.has_statements:
            self.conn.execute("SELECT pg_stat_statements_reset()")

    def snapshot(self) -> Counters:
        counters = Counters(wall_s=time.monotonic())
        params = {"database": self.database}
        if self.has_statements:
            counters.statements, counters.fk_checks, counters.nested = (
                float(v) for v in self.conn.execute(_STATEMENTS, params).fetchone())
        commits, tuples, sessions = self.conn.execute(_DATABASE, params).fetchone()
        counters.commits, counters.tuples_written, counters.new_connections = float(commits), float(tuples), \
            float(sessions)
        wal_bytes, wal_records, counters.wal_lsn = self.conn.execute(_WAL).fetchone()
        counters.wal_bytes, counters.wal_records = float(wal_bytes), float(wal_records)
        counters.cpu_postgres_s = process_tree_cpu_s(self.postmaster, reaped=True)
        counters.cpu_redis_s = process_tree_cpu_s(self.redis_process, reaped=False)
        for pid in self.worker_pids:
            try:
                counters.cpu_workers_s += process_tree_cpu_s(psutil.Process(pid), reaped=False)
            except psutil.Error:
                continue
        counters.redis_commands = float(self.redis.info("stats")["total_commands_processed"])
        counters.cpu_driver_s = time.process_time()
        counters.cpu_machine_s = machine_busy_s()
        return counters

    SETTLE_SECONDS = 10.5

    def settle(self) -> None:
        """Let idle backends' statistics reach the shared counters (PGSTAT_IDLE_INTERVAL is 10 s)."""
        time.sleep(self.SETTLE_SECONDS)

    def wal_by_relation(self, window: Counters, *, units: int, limit: int = 30) -> list[tuple[str, str, float, float]]:
        """(relation, record kind, records per unit, bytes per unit) over a measured window, biggest first."""
        start, end = window.wal_lsn.split("..")
        with psycopg.connect(self.conn.info.dsn.replace("dbname=postgres", f"dbname={self.database}"),
                             autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
            params = {"start": start, "end": end, "limit": limit}
            by_kind = conn.execute(_WAL_BY_KIND, params).fetchall()
            rows = conn.execute(_WAL_BY_RELATION, params).fetchall()
        return ([("(all relations)", kind, count / units, float(size) / units) for kind, count, size in by_kind]
                + [(relation, kind, records / units, float(bytes_ or 0) / units)
                   for relation, kind, records, bytes_ in rows])

    def wal_full_page_image_bytes(self, window: Counters) -> float:
        """Of a window's WAL, the bytes of full-page images: a page's first change after a checkpoint is written
        whole, so this part depends on when checkpoints fall and on how many distinct pages the inserts touch."""
        start, end = window.wal_lsn.split("..")
        with psycopg.connect(self.conn.info.dsn.replace("dbname=postgres", f"dbname={self.database}"),
                             autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
            return float(conn.execute("SELECT coalesce(sum(fpi_size), 0) FROM pg_get_wal_stats(%s::pg_lsn, "
                                      "%s::pg_lsn, false)", [start, end]).fetchone()[0])

    def top_statements(self, limit: int = 25) -> list[tuple[int, bool, float, float, str]]:
        """The benchmark database's statements by calls since the last reset: (calls, top level?, mean execution
        ms, planning ms per call — a prepared statement is planned once, not per call —, query)."""
        if not self.has_statements:
            return []
        return self.conn.execute(
            """SELECT calls, toplevel, mean_exec_time, total_plan_time / greatest(calls, 1),
                      regexp_replace(query, '\s+', ' ', 'g')
                 FROM pg_stat_statements s
                 JOIN pg_database d ON d.oid = s.dbid
                WHERE d.datname = %(database)s
                  AND s.userid <> (SELECT oid FROM pg_roles WHERE rolname = current_user)
                ORDER BY calls DESC LIMIT %(limit)s""", {"database": self.database, "limit": limit}).fetchall()

    def statements_matching(self, pattern: str) -> dict:
        """Calls, rows and execution ms, since the last reset, of the benchmark database's statements whose text is
        LIKE `pattern` (e.g. 'SELECT % FROM "agents_app_transcriptmessage"%': the reads of one table)."""
        if not self.has_statements:
            return {"calls": 0, "rows": 0, "exec_ms": 0.0}
        calls, rows, exec_ms = self.conn.execute(
            """SELECT coalesce(sum(calls), 0), coalesce(sum(rows), 0), coalesce(sum(total_exec_time), 0)
                 FROM pg_stat_statements s
                 JOIN pg_database d ON d.oid = s.dbid
                WHERE d.datname = %(database)s
                  AND s.userid <> (SELECT oid FROM pg_roles WHERE rolname = current_user)
                  AND s.query LIKE %(pattern)s""", {"database": self.database, "pattern": pattern}).fetchone()
        return {"calls": int(calls), "rows": int(rows), "exec_ms": float(exec_ms)}

    def close(self) -> None:
        self.conn.close()
