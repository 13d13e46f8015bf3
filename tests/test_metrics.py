"""Prometheus metrics (tasks_app.observability.metrics): /metrics of real web and worker processes counting into one
multiprocess directory, parsed by prometheus_client's own text parser, against what PostgreSQL says; who may scrape;
the Grafana dashboard's metric names."""

from __future__ import annotations

import concurrent.futures
import http.client
import json
import re
import time
import urllib.error
import urllib.request
from collections import defaultdict

import pytest
import redis
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db.models import Sum
from prometheus_client.parser import text_string_to_metric_families

from checkpoints_app.models import SideEffect
from tasks_app.db.dispatch import hint_queue_names
from tasks_app.engine.lease import lease_claim
from tasks_app.models import Step, Task, TaskStatus, TenantMembership
from tasks_app.observability import metrics
from tasks_app.services import api_token_create, tenant_get_or_create
from tasks_app.web.console import UNFINISHED_STATUSES
from tests.embedded_support import ROOT, free_port
from tests.engine_support import create_engine_task, expire_lease
from tests.web_support import call

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("external_root")]

METRICS_TOKEN = "scrape-me-4f1c9a"
DASHBOARD = ROOT / "deploy" / "grafana" / "agent-runtime.json"


def scrape(url: str, token: str | None = None) -> tuple[int, str]:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def samples(text: str) -> dict[str, dict[tuple, float]]:
    """{sample name: {sorted label pairs: value}} through prometheus_client's parser."""
    found: dict[str, dict[tuple, float]] = defaultdict(dict)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[sample.name][tuple(sorted(sample.labels.items()))] = sample.value
    return found


def total(found, name: str, **labels) -> float:
    return sum(value for pairs, value in found.get(name, {}).items() if set(labels.items()) <= set(pairs))


def dashboard_metric_names() -> set[str]:
    names = set()
    for panel in json.loads(DASHBOARD.read_text())["panels"]:
        for target in panel["targets"]:
            names |= set(re.findall(r"agent_runtime_[a-z_]+", target["expr"]))
    return names


def open_sse(port: int, token: str) -> http.client.HTTPConnection:
    """A tenant's live stream, held open (the caller closes it) once the server said it subscribed."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    connection.request("GET", "/runtime/events", headers={"Authorization": f"Bearer {token}",
                                                         "Accept": "text/event-stream"})
    response = connection.getresponse()
    assert response.status == 200
    assert response.read(len(b": subscribed")) == b": subscribed"
    return connection


def wait_for(predicate, seconds: float = 30, what: str = ""):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"not within {seconds} s: {what}")


def test_it_counts_what_the_database_says_across_two_workers_of_four_and_two_web_processes(workers, web, tmp_path):
    tenant = tenant_get_or_create(slug="acme", name="Acme")
    user = get_user_model().objects.create_user("scraper")
    TenantMembership.objects.create(user=user, tenant=tenant)
    _, token = api_token_create(tenant=tenant, user=user, name="api")
    directory = tmp_path / "metrics"
    directory.mkdir()
    shared = {"PROMETHEUS_MULTIPROC_DIR": str(directory), "METRICS_TOKEN": METRICS_TOKEN}

    # A task whose worker "dies": leased by nobody that will come back, its hint gone, its lease expired — the reaper
    # (in a worker) recovers it. And one whose workflow this code no longer has: its claim dead-letters it.
    ghost = create_engine_task(tenant, steps=3)
    assert lease_claim(task_id=ghost.id, owner="ghost:1:dead") is not None
    broker = redis.Redis.from_url(settings.REDIS_URL)
    broker.delete(*hint_queue_names())
    broker.close()
    expire_lease(ghost.id)
    retired = create_engine_task(tenant, steps=2)
    Task.objects.filter(id=retired.id).update(workflow_name="retired_workflow")

    worker_port = free_port()
    with concurrent.futures.ThreadPoolExecutor(4) as pool:  # (their start-ups overlap)
        started = [pool.submit(workers, "metrics1", concurrency=4, env={**shared, "WORKER_METRICS_PORT": str(
                       worker_port)}),
                   pool.submit(workers, "metrics2", concurrency=4, env=shared),
                   pool.submit(web, **shared),
                   # Scrapes without a token come from loopback here; this one serves none of them without the token.
                   pool.submit(web, **shared, METRICS_ALLOWED_NETWORKS="10.0.0.0/8")]
        _, _, first, second = [future.result() for future in started]

    created = []
    for n in range(10):
        server = (first, second)[n % 2]
        status, _, body = call(server.url("/runtime/tasks"), token, method="POST",
                               body={"workflow": "demo_steps", "input": {"steps": 5}})
        assert status == 201, body
        created.append(body["taskId"])
    from config.celery import app

    app.send_task("runtime.reap")  # the beat's job, once
    wait_for(lambda: Task.objects.filter(status=TaskStatus.COMPLETED).count() == 11
             and Task.objects.filter(status=TaskStatus.DEAD_LETTERED).count() == 1, 40,
             "10 tasks + the recovered one completed, the retired one dead-lettered")
    streams = [open_sse(first.port, token), open_sse(second.port, token)]
    try:
        time.sleep(metrics.POOL_SAMPLE_SECONDS + 0.5)  # every web process has sampled its pool
        status, text = scrape(first.url("/metrics"), METRICS_TOKEN)
        assert status == 200, text
        found = samples(text)
        worker_status, worker_text = scrape(f"http://127.0.0.1:{worker_port}/metrics", METRICS_TOKEN)
        assert worker_status == 200, worker_text
        from_worker = samples(worker_text)
    finally:
        for stream in streams:
            stream.close()

    # The counters add up to what PostgreSQL holds.
    committed = Step.objects.filter(status="committed").count()
    assert committed == 10 * 5 + 3
    assert total(found, "agent_runtime_steps_committed_total") == committed
    assert total(found, "agent_runtime_steps_committed_total", workflow="demo_steps") == committed
    assert total(found, "agent_runtime_step_duration_seconds_count") == committed
    assert total(found, "agent_runtime_lease_recoveries_total") == \
        Task.objects.aggregate(n=Sum("recoveries"))["n"] == 1
    assert total(found, "agent_runtime_dead_letters_total", reason="workflow_missing") == \
        Task.objects.filter(status=TaskStatus.DEAD_LETTERED).count() == 1
    assert total(found, "agent_runtime_dead_letters_total") == 1
    assert total(found, "agent_runtime_effects_unknown_total") == SideEffect.objects.filter(status="unknown").count()
    # Every task was claimed at least once on a pending hint (the 10, the recovered one, the retired one); a claim
    # per slice, so possibly more.
    assert total(found, "agent_runtime_schedule_to_start_seconds_count") >= 12
    assert total(found, "agent_runtime_schedule_to_start_seconds_bucket", le="+Inf") == \
        total(found, "agent_runtime_schedule_to_start_seconds_count")

    # The state read on scrape is the database's.
    assert total(found, "agent_runtime_state_read_ok") == 1
    for status_name in UNFINISHED_STATUSES:
        assert total(found, "agent_runtime_tasks", status=status_name) == \
            Task.objects.filter(status=status_name).count(), status_name
    assert total(found, "agent_runtime_waits_open") == 0
    assert "agent_runtime_hint_queue_depth" in found

    # Every process shows up: both web processes, both workers and all eight pool processes.
    assert total(found, "agent_runtime_processes", kind="web") == 2
    assert total(found, "agent_runtime_processes", kind="worker") == 2
    assert total(found, "agent_runtime_processes", kind="worker_child") == 8
    assert total(found, "agent_runtime_db_pool_max") == 2 * 8  # WEB_DB_POOL_MAX of each web process
    assert 0 <= total(found, "agent_runtime_db_pool_in_use") <= 16
    assert total(found, "agent_runtime_stream_subscribers", kind="sse_tenant") == 2  # one on each web process

    # A worker's /metrics reports the same directory.
    for name in ("agent_runtime_steps_committed_total", "agent_runtime_lease_recoveries_total",
                 "agent_runtime_dead_letters_total", "agent_runtime_step_duration_seconds_count"):
        assert total(from_worker, name) == total(found, name), name
    assert total(from_worker, "agent_runtime_tasks", status="dead_lettered") == 1

    # Who may scrape: loopback without a token (the default networks); never a wrong token; not from outside
    # METRICS_ALLOWED_NETWORKS without the token; the worker's port by the same rule.
    assert scrape(first.url("/metrics"))[0] == 200
    status, body = scrape(first.url("/metrics"), "not-the-token")
    assert status == 401 and json.loads(body)["type"] == "/runtime/problems/not-authenticated"
    assert scrape(second.url("/metrics"))[0] == 401
    assert scrape(second.url("/metrics"), METRICS_TOKEN)[0] == 200
    assert scrape(f"http://127.0.0.1:{worker_port}/metrics", "not-the-token")[0] == 401

    # The dashboard: valid JSON, and every metric it plots is one /metrics serves (families with no sample yet in
    # this scenario — model, tools, policy — are listed by a single-process exposition, which also runs the state
    # collector here against the test database).
    here = samples(metrics.exposition().decode())
    families = {family.name for family in text_string_to_metric_families(metrics.exposition().decode())}
    plotted = dashboard_metric_names()
    assert plotted
    for name in plotted:
        base = re.sub(r"_(total|bucket|count|sum)$", "", name)
        assert name in found or base in families, f"{name}: plotted by the dashboard, not served by /metrics"
    assert total(here, "agent_runtime_tasks", status="dead_lettered") == 1
    assert total(here, "agent_runtime_state_read_ok") == 1


def test_it_counts_unfinished_tasks_by_status_from_their_partial_index(tenant):
    """The scrape's count is served by task_unfinished_status_idx (its condition is the query's filter, word for word),
    so the finished tasks, however many, are never read; the gauge lists every unfinished status."""
    from django.db import connection, transaction

    from tasks_app import access
    from tasks_app.web import console

    query = Task.objects.filter(status__in=console.UNFINISHED_STATUSES).order_by().values_list("status")
    sql, params = query.query.sql_with_params()
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")  # (a tiny table would be read whole otherwise)
        cursor.execute(f"EXPLAIN {sql}", params)
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "task_unfinished_status_idx" in plan, plan
    create_engine_task(tenant, steps=1)
    counts = console.task_counts_unfinished(actor=access.SYSTEM)
    assert counts["queued"] == 1 and set(counts) == set(console.UNFINISHED_STATUSES)
    assert console.task_counts_by_status(actor=access.SYSTEM)["queued"] == 1  # the overview reads the same function
