"""Beat's scheduler: django-celery-beat's DatabaseScheduler, asking the database whether the schedule changed at most
once per CHANGE_CHECK_SECONDS, and saying in one line that an entry was not sent while the broker is away.

DatabaseScheduler asks on every read of its schedule — several times per tick (Scheduler.tick compares the schedule,
then reads it again to fill its heap) — and each ask is two statements (Django's health check of the connection it
has just recycled with close_old_connections, and the change query): about 2 statements a second from an idle beat,
half of the idle fleet's statements in `bench --compare`'s W4. An operator's edit in the admin is seen within
CHANGE_CHECK_SECONDS instead of at the next tick (≤ 5 s either way).
"""

import logging
import time

from celery.beat import SchedulingError
from django_celery_beat.schedulers import DatabaseScheduler
from kombu.exceptions import OperationalError

CHANGE_CHECK_SECONDS = 5.0

logger = logging.getLogger(__name__)


class RuntimeScheduler(DatabaseScheduler):
    _changes_checked_at = float("-inf")

    def schedule_changed(self) -> bool:
        now = time.monotonic()
        if now - self._changes_checked_at < CHANGE_CHECK_SECONDS:
            return False
        self._changes_checked_at = now
        return super().schedule_changed()

    def apply_async(self, entry, producer=None, advance=True, **kwargs):
        """Send a due entry. With the broker out of reach Celery logs each failure as an error with two stacks (~40
        lines per entry per tick, for as long as the outage lasts); here it is one warning line: nothing is lost —
        the entry is sent at its next time, and every task is in PostgreSQL."""
        try:
            return super().apply_async(entry, producer=producer, advance=advance, **kwargs)
        except SchedulingError as failed:
            if not isinstance(failed.__context__, OperationalError):
                raise
            logger.warning("beat: %s not sent, the broker is out of reach (%s); sent at its next time",
                           entry.name, failed.__context__)
            return None
