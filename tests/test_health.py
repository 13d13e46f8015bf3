import socket

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
