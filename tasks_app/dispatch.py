"""Handing a task to a worker: a run_step hint through the broker (sent by name: no import of the engine)."""


def task_dispatch(task_id, *, priority: int, countdown: float | None = None) -> None:
    """Send a run_step hint. A lost one is re-sent by the reaper; a duplicate finds the lease taken.

    Task priority 9 (most urgent) maps to Redis priority 0, which kombu consumes first.
    """
    from config.celery import app

    app.send_task("runtime.run_step", args=[str(task_id)], priority=9 - priority, countdown=countdown)
