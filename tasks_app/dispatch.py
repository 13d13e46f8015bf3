"""Handing a task to a worker: a run_step hint through the broker (sent by name: no import of the engine)."""

import logging

logger = logging.getLogger(__name__)


def task_dispatch(task_id, *, priority: int, countdown: float | None = None) -> bool:
    """Send a run_step hint; False if the broker could not take it.

    A hint that never arrives is not an error anyone should see: the task row is committed and the reaper
    re-sends runnable tasks whose message was lost. So a broker outage must not turn a created task into a
    500 or a committed step into a failed Celery task. Task priority 9 (most urgent) maps to Redis priority 0,
    which kombu consumes first.
    """
    from config.celery import app

    try:
        app.send_task("runtime.run_step", args=[str(task_id)], priority=9 - priority, countdown=countdown)
        return True
    except Exception:  # kombu/redis raise many types; all mean the same here
        logger.warning("broker unreachable: run_step for task %s left to the reaper's re-send", task_id,
                       exc_info=True)
        return False
