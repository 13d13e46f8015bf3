from django_celery_beat.models import PeriodicTask


def test_it_schedules_the_reaper_as_an_editable_beat_task(db):
    """Created by migration tasks_app.0004 (a plain `db` test: transactional tests flush migration data)."""
    reaper = PeriodicTask.objects.get(name="runtime: lease reaper")

    assert reaper.task == "runtime.reap" and reaper.enabled and reaper.priority == 0
    assert (reaper.interval.every, reaper.interval.period) == (10, "seconds")
