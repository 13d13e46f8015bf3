"""The ASGI entry point refuses oversized bodies before Django reads them and makes bodies of unknown length
(chunked) readable: driven as an ASGI server would, then through a real uvicorn."""

import asyncio
import json
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.conf import settings

from config.base.asgi_limits import BodySizeLimit
from tasks_app.models import Task
from tests import worker_support
from tests.asgi_support import asgi_request

ROOT = Path(__file__).resolve().parent.parent
CHUNKED = {"Content-Type": "application/json", "Transfer-Encoding": "chunked"}


class Recorder:
    def __init__(self):
        self.called_with_body = None
        self.headers = None

    async def __call__(self, scope, receive, send):
        self.headers = dict(scope["headers"])
        body = b""
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                self.called_with_body = "disconnected"
                return
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        self.called_with_body = body
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


def _run(app, headers, chunks, *, disconnect=False):
    sent, queue = [], [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1 or disconnect}
                       for i, c in enumerate(chunks)]

    async def receive():
        return queue.pop(0) if queue else {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/runtime/tasks", "headers": headers}
    asyncio.run(app(scope, receive, send))
    return sent


def test_it_answers_a_declared_oversized_body_with_413_without_calling_django():
    inner = Recorder()
    sent = _run(BodySizeLimit(inner, max_bytes=100), [(b"content-length", b"5000")], [b"x" * 5000])

    assert sent[0]["status"] == 413 and inner.called_with_body is None
    assert json.loads(sent[1]["body"])["type"] == "/runtime/problems/payload-too-large"


def test_it_answers_an_undeclared_body_that_streams_past_the_limit_with_413_without_calling_django():
    inner = Recorder()
    sent = _run(BodySizeLimit(inner, max_bytes=100), [(b"transfer-encoding", b"chunked")],
                [b"x" * 60, b"x" * 60, b"x" * 60])

    assert inner.called_with_body is None
    assert sent[0]["status"] == 413 and (b"connection", b"close") in sent[0]["headers"]
    assert json.loads(sent[1]["body"])["limit"] == 100


def test_it_passes_bodies_within_the_limit():
    inner = Recorder()
    sent = _run(BodySizeLimit(inner, max_bytes=100), [(b"content-length", b"50")], [b"y" * 50])

    assert inner.called_with_body == b"y" * 50 and sent[0]["status"] == 200


def test_it_hands_a_chunked_body_over_whole_with_its_length():
    inner = Recorder()
    _run(BodySizeLimit(inner, max_bytes=100), [(b"transfer-encoding", b"chunked")], [b"ab", b"", b"cde", b"f"])

    assert inner.called_with_body == b"abcdef"
    assert inner.headers.get(b"content-length") == b"6" and b"transfer-encoding" not in inner.headers


def test_it_accepts_a_chunked_body_of_exactly_the_limit():
    inner = Recorder()
    sent = _run(BodySizeLimit(inner, max_bytes=100), [(b"transfer-encoding", b"chunked")], [b"x" * 50, b"x" * 50])

    assert sent[0]["status"] == 200 and inner.called_with_body == b"x" * 100


def test_it_answers_nothing_to_a_client_that_left_mid_upload():
    inner = Recorder()
    sent = _run(BodySizeLimit(inner, max_bytes=100), [(b"transfer-encoding", b"chunked")], [b"x" * 10],
                disconnect=True)

    assert sent == [] and inner.called_with_body is None


# Through config.asgi.application: the middleware in front of the real Django stack.

def _chunks(body: bytes, size: int) -> list[bytes]:
    return [body[i:i + size] for i in range(0, len(body), size)] + [b""]


def test_it_creates_a_task_from_a_chunked_body(api):
    body = json.dumps({"workflow": "demo_steps", "input": {"steps": 4}, "goal": "g" * 5000}).encode()

    response = asgi_request("POST", "/runtime/tasks", chunks=_chunks(body, 700),
                            headers={**CHUNKED, "Authorization": f"Bearer {api.raw_token}"})

    assert response.status == 201, response.body
    task = Task.objects.get(id=response.json()["taskId"])
    assert task.input == {"steps": 4} and task.goal == "g" * 5000


def test_it_reports_a_bad_chunked_body_as_bad_json_rather_than_as_empty(api):
    response = asgi_request("POST", "/runtime/tasks", chunks=[b'{"workflow": ', b'"demo_steps", "inp', b""],
                            headers={**CHUNKED, "Authorization": f"Bearer {api.raw_token}"})

    assert response.status == 400
    assert response.json()["type"] == "/runtime/problems/malformed-json"


def test_it_answers_a_chunked_body_over_the_limit_with_413_and_closes_the_connection(api):
    body = b'{"workflow": "demo_steps", "input": {"steps": 1}, "goal": "' + b"x" * 2_000_000 + b'"}'

    response = asgi_request("POST", "/runtime/tasks", chunks=_chunks(body, 65536),
                            headers={**CHUNKED, "Authorization": f"Bearer {api.raw_token}"})

    assert response.status == 413 and response.headers["connection"] == "close"
    assert response.headers["content-type"] == "application/problem+json"
    assert response.json()["limit"] == settings.RUNTIME_MAX_REQUEST_BYTES
    assert Task.objects.count() == 0


def test_it_logs_nothing_and_answers_nothing_when_the_client_leaves_mid_upload(api, caplog):
    with caplog.at_level(logging.WARNING):
        response = asgi_request("POST", "/runtime/tasks", chunks=[b'{"workflow": "demo', b'_steps"'],
                                headers={**CHUNKED, "Authorization": f"Bearer {api.raw_token}"}, disconnect=True)

    assert response is None
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert Task.objects.count() == 0


# Through a real server: uvicorn parses the chunked framing, sees the disconnects and logs what it dislikes.

def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def uvicorn_server(transactional_db, tmp_path):
    """uvicorn serving config.asgi:application on the test database (committed rows, so the server sees them)."""
    port, log = _free_port(), tmp_path / "uvicorn.log"
    env = {**os.environ, "ALLOWED_HOSTS": "127.0.0.1", "DATABASE_URL": worker_support.test_database_url(),
           "REDIS_URL": settings.REDIS_URL}
    env.pop("DEBUG", None)
    process = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "config.asgi:application", "--host", "127.0.0.1", "--port", str(port)],
        cwd=ROOT, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 30
    while "Uvicorn running" not in log.read_text():
        assert process.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.1)
    try:
        yield port, log
    finally:
        os.killpg(process.pid, signal.SIGINT)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)


def _chunked_post(port, chunks, *, token, finish=True) -> bytes:
    """POST /runtime/tasks with a chunked body over a raw socket; stop sending when the server answers early.
    Returns what the server sent, up to its closing the connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(b"POST /runtime/tasks HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Transfer-Encoding: chunked\r\nConnection: close\r\n"
                     b"Authorization: Bearer " + token.encode() + b"\r\n\r\n")
        try:
            for chunk in chunks:
                if select.select([sock], [], [], 0)[0]:
                    break  # answered before the end of the upload
                sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            else:
                if not finish:
                    return b""  # the client leaves mid-upload
                sock.sendall(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server closed while we were still sending: its answer is already on its way
        received = b""
        try:
            while data := sock.recv(65536):
                received += data
        except ConnectionResetError:
            pass
        return received


@pytest.mark.slow
def test_it_answers_chunked_uploads_through_a_real_server_without_errors(api, uvicorn_server):
    port, log = uvicorn_server

    too_large = _chunked_post(port, [b"x" * 65536] * 32, token=api.raw_token)  # 2 MB
    _chunked_post(port, [b'{"workflow": "demo_steps"'], token=api.raw_token, finish=False)
    small = _chunked_post(port, [b'{"workflow": "demo_steps", ', b'"input": {"steps": 2}}'], token=api.raw_token)

    head, _, body = too_large.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 413 "), too_large[:500]
    assert b"connection: close" in head.lower()
    assert json.loads(body)["type"] == "/runtime/problems/payload-too-large"
    head, _, body = small.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 201 "), small[:2000]
    assert Task.objects.get().input == {"steps": 2}  # the one task: the body the client sent, read whole
    time.sleep(0.5)  # let the server finish with the client that left
    output = log.read_text()
    for sign_of_trouble in ("ERROR", "Exception", "returned without", "500 Internal Server Error"):
        assert sign_of_trouble not in output, output[-3000:]
