"""Retention (docs/audit.md): terminal tasks past retention_days are deleted with everything that belongs to them —
events, steps, plan chunks, checkpoints, the effect ledger, steering commands, downstream tasks, transcript messages
(every model with a CASCADE foreign key to Task: Django's collector finds them) and their files in storage — in small
batches, each one short transaction, optionally exported first (settings.RETENTION_EXPORT).

The events, the admin actions' record and the seals' index refuse DELETE (migration 0029) except inside the purge's
own transaction: ``purge_allowed`` says so to the trigger with ``SET LOCAL runtime.purge = 'on'``, which lasts until
that transaction ends. Every purged task leaves an AdminAction (actor ``system:retention``, action ``purge``), so
that ``verify_events --anchors`` tells a purged task from one deleted behind the runtime's back.

Forks: a fork inherits its original's state, and with it references to the original's files (artifacts, input
files; its transcript messages are copied at the fork, agents_app.transcript.messages_copy). Purging an original
therefore keeps its storage folder while a live fork refers to it — a StorageHold per (folder, fork) — and purging
that fork hands its holds on to its own live forks; a folder is deleted with its last hold. (Copying the files at
fork time was the alternative; references to them are inside the state, the ledger and digest-addressed transcript
messages, which cannot be rewritten.)
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from datetime import timedelta

from django.conf import settings
from django.db import connection, transaction
from django.db.models.functions import Now

from tasks_app.audit.anchors import PURGE_ACTOR
from tasks_app.models import TERMINAL_STATUSES, AdminAction, SealedHead, StorageHold, Task

logger = logging.getLogger(__name__)

# Tasks per purge transaction: each holds its tasks' row locks only while their rows are deleted (a task with
# 100,000 events is 100,000 index entries removed). Small batches keep every lock and WAL burst short.
PURGE_BATCH = 100
PURGE_BATCHES_PER_SWEEP = 10
# And at most about this many events per transaction: 100 tasks of 100,000 events each are 100 transactions.
PURGE_MAX_EVENTS = 50_000


@contextmanager
def purge_allowed():
    """A transaction in which the append-only tables accept DELETE: the retention purge's, and nothing else's
    (tests use it to stage a cut chain). The setting is transaction-local: it ends with the transaction."""
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SELECT set_config('runtime.purge', 'on', true)")
        yield
        # Off again before leaving: inside an outer transaction this block is a savepoint, whose release would keep
        # the setting on for the rest of the caller's transaction. (If the block raises, the rollback undoes it.)
        with connection.cursor() as cursor:
            cursor.execute("SELECT set_config('runtime.purge', 'off', true)")


def terminal_tasks_purge(*, batches: int = PURGE_BATCHES_PER_SWEEP) -> int:
    """Delete terminal tasks past retention (exported first if RETENTION_EXPORT), in batches served by
    task_retention_idx. How many were purged."""
    days = settings.RUNTIME.retention_days
    if not days:
        return 0
    if settings.RETENTION_EXPORT:
        from tasks_app.audit.anchors import anchors_seal

        anchors_seal()  # each export carries the seal of its final head: seal what is not sealed yet
    horizon = Now() - timedelta(days=days)
    purged = 0
    for _ in range(batches):
        expired = list(Task.objects.filter(status__in=sorted(TERMINAL_STATUSES), completed_at__lt=horizon)
                       .order_by("completed_at").values_list("id", "event_seq")[:PURGE_BATCH])
        if not expired:
            break
        if settings.RETENTION_EXPORT:
            from tasks_app.audit.export import task_export

            for task_id, _ in expired:  # outside the transaction: a terminal task's rows no longer change
                task_export(task_id=task_id)
        for ids in _by_events(expired):
            purged += tasks_purge(ids, horizon=horizon)
        if len(expired) < PURGE_BATCH:
            break
    return purged


def _by_events(expired: list[tuple]) -> list[list]:
    """The batch's task ids in runs of at most PURGE_MAX_EVENTS events (one task at least): a transaction deletes
    about that many events and as many other rows, however long the tasks were."""
    runs: list[list] = [[]]
    events = 0
    for task_id, event_seq in expired:
        if runs[-1] and events + event_seq > PURGE_MAX_EVENTS:
            runs.append([])
            events = 0
        runs[-1].append(task_id)
        events += event_seq
    return runs


def tasks_purge(ids, *, horizon=None) -> int:
    """Delete these tasks (those of them still terminal, and past ``horizon`` if given, and not locked by someone
    else: a fork being created holds its original's key share) with their rows, in one transaction; their files
    after the commit. How many were deleted."""
    folders_gone: list[str] = []
    with purge_allowed():
        locked = Task.objects.select_for_update(skip_locked=True).filter(id__in=ids,
                                                                         status__in=sorted(TERMINAL_STATUSES))
        if horizon is not None:
            locked = locked.filter(completed_at__lt=horizon)
        tasks = list(locked.only("id", "tenant", "workflow_name", "status"))
        if not tasks:
            return 0
        purging = {task.id for task in tasks}
        folders = {task.id: {f"tasks/{task.id}"} for task in tasks}
        for folder, holder in StorageHold.objects.filter(task_id__in=purging).values_list("folder", "task_id"):
            folders[holder].add(folder)
        involved = sorted({folder for held in folders.values() for folder in held})
        # Lock every hold of these folders, in one order: two purges of two forks holding one folder must not both
        # see the other's hold and keep the folder forever (the second waits, then sees the first's deletion).
        list(StorageHold.objects.select_for_update().filter(folder__in=involved).order_by("folder", "task_id")
             .values_list("folder"))
        live_forks: dict = {}
        for fork_id, original_id in (Task.objects.filter(forked_from_id__in=purging).exclude(id__in=purging)
                                     .values_list("id", "forked_from_id")):
            live_forks.setdefault(original_id, []).append(fork_id)
        StorageHold.objects.bulk_create(
            [StorageHold(folder=folder, task_id=fork_id) for original_id, forks in live_forks.items()
             for folder in folders[original_id] for fork_id in forks], ignore_conflicts=True)
        StorageHold.objects.filter(task_id__in=purging).delete()
        AdminAction.objects.bulk_create([
            AdminAction(actor=PURGE_ACTOR, action="purge", model="tasks_app.task", object_id=str(task.id),
                        object_repr=str(task)[:200], tenant_id=task.tenant_id,
                        message=f"Purged after {settings.RUNTIME.retention_days} days of retention, with its events, "
                                f"steps, checkpoints, ledger, commands and files.") for task in tasks])
        SealedHead.objects.filter(task_id__in=purging).delete()
        Task.objects.filter(id__in=purging).delete()  # Django's collector: every CASCADE child, forks' SET NULL
        still_held = set(StorageHold.objects.filter(folder__in=involved).values_list("folder", flat=True))
        folders_gone = [folder for folder in involved if folder not in still_held]
    for folder in folders_gone:  # after the commit: a rolled-back purge never loses a file
        storage_folder_delete(folder)
    return len(tasks)


def storage_folder_delete(folder: str) -> None:
    """Delete every file under a storage folder (works for any Django storage that can list)."""
    import os

    from django.core.files.storage import default_storage

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
