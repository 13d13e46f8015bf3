"""A broker outage loses no work and shows no client an error: messages are hints, PostgreSQL is the truth."""

import socket
import time
from datetime import timedelta

import pytest
from django.utils import timezone

from config.celery import app
from tasks_app import recovery
from tasks_app.models import Task
from tests.engine_support import configure, drive
from tests.helpers import create_task


@pytest.fixture
def broker_down():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead_port = sock.getsockname()[1]
    original = app.conf.broker_url

    def point_broker_at(url):
        # Drop every cached connection and producer so the next send connects to `url`.
        app.conf.broker_url = url
        app.pool.force_close_all()
        app._pool = None
        app.amqp._producer_pool = None

    point_broker_at(f"redis://127.0.0.1:{dead_port}/0")
    try:
        yield
    finally:
        point_broker_at(original)


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("external_root")
def test_it_creates_tasks_while_the_broker_is_down_and_the_reaper_sends_them_later(api, broker_down, settings):
    started = time.monotonic()
    response = create_task(api)
    elapsed = time.monotonic() - started

    assert response.status_code == 201 and elapsed < 10
    task_id = response.json()["taskId"]
    assert Task.objects.get(id=task_id).status == "queued"

    configure(settings, redispatch_after_seconds=60)
    Task.objects.filter(id=task_id).update(updated_at=timezone.now() - timedelta(minutes=5))  # move time
    assert recovery.tasks_redispatch_lost() == 1  # still down: the send fails quietly, the sweep comes again
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
