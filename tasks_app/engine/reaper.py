"""Recovery (ARCHITECTURE §7): the lease reaper's sweep (what operators do with dead letters is in
tasks_app.engine.dead_letters).

The sweep runs as the Celery task `runtime.reap`, scheduled by a django-celery-beat PeriodicTask (created by
a migration, editable in admin). Every part is idempotent and works one task per short transaction
(`try_<verb>_one` style), so a crash or a concurrent second reaper never leaves anything half done.
"""

from __future__ import annotations

import logging
import time
from datetime import timedelta

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Exists, F, OuterRef, Q
from django.db.models.functions import Now

from checkpoints_app.models import EffectStatus, SideEffect
from tasks_app.db import store
from tasks_app.db.dispatch import RECOVERY_PRIORITY, hint_queue_depth, hints_for_waiting, task_dispatch
from tasks_app.db.transitions import task_transition
from tasks_app.engine.failover import HOLDER_GONE_CONFIRM_SECONDS, HOLDER_GONE_SQL, HolderGone
from tasks_app.errors import InvalidTransition
from tasks_app.events import chain_events, events_insert, status_event
from tasks_app.models import RUNNABLE_STATUSES, TERMINAL_STATUSES, Task, TaskStatus, sources_of
from tasks_app.observability import metrics, tracing
from tasks_app.registry import reaper_sweeps

logger = logging.getLogger(__name__)

BATCH = 500
# A lease in these statuses expired: the holder died. pausing/cancelling keep their status (the request must
# survive the crash); the others become `recovering` and are claimed again from their checkpoint.
KEEP_STATUS_ON_RECOVERY = {TaskStatus.PAUSING, TaskStatus.CANCELLING}


def reaper_sweep() -> dict[str, int]:
    """One pass: expired leases, lost or unsent hints, deadlines, retention. Returns counts for the log.

    One statement first says which parts have anything to look at (store.sweep_due, which also samples the console's
    throughput): an idle fleet's sweep is that statement and the layers' own sweeps, not one per part."""
    due = store.sweep_due(retention_days=settings.RUNTIME.retention_days)
    counts = {"recovered": 0, "dead_lettered": 0, "redispatched": 0, "handed_slots": 0, "deadline_failed": 0,
              "purged": 0}
    if due["leased"]:
        counts.update(leases_recover_counts())
    if due["runnable"]:
        counts.update(redispatched=tasks_redispatch_lost(), handed_slots=slots_hand_out())
    if due["overdue"]:
        counts.update(deadline_failed=deadlines_enforce())
    if due["purgeable"]:
        counts.update(purged=terminal_tasks_purge())
    for name, sweep in reaper_sweeps().items():
        try:
            counts[name] = sweep()
        except Exception:  # one layer's sweep failing must not stop recovery
            logger.warning("reaper: the %s sweep failed", name, exc_info=True)
    if any(counts.values()):
        logger.info("reaper: %s", counts)
    return counts


def _lost(queryset):
    """The tasks of ``queryset`` whose lease is lost: expired, or held by a process that is gone (its liveness lock
    is free: tasks_app.engine.failover), annotated with ``holder_gone``."""
    return (queryset.filter(lease_expires_at__isnull=False)  # (task_lease_expiry_idx: leased rows only)
            .annotate(holder_gone=HolderGone(F("lease_owner")))
            .filter(Q(lease_expires_at__lt=Now()) | Q(holder_gone=True)))


# Up to BATCH lost leases (expired, or their holder gone) and whether any lease is held at all, in one statement:
# the failover watch's pass (it watches often only while leases exist) and the sweep's. Both subqueries read only
# leased rows (task_lease_expiry_idx); the holders' locks are read once (HOLDER_GONE_SQL's hashed subplan).
LEASES_LOST_SQL = """
SELECT EXISTS (SELECT FROM tasks_app_task WHERE lease_expires_at IS NOT NULL),
       coalesce(array_agg(lost.id), '{}'), coalesce(array_agg(lost.expired), '{}')
  FROM (SELECT id, lease_expires_at < now() AS expired FROM tasks_app_task
         WHERE lease_expires_at IS NOT NULL AND (lease_expires_at < now() OR %s)
         LIMIT %d) lost
""" % (HOLDER_GONE_SQL % "lease_owner", BATCH)


def leases_lost_read() -> tuple[bool, list[tuple]]:
    """(whether any lease is held, [(task id, expired), …] of the lost ones): LEASES_LOST_SQL."""
    with connection.cursor() as cursor:
        cursor.execute(LEASES_LOST_SQL)
        leased, ids, expired = cursor.fetchone()
    return leased, list(zip(ids, expired))


def leases_recover_counts(lost: list[tuple] | None = None) -> dict[str, int]:
    """Recover every task whose lease is lost (expired, or its holder gone) — ``lost`` as leases_lost_read gave it,
    else read now: {"recovered": n, "dead_lettered": m}. The reaper's sweep and the fleet's failover watcher
    (tasks_app.engine.failover) both call it.

    A holder seen gone with its lease unexpired is looked at again HOLDER_GONE_CONFIRM_SECONDS later (by
    lease_reap_one's own read): a live worker whose connection was cut has reconnected and taken its liveness lock
    again by then (its renewer watches its socket: tasks_app.engine.lease), so a database blip costs it nothing; a
    dead one is still gone. Nothing is waited for when no holder is seen gone."""
    counts = {"recovered": 0, "dead_lettered": 0}
    if lost is None:
        _, lost = leases_lost_read()
    if not all(expired for _, expired in lost):
        time.sleep(HOLDER_GONE_CONFIRM_SECONDS)
    for task_id, _ in lost:
        outcome = lease_reap_one(task_id)
        if outcome:
            counts[outcome] += 1
    return counts


def lease_reap_one(task_id) -> str | None:
    """Recover one task whose lease is lost: expired, or its holder gone (tasks_app.engine.failover). None if it was
    not lost after all (renewed, taken again, or recovered by another reaper)."""
    cfg = settings.RUNTIME
    with transaction.atomic():
        # SKIP LOCKED: a worker committing right now holds the row; its commit renews the lease, so skip it.
        task = (_lost(Task.objects.select_for_update(no_key=True, skip_locked=True).filter(id=task_id))
                .only("id", "status", "recoveries", "recoveries_since_progress", "lease_owner", "lease_epoch",
                      "event_seq", "event_head_hash", "priority", "tenant_id").first())
        if task is None:
            return None
        reason = "holder_gone" if task.holder_gone else "lease_expired"
        # Only recoveries without progress count against max_recoveries: each committed step resets the count,
        # so a long task on machines that get pre-empted keeps going as long as it keeps progressing.
        without_progress = task.recoveries_since_progress + 1
        if without_progress > cfg.max_recoveries:
            to, message = TaskStatus.DEAD_LETTERED, (
                f"Dead-lettered (max_recoveries_exceeded): its worker was lost {without_progress} times in a row "
                f"without a step committing (limit {cfg.max_recoveries})")
            extra = {"error": {"type": "DeadLettered", "reason": "max_recoveries_exceeded", "message": message}}
        elif task.status in KEEP_STATUS_ON_RECOVERY:
            to, message, extra = TaskStatus(task.status), f"Worker lost; resuming to {task.status} safely", {}
        else:
            to, message, extra = TaskStatus.RECOVERING, "Recovering: its worker was lost, resuming from checkpoint", {}
        events, seq, head = chain_events(task.id, [status_event(to, message, recoveries=without_progress,
                                                                reason=reason)],
                                         seq=task.event_seq, head=task.event_head_hash)
        # Guarded on the epoch we read: if someone re-claimed meanwhile, do nothing; and on the lease being lost
        # still — a holder that renewed since (an expired lease) matches nothing. The row is locked (FOR NO KEY
        # UPDATE above), so no commit of the holder's lands between the read and this write. Clearing lease_owner
        # is what fences the lost worker out should it wake up (its commit needs it).
        recovering = to != TaskStatus.DEAD_LETTERED
        rows = _lost(Task.objects.filter(id=task.id, lease_epoch=task.lease_epoch, status__in=sources_of(to))).update(
            status=to, status_message=message, recoveries=task.recoveries + 1,
            recoveries_since_progress=without_progress, lease_owner=None, lease_expires_at=None,
            hint_at=Now() if recovering else None, event_seq=seq, event_head_hash=head, updated_at=Now(), **extra,
        )
        if rows != 1:
            return None
        events_insert(events, tenant_id=task.tenant_id)
        if recovering:
            # Queue priority only: a recovered task's hint must not wait behind the whole backlog.
            transaction.on_commit(lambda: task_dispatch(task.id, priority=RECOVERY_PRIORITY))
    logger.warning("task %s: lease of %s %s; %s", task_id, task.lease_owner,
                   "lost: its process is gone" if reason == "holder_gone" else "expired", to)
    if recovering:
        metrics.lease_recovered()
    else:
        metrics.dead_lettered(reason="max_recoveries_exceeded")
    tracing.recovery(task.id, owner=task.lease_owner, epoch=task.lease_epoch, to=to)
    return "recovered" if recovering else "dead_lettered"


# How long a claim may take to follow the message it came from. A hint older than this while the broker's
# queues are empty was taken by a worker that never claimed: one killed between taking it and its claim.
LOST_HINT_GRACE_SECONDS = 5


def hint_queues_empty() -> bool:
    """True when no run_step hint waits in any of the broker's ten priority lists (kombu names them
    `celery`, `celery:1` … `celery:9`); False when some do or the broker cannot be asked."""
    return hint_queue_depth() == 0


def tasks_redispatch_lost(*, lost_grace_seconds: float = LOST_HINT_GRACE_SECONDS) -> int:
    """Re-send the hint of runnable, unleased tasks whose pending hint no claim consumed: it was lost in the
    broker or with a worker. Lost for sure once the broker's queues are empty and the hint is older than
    LOST_HINT_GRACE_SECONDS — after all workers were killed, the restarted fleet drains the queues and the next
    sweep re-sends what the dead took with them, instead of waiting out redispatch_after_seconds. While hints are
    queued a pending one may still be on its way (behind a backlog), so it is re-sent only after
    redispatch_after_seconds. Compared with the database's clock. The failover watch calls it with a shorter grace
    right after it took over a gone holder's leases: that process may have taken hints with it."""
    seconds = settings.RUNTIME.redispatch_after_seconds
    if seconds > lost_grace_seconds and hint_queues_empty():
        seconds = lost_grace_seconds
    horizon = Now() - timedelta(seconds=seconds)
    with transaction.atomic():
        stale = list(Task.objects.select_for_update(skip_locked=True)
                     .filter(status__in=sorted(RUNNABLE_STATUSES), lease_owner__isnull=True, hint_at__lt=horizon)
                     .values_list("id", "priority")[:BATCH])
        Task.objects.filter(id__in=[task_id for task_id, _ in stale]).update(hint_at=Now(), updated_at=Now())
    for task_id, priority in stale:
        task_dispatch(task_id, priority=priority)
    return len(stale)


def slots_hand_out() -> int:
    """Hand free slots to waiting tasks: those whose hint found the fleet full, or could not be sent at all."""
    free = store.slots_free(max_concurrent=settings.RUNTIME.max_concurrent_tasks)
    return hints_for_waiting(limit=min(free, BATCH))


def deadlines_enforce() -> int:
    """Fail tasks past their deadline that no worker holds and that have no effect of unknown outcome.

    A leased task is failed by its worker at its next safe point (the heartbeat reports the deadline), and a
    task with open effects is handed to a worker, which reconciles them before failing it: cutting either off
    here would leave a started effect unresolved.
    """
    failed = 0
    open_effects = SideEffect.objects.filter(task=OuterRef("pk"), status__in=[EffectStatus.STARTED,
                                                                              EffectStatus.UNKNOWN])
    overdue = (Task.objects.filter(deadline_at__lt=Now()).exclude(status__in=sorted(TERMINAL_STATUSES))
               .exclude(status=TaskStatus.DEAD_LETTERED).filter(lease_owner__isnull=True)
               .annotate(has_open_effects=Exists(open_effects)))
    for task_id, status, priority, has_open_effects in overdue.values_list(
            "id", "status", "priority", "has_open_effects")[:BATCH]:
        if has_open_effects:
            if status in RUNNABLE_STATUSES:
                task_dispatch(task_id, priority=priority)
            continue
        try:
            task_transition(task_id=task_id, to=TaskStatus.FAILED, message="Failed: the deadline passed",
                            event_data={"reason": "deadline_exceeded"},
                            error={"type": "DeadlineExceeded", "message": "the task's deadline passed"},
                            guard={"lease_owner__isnull": True}, completed_at=Now(), hint_at=None)
            failed += 1
        except InvalidTransition:
            continue  # finished or claimed meanwhile
    return failed


def terminal_tasks_purge() -> int:
    """Delete terminal tasks past retention with everything of theirs (tasks_app.audit.retention: in short batches, the
    only transactions in which the append-only tables accept DELETE; exported first if RETENTION_EXPORT)."""
    from tasks_app.audit.retention import terminal_tasks_purge as purge  # (retention imports the anchors' cryptography)

    return purge()
