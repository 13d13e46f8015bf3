"""OpenTelemetry traces: one trace per task, from the request that created it, across slices, recoveries and workers.

Off by default, and then free: ``setup()`` leaves ENABLED False, installs no SDK and no instrumentor, and every hook
below checks that flag first and returns at once (the span hooks return one shared no-op context manager, so nothing
is allocated per step). On only when the standard variables ask for it (``wanted()``):
- ``OTEL_TRACES_EXPORTER=otlp`` (OTLP over HTTP/protobuf) or ``console``; ``none`` keeps it off; or, with
  OTEL_TRACES_EXPORTER unset, an OTLP endpoint set (``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` or
  ``OTEL_EXPORTER_OTLP_ENDPOINT``);
- never when ``OTEL_SDK_DISABLED=true``.
Everything else is the SDK's own reading of the standard variables: the endpoint, headers and timeout
(OTEL_EXPORTER_OTLP_*), the batch processor (OTEL_BSP_*), the sampler (OTEL_TRACES_SAMPLER[_ARG]), the resource
(OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES). OTEL_PYTHON_DISABLED_INSTRUMENTATIONS=django,celery leaves those out.

Where it is set up (once per process, ``setup()``): the web process from TasksConfig.ready() (before the ASGI
handler loads Django's middleware, so the Django instrumentor's is in it); a celery worker in each process that runs
tasks — prefork children at worker_process_init (the SDK's batch thread is started after the fork), a solo or threads
pool at worker_init (config/celery.py). The prefork parent runs no task and traces nothing.

The trace of a task: ``task_trace_context()`` decides the W3C context stored with the task when it is created
(Task.trace_context): the current span's when tracing is on in that process (the HTTP request's span, or the MCP
SDK's server span of the tools/call, each itself a child of the caller's traceparent), else the caller's own
``traceparent`` (the HTTP header, or the MCP request's ``params._meta``) if well formed. Each slice reads it (one
statement, only when on) and its span (``slice``) is a child of it: every slice of the task, on any worker, after
any recovery, is in that one trace. Under a slice: ``step {name}``, ``effect {name}``, ``chat {model}`` (the GenAI
semantic conventions), ``tools/call {name}`` (the MCP ones; the mcp SDK's client span under it injects the
traceparent into the request's ``_meta``); waits and applied steering are events of the slice span; the reaper's
recovery is a short ``recover`` span in the task's trace. Message contents are recorded only with
OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true (redacted even then); arguments and results of tools never.
"""

from __future__ import annotations

import contextvars
import hashlib
import json
import logging
import os
import re
import socket
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit

logger = logging.getLogger(__name__)

ENABLED = False  # set once per process by setup(); every hook returns at once while it is False
CAPTURE_CONTENT = False  # OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true
TRACER_NAME = "agent-runtime"

_tracer = None
_set_up_in: int | None = None  # the pid setup() ran in (a forked child runs it again)

# W3C Trace Context, version 00: a traceparent we store must be one a propagator will accept.
_TRACEPARENT = re.compile(r"^[0-9a-f]{2}-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}$")
_TRACESTATE_MAX = 512  # the W3C limit a propagator must keep; longer is dropped, not truncated
_TRACESTATE = re.compile(r"^[\x20-\x7e]*$")


class _Off:
    """What every span hook returns while tracing is off: one shared instance; ``as span`` binds None."""

    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc) -> bool:
        return False


OFF = _Off()


# -- set-up ------------------------------------------------------------------------------------------------------
def _true(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() == "true"


def _exporters() -> list[str]:
    value = os.environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if value:
        return [name.strip() for name in value.split(",") if name.strip() and name.strip() != "none"]
    endpoint = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    return ["otlp"] if endpoint else []


def wanted() -> bool:
    """Whether the standard OTEL_* variables ask for traces (see the module's docstring)."""
    return not _true("OTEL_SDK_DISABLED") and bool(_exporters())


def setup(service: str = "agent-runtime", *, web: bool = False) -> bool:
    """Turn tracing on in this process if the environment asks for it; idempotent per process. True if on.
    ``web``: the process serves HTTP (the Django instrumentor's middleware is added)."""
    global ENABLED, CAPTURE_CONTENT, _tracer, _set_up_in
    if _set_up_in == os.getpid():
        return ENABLED
    _set_up_in = os.getpid()
    if not wanted():
        return False
    from opentelemetry import trace
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

    if not isinstance(trace.get_tracer_provider(), TracerProvider):  # (a forked child keeps its parent's)
        # OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES win over these.
        provider = TracerProvider(resource=Resource.create({
            "service.name": service, "service.instance.id": f"{socket.gethostname()}:{os.getpid()}"}))
        for name in _exporters():
            if name == "otlp":
                from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

                provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
            elif name == "console":
                provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
            else:
                logger.warning("OTEL_TRACES_EXPORTER=%s: not an exporter this runtime has (otlp, console)", name)
        trace.set_tracer_provider(provider)
    _tracer = trace.get_tracer(TRACER_NAME)
    CAPTURE_CONTENT = _true("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT")
    _instrument(web=web)
    ENABLED = True
    return True


def _instrument(*, web: bool) -> None:
    """The contrib instrumentors that fit this stack (the README's "Tracing" says which do not, and why): Django's
    where HTTP is served, Celery's everywhere (the sender's context travels in the message headers)."""
    disabled = {name.strip() for name in os.environ.get("OTEL_PYTHON_DISABLED_INSTRUMENTATIONS", "").split(",")}
    if web and "django" not in disabled:
        from opentelemetry.instrumentation.django import DjangoInstrumentor

        if not DjangoInstrumentor().is_instrumented_by_opentelemetry:
            DjangoInstrumentor().instrument()
    if "celery" not in disabled:
        from opentelemetry.instrumentation.celery import CeleryInstrumentor

        if not CeleryInstrumentor().is_instrumented_by_opentelemetry:
            CeleryInstrumentor().instrument()


def flush(timeout_millis: int = 5000) -> None:
    """Export what is buffered (a process about to exit: the batch thread would not get to it)."""
    if ENABLED:
        from opentelemetry import trace

        provider = trace.get_tracer_provider()
        if hasattr(provider, "force_flush"):
            provider.force_flush(timeout_millis)


# -- the task's trace context ------------------------------------------------------------------------------------
def carrier_from_headers(headers) -> dict | None:
    """The caller's W3C trace context from HTTP headers (a mapping read case-insensitively), or None."""
    traceparent = headers.get("traceparent")
    return {"traceparent": traceparent, "tracestate": headers.get("tracestate")} if traceparent else None


def carrier_from_meta(meta) -> dict | None:
    """The caller's W3C trace context from an MCP request's ``params._meta`` (SEP-414), or None."""
    if not isinstance(meta, dict) or not meta.get("traceparent"):
        return None
    return {"traceparent": meta.get("traceparent"), "tracestate": meta.get("tracestate")}


def _valid(carrier: Any) -> dict | None:
    if not isinstance(carrier, dict):
        return None
    traceparent = carrier.get("traceparent")
    if not isinstance(traceparent, str) or not _TRACEPARENT.match(traceparent) or traceparent.startswith("ff"):
        return None
    stored = {"traceparent": traceparent}
    tracestate = carrier.get("tracestate")
    if isinstance(tracestate, str) and tracestate and len(tracestate) <= _TRACESTATE_MAX \
            and _TRACESTATE.match(tracestate):
        stored["tracestate"] = tracestate
    return stored


def task_trace_context(caller: dict | None = None) -> dict | None:
    """What a new task stores as its trace context: the current span's when tracing is on (the request's span, a
    child of the caller's context), else the caller's own context if well formed (so a worker with tracing on
    continues the caller's trace even when the web tier's is off), else None."""
    if ENABLED:
        from opentelemetry import trace
        from opentelemetry.propagate import inject

        if trace.get_current_span().get_span_context().is_valid:
            carrier: dict[str, str] = {}
            inject(carrier)
            current = _valid(carrier)
            if current is not None:
                return current
    return _valid(caller)


def _parent(carrier: Any):
    """The OpenTelemetry context a stored carrier names, or None (the span then starts a trace of its own)."""
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    stored = _valid(carrier)
    if stored is None:
        return None
    context = TraceContextTextMapPropagator().extract(stored)
    return context if trace.get_current_span(context).get_span_context().is_valid else None


def _stored_context(task_id):
    from django.db import DatabaseError

    from tasks_app.models import Task

    try:
        return _parent(Task.objects.filter(id=task_id).values_list("trace_context", flat=True).first())
    except DatabaseError:  # (the slice itself meets the database's trouble and decides; its span starts a trace)
        logger.warning("task %s: its trace context could not be read", task_id)
        return None


def _links():
    """A link to the span current when a task's span starts in its own trace (the Celery message's run span)."""
    from opentelemetry import trace

    current = trace.get_current_span().get_span_context()
    return [trace.Link(current)] if current.is_valid else None


# -- spans of the engine -----------------------------------------------------------------------------------------
def slice_span(fence, *, status: str):
    """The span of one time slice, a child of the task's stored context (one statement to read it)."""
    if not ENABLED:
        return OFF
    return _span("slice", context=_stored_context(fence.task_id), links=_links(), attributes={
        "runtime.task.id": str(fence.task_id), "runtime.worker": fence.owner, "runtime.lease.epoch": fence.epoch,
        "runtime.task.status": str(status)})


def slice_outcome(outcome: str) -> None:
    if ENABLED:
        _current().set_attribute("runtime.slice.outcome", outcome)


def step_span(name: str, *, seq: int, index: int, waits: tuple[type[BaseException], ...] = ()):
    """``waits``: the exceptions by which a step stops to wait (the engine's): an event on the span, not an error."""
    if not ENABLED:
        return OFF
    return _span(f"step {name}", waits=waits, attributes={"runtime.step.name": name, "runtime.step.seq": seq,
                                                           "runtime.step.index": index})


def step_outcome(*, attempt: int, effects: int, tokens: int) -> None:
    if ENABLED:
        _current().set_attributes({"runtime.step.attempt": attempt, "runtime.step.effects": effects,
                                   "runtime.step.tokens": tokens})


def effect_span(name: str, key: str):
    if not ENABLED:
        return OFF
    return _span(f"effect {name}", attributes={"runtime.effect.name": name, "runtime.effect.key": key})


def effect_outcome(*, called: bool) -> None:
    """Whether the effect was called now (False: the ledger's recorded result was returned)."""
    if ENABLED:
        _current().set_attribute("runtime.effect.called", called)


def carry_context(fn):
    """``fn`` run in another thread (an effect's call with a timeout) under this thread's span."""
    if not ENABLED:
        return fn
    context = contextvars.copy_context()
    return lambda *args, **kwargs: context.run(fn, *args, **kwargs)


def event(name: str, **attributes: Any) -> None:
    """An event on the current span (a wait entered, steering applied); None values are left out."""
    if ENABLED:
        _current().add_event(name, {key.replace("_", "."): value for key, value in attributes.items()
                                    if value is not None})


def recovery(task_id, *, owner: str | None, epoch: int, to: str) -> None:
    """The reaper moved the task on from a lost lease: a short span in the task's trace."""
    if not ENABLED:
        return
    with _span("recover", context=_stored_context(task_id), links=_links(), attributes={
            "runtime.task.id": str(task_id), "runtime.lost.worker": owner or "", "runtime.lost.epoch": epoch,
            "runtime.task.status": str(to)}):
        pass


# -- model calls (GenAI semantic conventions) --------------------------------------------------------------------
def _server(url: str) -> dict:
    parts = urlsplit(url)
    attributes = {"server.address": parts.hostname or ""}
    port = parts.port or (443 if parts.scheme == "https" else 80 if parts.scheme == "http" else None)
    if port:
        attributes["server.port"] = port
    return attributes


def chat_span(*, model: str, base_url: str, messages: list[dict]):
    """``chat {model}`` (CLIENT): an OpenAI-compatible Chat Completions request."""
    if not ENABLED:
        return OFF
    attributes = {"gen_ai.operation.name": "chat", "gen_ai.provider.name": "openai", "gen_ai.system": "openai",
                  "gen_ai.request.model": model, **_server(base_url)}
    if CAPTURE_CONTENT:
        attributes["gen_ai.input.messages"] = _content(messages)
    return _span(f"chat {model}", kind="client", attributes=attributes, error_type=_reason)


def chat_reply(span, *, response_model: str | None, response_id: str | None, finish_reason: str | None,
               input_tokens: int, output_tokens: int, message: dict) -> None:
    if span is None:
        return
    attributes = {"gen_ai.usage.input_tokens": input_tokens, "gen_ai.usage.output_tokens": output_tokens,
                  "gen_ai.response.finish_reasons": [finish_reason] if finish_reason else []}
    if response_model:
        attributes["gen_ai.response.model"] = response_model
    if response_id:
        attributes["gen_ai.response.id"] = response_id
    if CAPTURE_CONTENT:
        attributes["gen_ai.output.messages"] = _content([message])
    span.set_attributes(attributes)


def _content(messages: list[dict]) -> str:
    from tasks_app.redaction import redact

    return redact(json.dumps(messages, default=str))


def _reason(error: BaseException) -> str:
    return getattr(error, "reason", None) or type(error).__qualname__


# -- MCP tool calls (MCP semantic conventions) -------------------------------------------------------------------
def tool_call_span(tool: str, *, url: str, key: str):
    """``tools/call {tool}`` (CLIENT) to a downstream MCP server over Streamable HTTP."""
    if not ENABLED:
        return OFF
    return _span(f"tools/call {tool}", kind="client", error_type=_tool_error, attributes={
        "mcp.method.name": "tools/call", "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": tool,
        "network.transport": "tcp", "network.protocol.name": "http", "runtime.effect.key": key, **_server(url)})


def tool_answered(span, *, protocol_version: str | None, session_id: str | None, is_error: bool) -> None:
    if span is None:
        return
    if protocol_version:
        span.set_attribute("mcp.protocol.version", protocol_version)
    if session_id:  # (a stateful server's session id may act as a capability: only its digest is recorded)
        span.set_attribute("mcp.session.id", hashlib.sha256(session_id.encode()).hexdigest()[:16])
    if is_error:
        from opentelemetry.trace import StatusCode

        span.set_attribute("error.type", "tool_error")
        span.set_status(StatusCode.ERROR)


def _tool_error(error: BaseException) -> str:
    # mcp_client's outcomes: NotSent, OutcomeUnknown, Refused (and its code); low cardinality, no text.
    code = getattr(error, "code", None)
    if code is not None:
        return str(code)
    return re.sub(r"(?<!^)(?=[A-Z])", "_", type(error).__name__).lower()


def meta_carrier() -> dict:
    """The current span's W3C context for a request's ``_meta`` (empty when off: the shared empty dict)."""
    if not ENABLED:
        return _EMPTY
    from opentelemetry.propagate import inject

    carrier: dict[str, str] = {}
    inject(carrier)
    return carrier


_EMPTY: dict = {}


# -- helpers -------------------------------------------------------------------------------------------------------
def _current():
    from opentelemetry import trace

    return trace.get_current_span()


@contextmanager
def _span(name: str, *, context=None, links=None, attributes: dict | None = None, kind: str = "internal",
          error_type=None, waits: tuple[type[BaseException], ...] = ()):
    from opentelemetry.trace import SpanKind, StatusCode

    with _tracer.start_as_current_span(name, context=context, links=links, attributes=attributes,
                                       kind=SpanKind.CLIENT if kind == "client" else SpanKind.INTERNAL,
                                       record_exception=False, set_status_on_exception=False) as span:
        try:
            yield span
        except waits as waiting:  # a step that stops to wait did not fail
            span.add_event("wait", {"runtime.wait": type(waiting).__name__})
            raise
        except BaseException as error:
            span.set_attribute("error.type", error_type(error) if error_type else type(error).__qualname__)
            span.set_status(StatusCode.ERROR, type(error).__name__)
            raise
