"""Celery tasks: thin interfaces over the engine and the reaper."""

import uuid

from celery import shared_task

from tasks_app import engine, recovery


@shared_task(name="runtime.run_step", ignore_result=True)
def run_step(task_id: str) -> str:
    """Run a task for one time slice (a hint: duplicates and stale messages do nothing)."""
    return engine.run_step(uuid.UUID(task_id))


@shared_task(name="runtime.reap", ignore_result=True)
def reap() -> dict:
    """The lease reaper's sweep (scheduled by django-celery-beat; see the PeriodicTask in admin)."""
    return recovery.reaper_sweep()
