"""The web tier under load, through real uvicorn processes started as the run command starts them
(deploy/dev.py web_command): bounded database connections, no 500s, the snapshot edge answering as the API view
does, and any web process serving any task."""

from __future__ import annotations

import concurrent.futures
import threading
import time

import psycopg
import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from tasks_app.models import ApiToken, Task
from tasks_app.services import api_token_create, api_token_revoke, task_create, tenant_get_or_create
from tests import worker_support
from tests.embedded_support import free_port
from tests.web_support import WebProcess, call, dev  # noqa: F401  (also imported from here by other tests)


@pytest.fixture
def token(transactional_db):
    tenant = tenant_get_or_create(slug="acme", name="Acme")
    user = get_user_model().objects.create_user("poller")
    from tasks_app.models import TenantMembership

    TenantMembership.objects.create(user=user, tenant=tenant)
    _, raw = api_token_create(tenant=tenant, user=user, name="poller")
    return raw


def _connections_of(conn, application_name: str) -> int:
    return conn.execute("SELECT count(*) FROM pg_stat_activity "
                        "WHERE application_name = %s AND datname = current_database()",
                        [application_name]).fetchone()[0]


def test_it_keeps_database_connections_within_the_pools_bound_under_many_concurrent_requests(web, token):
    server = web(WEB_DB_POOL_MAX=3, WEB_SNAPSHOT_POOL_MAX=2, PGAPPNAME="web-under-load")  # libpq names them
    tenant = tenant_get_or_create(slug="acme")
    ids = [str(task_create(tenant=tenant, owner=None, workflow="demo_steps", input={"steps": 1}).task.id)
           for _ in range(5)]
    requests = ([("GET", f"/runtime/tasks/{ids[n % 5]}", None) for n in range(150)]
                + [("GET", "/runtime/tasks?limit=20", None) for _ in range(60)]
                + [("GET", f"/runtime/tasks/{ids[n % 5]}?view=full", None) for n in range(60)]  # the Django path
                + [("POST", "/runtime/tasks", {"workflow": "demo_steps", "input": {"steps": 1}}) for _ in range(30)])
    peak, sampling = [0], threading.Event()

    def sample():
        with psycopg.connect(worker_support.test_database_url(), autocommit=True) as conn:
            while not sampling.is_set():
                peak[0] = max(peak[0], _connections_of(conn, "web-under-load"))
                time.sleep(0.02)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        with concurrent.futures.ThreadPoolExecutor(48) as pool:
            statuses = list(pool.map(lambda r: call(server.url(r[1]), token, method=r[0], body=r[2])[0], requests))
    finally:
        sampling.set()
        sampler.join()

    assert sorted(set(statuses)) == [200, 201], statuses  # no 500, no 503 at this load
    assert 0 < peak[0] <= 3 + 2  # the web process's two pools, whatever the concurrency


def test_it_serves_the_same_tasks_from_a_second_web_process_on_another_port(web, token):
    first, second = web(), web()

    status, _, created = call(first.url("/runtime/tasks"), token, method="POST",
                              body={"workflow": "demo_steps", "input": {"steps": 1}})
    task_id = created["taskId"]
    read = call(second.url(f"/runtime/tasks/{task_id}"), token)
    listed = call(second.url("/runtime/tasks"), token)
    cancelled = call(second.url(f"/runtime/tasks/{task_id}/cancel"), token, method="POST", body={})
    after = call(first.url(f"/runtime/tasks/{task_id}"), token)

    assert status == 201 and read[0] == 200 and read[2]["taskId"] == task_id
    assert task_id in [item["taskId"] for item in listed[2]["results"]]
    assert cancelled[0] in (200, 202) and after[2]["status"] == "cancelled"


def _snapshot_tasks():
    """Tasks in the states a snapshot shows differently: queued, completed with a result, failed with an error,
    with a checkpoint, with a deadline, waiting with its policies."""
    tenant = tenant_get_or_create(slug="acme")
    make = lambda **input_: task_create(tenant=tenant, owner=None, workflow="demo_steps",  # noqa: E731
                                        input={"steps": 3, **input_}).task
    queued = make()
    completed = make()
    Task.objects.filter(id=completed.id).update(status="completed", result={"answer": "é ✓", "n": [1, 2.5]},
                                                progress=1, steps_completed=3, completed_at=timezone.now())
    failed = make()
    Task.objects.filter(id=failed.id).update(status="failed", error={"type": "ValueError", "message": "no"},
                                             checkpoint_sequence=2, checkpoint_at=timezone.now(),
                                             deadline_at=timezone.now(), completed_at=timezone.now())
    waiting = task_create(tenant=tenant, owner=None, workflow="demo_steps", input={"steps": 3},
                          approval_policy={"before": ["record"]}, checkpoint_policy={"everySteps": 2},
                          tool_policy={"deny": ["github.delete_*"], "maxCalls": 5}).task
    Task.objects.filter(id=waiting.id).update(status="input_required", wait={
        "waitId": "6f1c1d8e-0c1f-5d59-9d0b-5f4c2b6f0a11", "kind": "input", "name": "note", "prompt": "Why? ✓",
        "schema": {"type": "object", "properties": {"note": {"type": "string"}}}, "step": 1, "planVersion": 1})
    return [queued.id, completed.id, failed.id, waiting.id]


def test_it_answers_a_pollers_snapshot_exactly_as_the_api_view_does(web, token):
    server = web()
    for task_id in _snapshot_tasks():
        for path in (f"/runtime/tasks/{task_id}", f"/runtime/tasks/{str(task_id).upper()}"):
            edge = call(server.url(path), token)
            view = call(server.url(path + "?via=django"), token)  # a query string: the edge leaves it to Django

            assert edge[0] == view[0] == 200
            assert edge[2] == view[2]
            ignored = {"date", "server", "content-length", "transfer-encoding"}
            assert {k: v for k, v in edge[1].items() if k not in ignored} == \
                   {k: v for k, v in view[1].items() if k not in ignored}


def test_it_refuses_a_revoked_token_on_the_next_poll(web, token):
    server = web()
    task_id = _snapshot_tasks()[0]
    assert call(server.url(f"/runtime/tasks/{task_id}"), token)[0] == 200

    api_token_revoke(token=ApiToken.objects.get())
    status, headers, body = call(server.url(f"/runtime/tasks/{task_id}"), token)

    assert status == 401 and headers["content-type"] == "application/problem+json"
    assert body["detail"] == "Invalid or revoked token."


def test_it_hides_another_tenants_task_from_a_poller(web, token):
    server = web()
    other = tenant_get_or_create(slug="globex")
    task = task_create(tenant=other, owner=None, workflow="demo_steps", input={"steps": 1}).task

    status, headers, body = call(server.url(f"/runtime/tasks/{task.id}"), token)

    assert status == 404 and headers["content-type"] == "application/problem+json"


def test_it_answers_503_with_retry_after_when_the_database_cannot_be_reached(web, token):
    task_id = _snapshot_tasks()[0]
    server = web(DATABASE_URL=f"postgres://postgres@127.0.0.1:{free_port()}/nowhere", WEB_DB_POOL_TIMEOUT=1,
                 WEB_SNAPSHOT_POOL_TIMEOUT=1)

    answers = [call(server.url(path), token) for path in
               (f"/runtime/tasks/{task_id}", "/runtime/tasks", f"/runtime/tasks/{task_id}?via=django")]

    for status, headers, body in answers:
        assert status == 503 and headers["retry-after"] and body["type"] == "/runtime/problems/database-unavailable"


def test_it_answers_503_with_retry_after_never_500_when_its_pools_are_exhausted(web, token):
    # One connection in each pool and almost no patience: most of 96 concurrent requests cannot get one in time.
    server = web(WEB_DB_POOL_MIN=1, WEB_DB_POOL_MAX=1, WEB_DB_POOL_TIMEOUT=0.01, WEB_SNAPSHOT_POOL_MAX=1,
                 WEB_SNAPSHOT_POOL_TIMEOUT=0.001)
    task_id = _snapshot_tasks()[0]
    paths = [f"/runtime/tasks/{task_id}", "/runtime/tasks?limit=50"] * 48
    for path in paths[:2]:  # both pools hold their one connection before the storm (it may still be opening)
        deadline = time.monotonic() + 10
        while call(server.url(path), token)[0] != 200:
            assert time.monotonic() < deadline, f"{path} never answered a lone request"
            time.sleep(0.1)

    with concurrent.futures.ThreadPoolExecutor(96) as pool:
        answers = list(pool.map(lambda path: call(server.url(path), token), paths))

    statuses = [status for status, _, _ in answers]
    refused = [(headers, body) for status, headers, body in answers if status == 503]
    assert set(statuses) <= {200, 503} and 200 in statuses, statuses
    assert refused, "the pools were never exhausted: the test proves nothing"
    assert all(headers["retry-after"] and body["type"] == "/runtime/problems/database-unavailable"
               for headers, body in refused)
    assert {body["detail"] for _, body in refused} == {"Too many requests are waiting for the database; retry after "
                                                       "the seconds in Retry-After."}
    log = server.log.read_text()
    assert "Traceback" not in log and "Service Unavailable" not in log  # one warning per 503, no ERROR line


def test_it_answers_every_poll_after_the_database_ended_all_its_sessions(web, token):
    server = web(PGAPPNAME="web-sessions-ended")
    task_id = _snapshot_tasks()[0]
    paths = [f"/runtime/tasks/{task_id}", f"/runtime/tasks/{task_id}?via=django", "/runtime/tasks?limit=5"]
    statuses = []
    with psycopg.connect(worker_support.test_database_url(), autocommit=True) as admin:
        for _ in range(3):
            statuses += [call(server.url(path), token)[0] for path in paths * 5]  # fill both pools
            ended = admin.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                                  "WHERE application_name = 'web-sessions-ended' "
                                  "AND datname = current_database()").fetchone()[0]
            assert ended >= 2  # as a database restart or a failover would
        statuses += [call(server.url(path), token)[0] for path in paths * 5]

    assert set(statuses) == {200}, statuses  # dead pooled connections are replaced, never reported to a client
