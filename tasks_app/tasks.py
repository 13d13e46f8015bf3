"""Celery tasks: thin interfaces over the engine and the reaper."""

import uuid

from celery import shared_task
from django.db import close_old_connections

from tasks_app.engine import reaper
from tasks_app.engine import slice as engine


@shared_task(bind=True, name="runtime.run_step", ignore_result=True, max_retries=None)
def run_step(self, task_id: str) -> str:
    """Run a task for one time slice (a hint: duplicates and stale messages do nothing)."""
    close_old_connections()  # the worker keeps its connection across tasks (CELERY_DB_REUSE_MAX); drop a dead one
    outcome = engine.run_step(uuid.UUID(task_id))
    if outcome == "database_unavailable":
        # The claim never reached the database: the hint must not be acked away. Send it again at once, for any
        # worker (this one's hint gate closes while the database is out of its reach; the short countdown keeps a
        # worker whose gate is open from spinning). If the broker is away too, the reaper's lost-hint sweep re-sends.
        raise self.retry(countdown=0.2)
    return outcome


@shared_task(name="runtime.reap", ignore_result=True)
def reap() -> dict:
    """The lease reaper's sweep (scheduled by django-celery-beat; see the PeriodicTask in admin)."""
    return reaper.reaper_sweep()


@shared_task(name="runtime.audit_seal", ignore_result=True)
def audit_seal() -> int:
    """Seal the heads of the event chains changed since the last seal (scheduled by django-celery-beat: the
    "runtime: seal audit chains" periodic task, made by tasks_app migration 0029)."""
    from tasks_app.audit.anchors import anchors_seal

    return anchors_seal()
