"""The Celery app with statement counting, for benchmark workers only (`celery -A bench.instrumented worker`).

Every SQL statement a worker process sends through Django is counted; after each Celery task the count is
added to a Redis counter the benchmark reads. Product code is untouched.
"""

import redis
from celery.signals import task_postrun, worker_process_init
from django.conf import settings
from django.db.backends.signals import connection_created

from config.celery import app  # noqa: F401  (the app the worker runs)

_statements = 0
COUNTER_KEY = "bench:statements"
STEPS_KEY = "bench:run_step_calls"


def _count(execute, sql, params, many, context):
    global _statements
    _statements += 1
    return execute(sql, params, many, context)


def _instrument(sender, connection, **kwargs):
    # Fired on every (re)connect of the same wrapper object: add the counter once.
    if _count not in connection.execute_wrappers:
        connection.execute_wrappers.append(_count)


connection_created.connect(_instrument, weak=False)
_client = None


@worker_process_init.connect
def _reset(**kwargs):
    global _client, _statements
    _client, _statements = None, 0


@task_postrun.connect
def _flush(task=None, **kwargs):
    global _client, _statements
    if _client is None:
        _client = redis.Redis.from_url(settings.REDIS_URL)
    pipe = _client.pipeline()
    pipe.incrby(COUNTER_KEY, _statements)
    if task is not None and task.name == "runtime.run_step":
        pipe.incr(STEPS_KEY)
    pipe.execute()
    _statements = 0
