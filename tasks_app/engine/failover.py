"""Failover in about a second: a dead worker's leases are taken over when its process is gone, not when its lease
runs out (ARCHITECTURE §7; docs/failover.md).

**Liveness.** Every process that takes leases holds, for its life, a PostgreSQL session-level advisory lock named by
its lease owner id (tasks_app.engine.lease.current_worker_id): (LIVENESS_NAMESPACE, hashtext(owner)), taken by its
lease renewer on the renewer's own connection before the process's first claim, and again whenever that connection
is new. PostgreSQL releases it the moment the process dies, or its connection does: a SIGKILL or an OOM kill frees it at
once (the kernel closes the socket); a host that vanished or was cut off, once the server notices the connection is
dead (its tcp_keepalives_* settings: docs/failover.md).

**The holder is gone** when its lock is free. A lease whose holder is gone is recovered exactly as an expired one
(tasks_app.engine.reaper.lease_reap_one: the same guarded UPDATE on the epoch read, the same recovery event, reason
``holder_gone``), so fencing is unchanged: a worker wrongly taken for dead (its renewer's connection was cut, it
is alive) is fenced out by the new epoch and can never commit. A stalled-but-alive worker keeps its session and
its lock: it loses its lease on expiry, as before.

**Right after PostgreSQL restarts** every session is new and no lock is held until each renewer reconnects (at its
next beat, or its next claim). For POSTMASTER_GRACE_SECONDS after the server's start, holders are not judged by
their locks; leases run out as before.

**Who watches.** The reaper's sweep (beat) recovers both kinds. And, so that recovery never waits for beat (nor
depends on it), one `celery worker` main process of the fleet watches every WATCH_INTERVAL_SECONDS: the one that
holds the watch lock (WATCH_LOCK, session-level). The others wait for that lock blocked inside PostgreSQL — no
statement, no polling — and the first of them takes over the watch the moment the watcher's session ends.

**Only while leases exist.** A pass also says whether any lease is held anywhere. While none is, the watcher waits
on LISTEN LEASES_CHANNEL for up to failover_idle_pass_seconds (a safety net) instead of passing every second; a
process that has taken a lease sends NOTIFY on it (its lease renewer's thread, after the claim committed — at most
once per ANNOUNCE_EVERY_SECONDS), and for WAKE_HOT_SECONDS after one the watcher passes every second whatever it
sees. It listens only once no lease has been seen for failover_idle_after_seconds (a fleet between two slices of its
tasks is not idle), and never while leases are held (UNLISTEN): a busy fleet's notifications would be traffic from the
server to the watcher's session, and a session with data in flight to a host that was cut off is found dead by the
server's retransmission timeout, counted from that data, instead of by its keepalives — seen as a partitioned
watcher holding the watch lock, and with it every recovery, 2 s longer. Going idle again it listens, then passes
every second for LISTEN_CATCH_UP_SECONDS before it waits.

Races this closes: (1) a pass that saw no lease, then a claim committing — its notification wakes the watcher, whose
next pass sees the lease and keeps it watching while any is held. (2) A claim that sent no notification because its
process sent one less than ANNOUNCE_EVERY_SECONDS before: if the watcher heard that one, it passes for
WAKE_HOT_SECONDS after it; if that one came before the watcher listened, the claim committed less than
ANNOUNCE_EVERY_SECONDS after it began to, and the catch-up passes see it. A process that dies between its claim's
commit and its notification leaves a lease the watcher finds at its next idle pass (or the sweep, or the lease's
expiry). The idle fleet's cost: one statement per failover_idle_pass_seconds.
"""

from __future__ import annotations

import logging
import threading
import time

from django.db import connection, connections
from django.db.models import BooleanField, Func

from tasks_app.db.prepared import connection_close_quietly

logger = logging.getLogger(__name__)

# pg_advisory_lock(int4, int4) keys: (LIVENESS_NAMESPACE, hashtext(owner)) per lease holder; WATCH_LOCK the watcher's.
LIVENESS_NAMESPACE = 0x4C495645  # "LIVE"
WATCH_LOCK = (0x57415443, 0)  # "WATC"
WATCH_INTERVAL_SECONDS = 1.0
# Lease announcements (the module's docstring, "Only while leases exist").
LEASES_CHANNEL = "runtime_leases"
ANNOUNCE_EVERY_SECONDS = 1.0
WAKE_HOT_SECONDS = 5.0
LISTEN_CATCH_UP_SECONDS = 2 * ANNOUNCE_EVERY_SECONDS
# A holder seen gone is looked at again this much later before its leases are taken (tasks_app.engine.reaper): a
# live worker whose connection was cut (pg_terminate_backend, a proxy's reset) reconnects and locks again well
# within it (its renewer checks its socket every RENEWER_SOCKET_CHECK_SECONDS).
HOLDER_GONE_CONFIRM_SECONDS = 0.3
RENEWER_SOCKET_CHECK_SECONDS = 0.1
POSTMASTER_GRACE_SECONDS = 30
# After taking over a gone holder's leases, a pending hint this old (the broker's queues empty) is taken for lost with
# it and sent again (FailoverWatch._watch).
DEAD_HOLDER_HINT_GRACE_SECONDS = 0.5
# ... on that pass and the next ones: a hint the dead process took just before it died is younger than the grace at
# the first of them.
DEAD_HOLDER_HINT_PASSES = 3
# Whether the holder of a lease is gone: its liveness lock is held by no session of this database (a lock taken
# with two int4 keys shows as classid = key1, objid = key2, objsubid = 2), and the server has been up longer than the
# grace. Uncorrelated, so PostgreSQL reads the lock table once per statement (a hashed subplan), not once per lease.
# An owner that never took its lock (a process older than this code) looks gone: its leases are taken over and it
# is fenced out, which is safe (it may do a step's work twice, never commit it twice).
HOLDER_GONE_SQL = f"""(
  pg_postmaster_start_time() < now() - interval '{POSTMASTER_GRACE_SECONDS} seconds'
  AND hashtext(%s)::oid NOT IN (
    SELECT l.objid FROM pg_locks l
     WHERE l.locktype = 'advisory' AND l.classid = {LIVENESS_NAMESPACE}::oid AND l.objsubid = 2 AND l.granted
       AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())))"""


class HolderGone(Func):
    """HolderGone(F("lease_owner")): a boolean expression for the ORM (filters, annotations) — HOLDER_GONE_SQL."""

    template = HOLDER_GONE_SQL.replace("%s", "%(expressions)s")
    output_field = BooleanField()
    arity = 1


def session_connection():
    """This thread's connection for session-level locks: DATABASE_SESSION_URL's (alias "session") when set — a
    transaction pooler in front of DATABASE_URL cannot carry them — else its default one."""
    return connections["session"] if "session" in connections.settings else connection


def session_connection_close_quietly() -> None:
    """Drop this thread's session-lock connection (and its default one: the same, unless a pooler is in front)."""
    connection_close_quietly()
    if "session" in connections.settings:
        try:
            connections["session"].close()
        except Exception:  # (already dropped by the server: gone either way)
            pass


def liveness_lock_take(owner: str) -> bool:
    """Take this process's liveness lock on the current thread's session connection (the lease renewer's). False if
    another session holds it: a hashtext collision with another live process (then this one's leases look alive
    while that one lives — never taken over wrongly, only recovered at expiry)."""
    with session_connection().cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_lock(%s, hashtext(%s))", [LIVENESS_NAMESPACE, owner])
        taken = cursor.fetchone()[0]
    if not taken:
        logger.warning("liveness lock of %s is held by another session (hash collision): its leases are recovered "
                       "at expiry only", owner)
    return taken


def leases_announce() -> None:
    """Wake the fleet's watcher: this process has taken a lease (on the current thread's session connection — the
    lease renewer's — after the claim committed; NOTIFY is delivered to listeners once committed, at once here)."""
    with session_connection().cursor() as cursor:
        cursor.execute(f"NOTIFY {LEASES_CHANNEL}")


class HintGate:
    """Whether this worker takes hints (broker messages): not while its database is out of its reach.

    A host that reaches the broker but not PostgreSQL (a partition, docs/failover.md) would otherwise keep taking
    hints it cannot act on — among them the recovery hints of its own lost tasks — and hold each through a claim
    that cannot succeed, while a host that can reach the database waits for them. The watch's connection tells,
    at no cost: when it is lost and cannot be made again at once, the worker stops consuming (Celery's
    cancel_task_queue, as the cancel_consumer control command does) until it can, then consumes again.

    The watch thread only says what it wants (``close``, ``open``); the consumer's own loop makes it so (call_soon),
    by one idempotent ``_apply`` that reads the latest wish when it runs — so two wishes queued together (the loop was
    busy reconnecting to the broker) cannot be applied in the wrong order. ``open`` asks again at every watch pass
    while the wish is open and the consumer is not consuming (a consumer restarted by a broker outage)."""

    def __init__(self, consumer=None):
        self.consumer = consumer
        self.wanted_open = True
        self.queues: list[str] = []

    def close(self) -> None:
        if self.consumer is None or not self.wanted_open:
            return
        logger.warning("database out of reach: this worker stops taking hints until it is back")
        self.wanted_open = False
        self.consumer.call_soon(self._apply)

    def open(self) -> None:
        if self.consumer is None:
            return
        if not self.wanted_open:
            logger.warning("database back: this worker takes hints again")
            self.wanted_open = True
            self.consumer.call_soon(self._apply)
        elif self.queues and not self._consuming():
            self.consumer.call_soon(self._apply)

    def _consuming(self) -> bool:
        try:
            return all(self.consumer.task_consumer.consuming_from(name) for name in self.queues)
        except Exception:  # (no task consumer: the worker is starting or stopping)
            return True

    def _apply(self) -> None:
        """(In the consumer's loop.) Make consumption match the latest wish."""
        task_consumer = getattr(self.consumer, "task_consumer", None)
        if task_consumer is None:
            return
        if not self.wanted_open:
            consumed = [queue.name for queue in task_consumer.queues if task_consumer.consuming_from(queue.name)]
            self.queues = sorted(set(self.queues) | set(consumed))
            for name in consumed:
                self.consumer.cancel_task_queue(name)
        else:
            for name in self.queues:
                if not task_consumer.consuming_from(name):
                    self.consumer.add_task_queue(name)


class FailoverWatch(threading.Thread):
    """The fleet's watcher, in a `celery worker` main process: wait for the watch lock (blocked in PostgreSQL), then
    recover the leases of gone holders and expired leases every WATCH_INTERVAL_SECONDS, for the process's life.

    A database error drops the connection (and with it the watch: another process may take it) and connects again
    at once; if that fails too, the database is out of this process's reach: its HintGate closes until a connection
    is made again (tried every second). In every process, watching or waiting: a waiting one's session ends too when
    the server finds its peer gone (client_connection_check_interval, docs/failover.md)."""

    def __init__(self, gate: HintGate | None = None):
        super().__init__(daemon=True, name="failover-watch")  # (ends with its process)
        self.gate = gate or HintGate()
        self.connected = False

    def run(self) -> None:
        while True:
            self.connected = False
            try:
                self._watch()
            except Exception:  # the database went away, or our session was ended: let another process watch
                logger.info("failover watch: connection lost", exc_info=True)
            finally:
                session_connection_close_quietly()
            if self.connected:  # it had a session: try again at once (a terminated session is back at once)
                time.sleep(0.05)
                continue
            self.gate.close()
            time.sleep(1.0)

    def _watch(self) -> None:
        from django.conf import settings

        from tasks_app.engine.reaper import leases_lost_read, leases_recover_counts, tasks_redispatch_lost

        session = session_connection()
        with session.cursor() as cursor:
            # Named apart in pg_stat_activity: the fleet's one watcher, not any task's cost.
            cursor.execute("SET application_name = 'runtime-failover-watch'")
            self.connected = True
            self.gate.open()
            # Blocks, without polling, while another process watches; returns the moment its session ends.
            cursor.execute("SELECT pg_advisory_lock(%s, %s)", list(WATCH_LOCK))
        logger.info("failover watch: this process watches the fleet's leases")
        hint_passes = 0
        hot_until = 0.0
        listening = False  # (never while waiting for the watch lock: it would hold back the notification queue)
        busy_at = time.monotonic()  # when a pass last saw a lease (or the watch began)
        while True:
            # A pass at once, then every interval: the watch lock came either to a fleet that was just (re)started —
            # every worker may have died with its leases — or the moment the previous watcher's session ended, as
            # when its process was SIGKILLed with its tasks' liveness locks (bench --compare, W3 and W3-one).
            self.gate.open()  # (no-op unless a broker outage restarted the consumer while it was closed)
            leased, lost = leases_lost_read()
            recovered = sum(leases_recover_counts(lost).values()) if lost else 0
            if recovered:
                logger.warning("failover watch: recovered %s lease(s)", recovered)
                hint_passes = DEAD_HOLDER_HINT_PASSES
            if hint_passes:
                # A process that died with leases may have died with hints too (taken, not yet claimed: a slice
                # released just before, its hint prefetched there). With beat down nobody else would send them
                # again; with it, not before its next sweep and the lost-hint grace. Runnable, unleased, hint
                # pending for over DEAD_HOLDER_HINT_GRACE_SECONDS with the broker's queues empty: sent again (a
                # duplicate is harmless: a claim is idempotent).
                hint_passes -= 1
                tasks_redispatch_lost(lost_grace_seconds=DEAD_HOLDER_HINT_GRACE_SECONDS)
            if listening and self._woken(session, timeout=0):  # (announced during the pass or the sleep before it)
                hot_until = time.monotonic() + WAKE_HOT_SECONDS
            if leased or hint_passes:
                busy_at = time.monotonic()
            if leased or hint_passes or time.monotonic() - busy_at < settings.RUNTIME.failover_idle_after_seconds:
                if listening:
                    listening = self._listen(session, False)
                time.sleep(WATCH_INTERVAL_SECONDS)
                continue
            if not listening:
                listening = self._listen(session, True)
                hot_until = max(hot_until, time.monotonic() + LISTEN_CATCH_UP_SECONDS)
            if time.monotonic() < hot_until:
                time.sleep(WATCH_INTERVAL_SECONDS)
            elif self._woken(session, timeout=settings.RUNTIME.failover_idle_pass_seconds):
                hot_until = time.monotonic() + WAKE_HOT_SECONDS

    @staticmethod
    def _listen(session, on: bool) -> bool:
        with session.cursor() as cursor:
            cursor.execute(f"LISTEN {LEASES_CHANNEL}" if on else f"UNLISTEN {LEASES_CHANNEL}")
        return on

    @staticmethod
    def _woken(session, *, timeout: float) -> bool:
        """Whether a lease was announced (LEASES_CHANNEL) since the last look, waiting up to ``timeout`` for one. A
        lost connection raises (psycopg reads the socket), as a failed pass would."""
        return any(True for _ in session.connection.notifies(timeout=timeout, stop_after=1))


_WATCH: FailoverWatch | None = None


def failover_watch_start(consumer=None) -> None:
    """Start this process's watcher (worker_ready: in the main process, after its pool has forked), with the hint
    gate of ``consumer`` (the worker's Celery consumer; None: no gate)."""
    global _WATCH
    if _WATCH is None or not _WATCH.is_alive():
        _WATCH = FailoverWatch(HintGate(consumer))
        _WATCH.start()
