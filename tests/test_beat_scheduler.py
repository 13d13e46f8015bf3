"""config/beat.py: beat asks the database whether its schedule changed at most once per CHANGE_CHECK_SECONDS
(django-celery-beat's DatabaseScheduler asks several times per tick, two statements each: half an idle fleet's
statements in `bench --compare`'s W4); an entry it cannot send while the broker is away is one warning line."""

import logging
from datetime import timedelta
from unittest import mock

import pytest
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


@pytest.mark.django_db(transaction=True)
def test_it_says_in_one_warning_line_that_an_entry_was_not_sent_while_the_broker_is_out_of_reach(broker_down, caplog):
    from celery.beat import ScheduleEntry

    from config.celery import app

    # (An entry of its own: the reaper's row, made by a migration, may have been flushed by an earlier test.)
    scheduler = beat.RuntimeScheduler(app=app, lazy=True)
    entry = ScheduleEntry(name="runtime: lease reaper", task="runtime.reap", schedule=timedelta(seconds=10), app=app)

    with caplog.at_level(logging.INFO):
        scheduler.apply_entry(entry)

    problems = [record for record in caplog.records if record.levelno >= logging.WARNING]
    assert [(record.name, record.levelname) for record in problems] == [("config.beat", "WARNING")]
    assert "not sent, the broker is out of reach" in problems[0].getMessage()
    assert "\n" not in problems[0].getMessage() and problems[0].exc_info is None
