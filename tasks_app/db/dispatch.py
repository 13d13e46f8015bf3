"""Handing a task to a worker: a run_step hint through the broker (sent by name: no import of the engine).

A hint is pending from when its sender marks ``hint_at`` (in the same statement that makes the task runnable
or releases its lease) until a claim consumes it. At most one is pending per task: a claim that finds the fleet
full, or the task's tenant at its max_running_tasks, consumes the hint without re-sending it, and the task waits
hint-less until a released slot or the reaper hands it one (tenant by tenant, each tenant's most urgent first).
"""

import logging

from celery import current_app
from django.conf import settings
from django.db import DatabaseError, connection, transaction

from tasks_app.db import sql

logger = logging.getLogger(__name__)

# Queue priority for a task coming back from a crash: its hint must not wait behind the whole backlog.
RECOVERY_PRIORITY = 9


def hint_queue_names() -> list[str]:
    """The broker's lists that hold run_step hints, one per priority step, as kombu's Redis transport names
    them: `celery`, `celery:1` … `celery:9`."""
    from django.conf import settings

    options = settings.CELERY_BROKER_TRANSPORT_OPTIONS
    return ["celery" if not step else f"celery{options['sep']}{step}" for step in options["priority_steps"]]


def hint_queue_depth() -> int | None:
    """run_step hints waiting in the broker, over all its priority lists (one pipeline of LLENs); None when the
    broker does not answer within 2 s. Serves the console's overview and /metrics."""
    import redis
    from django.conf import settings

    client = redis.Redis.from_url(settings.CELERY_BROKER_URL, socket_timeout=2, socket_connect_timeout=2)
    try:
        pipe = client.pipeline(transaction=False)
        for name in hint_queue_names():
            pipe.llen(name)
        return sum(pipe.execute())
    except redis.RedisError:
        return None
    finally:
        client.close()


def task_dispatch(task_id, *, priority: int, countdown: float | None = None) -> bool:
    """Send a run_step hint; False if the broker could not take it.

    A hint that never arrives is not an error anyone should see: the task row is committed. So a broker outage
    must not turn a created task into a 500 or a committed step into a failed Celery task. A failed send clears
    the pending mark, which makes the task "waiting" again: the reaper's next sweep hands it a hint (seconds),
    instead of the lost-message horizon. Task priority 9 (most urgent) maps to Redis priority 0, which kombu
    consumes first.

    Sent through celery.current_app, not by importing config.celery: that module is the wiring, which imports the
    engine (its worker signals start the failover watcher, whose hand-outs come back here), so the import closed a
    cycle dispatch → config.celery → engine.failover → … → dispatch (issue 38). The settings load the app before any
    of this can run and make it every thread's default (config/celery.py says why that matters).
    """
    try:
        current_app.send_task("runtime.run_step", args=[str(task_id)], priority=9 - priority, countdown=countdown)
        return True
    except Exception as error:  # kombu/redis raise many types; all mean the same here
        # One line, not the traceback: during a broker outage every create and every released slice lands here
        # (a Valkey restart under load printed 60 lines per create).
        logger.warning("broker unreachable (%s: %s): run_step for task %s left to the reaper",
                       type(error).__name__, str(error)[:200], task_id)
    try:
        with connection.cursor() as cursor:
            cursor.execute(sql.HINT_UNSENT, {"task_id": task_id})
    except DatabaseError as error:  # both away: the lost-hint sweep re-sends it once the hint is old enough
        logger.warning("could not clear the unsent hint of task %s (%s)", task_id, type(error).__name__)
    return False


def hints_for_waiting(*, limit: int, releasing_tenant: int | None = None) -> int:
    """Hand up to ``limit`` free slots to waiting tasks (runnable, unleased, no hint pending), tenant by tenant
    (sql.HINT_WAITING: the tenants take turns, one at its cap — its max_running_tasks, or the default share of the live
    fleet — gets none, and no more than the fleet's free slots go out).

    ``releasing_tenant``: the tenant of the task whose letting go frees the slot. Between tenants running as many it
    comes last, so a tie goes to the other tenant (sql.HINT_WAITING says why). A letting-go asks for two: the fleet
    slot it freed, which that ranking may give to another tenant, and its tenant's room, for its own next waiting task
    — with one, the releasing tenant's room would wait for the next letting-go or the reaper's sweep while the fleet
    had a free worker.

    Under the claim's advisory lock (sql.CLAIM_ADVISORY_LOCK), in a transaction of its own, so the statement's
    snapshot is taken after every claim that came before it had committed. Race this closes: a claim refused for the
    tenant's cap while the tenant's running task was letting go counted that task as running, and the releasing
    write's "anyone waiting?" probe, read before the refusal committed, saw nobody; the releasing worker's hand-out,
    after its release, waits for the refusal's lock and then sees both the waiting task and the free slot. Hand-outs
    are rare (a released slot with tasks waiting, the reaper's sweep), and hold the lock for one statement."""
    if limit <= 0:
        return 0
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s)", [sql.CLAIM_ADVISORY_LOCK])
        cursor.execute(sql.HINT_WAITING, {"limit": limit, "releasing": releasing_tenant,
                                          "max_concurrent": settings.RUNTIME.max_concurrent_tasks,
                                          "share": settings.RUNTIME.tenants.default_running_share})
        waiting = cursor.fetchall()
    for task_id, priority in waiting:
        task_dispatch(task_id, priority=priority)
    return len(waiting)


def hints_for_tenant_room(*, tenant_id: int, cap: int) -> int:
    """Hand out a free slot when the tenant runs fewer than ``cap`` tasks (sql.TENANT_LEASED, unlocked: the
    hand-out itself counts again under the lock); 0 when it is at its cap. After a new task joined the tenant's
    waiting ones (services.task_join_waiting)."""
    with connection.cursor() as cursor:
        cursor.execute(sql.TENANT_LEASED, {"tenant_id": tenant_id})
        if cursor.fetchone()[0] >= cap:
            return 0
    return hints_for_waiting(limit=1)
