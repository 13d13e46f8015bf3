"""Live events over SSE, through real uvicorn processes and real `celery worker` processes publishing through
Redis: snapshot first, every event in seq order, resume by Last-Event-ID, the end after terminal, any web process."""

from __future__ import annotations

import http.client
import json
import os
import signal
import threading
import time

import pytest
from django.contrib.auth import get_user_model

from tasks_app.models import TaskEvent
from tests.engine_support import create_engine_task
from tests.support.streams import sse
from tests.worker_support import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("external_root")]
SHARED_WEB = True  # (tests/conftest.py web: shared web processes; web(private=True) for one of its own)


def db_events_after(task_id, seq: int) -> list[tuple[int, str]]:
    return list(TaskEvent.objects.filter(task_id=task_id, seq__gt=seq).order_by("seq").values_list("seq", "type"))


def test_it_streams_the_snapshot_then_every_event_in_seq_order_and_ends_after_terminal(web, workers, tenant_token):
    tenant, token = tenant_token("acme")
    server = web()
    task = create_engine_task(tenant, steps=6, sleep_ms=150)
    workers("publisher")

    stream = sse(server.port, f"/runtime/tasks/{task.id}/events", token=token)

    assert stream.status == 200 and stream.headers["content-type"].startswith("text/event-stream")
    first, *rest = stream.events
    assert first["event"] == "task.snapshot" and first["data"]["snapshot"]["taskId"] == str(task.id)
    assert int(first["id"]) == first["data"]["seq"]
    seqs = [int(event["id"]) for event in rest]
    assert seqs == list(range(int(first["id"]) + 1, int(first["id"]) + 1 + len(seqs)))  # in order, no gap
    assert [(int(e["id"]), e["event"]) for e in rest] == db_events_after(task.id, int(first["id"]))
    assert rest[-1]["event"] == "terminal" and stream.ended
    assert {"progress", "status", "terminal"} <= {e["event"] for e in rest}
    assert all(e["data"]["seq"] == int(e["id"]) and e["data"]["type"] == e["event"] for e in rest)


def test_it_resumes_from_last_event_id_without_a_gap_and_without_it_starts_from_the_snapshot(web, workers,
                                                                                            tenant_token):
    tenant, token = tenant_token("acme")
    server = web()
    task = create_engine_task(tenant, steps=8, sleep_ms=200)
    workers("publisher")
    first = sse(server.port, f"/runtime/tasks/{task.id}/events", token=token, stop_after=3)
    last_seen = int(first.events[-1]["id"])
    wait_until(task.id, lambda t: t.event_seq >= last_seen + 2)  # events go by while the client is away

    resumed = sse(server.port, f"/runtime/tasks/{task.id}/events", token=token, last_event_id=last_seen)
    wait_until(task.id, lambda t: t.status == "completed")
    fresh = sse(server.port, f"/runtime/tasks/{task.id}/events", token=token)
    after_end = sse(server.port, f"/runtime/tasks/{task.id}/events", token=token,
                    last_event_id=int(resumed.events[-1]["id"]))

    assert resumed.events[0]["event"] != "task.snapshot"
    seen = [int(e["id"]) for e in first.events[1:]] + [int(e["id"]) for e in resumed.events]
    assert seen == [seq for seq, _ in db_events_after(task.id, int(first.events[0]["id"]))]  # nothing missed
    assert [e["event"] for e in fresh.events] == ["task.snapshot"] and fresh.ended  # a finished task: its state
    assert fresh.events[0]["data"]["snapshot"]["status"] == "completed"
    assert after_end.status == 204  # EventSource stops reconnecting to a stream it has seen to the end


def test_it_delivers_the_same_events_on_a_second_web_process(web, workers, tenant_token):
    tenant, token = tenant_token("acme")
    one, two = web(), web()
    task = create_engine_task(tenant, steps=5, sleep_ms=300)
    answers = {}
    connected = {one.port: threading.Event(), two.port: threading.Event()}

    def follow(server):
        answers[server.port] = sse(server.port, f"/runtime/tasks/{task.id}/events", token=token, last_event_id=0,
                                   connected=connected[server.port])

    readers = [threading.Thread(target=follow, args=(server,)) for server in (one, two)]
    for reader in readers:
        reader.start()
    assert all(event.wait(15) for event in connected.values())  # both subscribed before the worker starts
    workers("publisher")
    for reader in readers:
        reader.join(60)

    first, second = answers[one.port], answers[two.port]
    assert [(e["id"], e["event"]) for e in first.events] == [(e["id"], e["event"]) for e in second.events]
    assert first.events[-1]["event"] == "terminal" and len(first.events) >= 5


def test_it_answers_404_for_another_tenant_s_task_and_401_without_credentials_before_any_byte(web, tenant_token):
    mine, my_token = tenant_token("acme")
    theirs, _ = tenant_token("globex")
    server = web()
    their_task = create_engine_task(theirs, steps=1)

    hidden = sse(server.port, f"/runtime/tasks/{their_task.id}/events", token=my_token)
    anonymous = sse(server.port, f"/runtime/tasks/{their_task.id}/events")
    bad_resume = sse(server.port, f"/runtime/tasks/{create_engine_task(mine, steps=1).id}/events", token=my_token,
                     last_event_id=-1)

    assert hidden.status == 404 and hidden.headers["content-type"] == "application/problem+json"
    assert json.loads(hidden.body_before_events)["status"] == 404
    assert anonymous.status == 401 and "Bearer" in anonymous.headers["www-authenticate"]
    assert bad_resume.status == 400


def test_it_streams_a_tenant_s_status_changes_and_none_of_another_tenant_s(web, workers, tenant_token):
    mine, my_token = tenant_token("acme")
    theirs, _ = tenant_token("globex")
    server = web()
    received: list[dict] = []
    done = threading.Event()

    def on_event(event):
        received.append(event)
        if event["data"]["type"] == "terminal" and event["data"]["taskId"] == str(my_task.id):
            done.set()

    my_task = create_engine_task(mine, steps=3, sleep_ms=100)
    their_task = create_engine_task(theirs, steps=3, sleep_ms=100)
    connected = threading.Event()
    reader = threading.Thread(target=lambda: sse(server.port, "/runtime/events", token=my_token, timeout=30,
                                                 on_event=on_event, stop_after=10_000, connected=connected),
                              daemon=True)
    reader.start()
    assert connected.wait(15)
    workers("publisher")

    assert done.wait(60)
    wait_until(their_task.id, lambda t: t.status == "completed")
    time.sleep(0.5)
    task_ids = {event["data"]["taskId"] for event in received}
    assert task_ids == {str(my_task.id)}
    assert {event["data"]["type"] for event in received} >= {"status", "terminal"}
    assert all(event["event"] == "task" for event in received)


@pytest.mark.slow
def test_it_delivers_every_event_across_a_restart_of_the_stream_s_redis_and_the_steps_do_not_wait(
        web, workers, tenant_token, tmp_path):
    from deploy.embedded import EmbeddedValkey
    from tests.embedded_support import free_port

    valkey = EmbeddedValkey(tmp_path / "valkey", free_port())
    valkey.start()
    try:
        tenant, token = tenant_token("acme")
        server = web(private=True, STREAM_REDIS_URL=valkey.url)
        task = create_engine_task(tenant, steps=25, sleep_ms=200)
        received: list[dict] = []
        connected = threading.Event()
        reader = threading.Thread(target=lambda: received.append(sse(
            server.port, f"/runtime/tasks/{task.id}/events", token=token, timeout=60, connected=connected)),
            daemon=True)
        reader.start()
        assert connected.wait(15)
        started = time.monotonic()
        workers("publisher", env={"STREAM_REDIS_URL": valkey.url})
        wait_until(task.id, lambda t: t.steps_completed >= 5)
        valkey.stop(grace_seconds=0)  # the live path is gone: publishers skip it, the stream's subscription retries
        time.sleep(2.0)
        valkey.start()
        wait_until(task.id, lambda t: t.status == "completed", seconds=60)
        took = time.monotonic() - started
        reader.join(30)
    finally:
        valkey.stop(grace_seconds=0)

    (stream,) = received
    first, *rest = stream.events
    assert [(int(e["id"]), e["event"]) for e in rest] == db_events_after(task.id, int(first["id"]))  # all, in order
    assert rest[-1]["event"] == "terminal" and stream.ended
    assert took < 5 + 25 * 0.2 + 4  # the steps went on at their pace while Redis was away (a little start-up)


def test_it_reads_nothing_from_postgresql_while_a_stream_waits_for_events(web, tenant_token):
    from django.db import connection

    tenant, token = tenant_token("acme")
    # The one statement a waiting stream does make is its token's re-check, once per oauth.stream_token_check_seconds
    # per token (tasks_app.web.stream_guard, tests/test_stream_revocation.py): set beyond this test's window.
    server = web(private=True, PGAPPNAME="quiet-web", RUNTIME_OAUTH__STREAM_TOKEN_CHECK_SECONDS="300")
    task = create_engine_task(tenant, steps=1)  # queued: no worker runs, so no event comes
    done, snapshot_sent = threading.Event(), threading.Event()
    threading.Thread(target=lambda: (sse(server.port, f"/runtime/tasks/{task.id}/events", token=token,
                                         timeout=20, on_event=lambda e: snapshot_sent.set(), stop_after=2),
                                     done.set()),
                     daemon=True).start()
    assert snapshot_sent.wait(15)  # connected, the snapshot sent
    time.sleep(1.5)  # settled: what serving the snapshot runs after sending it (seen: 2 statements) is not waiting

    with connection.cursor() as cursor:
        cursor.execute("SELECT statement_timestamp()")
        since = cursor.fetchone()[0]
        time.sleep(3)
        cursor.execute("SELECT count(*) FILTER (WHERE query_start >= %s), count(*) FROM pg_stat_activity "
                       "WHERE application_name = 'quiet-web' AND datname = current_database()", [since])
        statements_since, backends = cursor.fetchone()

    assert not done.is_set() and backends >= 1  # still streaming; the web process's pool is connected
    assert statements_since == 0  # the waiting stream polls nothing (its connection went back to the pool)


def test_it_ends_its_open_streams_and_exits_within_its_shutdown_grace_on_sigterm(web, tenant_token):
    # uvicorn stops only once every connection has ended, and a stream of a task that does not move never ends by
    # itself: without a bound (web_command's --timeout-graceful-shutdown, 2 s in tests) a deploy's SIGTERM hung until
    # the supervisor's SIGKILL. After the grace the streams end as streams end (config.asgi_shutdown) — not cut
    # mid-chunk with a traceback per stream in the log — and their clients reconnect elsewhere.
    from tests.support.mcp import rpc

    tenant, token = tenant_token("acme")
    task = create_engine_task(tenant, steps=1)  # queued: no worker runs, so its streams wait
    server = web(private=True)  # (it is stopped here)
    outcomes: list[str] = []

    def follow():
        try:
            ended = sse(server.port, f"/runtime/tasks/{task.id}/events", token=token, timeout=30).ended
            outcomes.append("sse ended" if ended else "sse stopped early")
        except (http.client.HTTPException, OSError) as error:
            outcomes.append(f"sse cut: {type(error).__name__}")

    def listen():
        try:
            _, _, frames = rpc(server.url("/mcp"), "subscriptions/listen",
                               {"notifications": {"taskIds": [str(task.id)]}}, token=token, frames=True)
            outcomes.append(f"listen ended after {frames[0]['method']}")
        except (http.client.HTTPException, OSError) as error:
            outcomes.append(f"listen cut: {type(error).__name__}")

    readers = [threading.Thread(target=target, daemon=True) for target in (follow, follow, listen)]
    for reader in readers:
        reader.start()
    time.sleep(1.5)  # connected: the snapshots and the acknowledgement sent
    assert outcomes == []

    stopping = time.monotonic()
    os.killpg(server.process.pid, signal.SIGTERM)
    server.process.wait(timeout=15)
    took = time.monotonic() - stopping
    for reader in readers:
        reader.join(5)
    assert took < 5, f"the web process took {took:.1f} s to stop with open streams"
    assert sorted(outcomes) == ["listen ended after notifications/subscriptions/acknowledged", "sse ended",
                                "sse ended"], outcomes
    assert "Exception in ASGI application" not in server.log.read_text()


def test_it_holds_no_database_connection_for_signed_in_console_streams(web, tenant_token):
    import urllib.request

    from django.contrib.auth import get_user_model
    from django.test import Client

    tenant, token = tenant_token("acme")
    task = create_engine_task(tenant, steps=1)  # queued: its streams wait
    operator = get_user_model().objects.create_superuser("op", password=None)
    client = Client()
    client.force_login(operator)
    session = client.cookies["sessionid"].value
    server = web(private=True, WEB_DB_POOL_MAX=2, WEB_DB_POOL_MIN=1, WEB_DB_POOL_TIMEOUT=2)

    def open_stream():
        connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=20)
        connection.request("GET", f"/runtime/tasks/{task.id}/events", headers={"Cookie": f"sessionid={session}"})
        response = connection.getresponse()
        assert response.status == 200
        response.readline()  # the snapshot is on its way: the stream is open
        return connection

    streams = [open_stream() for _ in range(4)]  # twice the pool
    try:
        started = time.monotonic()
        request = urllib.request.Request(server.url(f"/runtime/tasks/{task.id}?via=django"),
                                         headers={"Authorization": f"Bearer {token}"})
        with urllib.request.urlopen(request, timeout=10) as answer:
            status = answer.status
        took = time.monotonic() - started
    finally:
        for stream in streams:
            stream.close()

    assert status == 200 and took < 1.5  # not queued behind the streams for the pool's 2 s timeout


def test_it_publishes_from_many_threads_at_once_in_a_fresh_process_without_raising(settings):
    """A web process's first requests arrive together, each on its own thread (Django's sync views run in a thread
    pool). They once each made the process's Redis client, the last replacing the others — and a replaced client
    closes its pool when it is collected, under a thread still reading from it: a ValueError out of redis-py, raised
    from a create's on-commit publish as a 500 after the task had committed (a client retrying it makes it twice).
    Every message must arrive and no publish may raise, whatever Redis does."""
    import redis as redis_lib

    from tasks_app import streaming

    listener = redis_lib.Redis.from_url(settings.STREAM_REDIS_URL)
    subscription = listener.pubsub(ignore_subscribe_messages=True)
    subscription.subscribe(streaming.redis_topic())
    threads, rounds, errors, received = 24, 15, [], []
    try:
        for round_ in range(rounds):
            publisher, barrier = streaming._Publisher(), threading.Barrier(threads)

            def send(n, publisher=publisher, barrier=barrier, round_=round_):
                barrier.wait()
                try:
                    publisher.publish([(f"race-{round_}", "progress", json.dumps({"n": n}), n, None)], set())
                except Exception as error:  # noqa: BLE001  (what the test looks for)
                    errors.append(repr(error))

            running = [threading.Thread(target=send, args=(n,)) for n in range(threads)]
            for thread in running:
                thread.start()
            for thread in running:
                thread.join()
            assert publisher.paused_until == 0.0, "a publish failed and paused the publisher"
        deadline = time.monotonic() + 5
        while len(received) < threads * rounds and time.monotonic() < deadline:
            message = subscription.get_message(timeout=0.2)
            if message is not None:
                received.append(json.loads(message["data"]))
    finally:
        subscription.close()
        listener.close()
    assert errors == []
    assert len(received) == threads * rounds
