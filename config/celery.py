"""The Celery application: settings come from Django's (CELERY_* names), tasks from each app's tasks.py."""

import logging
import os

from celery import Celery
from celery.signals import (
    after_setup_logger,
    after_setup_task_logger,
    worker_init,
    worker_process_init,
    worker_process_shutdown,
    worker_ready,
    worker_shutdown,
)

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

app = Celery("agent_runtime")
# The default app of every thread, not only of this one. The apps send tasks through celery.current_app (they do not
# import this module: it imports them), and Celery's current app is per thread: in a thread other than the one that
# ran this line — the ASGI edge's sync_to_async threads, the failover watcher's, a heartbeat's — it is the default
# app, which Celery would otherwise create on first use as a fallback aimed at amqp://localhost, and every hint sent
# from there would be lost to the reaper's sweep. (Celery's Django fixup sets it only when no default exists yet.)
app.set_default()
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@after_setup_logger.connect
@after_setup_task_logger.connect
def _redact_worker_logs(logger=None, **kwargs):
    """Celery replaces the root logger's handlers with its own: they get the redaction filter too."""
    from config.logging_redaction import RedactingFilter

    for handler in [*(logger.handlers if logger else []), *logging.getLogger().handlers]:
        if not any(isinstance(existing, RedactingFilter) for existing in handler.filters):
            handler.addFilter(RedactingFilter())


# Metrics (tasks_app.observability.metrics). With PROMETHEUS_MULTIPROC_DIR every process counts into that directory;
# the main process serves /metrics for all of them on WORKER_METRICS_PORT (0: off), once its pool has started (the
# children must not inherit the listening socket).
@worker_ready.connect
def _metrics_serve(**kwargs):
    from django.conf import settings

    from tasks_app.observability import metrics

    metrics.process_started("worker")
    if settings.WORKER_METRICS_PORT:
        metrics.worker_server_start(port=settings.WORKER_METRICS_PORT, host=settings.WORKER_METRICS_HOST)


@worker_ready.connect
def _failover_watch(sender=None, **kwargs):
    """The fleet's failover watcher (tasks_app.engine.failover): every worker's main process offers to watch; one
    does, the others wait for its session to end. Started after the pool forked (no thread crosses a fork). Its
    connection also gates the consumer (``sender``): no hints taken while the database is out of reach."""
    from tasks_app.engine.failover import failover_watch_start

    failover_watch_start(consumer=sender)


@worker_init.connect
@worker_process_init.connect
def _stacks_on_sigusr2(**kwargs):
    """`kill -USR2 <pid>` prints every thread's stack to the process's stderr (its log): for a slice that seems stuck,
    in the main process and in each pool process (Celery's own SIGUSR1 does the main process only)."""
    import faulthandler
    import signal
    import sys

    # The process's real stderr: Celery replaces sys.stderr with a logging proxy, which has no file descriptor.
    faulthandler.register(signal.SIGUSR2, file=sys.__stderr__, all_threads=True, chain=False)


@worker_process_init.connect
def _metrics_child_started(**kwargs):
    from tasks_app.observability import metrics

    metrics.process_started("worker_child")


@worker_process_shutdown.connect
def _metrics_child_exits(pid=None, **kwargs):
    """A pool process exits (max-tasks-per-child, a shrinking pool, shutdown): its live gauges go with it."""
    from tasks_app.observability import metrics

    metrics.process_dead(pid or os.getpid())


@worker_shutdown.connect
def _metrics_worker_exits(**kwargs):
    from tasks_app.observability import metrics

    metrics.process_dead(os.getpid())
@worker_init.connect
def _tracing_in_a_worker_without_children(sender=None, **kwargs):
    """Traces (tasks_app.observability.tracing), when the OTEL_* variables ask for them, in the process that runs the
    tasks: this one for a solo or threads pool; a prefork pool's children set up after their fork (below), since the
    span processor's export thread belongs to the process that started it."""
    pool = getattr(sender, "pool_cls", None)
    name = pool if isinstance(pool, str) else getattr(pool, "__module__", "") or ""
    if "prefork" not in name:
        from tasks_app.observability import tracing

        tracing.setup(service="agent-runtime-worker")


@worker_process_init.connect
def _tracing_in_a_prefork_child(**kwargs):
    from tasks_app.observability import tracing

    tracing.setup(service="agent-runtime-worker")
