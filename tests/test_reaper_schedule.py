import pytest
from django_celery_beat.models import PeriodicTask

# The rows migrate made, put back before each test (Django's serialized rollback: what the test database held right
# after migrating): a transactional test that ran before in the same test process emptied every table.
pytestmark = pytest.mark.django_db(transaction=True, serialized_rollback=True)


def test_it_schedules_the_reaper_as_an_editable_beat_task():
    """Created by migration tasks_app.0004."""
    reaper = PeriodicTask.objects.get(name="runtime: lease reaper")

    assert reaper.task == "runtime.reap" and reaper.enabled and reaper.priority == 0
    assert (reaper.interval.every, reaper.interval.period) == (10, "seconds")


def test_it_warns_operators_when_the_reaper_is_disabled_or_missing():
    from django.core.checks import run_checks

    def warnings():
        return [m.id for m in run_checks(tags=["runtime"], databases=["default"], include_deployment_checks=True)]

    assert warnings() == []
    PeriodicTask.objects.filter(name="runtime: lease reaper").update(enabled=False)
    assert warnings() == ["runtime.W002"]
    PeriodicTask.objects.filter(name="runtime: lease reaper").delete()
    assert warnings() == ["runtime.W001"]
