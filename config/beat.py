"""Beat's scheduler: django-celery-beat's DatabaseScheduler, asking the database whether the schedule changed at most
once per CHANGE_CHECK_SECONDS.

DatabaseScheduler asks on every read of its schedule — several times per tick (Scheduler.tick compares the schedule,
then reads it again to fill its heap) — and each ask is two statements (Django's health check of the connection it
has just recycled with close_old_connections, and the change query): about 2 statements a second from an idle beat,
half of the idle fleet's statements in `bench --compare`'s W4. An operator's edit in the admin is seen within
CHANGE_CHECK_SECONDS instead of at the next tick (≤ 5 s either way).
"""

import time

from django_celery_beat.schedulers import DatabaseScheduler

CHANGE_CHECK_SECONDS = 5.0


class RuntimeScheduler(DatabaseScheduler):
    _changes_checked_at = float("-inf")

    def schedule_changed(self) -> bool:
        now = time.monotonic()
        if now - self._changes_checked_at < CHANGE_CHECK_SECONDS:
            return False
        self._changes_checked_at = now
        return super().schedule_changed()
