"""config/beat.py: beat asks the database whether its schedule changed at most once per CHANGE_CHECK_SECONDS
(django-celery-beat's DatabaseScheduler asks several times per tick, two statements each: half an idle fleet's
statements in `bench --compare`'s W4)."""

from unittest import mock

from django_celery_beat.schedulers import DatabaseScheduler

from config import beat


def test_it_asks_the_database_whether_the_schedule_changed_at_most_once_per_interval():
    scheduler = beat.RuntimeScheduler.__new__(beat.RuntimeScheduler)  # (no broker or database needed to ask)
    now = [1000.0]
    with mock.patch.object(DatabaseScheduler, "schedule_changed", return_value=True) as asked, \
            mock.patch.object(beat.time, "monotonic", side_effect=lambda: now[0]):
        answers = [scheduler.schedule_changed() for _ in range(4)]  # one tick's reads of the schedule
        now[0] += beat.CHANGE_CHECK_SECONDS - 0.1
        answers.append(scheduler.schedule_changed())
        now[0] += 0.1
        answers.append(scheduler.schedule_changed())

    assert asked.call_count == 2
    assert answers == [True, False, False, False, False, True]  # a change is still seen, one interval later at most
