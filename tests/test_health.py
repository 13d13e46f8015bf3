import socket

import pytest
from django.test import Client


def _unused_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_it_reports_the_process_up(db):
    response = Client().get("/healthz")

    assert response.status_code == 200 and response.json() == {"status": "ok"}


def test_it_is_ready_when_database_and_broker_answer(db):
    response = Client().get("/readyz")

    assert response.status_code == 200
    assert response.json()["checks"] == {"database": "ok", "broker": "ok"}


def test_it_is_not_ready_without_a_broker_and_reveals_no_address(db, settings):
    settings.REDIS_URL = f"redis://user:secret@127.0.0.1:{_unused_port()}/0"

    response = Client().get("/readyz")

    assert response.status_code == 503
    assert response.json()["checks"] == {"database": "ok", "broker": "unavailable"}
    assert b"127.0.0.1" not in response.content and b"secret" not in response.content


@pytest.mark.django_db(transaction=True)
def test_it_answers_503_with_retry_after_while_the_database_is_unreachable_then_recovers(api, tenant):
    from django.db import connection

    from tests.helpers import create_task

    task_id = create_task(api).json()["taskId"]
    dead_port = _unused_port()
    real_host, real_port = connection.settings_dict["HOST"], connection.settings_dict["PORT"]
    connection.close()
    connection.settings_dict.update(HOST="127.0.0.1", PORT=dead_port)  # as if PostgreSQL were restarting
    try:
        down = api.get(f"/runtime/tasks/{task_id}")
    finally:
        connection.close()
        connection.settings_dict.update(HOST=real_host, PORT=real_port)

    assert down.status_code == 503 and down["Retry-After"] == "2"
    assert down["Content-Type"] == "application/problem+json" and "database" in down.json()["detail"]
    assert api.get(f"/runtime/tasks/{task_id}").status_code == 200  # and the next request reconnects
