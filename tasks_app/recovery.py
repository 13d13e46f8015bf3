"""Recovery (ARCHITECTURE §7): the lease reaper's sweep, and what operators do with dead letters.

The sweep runs as the Celery task `runtime.reap`, scheduled by a django-celery-beat PeriodicTask (created by
a migration, editable in admin). Every part is idempotent and works one task per short transaction
(`try_<verb>_one` style), so a crash or a concurrent second reaper never leaves anything half done.
"""

from __future__ import annotations

import logging
import os
from datetime import timedelta

from django.conf import settings
from django.core.files.storage import default_storage
from django.db import transaction
from django.db.models.functions import Now
from django.utils import timezone

from checkpoints_app.checkpoints import CheckpointCorrupt, checkpoint_verify
from checkpoints_app.models import Checkpoint, EffectStatus, SideEffect
from tasks_app.dispatch import task_dispatch
from tasks_app.errors import InvalidTransition
from tasks_app.models import RUNNABLE_STATUSES, TERMINAL_STATUSES, Task, TaskEvent, TaskStatus, sources_of
from tasks_app.services import chain_events, status_event, task_transition

logger = logging.getLogger(__name__)

BATCH = 500
# A lease in these statuses expired: the holder died. pausing/cancelling keep their status (the request must
# survive the crash); the others become `recovering` and are claimed again from their checkpoint.
KEEP_STATUS_ON_RECOVERY = {TaskStatus.PAUSING, TaskStatus.CANCELLING}


def reaper_sweep() -> dict[str, int]:
    """One pass: expired leases, lost messages, deadlines, retention. Returns counts for the log."""
    counts = {
        "recovered": 0, "dead_lettered": 0,
        "redispatched": tasks_redispatch_lost(),
        "deadline_failed": deadlines_enforce(),
        "purged": terminal_tasks_purge(),
    }
    for task_id in Task.objects.filter(lease_expires_at__lt=Now()).values_list("id", flat=True)[:BATCH]:
        outcome = lease_reap_one(task_id)
        if outcome:
            counts[outcome] += 1
    if any(counts.values()):
        logger.info("reaper: %s", counts)
    return counts


def lease_reap_one(task_id) -> str | None:
    """Recover one task whose lease expired. None if it was not expired after all (renewed, or another reaper)."""
    cfg = settings.RUNTIME
    with transaction.atomic():
        # SKIP LOCKED: a worker committing right now holds the row; its commit renews the lease, so skip it.
        task = (Task.objects.select_for_update(no_key=True, skip_locked=True)
                .filter(id=task_id, lease_expires_at__lt=Now())
                .only("id", "status", "recoveries", "lease_owner", "lease_epoch", "event_seq", "event_head_hash",
                      "priority").first())
        if task is None:
            return None
        recoveries = task.recoveries + 1
        if recoveries > cfg.max_recoveries:
            to, message = TaskStatus.DEAD_LETTERED, (f"Dead-lettered (max_recoveries_exceeded): its worker was "
                                                     f"lost {recoveries} times (limit {cfg.max_recoveries})")
            extra = {"error": {"type": "DeadLettered", "reason": "max_recoveries_exceeded", "message": message}}
        elif task.status in KEEP_STATUS_ON_RECOVERY:
            to, message, extra = TaskStatus(task.status), f"Worker lost; resuming to {task.status} safely", {}
        else:
            to, message, extra = TaskStatus.RECOVERING, "Recovering: its worker was lost, resuming from checkpoint", {}
        events, seq, head = chain_events(task.id, [status_event(to, message, recoveries=recoveries,
                                                                reason="lease_expired")],
                                         seq=task.event_seq, head=task.event_head_hash)
        # Guarded on the epoch we read: if the holder renewed or someone re-claimed meanwhile, do nothing.
        # Clearing lease_owner is what fences the lost worker out should it wake up (its commit needs it).
        rows = Task.objects.filter(id=task.id, lease_epoch=task.lease_epoch, lease_expires_at__lt=Now(),
                                   status__in=sources_of(to)).update(
            status=to, status_message=message, recoveries=recoveries, lease_owner=None, lease_expires_at=None,
            event_seq=seq, event_head_hash=head, updated_at=Now(), **extra,
        )
        if rows != 1:
            return None
        TaskEvent.objects.bulk_create(events)
        if to != TaskStatus.DEAD_LETTERED:
            transaction.on_commit(lambda: task_dispatch(task.id, priority=task.priority))
    logger.warning("task %s: lease of %s expired; %s", task_id, task.lease_owner, to)
    return "dead_lettered" if to == TaskStatus.DEAD_LETTERED else "recovered"


def tasks_redispatch_lost() -> int:
    """Re-send run_step for runnable, unleased tasks nobody touched for redispatch_after_seconds.

    Such a task's message was lost (broker restart, crash between commit and send). Touching updated_at
    spaces the re-sends; a duplicate message is harmless (its claim finds the lease taken).
    """
    horizon = timezone.now() - timedelta(seconds=settings.RUNTIME.redispatch_after_seconds)
    with transaction.atomic():
        stale = list(Task.objects.select_for_update(skip_locked=True)
                     .filter(status__in=sorted(RUNNABLE_STATUSES), lease_owner__isnull=True, updated_at__lt=horizon)
                     .values_list("id", "priority")[:BATCH])
        Task.objects.filter(id__in=[task_id for task_id, _ in stale]).update(updated_at=Now())
    for task_id, priority in stale:
        task_dispatch(task_id, priority=priority)
    return len(stale)


def deadlines_enforce() -> int:
    failed = 0
    overdue = Task.objects.filter(deadline_at__lt=Now()).exclude(status__in=sorted(TERMINAL_STATUSES))
    for task_id in overdue.values_list("id", flat=True)[:BATCH]:
        try:
            # Clearing the lease fences out a worker still running it: its next write fails as LeaseLost.
            task_transition(task_id=task_id, to=TaskStatus.FAILED, message="Failed: the deadline passed",
                            event_data={"reason": "deadline_exceeded"}, extra_events=[("terminal", {"status": "failed"})],
                            error={"type": "DeadlineExceeded", "message": "the task's deadline passed"},
                            completed_at=Now(), lease_owner=None, lease_expires_at=None)
            failed += 1
        except InvalidTransition:
            continue  # finished meanwhile
    return failed


def terminal_tasks_purge() -> int:
    days = settings.RUNTIME.retention_days
    if not days:
        return 0
    horizon = timezone.now() - timedelta(days=days)
    ids = list(Task.objects.filter(status__in=sorted(TERMINAL_STATUSES), completed_at__lt=horizon)
               .values_list("id", flat=True)[:BATCH])
    if ids:
        Task.objects.filter(id__in=ids).delete()  # cascades to steps, events, checkpoints, effects
        for task_id in ids:  # then their files: artifacts and results of every lease, committed or not
            storage_folder_delete(f"tasks/{task_id}")
    return len(ids)


def storage_folder_delete(folder: str) -> None:
    """Delete every file under a storage folder (works for any Django storage that can list)."""
    try:
        folders, files = default_storage.listdir(folder)
    except (FileNotFoundError, NotADirectoryError):
        return
    for name in files:
        default_storage.delete(f"{folder}/{name}")
    for name in folders:
        storage_folder_delete(f"{folder}/{name}")
    local = getattr(default_storage, "path", None)  # a filesystem leaves empty folders behind: remove them
    if local is not None:
        try:
            os.rmdir(local(folder))
        except OSError:
            pass


# -- dead letters ------------------------------------------------------------------------------------------------
class DeadLetterError(ValueError):
    pass


def dead_letter_retry(*, task_id, effects: str | None = None, requested_by: str = "") -> Task:
    """Resume a dead-lettered task from its last good checkpoint.

    Checkpoints that fail verification are quarantined (kept for forensics, skipped by recovery), so the task
    resumes from the newest good one plus the step deltas after it. Effects whose outcome is unknown must be
    resolved by the operator: ``effects="applied"`` records them as done, ``"not_applied"`` lets the step call
    them again with the same idempotency key.
    """
    with transaction.atomic():
        task = Task.objects.select_for_update(no_key=True).get(id=task_id)
        if task.status != TaskStatus.DEAD_LETTERED:
            raise DeadLetterError(f"task {task_id} is {task.status}, not dead_lettered")
        open_effects = SideEffect.objects.filter(task_id=task_id, status__in=[EffectStatus.STARTED,
                                                                             EffectStatus.UNKNOWN])
        if open_effects.exists():
            if effects not in ("applied", "not_applied"):
                keys = ", ".join(open_effects.values_list("key", flat=True)[:5])
                raise DeadLetterError(f"effects with unknown outcome: {keys}. Check the remote system, then retry "
                                      f"saying whether they happened: admin action 'Retry … DID happen' / 'did NOT "
                                      f"happen', or manage.py dead_letters retry ID --effects applied|not_applied")
            open_effects.update(status=EffectStatus.SUCCEEDED if effects == "applied" else EffectStatus.FAILED,
                                finished_at=Now(), error={"resolvedBy": requested_by, "resolution": effects})
        # Sequences keep counting past quarantined checkpoints; recovery reads the newest good one.
        quarantined = _quarantine_corrupt_checkpoints(task_id)
        task = task_transition(task_id=task_id, to=TaskStatus.RECOVERING,
                               message="Retrying from the last good checkpoint",
                               event_data={"requestedBy": requested_by, "quarantinedCheckpoints": quarantined,
                                           "effects": effects},
                               recoveries=0, error=None)
        transaction.on_commit(lambda: task_dispatch(task.id, priority=task.priority))
    return task


def _quarantine_corrupt_checkpoints(task_id) -> list[int]:
    quarantined = []
    for checkpoint in Checkpoint.objects.filter(task_id=task_id, quarantined=False).order_by("-sequence"):
        try:
            checkpoint_verify(payload=checkpoint.payload, checksum=checkpoint.checksum,
                              schema_version=checkpoint.schema_version)
            break
        except CheckpointCorrupt:
            Checkpoint.objects.filter(id=checkpoint.id).update(quarantined=True)
            quarantined.append(checkpoint.sequence)
    return quarantined


def dead_letter_abandon(*, task_id, requested_by: str = "") -> Task:
    """Give up on a dead-lettered task: it fails with the dead-letter reason kept in its error."""
    task = Task.objects.get(id=task_id)
    if task.status != TaskStatus.DEAD_LETTERED:
        raise DeadLetterError(f"task {task_id} is {task.status}, not dead_lettered")
    error = {**(task.error or {}), "abandonedBy": requested_by}
    return task_transition(task_id=task_id, to=TaskStatus.FAILED, message="Abandoned by an operator",
                           event_data={"requestedBy": requested_by}, extra_events=[("terminal", {"status": "failed"})],
                           error=error, completed_at=Now())


def dead_letters():
    return Task.objects.filter(status=TaskStatus.DEAD_LETTERED).order_by("-updated_at")

