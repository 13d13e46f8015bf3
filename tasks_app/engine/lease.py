"""The lease: claiming a task and keeping it with a heartbeat (ARCHITECTURE §4, steps 1–2); giving it back
without a status change is one statement, tasks_app.db.store.lease_release (step 7).

The lease epoch is the fencing token: every write a worker makes carries (owner, epoch) and matches nothing once
the reaper or another claim moved it on.
"""

from __future__ import annotations

import logging
import os
import select
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from django.conf import settings

from checkpoints_app.fencing import Fence
from tasks_app.db import store
from tasks_app.db.prepared import json_value
from tasks_app.engine import failover, faults
from tasks_app.engine.plans import PLAN_CHUNK_STEPS
from tasks_app.observability import metrics

logger = logging.getLogger(__name__)


def worker_identity() -> str:
    """Unique per process: the same host and pid after a restart still gets a new lease epoch anyway."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


_WORKER_ID: str | None = None
_WORKER_PID: int | None = None


def current_worker_id() -> str:
    global _WORKER_ID, _WORKER_PID
    if _WORKER_PID != os.getpid():  # prefork children inherit the parent's module state
        _WORKER_ID, _WORKER_PID = worker_identity(), os.getpid()
    return _WORKER_ID



@dataclass
class Claim:
    """What the claim statement returns: everything a slice needs to start, in one round trip."""

    fence: Fence
    status: str
    workflow_name: str
    workflow_version: str
    input: dict
    goal: Any
    plan_version: int
    plan_length: int | None  # None: no plan stored yet (the first slice makes it)
    next_step_index: int
    steps_completed: int
    event_seq: int
    event_head_hash: str
    checkpoint_sequence: int | None
    budget_steps: int | None
    budget_cost: Decimal | None
    cost_spent: Decimal
    priority: int
    deadline_passed: bool
    seconds_since_checkpoint: float
    state_version: int
    steering_cursor: int
    plan_chunk: list | None  # the runs of the chunk holding next_step_index
    open_effects: list[dict]  # effects a previous lease started whose outcome is not recorded
    answers: dict  # resolved waits by wait id (Task.answers): fixed while leased, only an unleased task is answered
    approval_policy: dict | None
    checkpoint_policy: dict | None
    tenant_id: int  # where the task's live events are published (tasks_app.streaming)
    budget_tokens: int | None
    tokens_spent: int
    budget_on_exhausted: str  # "fail", "wait", or "" for the workflow's on_budget_exhausted
    # The running cap the claim applied to the task's tenant: its max_running_tasks, or the default share of the live
    # fleet (runtime.yaml tenants.default_running_share; 1 when the claim had no need to count it). None: no cap at
    # all. A slice that lets the task go for good hands the freed slot on even when its write saw nobody waiting
    # (engine/exits.py, Exits.hand_on, names the race).
    tenant_max_running: int | None = None


def lease_claim(*, task_id, owner: str) -> Claim | None:
    """Take the task's lease (store.claim). None: someone holds it, it is not runnable, or the fleet or the task's
    tenant is at its cap."""
    cfg = settings.RUNTIME
    # A lease is taken only by a process that holds its liveness lock (tasks_app.engine.failover): else the fleet's
    # watcher would take this process for gone, and its new lease from it, at once. (Not held within the wait: the
    # database is away, and the claim will say so.)
    _renewer().hold_liveness(owner, timeout=LIVENESS_WAIT_SECONDS)
    row = store.claim(task_id=task_id, owner=owner, ttl=cfg.lease_seconds, max_concurrent=cfg.max_concurrent_tasks,
                      chunk_steps=PLAN_CHUNK_STEPS, share=cfg.tenants.default_running_share)
    if row is None:
        return None
    (epoch, status, wf_name, wf_version, input_, goal, plan_version, plan_length, next_index, steps_completed,
     event_seq, head, cp_seq, budget_steps, budget_cost, cost_spent, priority, deadline_passed, since_cp,
     state_version, steering_cursor, plan_chunk, open_effects, answers, approval_policy, checkpoint_policy,
     tenant_id, budget_tokens, tokens_spent, budget_on_exhausted, tenant_max_running, hint_waited) = row
    metrics.task_claimed(hint_waited_seconds=hint_waited)
    return Claim(
        fence=Fence(task_id=task_id, owner=owner, epoch=epoch), status=status, workflow_name=wf_name,
        workflow_version=wf_version, input=json_value(input_), goal=json_value(goal), plan_version=plan_version,
        plan_length=plan_length, next_step_index=next_index, steps_completed=steps_completed, event_seq=event_seq,
        event_head_hash=head, checkpoint_sequence=cp_seq, budget_steps=budget_steps, budget_cost=budget_cost,
        cost_spent=cost_spent, priority=priority, deadline_passed=deadline_passed,
        seconds_since_checkpoint=float(since_cp), state_version=state_version, steering_cursor=steering_cursor,
        plan_chunk=json_value(plan_chunk), open_effects=json_value(open_effects) or [],
        answers=json_value(answers) or {}, approval_policy=json_value(approval_policy),
        checkpoint_policy=json_value(checkpoint_policy), tenant_id=tenant_id, budget_tokens=budget_tokens,
        tokens_spent=tokens_spent, budget_on_exhausted=budget_on_exhausted, tenant_max_running=tenant_max_running,
    )


class Heartbeat:
    """Keeps one slice's lease alive: renewed every heartbeat_seconds by the process's lease renewer.

    What the renewals learn is read by the slice loop at its safe points: the lease is lost, the status moved
    (pause, cancel), the deadline passed. A step past its time limit is not renewed for: its lease runs out and the
    reaper hands the task on, even if the step never returns.
    """

    def __init__(self, fence: Fence):
        self.fence = fence
        self.lost = False  # the lease is not ours any more: stop at the next safe point, write nothing
        self.status: str | None = None
        self.deadline_passed = False
        self.state_version: int | None = None
        self._step_limit_at: float | None = None  # monotonic time after which the running step is overdue
        self.step_overdue = False
        self.next_beat = 0.0

    def start(self) -> None:
        self.next_beat = time.monotonic() + settings.RUNTIME.heartbeat_seconds
        _renewer().watch(self)

    def stop(self) -> None:
        _renewer().unwatch(self)

    def step_started(self, limit_seconds: float) -> None:
        self._step_limit_at = time.monotonic() + limit_seconds
        self.step_overdue = False

    def step_finished(self) -> None:
        self._step_limit_at = None

    def beat(self) -> None:
        """One renewal (on the renewer's thread); database errors propagate to the renewer."""
        if self._step_limit_at is not None and time.monotonic() > self._step_limit_at:
            # The step is past its limit: never keep a lease alive for it (ARCHITECTURE §4).
            if not self.step_overdue:
                logger.warning("task %s: step past its time limit, lease left to expire", self.fence.task_id)
            self.step_overdue = True
            return
        faults.point("during_lease_renewal", task_id=self.fence.task_id)
        row = store.lease_renew(self.fence, ttl=settings.RUNTIME.lease_seconds)
        if row is None:
            self.lost = True
            return
        self.status, self.deadline_passed, self.state_version = row


# How long a claim waits for its process's liveness lock (taken once per renewer connection).
LIVENESS_WAIT_SECONDS = 2.0


class LeaseRenewer(threading.Thread):
    """One thread per worker process renews every lease the process holds, on one database connection kept for
    the process's life — not a thread and a new PostgreSQL backend per slice. On that connection it holds the
    process's liveness lock (tasks_app.engine.failover): taken when the thread starts, before the process's first
    claim, and again on every new connection.

    A renewal that fails on a database error closes that connection, so the next beat reconnects (Django would
    otherwise keep handing this thread the dead one, every renewal would fail and the lease would lapse under a
    healthy step).
    """

    def __init__(self):
        super().__init__(daemon=True, name="lease-renewer")
        self._watched: set[Heartbeat] = set()
        self._changed = threading.Condition()
        self._stopping = False
        self.live = threading.Event()  # every owner's liveness lock is held, on self._locked_on
        self._owners: set[str] = set()  # the owners this process takes leases as (one, but for tests)
        self._locked: set[str] = set()  # those whose lock self._locked_on holds
        self._locked_on = None
        self._failing = False
        self._announce = False  # a lease was taken: wake the fleet's failover watcher (failover.leases_announce)
        self._announced_at = float("-inf")

    def hold_liveness(self, owner: str, *, timeout: float) -> bool:
        """Have this process hold ``owner``'s liveness lock (a worker leases as current_worker_id() only; a test
        process as the owners it names); wait up to ``timeout`` for it. Whether it is held."""
        with self._changed:
            if owner not in self._owners:
                self._owners.add(owner)
                self.live.clear()
                self._changed.notify()
        return self.live.wait(timeout=timeout)

    def _hold_liveness(self) -> None:
        """(On this thread.) Take the liveness locks this thread's connection does not hold yet: all of them on a
        new connection. No statement while it holds them all; database errors propagate (the caller closes the
        connection and tries again). ``live`` is set only if no owner was added meanwhile (hold_liveness clears it
        under the same lock)."""
        session = failover.session_connection()
        if session.connection is None or session.connection is not self._locked_on:
            self._locked = set()
        with self._changed:
            missing = self._owners - self._locked
        if missing:
            session.ensure_connection()
            for owner in sorted(missing):
                failover.liveness_lock_take(owner)
                self._locked.add(owner)
            self._locked_on = session.connection
        with self._changed:
            if self._owners <= self._locked:
                self.live.set()

    def shutdown(self) -> None:
        with self._changed:
            self._stopping = True
            self._changed.notify()
        self.join(timeout=5)

    def watch(self, heartbeat: Heartbeat) -> None:
        """Renew ``heartbeat``'s lease from now on (its claim has committed), and tell the fleet's watcher that this
        process holds a lease — at most once per failover.ANNOUNCE_EVERY_SECONDS: the watcher keeps watching at least
        WAKE_HOT_SECONDS after an announcement, and for as long as it sees a lease."""
        with self._changed:
            self._watched.add(heartbeat)
            if time.monotonic() - self._announced_at >= failover.ANNOUNCE_EVERY_SECONDS:
                self._announce = True
            self._changed.notify()

    def unwatch(self, heartbeat: Heartbeat) -> None:
        with self._changed:
            self._watched.discard(heartbeat)

    def run(self) -> None:
        try:
            self._renew_until_shutdown()
        finally:
            failover.session_connection_close_quietly()

    def _renew_until_shutdown(self) -> None:
        while True:
            if self.live.is_set() and self._connection_dropped():
                # The server ended our session (pg_terminate_backend, a restart, a proxy's reset): the liveness
                # lock went with it. Reconnect and lock again now, not at the next beat — the fleet's watcher looks
                # twice, HOLDER_GONE_CONFIRM_SECONDS apart, before it takes a holder for gone.
                logger.warning("lease renewer: the database ended its session; reconnecting")
                failover.session_connection_close_quietly()
                self.live.clear()
            if not self.live.is_set():  # not yet taken, or its connection failed: try again (every second, idle)
                self._liveness_or_reconnect()
            if self._announce and self.live.is_set():
                self._leases_announce()
            with self._changed:
                if self._stopping:
                    return
                now = time.monotonic()
                due = [h for h in self._watched if h.next_beat <= now]
                if not due:
                    wait = min((h.next_beat for h in self._watched), default=now + 60) - now
                    if self.live.is_set() and failover.session_connection().connection is not None:
                        # Look at the socket often (a select, no statement): a process between two claims must be
                        # locked again before its next one, not be taken for gone with its next lease.
                        wait = min(wait, failover.RENEWER_SOCKET_CHECK_SECONDS)
                    elif not self.live.is_set():
                        wait = min(wait, 1.0)
                    self._changed.wait(timeout=max(wait, 0.01))
                    continue
            interval = settings.RUNTIME.heartbeat_seconds
            self._liveness_or_reconnect()
            for heartbeat in due:
                heartbeat.next_beat = time.monotonic() + interval
                try:
                    heartbeat.beat()
                except faults.InjectedFault:  # a simulated renewal failure: this lease is left to lapse
                    self.unwatch(heartbeat)
                except Exception:  # a database blip: reconnect at the next beat; the commit's fence decides anyway
                    logger.warning("lease renewal failed for task %s; reconnecting", heartbeat.fence.task_id,
                                   exc_info=True)
                    failover.session_connection_close_quietly()
                    self.live.clear()  # (the liveness lock went with the connection: taken again on the next)
                if heartbeat.lost:
                    self.unwatch(heartbeat)


    def _leases_announce(self) -> None:
        with self._changed:
            self._announce, self._announced_at = False, time.monotonic()
        try:
            failover.leases_announce()
        except Exception:  # the database is away: the lease is found at the watcher's next idle pass, if it lasts
            logger.warning("lease announcement failed; reconnecting", exc_info=True)
            failover.session_connection_close_quietly()
            self.live.clear()

    @staticmethod
    def _connection_dropped() -> bool:
        """Whether the server has ended this thread's session: its socket is readable while no statement runs (the
        server's last words, then EOF). No statement is sent."""
        raw = failover.session_connection().connection
        if raw is None:
            return False
        try:
            readable, _, _ = select.select([raw.pgconn.socket], [], [], 0)
        except Exception:  # (closed under us: no socket any more)
            return True
        return bool(readable)

    def _liveness_or_reconnect(self) -> None:
        try:
            self._hold_liveness()
            self._failing = False
        except Exception:  # the database is away: the renewals fail too; tried again within a second
            if not self._failing:  # (once per outage, not every second of it)
                logger.warning("liveness lock not taken; trying again every second", exc_info=True)
            self._failing = True
            self.live.clear()
            failover.session_connection_close_quietly()


_RENEWER: LeaseRenewer | None = None
_RENEWER_PID: int | None = None
_RENEWER_LOCK = threading.Lock()


def _renewer() -> LeaseRenewer:
    global _RENEWER, _RENEWER_PID
    with _RENEWER_LOCK:
        if _RENEWER is None or _RENEWER_PID != os.getpid() or not _RENEWER.is_alive():  # prefork children
            _RENEWER, _RENEWER_PID = LeaseRenewer(), os.getpid()
            _RENEWER.start()
        return _RENEWER


def lease_renewer_shutdown() -> None:
    """Stop this process's lease renewer and close its connection (tests, before their database is dropped)."""
    global _RENEWER
    with _RENEWER_LOCK:
        renewer, _RENEWER = _RENEWER, None
    if renewer is not None and renewer.is_alive():
        renewer.shutdown()

