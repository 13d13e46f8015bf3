"""A broker outage loses no work and shows no client an error: messages are hints, PostgreSQL is the truth."""

import time

import pytest

from tasks_app.engine import reaper
from tasks_app.models import Task
from tests.engine_support import drive
from tests.helpers import create_task


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("external_root")
def test_it_creates_tasks_while_the_broker_is_down_and_the_reaper_sends_them_later(api, broker_down):
    started = time.monotonic()
    response = create_task(api)
    elapsed = time.monotonic() - started

    assert response.status_code == 201 and elapsed < 10
    task_id = response.json()["taskId"]
    assert Task.objects.get(id=task_id).status == "queued"

    # The send failed, so no hint is pending: the task waits for a slot, which the very next sweep hands it
    # (not the lost-message horizon). Still down: that send fails quietly too, and the sweep after tries again.
    assert Task.objects.get(id=task_id).hint_at is None
    assert reaper.slots_hand_out() == 1
    assert Task.objects.get(id=task_id).hint_at is None
    assert drive(task_id) == ["completed"]  # and nothing about the task itself was lost


@pytest.mark.django_db(transaction=True)
def test_it_sends_hints_again_once_the_broker_is_back(api):
    """(Also guards the fixture above: after it, the app must send to the real broker again.)"""
    import redis
    from django.conf import settings

    broker = redis.Redis.from_url(settings.REDIS_URL)
    before = broker.llen("celery:4")

    assert create_task(api).status_code == 201
    assert broker.llen("celery:4") == before + 1


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("external_root")
def test_it_takes_work_again_within_seconds_once_the_broker_is_back_from_a_long_outage(
        api, broker_down, workers, tmp_path):
    """A worker whose broker was away for a while consumes again ≤ 3 s after it returns. Celery's consumer retries
    its connection at growing intervals (kombu's 2, 4, 6 … 30 s: tries 0, 2, 6, 12, 20 … s into the outage): after a
    13 s outage its next try was 7 s after the return, after a minute's up to 30 s — every task waited that long, hints queued and no worker taking them
    (seen from outside with the README's run command: tasks without a step ~30 s after Valkey came back).
    config.celery_consumer caps the interval."""
    from deploy.embedded import EmbeddedValkey
    from tests.embedded_support import free_port
    from tests.worker_support import wait_for_status

    valkey = EmbeddedValkey(tmp_path / "valkey", free_port())
    valkey.start()
    try:
        broker_down(valkey.url)  # this test's hints go to its own Valkey too
        workers("patient", env={"REDIS_URL": valkey.url})
        first = create_task(api).json()["taskId"]
        wait_for_status(first, {"completed"}, seconds=30)  # consuming

        valkey.stop(grace_seconds=0)
        time.sleep(13)
        valkey.start()
        back = time.monotonic()
        task_id = create_task(api).json()["taskId"]
        wait_for_status(task_id, {"completed"}, seconds=40)
        took = time.monotonic() - back
    finally:
        valkey.stop(grace_seconds=0)

    assert took < 3, f"the worker took {took:.1f} s to take work after the broker came back"
