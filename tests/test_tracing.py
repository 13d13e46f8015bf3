"""OpenTelemetry traces (issue 23): one trace per task, from the traceparent of the request that created it, across a
worker SIGKILL and its recovery; model and tool spans with the GenAI / MCP semantic conventions' attributes.

The spans are counted from outside: a real web process and real `celery worker` processes export OTLP/HTTP (protobuf)
to a receiver in this test process (a small HTTP server thread decoding ExportTraceServiceRequest), configured by the
standard OTEL_* variables only. The test process itself traces nothing (tracing is off by default).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from agents_app.models import ToolServer
from config.celery import app
from tasks_app.models import Task
from tests.engine_support import configure, expire_lease
from tests.mcp_support import mcp_client
from tests.scripted_model_support import unique_key
from tests.tool_server_support import tool_server  # noqa: F401 — the fixture
from tests.worker_support import wait_for_status

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("external_root"), pytest.mark.slow]

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{CALLER_SPAN_ID}-01"
MCP_TRACE_ID = "0af7651916cd43dd8448eb211c80319c"


def _value(any_value):
    kind = any_value.WhichOneof("value")
    if kind == "array_value":
        return [_value(item) for item in any_value.array_value.values]
    return getattr(any_value, kind) if kind else None


class OtlpReceiver:
    """An OTLP/HTTP trace receiver on 127.0.0.1: every span it was sent, flattened (name, ids, kind, attributes, the
    resource's attributes)."""

    def __init__(self):
        self.spans: list[dict] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                receiver.add(request)
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200 if self.path == "/v1/traces" else 404)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def add(self, request: ExportTraceServiceRequest) -> None:
        with self.lock:
            for resource_spans in request.resource_spans:
                resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
                for scope_spans in resource_spans.scope_spans:
                    for span in scope_spans.spans:
                        self.spans.append({
                            "name": span.name, "trace_id": span.trace_id.hex(), "span_id": span.span_id.hex(),
                            "parent_span_id": span.parent_span_id.hex(), "kind": span.kind,
                            "attributes": {a.key: _value(a.value) for a in span.attributes},
                            "events": [event.name for event in span.events], "resource": resource,
                            "status": span.status.code})

    def find(self, predicate) -> list[dict]:
        with self.lock:
            return [span for span in self.spans if predicate(span)]

    def wait_for(self, predicate, what: str, seconds: float = 30) -> list[dict]:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            found = self.find(predicate)
            if found:
                return found
            time.sleep(0.05)
        raise AssertionError(f"no span {what} received; got {sorted({s['name'] for s in self.find(bool)})}")

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def otlp_receiver():
    receiver = OtlpReceiver()
    yield receiver
    receiver.stop()


def test_it_stores_the_callers_traceparent_as_it_came_when_this_process_does_not_trace(api):
    good = api.post("/runtime/tasks", {"workflow": "demo_steps", "input": {"steps": 1}}, format="json",
                    HTTP_TRACEPARENT=TRACEPARENT, HTTP_TRACESTATE="vendor=1")
    malformed = api.post("/runtime/tasks", {"workflow": "demo_steps", "input": {"steps": 1}}, format="json",
                         HTTP_TRACEPARENT=f"00-{'0' * 32}-{CALLER_SPAN_ID}-01")
    untraced = api.post("/runtime/tasks", {"workflow": "demo_steps", "input": {"steps": 1}}, format="json")

    assert (good.status_code, malformed.status_code, untraced.status_code) == (201, 201, 201)
    assert Task.objects.get(id=good.json()["taskId"]).trace_context == {"traceparent": TRACEPARENT,
                                                                        "tracestate": "vendor=1"}
    assert Task.objects.get(id=malformed.json()["taskId"]).trace_context is None  # (an all-zero trace id)
    assert Task.objects.get(id=untraced.json()["taskId"]).trace_context is None


def test_it_continues_the_creating_requests_trace_across_a_sigkilled_worker_with_model_and_tool_spans(
        api, tenant, web, workers, scripted_model, tool_server, otlp_receiver, settings):  # noqa: F811
    configure(settings, model={"base_url": scripted_model.url, "name": "scripted-1"})  # (checked at create)
    ToolServer.objects.create(tenant=tenant, name="shop", url=tool_server.url, timeout_seconds=10)
    key = unique_key("traced")
    scripted_model.script(key, [
        {"tool_calls": [{"name": "shop__upsert", "arguments": {"key": key, "value": "v", "delay_ms": 1500}}],
         "usage": {"prompt_tokens": 31, "completion_tokens": 7}},
        {"content": "done", "usage": {"prompt_tokens": 45, "completion_tokens": 2}}])
    env = {"RUNTIME_MODEL__BASE_URL": scripted_model.url, "RUNTIME_MODEL__NAME": "scripted-1",
           "OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": otlp_receiver.endpoint,
           "OTEL_BSP_SCHEDULE_DELAY": "50"}
    first = workers("traced-1", pool="solo", env=env)
    server = web(**env)

    request = urllib.request.Request(server.url("/runtime/tasks"), method="POST", data=json.dumps(
        {"workflow": "agent", "input": {"goal": f"Set {key}", "servers": ["shop"]}}).encode(), headers={
        "Authorization": f"Bearer {api.raw_token}", "Content-Type": "application/json",
        "traceparent": TRACEPARENT, "tracestate": "vendor=1"})
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status == 201
        task_id = json.loads(response.read())["taskId"]
    # The web process traces: the task continues its request's span (the Django instrumentor's), the caller's child.
    (http,) = otlp_receiver.wait_for(lambda s: s["kind"] == Span.SPAN_KIND_SERVER and s["trace_id"] == TRACE_ID,
                                     "for the HTTP request")
    assert http["parent_span_id"] == CALLER_SPAN_ID
    assert http["attributes"].get("http.route") == "runtime/tasks", http
    assert Task.objects.get(id=task_id).trace_context == {"traceparent": f"00-{TRACE_ID}-{http['span_id']}-01",
                                                          "tracestate": "vendor=1"}

    # Killed during the tool call, once its model turn's spans are out (a killed process exports nothing more).
    tool_key = f"{task_id}:2:shop.upsert:1"
    tool_server.wait_for_call(seconds=30, event="received", idempotency_key_meta=tool_key)
    otlp_receiver.wait_for(lambda s: s["name"] == "step think", "step think from the first worker")
    os.killpg(first.process.pid, signal.SIGKILL)
    first.process.wait(timeout=10)
    first_spans = otlp_receiver.find(bool)

    workers("traced-2", pool="solo", env=env)
    expire_lease(task_id)
    app.send_task("runtime.reap", priority=0)
    task = wait_for_status(task_id, {"completed", "failed", "dead_lettered"}, seconds=60)
    assert task.status == "completed", (task.status, task.error)
    otlp_receiver.wait_for(lambda s: s["name"] == "slice" and s["attributes"].get("runtime.slice.outcome")
                           == "completed", "slice that completed the task")
    spans = otlp_receiver.find(bool)

    # One trace: every span of the task (slices, the recovery) is in the caller's trace, children of its request's.
    of_task = [s for s in spans if s["attributes"].get("runtime.task.id") == task_id]
    assert {s["name"] for s in of_task} >= {"slice", "recover"}, of_task
    assert {s["trace_id"] for s in of_task} == {TRACE_ID}
    assert {s["parent_span_id"] for s in of_task} == {http["span_id"]}
    in_trace = [s for s in spans if s["trace_id"] == TRACE_ID]
    # Steps ran in two processes (the killed worker's slice span never ended, so never left it: its steps did),
    # under different slices (two, or more when a slow machine ends a slice after its time and the next one goes on).
    steps = [s for s in in_trace if s["name"].startswith("step ")]
    assert len({s["resource"]["service.instance.id"] for s in steps}) == 2, steps
    assert len({s["parent_span_id"] for s in steps}) >= 2
    assert any(s["name"] == "step think" for s in first_spans if s["trace_id"] == TRACE_ID)
    slice_ids = {s["span_id"] for s in of_task if s["name"] == "slice"}
    assert any(s["parent_span_id"] in slice_ids for s in steps)

    # Model calls: `chat {model}` with the GenAI attributes; never the messages.
    chats = sorted((s for s in in_trace if s["name"] == "chat scripted-1"),
                   key=lambda s: s["attributes"]["gen_ai.usage.input_tokens"])
    assert [(c["attributes"]["gen_ai.usage.input_tokens"], c["attributes"]["gen_ai.usage.output_tokens"],
             c["attributes"]["gen_ai.response.finish_reasons"]) for c in chats] == [
        (31, 7, ["tool_calls"]), (45, 2, ["stop"])]
    for chat in chats:
        assert chat["kind"] == Span.SPAN_KIND_CLIENT
        assert chat["attributes"]["gen_ai.operation.name"] == "chat"
        assert chat["attributes"]["gen_ai.provider.name"] == "openai"
        assert chat["attributes"]["gen_ai.request.model"] == "scripted-1"
        assert chat["attributes"]["gen_ai.response.model"]
        assert chat["attributes"]["server.address"] == "127.0.0.1"
        assert not {"gen_ai.input.messages", "gen_ai.output.messages"} & set(chat["attributes"])
    # The goal's text (the key is in it, and in the tool's arguments) is in no span of the trace.
    assert key not in json.dumps([s["attributes"] for s in spans] + [s["events"] for s in spans])

    # Tool calls: `tools/call {name}` (CLIENT) with the MCP attributes, under the effect of its step; the call made
    # again after the recovery (upsert is idempotent: the same key, replayed by the server) is in the same trace.
    calls = [s for s in in_trace if s["name"] == "tools/call upsert"]
    assert calls, sorted({s["name"] for s in in_trace})
    for call in calls:
        assert call["kind"] == Span.SPAN_KIND_CLIENT
        attributes = call["attributes"]
        assert attributes["mcp.method.name"] == "tools/call"
        assert attributes["gen_ai.tool.name"] == "upsert"
        assert attributes["gen_ai.operation.name"] == "execute_tool"
        assert attributes["mcp.protocol.version"]
        assert (attributes["server.address"], attributes["server.port"]) == ("127.0.0.1", tool_server.port)
        assert attributes["runtime.effect.key"] == tool_key
        assert "error.type" not in attributes
    effects = {s["span_id"] for s in in_trace if s["name"] == "effect shop.upsert:1"}
    assert all(call["parent_span_id"] in effects for call in calls)
    # …and the tool server got the trace in the request's _meta, before and after the kill.
    received = tool_server.calls(tool="upsert", event="received", idempotency_key_meta=tool_key)
    assert len(received) == 2
    assert all(line.get("traceparent", "").split("-")[1] == TRACE_ID for line in received), received

    # …and a task created over MCP continues the trace of the tools/call's params._meta.traceparent (SEP-414), through
    # the mcp SDK's server span.
    async def over_mcp():
        async with mcp_client(server.url("/mcp"), api.raw_token) as client:
            created = await client.session.call_tool("demo_steps", {"steps": 1}, allow_claimed=True,
                                                     meta={"traceparent": f"00-{MCP_TRACE_ID}-{CALLER_SPAN_ID}-01"})
            return created.task_id

    mcp_task_id = asyncio.run(over_mcp())
    (call,) = otlp_receiver.wait_for(lambda s: s["trace_id"] == MCP_TRACE_ID and s["name"] == "tools/call demo_steps",
                                     "for the MCP tools/call")
    assert (call["kind"], call["parent_span_id"]) == (Span.SPAN_KIND_SERVER, CALLER_SPAN_ID)
    assert Task.objects.get(id=mcp_task_id).trace_context == {"traceparent": f"00-{MCP_TRACE_ID}-{call['span_id']}-01"}
