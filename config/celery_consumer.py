"""The worker's broker consumer (Celery's ``worker_consumer`` setting): Celery's own, reconnecting sooner.

Celery's consumer retries a lost broker connection through kombu's ``ensure_connection`` with its default intervals,
2 s growing by 2 s up to 30 s, and passes no way to change them. After an outage of 22 s its next try came 8 s after
the broker was back; after a minute's, up to 30 s — and every task waited that long: the hints were queued, and no
worker took them (tests/test_broker_outage.py). A try costs a TCP connect to 127.0.0.1 or the broker's host, so
a fleet can afford one every ``RECONNECT_MAX_SECONDS``.

Only the consumer's connection: a process's sends (a slice's next hint, a create's) try briefly and leave a hint
that could not be sent to the reaper's next sweep (CELERY_TASK_PUBLISH_RETRY_POLICY, tasks_app.db.dispatch).
"""

from __future__ import annotations

import functools

from celery.worker.consumer import Consumer

RECONNECT_FIRST_SECONDS = 0.5
RECONNECT_MAX_SECONDS = 2.0


class RuntimeConsumer(Consumer):
    def ensure_connected(self, conn):
        # Celery calls conn.ensure_connection(errback, max_retries, callback=…) without intervals: bind ours to this
        # connection object, which Celery made for this attempt (a new one each time the consumer restarts).
        conn.ensure_connection = functools.partial(
            conn.ensure_connection, interval_start=RECONNECT_FIRST_SECONDS, interval_step=RECONNECT_FIRST_SECONDS,
            interval_max=RECONNECT_MAX_SECONDS)
        return super().ensure_connected(conn)
