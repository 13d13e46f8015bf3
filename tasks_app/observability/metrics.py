"""Prometheus metrics: what the runtime counts as it happens, and what it reads from PostgreSQL and Redis when
scraped (README, "Metrics"; the Grafana dashboard is deploy/grafana/agent-runtime.json).

Two kinds of numbers, kept apart on purpose:

- **events**, counted in the process where they happen (steps committed, their duration, schedule-to-start, lease
  recoveries, dead letters, effects of unknown outcome, model tokens and cost, tool calls, policy denials) and the
  live gauges of a process (stream subscribers, its database pool). Each is one in-memory (or mmap) increment: no
  statement, no I/O. The engine, the agent and the gateway call the one-line functions below at their hook sites.
- **state**, read from the database and the broker only when /metrics is scraped (tasks by status, open waits and
  the oldest one's age, the hint queue's depth), by the reader registered with ``state_reader_register`` (the
  console's Overview reads the same functions: tasks_app.web.console). This module imports nothing of the apps
  above it; the reader is handed to it by tasks_app's AppConfig.

Several processes (uvicorn's, Celery's prefork children) count into one directory when PROMETHEUS_MULTIPROC_DIR is
set (prometheus_client's multiprocess mode); any process of that directory answers a scrape with the sum of all of
them. A child that exits has its live gauges removed (``process_dead``); its counters stay counted.

Labels never carry personal data, secrets or ids, and their sets stay bounded: a workflow's, tool server's and tool's
registered names (a tool's from its server's list, checked before the count), a model's configured name (else
"other"), a tenant's slug, and words from fixed sets.
"""

from __future__ import annotations

import atexit
import hmac
import ipaddress
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram, generate_latest, multiprocess
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

logger = logging.getLogger(__name__)

CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4  # the text format every Prometheus reads
_LABEL_MAX = 80

# Buckets: a step of a demo workflow takes milliseconds, an agent's model turn seconds to minutes.
STEP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, float("inf"))
# From the hint (the task became runnable, or its slice ended) to the claim: queueing in the broker and the pool.
SCHEDULE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, float("inf"))

STEPS_COMMITTED = Counter("agent_runtime_steps_committed", "Steps committed (rate: steps per second).",
                          ["workflow"])
STEP_SECONDS = Histogram("agent_runtime_step_duration_seconds", "A step from its start to its commit, committed "
                         "steps only.", ["workflow"], buckets=STEP_BUCKETS)
SCHEDULE_TO_START = Histogram("agent_runtime_schedule_to_start_seconds", "From the run_step hint being marked (the "
                              "task became runnable or its slice was handed on) to the claim, by the database's "
                              "clock.", buckets=SCHEDULE_BUCKETS)
LEASE_RECOVERIES = Counter("agent_runtime_lease_recoveries", "Expired leases the reaper took back (a worker was "
                           "lost); those over max_recoveries count as dead letters instead.")
DEAD_LETTERS = Counter("agent_runtime_dead_letters", "Tasks dead-lettered, by reason.", ["reason"])
EFFECTS_UNKNOWN = Counter("agent_runtime_effects_unknown", "Effects recorded with an unknown outcome (a call timed "
                          "out or a worker died mid-call, and nothing could reconcile it yet).")
MODEL_TOKENS = Counter("agent_runtime_model_tokens", "Model tokens used, by model (its configured name, or 'other' "
                       "for a name only a task asked for), tenant (slug) and direction.",
                       ["model", "tenant", "direction"])
MODEL_COST = Counter("agent_runtime_model_cost", "Model cost (the configured prices' currency), by model and "
                     "tenant.", ["model", "tenant"])
TOOL_CALLS = Counter("agent_runtime_tool_calls", "Downstream MCP tool calls sent, by server, tool and outcome "
                     "(ok, tool_error, task_created, error).", ["server", "tool", "outcome"])
POLICY_DENIALS = Counter("agent_runtime_policy_denials", "Tool calls the policy gateway refused, by server and the "
                         "layer whose rule refused (deployment, tenant, task, server, hosts).", ["server", "layer"])
SUBSCRIBERS = Gauge("agent_runtime_stream_subscribers", "Open live streams: SSE of a task (sse_task) or of a "
                    "tenant (sse_tenant), MCP subscriptions/listen (listen).", ["kind"], multiprocess_mode="livesum")
DB_POOL_IN_USE = Gauge("agent_runtime_db_pool_in_use", "Web processes' database pool connections lent out "
                       "(sampled every POOL_SAMPLE_SECONDS).", multiprocess_mode="livesum")
DB_POOL_MAX = Gauge("agent_runtime_db_pool_max", "Web processes' database pool capacity (WEB_DB_POOL_MAX each).",
                    multiprocess_mode="livesum")
PROCESSES = Gauge("agent_runtime_processes", "Live processes counting into this metrics directory: web, "
                  "worker (a Celery worker's main process), worker_child (its pool processes).", ["kind"],
                  multiprocess_mode="livesum")

SUBSCRIBER_KINDS = ("sse_task", "sse_tenant", "listen")
POOL_SAMPLE_SECONDS = 2.0


def _label(value) -> str:
    return str(value or "")[:_LABEL_MAX] or "unknown"


# -- event hooks: one call per site, each an in-memory increment ---------------------------------------------------
_step_children: dict[str, tuple] = {}  # workflow → its counter and histogram children (labels() takes a lock)


def step_committed(*, workflow: str, seconds: float) -> None:
    children = _step_children.get(workflow)
    if children is None:
        children = _step_children[workflow] = (STEPS_COMMITTED.labels(_label(workflow)),
                                               STEP_SECONDS.labels(_label(workflow)))
    children[0].inc()
    children[1].observe(max(seconds, 0.0))


def task_claimed(*, hint_waited_seconds: float | None) -> None:
    """A claim took a task: how long its hint waited. None: the task had no hint pending (a duplicate message that
    found it runnable, say): nothing to measure."""
    if hint_waited_seconds is not None:
        SCHEDULE_TO_START.observe(max(float(hint_waited_seconds), 0.0))  # (a parked task's hint is due at hint_at)


def lease_recovered() -> None:
    LEASE_RECOVERIES.inc()


def dead_lettered(*, reason: str) -> None:
    DEAD_LETTERS.labels(_label(reason)).inc()


def effect_unknown() -> None:
    EFFECTS_UNKNOWN.inc()


def model_used(*, model: str, tenant: str, tokens_in: int, tokens_out: int, cost: Decimal | float) -> None:
    model, tenant = _label(model), _label(tenant)
    MODEL_TOKENS.labels(model, tenant, "input").inc(max(int(tokens_in), 0))
    MODEL_TOKENS.labels(model, tenant, "output").inc(max(int(tokens_out), 0))
    MODEL_COST.labels(model, tenant).inc(max(float(cost), 0.0))


def tool_called(*, server: str, tool: str, outcome: str) -> None:
    TOOL_CALLS.labels(_label(server), _label(tool), _label(outcome)).inc()


def policy_layer(rule: str) -> str:
    """Which layer's rule refused a call, from the rule's wording (agents_app.policy): a bounded label."""
    for prefix, layer in (("tools.", "deployment"), ("tenant ", "tenant"), ("task ", "task"),
                          ("tool server ", "server"), ("allowed_hosts", "hosts")):
        if rule.startswith(prefix):
            return layer
    return "other"


def policy_denied(*, server: str, rule: str) -> None:
    POLICY_DENIALS.labels(_label(server), policy_layer(rule)).inc()


class subscriber:
    """``with subscriber("sse_task"):`` (or ``async with``, beside the subscription it counts): one more open live
    stream of that kind while it is open."""

    def __init__(self, kind: str):
        self.gauge = SUBSCRIBERS.labels(kind)

    def __enter__(self):
        self.gauge.inc()
        return self

    def __exit__(self, *exc_info) -> None:
        self.gauge.dec()

    async def __aenter__(self):
        return self.__enter__()

    async def __aexit__(self, *exc_info) -> None:
        self.__exit__(*exc_info)


# -- processes -----------------------------------------------------------------------------------------------------
def multiprocess_dir() -> str | None:
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None


def process_started(kind: str) -> None:
    PROCESSES.labels(kind).set(1)


def process_dead(pid: int) -> None:
    """A process of the directory exited: its live gauges (subscribers, pool, processes) go; its counters stay."""
    directory = multiprocess_dir()
    if directory:
        multiprocess.mark_process_dead(pid, directory)


_sampler_started = False
_sampler_lock = threading.Lock()


def web_process_started() -> None:
    """A web process: count it, and sample its database pool every POOL_SAMPLE_SECONDS on a daemon thread (a pool
    has no checkout hook, and in multiprocess mode a scrape answered by another process cannot ask this one)."""
    global _sampler_started
    process_started("web")
    atexit.register(process_dead, os.getpid())  # (a process killed outright leaves its live gauges behind)
    with _sampler_lock:
        if _sampler_started:
            return
        _sampler_started = True
    threading.Thread(target=_sample_pool_forever, name="metrics-pool-sampler", daemon=True).start()


def pool_sample() -> None:
    from django.db import connections

    wrapper = connections["default"]
    pool = getattr(wrapper, "pool", None) if wrapper.settings_dict.get("OPTIONS", {}).get("pool") else None
    if pool is None:
        return
    stats = pool.get_stats()
    DB_POOL_MAX.set(pool.max_size)
    DB_POOL_IN_USE.set(max(stats.get("pool_size", 0) - stats.get("pool_available", 0), 0))


def _sample_pool_forever() -> None:
    while True:
        try:
            pool_sample()
        except Exception:  # a metric must never take a process down (nor fill its log every 2 s)
            logger.debug("database pool sample failed", exc_info=True)
        time.sleep(POOL_SAMPLE_SECONDS)


# -- state, read on scrape -----------------------------------------------------------------------------------------
@dataclass
class RuntimeState:
    """What a scrape reads from PostgreSQL and Redis (the reader: tasks_app.web.console.runtime_state)."""

    tasks_by_status: dict[str, int] = field(default_factory=dict)  # unfinished statuses only
    waits_open: dict[str, int] = field(default_factory=dict)  # by kind: input, approval, budget
    oldest_wait_seconds: float | None = None
    hint_queue_depth: int | None = None  # None: the broker did not answer


_state_reader: Callable[[], RuntimeState] | None = None


def state_reader_register(reader: Callable[[], RuntimeState]) -> None:
    global _state_reader
    _state_reader = reader


class StateCollector:
    """The scrape-time gauges. A reader that fails (the database away) yields agent_runtime_state_read_ok 0 and no
    state gauges, rather than a failed scrape that would hide the event counters too."""

    def collect(self):
        ok = GaugeMetricFamily("agent_runtime_state_read_ok", "1 when this scrape could read the runtime's state "
                               "from PostgreSQL and Redis.")
        state = None
        if _state_reader is not None:
            try:
                state = _state_reader()
            except Exception:
                logger.warning("metrics: reading the runtime's state failed", exc_info=True)
        ok.add_metric([], 1 if state is not None else 0)
        yield ok
        if state is None:
            return
        tasks = GaugeMetricFamily("agent_runtime_tasks", "Unfinished tasks by status (read on scrape; finished "
                                  "tasks: the console's Overview).", labels=["status"])
        for status, count in state.tasks_by_status.items():
            tasks.add_metric([status], count)
        yield tasks
        waits = GaugeMetricFamily("agent_runtime_waits_open", "Tasks waiting for a person (input_required), by "
                                  "kind of wait.", labels=["kind"])
        for kind, count in state.waits_open.items():
            waits.add_metric([kind], count)
        yield waits
        oldest = GaugeMetricFamily("agent_runtime_wait_oldest_age_seconds", "How long the longest-waiting "
                                   "input_required task has waited (0 when none waits).")
        oldest.add_metric([], state.oldest_wait_seconds or 0.0)
        yield oldest
        if state.hint_queue_depth is not None:
            depth = GaugeMetricFamily("agent_runtime_hint_queue_depth", "run_step hints waiting in the broker, "
                                      "over all priority lists.")
            depth.add_metric([], state.hint_queue_depth)
            yield depth


class _ThisProcess:
    """The default registry's metrics (single-process mode: tests, a lone process)."""

    def collect(self):
        yield from REGISTRY.collect()


def exposition() -> bytes:
    """The /metrics body: every process of the directory (multiprocess mode) or this one, plus the state."""
    registry = CollectorRegistry()
    directory = multiprocess_dir()
    if directory:
        multiprocess.MultiProcessCollector(registry, path=directory)
    else:
        registry.register(_ThisProcess())
    registry.register(StateCollector())
    return generate_latest(registry)


# -- who may scrape ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Refusal:
    status: int
    slug: str
    detail: str


def scrape_refusal(*, authorization: str | None, remote_addr: str | None) -> Refusal | None:
    """None when this request may read /metrics: it carries `Authorization: Bearer <METRICS_TOKEN>` (compared in
    constant time), or it sends none and comes from METRICS_ALLOWED_NETWORKS (default: loopback only). A wrong
    token is refused wherever it comes from."""
    from django.conf import settings

    token = settings.METRICS_TOKEN
    if authorization:
        scheme, _, given = authorization.partition(" ")
        if token and scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), token.encode()):
            return None
        return Refusal(401, "not-authenticated", "That is not the metrics token (METRICS_TOKEN).")
    if _in_networks(remote_addr, settings.METRICS_ALLOWED_NETWORKS):
        return None
    if token:
        return Refusal(401, "not-authenticated", "Send `Authorization: Bearer <METRICS_TOKEN>`, or scrape from a "
                                                 "network in METRICS_ALLOWED_NETWORKS.")
    return Refusal(403, "permission-denied", "Metrics are served to METRICS_ALLOWED_NETWORKS only (set "
                                             "METRICS_TOKEN to scrape from elsewhere with a bearer token).")


def _in_networks(address: str | None, networks: list[str]) -> bool:
    try:
        ip = ipaddress.ip_address((address or "").split("%")[0])
    except ValueError:
        return False
    if ip.version == 6 and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return any(ip in ipaddress.ip_network(network, strict=False) for network in networks)


# -- a worker's /metrics -------------------------------------------------------------------------------------------
def _worker_app(environ, start_response):
    import json

    from django.db import connection

    if environ.get("PATH_INFO", "/").rstrip("/") not in ("", "/metrics"):
        start_response("404 Not Found", [("Content-Type", "text/plain")])
        return [b"not found: scrape /metrics\n"]
    refusal = scrape_refusal(authorization=environ.get("HTTP_AUTHORIZATION"), remote_addr=environ.get("REMOTE_ADDR"))
    if refusal is not None:
        body = json.dumps({"type": f"/runtime/problems/{refusal.slug}", "status": refusal.status,
                           "title": "Not authenticated" if refusal.status == 401 else "Permission denied",
                           "detail": refusal.detail}).encode()
        headers = [("Content-Type", "application/problem+json")]
        if refusal.status == 401:
            headers.append(("WWW-Authenticate", 'Bearer realm="metrics"'))
        start_response(f"{refusal.status} {'Unauthorized' if refusal.status == 401 else 'Forbidden'}", headers)
        return [body]
    try:
        body = exposition()
    finally:
        connection.close()  # this server thread's connection: a scrape every 15 s need not keep one open
    start_response("200 OK", [("Content-Type", CONTENT_TYPE)])
    return [body]


def worker_server_start(*, port: int, host: str) -> None:
    """Serve /metrics from a Celery worker's main process (after its pool started: the children do not inherit
    the socket); with PROMETHEUS_MULTIPROC_DIR it answers for every pool process."""
    from wsgiref.simple_server import make_server

    from prometheus_client.exposition import ThreadingWSGIServer, _SilentHandler

    server = make_server(host, port, _worker_app, ThreadingWSGIServer, handler_class=_SilentHandler)
    threading.Thread(target=server.serve_forever, name="metrics-server", daemon=True).start()
    logger.info("metrics: serving /metrics on %s:%s", host, port)
