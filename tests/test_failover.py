"""Failover by liveness (tasks_app.engine.failover): a SIGKILLed worker's task moves to another worker in about a
second, with the default 30 s lease and no beat; a stopped-but-alive worker keeps its lease until it expires; a
worker wrongly taken for dead (its liveness connection cut) is fenced out; the idle fleet watches at under one
statement per second.

The bound asserted here is loose (well under the lease, so the takeover is shown to come from liveness, not from
expiry, on a loaded test machine); the measured failover time is the bench's (docs/failover.md)."""

import os
import signal
import time

import psutil
import psycopg
import pytest
from django.db import connection

from tasks_app.engine.failover import LISTEN_CATCH_UP_SECONDS, LIVENESS_NAMESPACE, WATCH_INTERVAL_SECONDS, HolderGone
from tasks_app.models import Task
from tests.engine_support import effects, executions, new_task
from tests.worker_support import wait_for_status

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("external_root")]


def _admin():
    """A connection of our own to the test database, outside Django's (autocommit)."""
    db = connection.settings_dict
    return psycopg.connect(host=db["HOST"] or "127.0.0.1", port=db["PORT"] or 5432, user=db["USER"],
                           password=db["PASSWORD"] or None, dbname=db["NAME"], autocommit=True)


def _owner(task_id):
    return Task.objects.filter(id=task_id).values_list("lease_owner", flat=True).first()


def _wait(predicate, seconds, what):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"{what}: not within {seconds} s")


def _killpg(worker, sig):
    os.killpg(worker.process.pid, sig)


def _running(tenant, fleet, *, steps, sleep_ms=150):
    """A demo task started on a fleet already up; (the task, its lease owner, the worker holding it)."""
    task = new_task(tenant, steps=steps, sleep_ms=sleep_ms)
    _wait(lambda: Task.objects.get(id=task.id).steps_completed >= 2, 30, "a worker runs it")
    owner = _owner(task.id)
    holder = int(owner.split(":")[1])
    worker = next(w for w in fleet if holder in [w.process.pid] + [c.pid for c in
                                                                    psutil.Process(w.process.pid).children()])
    return task, owner, worker


def test_it_tells_a_holders_lease_gone_the_moment_its_session_ends():
    with _admin() as probe:
        holder = _admin()
        holder.execute("SELECT pg_advisory_lock(%s, hashtext(%s))", [LIVENESS_NAMESPACE, "host:1:abc"])

        def gone(owner):
            return probe.execute(f"SELECT {HolderGone.template % {'expressions': '%s'}}", [owner]).fetchone()[0]

        assert gone("host:1:abc") is False
        assert gone("host:2:def") is True  # nobody holds that one's lock
        holder.close()
        assert _wait(lambda: gone("host:1:abc"), 2, "the lock freed with the session")


def test_it_moves_a_sigkilled_workers_task_to_another_worker_long_before_its_lease_expires(tenant, workers):
    fleet = [workers("first"), workers("second")]
    task, doomed_owner, first = _running(tenant, fleet, steps=30, sleep_ms=100)
    assert f":{first.process.pid}:" not in doomed_owner  # (held by the pool process, not the main one)

    done_before = Task.objects.get(id=task.id).steps_completed
    killed_at = time.monotonic()
    _killpg(first, signal.SIGKILL)  # the whole worker: main process (the fleet's watcher, maybe) and pool process
    _wait(lambda: (_owner(task.id) or doomed_owner) != doomed_owner, 10, "another worker took the task")
    taken_after = time.monotonic() - killed_at
    _wait(lambda: Task.objects.get(id=task.id).steps_completed > done_before + 1, 10, "it progresses again")
    progressing_after = time.monotonic() - killed_at

    # 30 s lease, no beat: only liveness can explain a takeover this early.
    assert taken_after < 6 and progressing_after < 8, (taken_after, progressing_after)
    task = wait_for_status(task.id, {"completed", "failed", "dead_lettered"}, seconds=60)
    assert task.status == "completed" and task.recoveries == 1
    assert task.events.filter(type="status", data__reason="holder_gone").count() == 1
    assert effects(task.id) == {f"{task.id}:{seq}:record": 1 for seq in range(1, 31)}  # every effect exactly once
    assert all(count <= 2 for count in executions(task.id).values())  # only the step in flight ran twice


def test_it_leaves_a_stopped_but_alive_workers_lease_until_it_expires_then_fences_it(tenant, workers):
    short = {"RUNTIME_LEASE_SECONDS": "4", "RUNTIME_HEARTBEAT_SECONDS": "1"}
    fleet = [workers("one", env=short), workers("two", env=short)]
    task, owner, _ = _running(tenant, fleet, steps=30)

    # The pool process holding the lease, stopped: alive (its sessions and its liveness lock stay), not renewing.
    # (Its worker's main process goes on; it may be the fleet's watcher. A watcher stopped too would leave recovery
    # to the reaper's beat: docs/failover.md.)
    holder = int(owner.split(":")[1])
    os.kill(holder, signal.SIGSTOP)
    stopped_at = time.monotonic()
    try:
        time.sleep(2.5)
        assert _owner(task.id) == owner  # not taken for dead: its lock is held
        _wait(lambda: (_owner(task.id) or owner) != owner, 10, "taken over once the lease expired")
        assert time.monotonic() - stopped_at >= 3  # (renewed at most 1 s before the stop, for 4 s)
    finally:
        os.kill(holder, signal.SIGCONT)  # it wakes up mid-step: its commit is fenced out

    task = wait_for_status(task.id, {"completed", "failed", "dead_lettered"}, seconds=60)
    assert task.status == "completed"
    assert task.events.filter(type="status", data__reason="lease_expired").count() == 1
    assert effects(task.id) == {f"{task.id}:{seq}:record": 1 for seq in range(1, 31)}


def _liveness_backends(admin, owner):
    return [pid for (pid,) in admin.execute(
        "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND classid = %s::oid AND objsubid = 2 "
        "AND objid = hashtext(%s)::oid AND granted", [LIVENESS_NAMESPACE, owner])]


def test_it_keeps_the_lease_of_a_worker_whose_liveness_connection_is_cut(tenant, workers):
    fleet = [workers("cut"), workers("other")]  # (either main process may be the fleet's watcher)
    task, owner, _ = _running(tenant, fleet, steps=25, sleep_ms=100)

    with _admin() as admin:
        backends = _liveness_backends(admin, owner)
        assert len(backends) == 1
        admin.execute("SELECT pg_terminate_backend(%s)", backends)
        # The renewer sees its socket closed, reconnects and locks again before the watcher's second look.
        _wait(lambda: _liveness_backends(admin, owner), 2, "locked again on a new connection")

    task = wait_for_status(task.id, {"completed", "failed", "dead_lettered"}, seconds=60)
    assert task.status == "completed" and task.recoveries == 0  # never taken for dead
    assert executions(task.id) == {seq: 1 for seq in range(1, 26)}


def test_it_fences_a_live_worker_taken_for_dead(tenant, workers):
    """Its liveness connection cut while it could not reconnect (stopped): taken for dead, rightly by what the
    database shows; it wakes up mid-step and can commit nothing."""
    fleet = [workers("cut"), workers("other")]
    task, owner, _ = _running(tenant, fleet, steps=25, sleep_ms=100)
    holder = int(owner.split(":")[1])

    os.kill(holder, signal.SIGSTOP)
    try:
        with _admin() as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", _liveness_backends(admin, owner))
        _wait(lambda: (_owner(task.id) or owner) != owner, 10, "taken for dead")
    finally:
        os.kill(holder, signal.SIGCONT)

    task = wait_for_status(task.id, {"completed", "failed", "dead_lettered"}, seconds=60)
    assert task.status == "completed" and task.recoveries == 1
    assert list(task.steps.order_by("seq").values_list("seq", flat=True)) == list(range(1, 26))
    assert effects(task.id) == {f"{task.id}:{seq}:record": 1 for seq in range(1, 26)}


def _statements_started(admin):
    """{backend pid: when its latest statement started} of the test database's other sessions (pg_stat_activity is
    current — unlike pg_stat_database's counters, which an idle backend reports up to 10 s late)."""
    return dict(admin.execute("SELECT pid, query_start FROM pg_stat_activity WHERE datname = current_database() "
                              "AND backend_type = 'client backend' AND pid <> pg_backend_pid()").fetchall())


def test_it_leaves_an_idle_fleet_quiet_and_wakes_its_watcher_with_the_first_lease(tenant, workers):
    """No lease anywhere: the watcher waits on LISTEN instead of passing every second (one pass per
    failover_idle_pass_seconds, here longer than the test). The first claim's announcement wakes it: the task of a
    pool process SIGKILLed right after is taken over within seconds — without the announcement the watcher would sleep
    on, and the 30 s lease (no beat here) would be the first to let it go."""
    quiet = {"RUNTIME_FAILOVER_IDLE_PASS_SECONDS": "300", "RUNTIME_FAILOVER_IDLE_AFTER_SECONDS": "1"}
    fleet = [workers("idle1", env=quiet), workers("idle2", env=quiet)]
    # One of them has taken the watch, passed, begun to listen and made its catch-up passes; the other waits.
    time.sleep(WATCH_INTERVAL_SECONDS * 3 + LISTEN_CATCH_UP_SECONDS + 1)

    with _admin() as admin:
        before = _statements_started(admin)
        time.sleep(WATCH_INTERVAL_SECONDS * 6)  # a watcher passing every second would have started 6 statements
        assert _statements_started(admin) == before  # not one statement from the idle fleet
        waiting = admin.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted "
                                "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
                                ).fetchone()[0]
    assert waiting == 1  # the one that does not watch waits inside PostgreSQL, issuing nothing

    task, owner, _ = _running(tenant, fleet, steps=30, sleep_ms=100)
    holder = int(owner.split(":")[1])
    killed_at = time.monotonic()
    os.kill(holder, signal.SIGKILL)  # the pool process only: the watcher (a main process) lives on
    _wait(lambda: (_owner(task.id) or owner) != owner, 10, "another process took the task")
    assert time.monotonic() - killed_at < 6
    task = wait_for_status(task.id, {"completed", "failed", "dead_lettered"}, seconds=60)
    assert task.status == "completed"
    assert task.events.filter(type="status", data__reason="holder_gone").count() == 1
