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
    app.conf.broker_url = f"redis://127.0.0.1:{dead_port}/0"
    app.pool.force_close_all()
    app._pool = None
    try:
        yield
    finally:
        app.conf.broker_url = original
        app.pool.force_close_all()
        app._pool = None


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
