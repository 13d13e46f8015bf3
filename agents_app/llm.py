"""The model client: one Chat Completions request to an OpenAI-compatible endpoint (OpenAI, vLLM, Ollama, llama.cpp's
server, LiteLLM), streamed, through the official `openai` SDK.

What the agent loop (agents_app.agent) needs of a model call, and where each part is decided:
- the endpoint: `model` in config/runtime.yaml (MODEL_BASE_URL / MODEL_NAME / MODEL_API_KEY from the environment stand
  in when it is unset); a task may name another model on the same endpoint (`input.model`). The API key is read from
  the environment by its credential's *name* at the moment of the call, never stored or logged;
- retries: the SDK's own — 429, 5xx, timeouts and connection errors, `model.max_retries` times with backoff,
  honouring Retry-After. A stream that breaks off after it started is not retried here: the step's attempt fails
  (ModelUnavailable) and the engine runs it again — a model call has no side effect, so calling again is safe, and
  the attempt is counted;
- a refusal (400, 401, 403, 404, 422: a request no retry mends; a redirect, never followed) is ModelRefused: the step
  fails at once, saying the status — never the endpoint's body;
- every connection through the outbound connector (agents_app.outbound): a tenant's endpoint only to an address its
  tool policy allows, checked where the connection is opened; no redirect; the answer cut at model.max_answer_bytes;
- streamed content is handed to `on_delta` as it arrives (the loop publishes it live, never stores it); the reply is
  the whole message once the stream ended, with its tool calls and token usage.

`chat_async` is the same call awaited on an event loop (the same request, stream handling, failures and connector):
for a process that has many model calls in flight without a thread or a worker each (ARCHITECTURE §13). The agent
loop does not use it yet.
"""

from __future__ import annotations

import functools
import json
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from django.conf import settings

from agents_app import credentials, outbound
from agents_app.models import TenantModel
from config.base.lazy_imports import lazy_module
from tasks_app.observability import tracing

openai = lazy_module("openai")  # (loaded by the first model call: config/base/lazy_imports.py)

logger = logging.getLogger(__name__)

ENV_BASE_URL, ENV_NAME, ENV_KEY = "MODEL_BASE_URL", "MODEL_NAME", "MODEL_API_KEY"
NO_KEY = "not-needed"  # (the SDK insists on a key; local servers take any)


class ModelError(Exception):
    reason = "model_error"
    retryable = True

    def __init__(self, message: str, *, events: list | tuple = ()):
        super().__init__(message)
        self.events = list(events)


class ModelUnavailable(ModelError):
    """Not reached, overloaded, timed out or broken off (after the SDK's own retries): the step may try again."""

    reason = "model_unavailable"


class ModelRefused(ModelError):
    """The endpoint refused the request (bad request, key, model name): the same request would be refused again."""

    reason = "model_refused"
    retryable = False


class ModelCredentialNotGranted(ModelRefused):
    """A tenant's model endpoint names a credential not granted to its tenant for its host: nothing is sent."""

    reason = "credential_not_granted"


class ModelNotConfigured(ModelError):
    reason = "model_not_configured"
    retryable = False


@dataclass(frozen=True)
class Endpoint:
    base_url: str
    model: str
    credential: str | None  # the environment variable's name
    context_window: int
    timeout_seconds: float
    max_retries: int
    prices: tuple[float, float] | None  # per million tokens: input, output
    tenant_owned: bool = False  # a tenant's own (TenantModel), not the deployment's
    # A tenant's own endpoint: its tenant's slug, whose grants its credential is checked against at each request.
    tenant: str | None = None
    # Where its connections may go (agents_app.outbound): a tenant's own endpoint, the tenant's tool hosts
    # (tools.allowed_hosts narrowed by the tenant's); the deployment's own, anywhere its operator pointed it.
    where: outbound.Policy = outbound.Policy(anywhere=True)
    # How metrics name the model: its configured name, or one with a configured price; "other" for any other name a
    # task asked for (a task's choice must not grow the metrics' label set without bound).
    metrics_label: str = "other"

    def describe(self) -> str:
        return f"{self.model} at {self.base_url}"


def endpoint_get(model: str | None = None, *, tenant_id=None) -> Endpoint | None:
    """The endpoint a task of this tenant calls: the tenant's own (TenantModel, in admin) if it has one, else the
    deployment's (runtime.yaml `model`, else MODEL_BASE_URL / MODEL_NAME); `model` — a task's choice — in place of
    its model name. None: no model is configured."""
    config = settings.RUNTIME.model
    own = (TenantModel.objects.select_related("tenant").filter(tenant_id=tenant_id).first()
           if tenant_id is not None else None)
    if own is not None:
        name = model or own.name
        prices = ((float(own.input_price or 0), float(own.output_price or 0))
                  if own.input_price is not None or own.output_price is not None else (config.prices or {}).get(name))
        return Endpoint(base_url=own.base_url.rstrip("/"), model=name, credential=own.credential or None,
                        context_window=own.context_window or config.context_window,
                        timeout_seconds=config.timeout_seconds, max_retries=config.max_retries, prices=prices,
                        tenant_owned=True, tenant=own.tenant.slug, metrics_label=_metrics_label(name, own.name),
                        where=outbound.policy_for_tenant(tenant_id))
    base_url = config.base_url or os.environ.get(ENV_BASE_URL) or None
    name = model or config.name or os.environ.get(ENV_NAME) or None
    if not base_url or not name:
        return None
    credential = config.credential or (ENV_KEY if os.environ.get(ENV_KEY) else None)
    prices = (config.prices or {}).get(name)
    return Endpoint(base_url=base_url.rstrip("/"), model=name, credential=credential,
                    context_window=config.context_window, timeout_seconds=config.timeout_seconds,
                    max_retries=config.max_retries, prices=prices,
                    metrics_label=_metrics_label(name, config.name or os.environ.get(ENV_NAME)))


def _metrics_label(name: str, configured: str | None) -> str:
    return name if name == configured or name in (settings.RUNTIME.model.prices or {}) else "other"


NOT_CONFIGURED_HELP = (f"No language model is configured: set `model.base_url` and `model.name` in config/runtime.yaml "
                       f"(or RUNTIME_MODEL__BASE_URL / RUNTIME_MODEL__NAME), or {ENV_BASE_URL} and {ENV_NAME} (with "
                       f"{ENV_KEY} for its key) in the environment — any OpenAI-compatible Chat Completions endpoint.")


@dataclass
class Reply:
    """The model's answer: the assistant message as the next request sends it back, and what it cost."""

    message: dict[str, Any]
    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int
    tool_calls: list[dict[str, Any]] = field(default_factory=list)  # [{id, name, arguments (text)}]
    response_model: str | None = None  # the model the endpoint says answered (traces: gen_ai.response.model)
    response_id: str | None = None

    def cost(self, endpoint: Endpoint) -> Decimal:
        if not endpoint.prices:
            return Decimal(0)
        per_input, per_output = (Decimal(str(price)) for price in endpoint.prices)
        return (per_input * self.prompt_tokens + per_output * self.completion_tokens) / Decimal(1_000_000)


@functools.lru_cache(maxsize=16)
def _client(base_url: str, key: str, timeout: float, max_retries: int, where: outbound.Policy,
            cap: int) -> openai.OpenAI:
    # One client (its connection pool) per endpoint, key and policy in a process: building one per call costs a TLS
    # context. Its HTTP client is the outbound connector's (agents_app.outbound), not the SDK's default: that one
    # follows redirects (a 307 from an allowed host sent a tenant's requests to a refused address) and resolves the
    # name again for each connection; ours checks the address where each connection is opened, dials that address,
    # follows no redirect and cuts an answer at model.max_answer_bytes. A pooled connection was checked when opened;
    # a changed policy is a new key here, so a new pool.
    http = outbound.Connector(where, kind="model", cap=cap, setting="model.max_answer_bytes").client(timeout=timeout)
    return openai.OpenAI(base_url=base_url, api_key=key, timeout=timeout, max_retries=max_retries, http_client=http)


def _key(endpoint: Endpoint) -> str:
    """The API key for a request, read now by its credential's name, never stored or logged. A tenant's own endpoint
    may send only a credential the deployment grants to its tenant for the endpoint's host (agents_app.credentials):
    any other fails closed here, before the client exists — nothing is sent (a tenant admin once named SECRET_KEY
    and their endpoint received it with every request). The deployment's own endpoint uses the deployment's key."""
    if not endpoint.credential:
        return NO_KEY
    if endpoint.tenant_owned:
        try:
            return credentials.value(name=endpoint.credential, tenant_slug=endpoint.tenant, url=endpoint.base_url)
        except credentials.CredentialNotGranted as refused:
            raise ModelCredentialNotGranted(f"the model endpoint's credential: {refused} Nothing was sent.") from None
        except credentials.CredentialUnavailable as missing:
            raise ModelRefused(f"the model endpoint's credential: {missing}") from None
    value = os.environ.get(endpoint.credential)
    if not value:
        raise ModelRefused(f"the model's credential {endpoint.credential!r} is not set in this worker's environment")
    return value


def chat(endpoint: Endpoint, *, messages: list[dict], tools: list[dict] | None = None,
         on_delta: Callable[[str], None] | None = None) -> Reply:
    """One streamed Chat Completions request; the whole reply once the stream ended. Traced as `chat {model}` (the
    GenAI semantic conventions: usage, models, finish reason; contents only when asked for) when tracing is on."""
    with tracing.chat_span(model=endpoint.model, base_url=endpoint.base_url, messages=messages) as span:
        reply = _chat(endpoint, messages=messages, tools=tools, on_delta=on_delta)
        tracing.chat_reply(span, response_model=reply.response_model, response_id=reply.response_id,
                           finish_reason=reply.finish_reason, input_tokens=reply.prompt_tokens,
                           output_tokens=reply.completion_tokens, message=reply.message)
        return reply


def _chat(endpoint: Endpoint, *, messages: list[dict], tools: list[dict] | None,
          on_delta: Callable[[str], None] | None) -> Reply:
    client = _client(endpoint.base_url, _key(endpoint), endpoint.timeout_seconds, endpoint.max_retries,
                     endpoint.where, settings.RUNTIME.model.max_answer_bytes)
    stream = _Stream(on_delta)
    try:
        for chunk in client.chat.completions.create(**_request(endpoint, messages, tools)):
            stream.take(chunk)
    except _failures() as failed:
        raise _failure(endpoint, failed) from None
    return stream.reply(messages)


async def chat_async(endpoint: Endpoint, *, messages: list[dict], tools: list[dict] | None = None,
                     on_delta: Callable[[str], None] | None = None) -> Reply:
    """chat(), on an event loop: the same request, the same reply from the same stream, the same failures — through
    the same outbound connector (its async client: every connection's address checked where it is opened, no
    redirect, the answer cut at model.max_answer_bytes), the SDK's own retries. For a process that makes many model
    calls at once without a thread or a worker each (ARCHITECTURE §13). The key is read now, as chat() reads it."""
    with tracing.chat_span(model=endpoint.model, base_url=endpoint.base_url, messages=messages) as span:
        http = outbound.Connector(endpoint.where, kind="model", cap=settings.RUNTIME.model.max_answer_bytes,
                                  setting="model.max_answer_bytes").async_client(timeout=endpoint.timeout_seconds)
        client = openai.AsyncOpenAI(base_url=endpoint.base_url, api_key=_key(endpoint),
                                    timeout=endpoint.timeout_seconds, max_retries=endpoint.max_retries,
                                    http_client=http)
        stream = _Stream(on_delta)
        try:
            async with client:
                async for chunk in await client.chat.completions.create(**_request(endpoint, messages, tools)):
                    stream.take(chunk)
        except _failures() as failed:
            raise _failure(endpoint, failed) from None
        reply = stream.reply(messages)
        tracing.chat_reply(span, response_model=reply.response_model, response_id=reply.response_id,
                           finish_reason=reply.finish_reason, input_tokens=reply.prompt_tokens,
                           output_tokens=reply.completion_tokens, message=reply.message)
        return reply


def _request(endpoint: Endpoint, messages: list[dict], tools: list[dict] | None) -> dict[str, Any]:
    request: dict[str, Any] = {"model": endpoint.model, "messages": messages, "stream": True,
                               "stream_options": {"include_usage": True}}
    if tools:
        request["tools"] = tools
    return request


class _Stream:
    """A streamed reply as it arrives (chunk by chunk, from the sync or the async client alike): content handed to
    ``on_delta`` as it comes, tool calls assembled by index, usage and finish reason kept; reply() once it ended."""

    def __init__(self, on_delta: Callable[[str], None] | None):
        self.on_delta = on_delta
        self.content: list[str] = []
        self.calls: dict[int, dict[str, Any]] = {}
        self.finish_reason = self.usage = self.response_model = self.response_id = None

    def take(self, chunk) -> None:
        self.response_model, self.response_id = chunk.model or self.response_model, chunk.id or self.response_id
        if chunk.usage is not None:
            self.usage = chunk.usage
        for choice in chunk.choices or ():
            delta = choice.delta
            if delta is not None and delta.content:
                self.content.append(delta.content)
                if self.on_delta is not None:
                    self.on_delta(delta.content)
            for call in (delta.tool_calls or ()) if delta is not None else ():
                slot = self.calls.setdefault(call.index, {"id": None, "name": "", "arguments": ""})
                slot["id"] = call.id or slot["id"]
                if call.function is not None:
                    slot["name"] += call.function.name or ""
                    slot["arguments"] += call.function.arguments or ""
            if choice.finish_reason:
                self.finish_reason = choice.finish_reason

    def reply(self, messages: list[dict]) -> Reply:
        tool_calls = [{"id": slot["id"] or f"call_{index}", "name": slot["name"], "arguments": slot["arguments"]}
                      for index, slot in sorted(self.calls.items())]
        message: dict[str, Any] = {"role": "assistant", "content": "".join(self.content) or None}
        if tool_calls:
            message["tool_calls"] = [{"id": call["id"], "type": "function",
                                      "function": {"name": call["name"], "arguments": call["arguments"]}}
                                     for call in tool_calls]
        prompt_tokens = getattr(self.usage, "prompt_tokens", None)
        completion_tokens = getattr(self.usage, "completion_tokens", None)
        if prompt_tokens is None:  # an endpoint that reports no usage: counted roughly (4 characters a token)
            prompt_tokens = len(json.dumps(messages)) // 4
        if completion_tokens is None:
            completion_tokens = len(json.dumps(message)) // 4
        return Reply(message=message, finish_reason=self.finish_reason, prompt_tokens=int(prompt_tokens),
                     completion_tokens=int(completion_tokens), tool_calls=tool_calls,
                     response_model=self.response_model, response_id=self.response_id)


def _failures() -> tuple[type[BaseException], ...]:
    """The exceptions a model call's failure comes as (the SDK's, the connector's, a JSON nested too deeply), for an
    ``except`` clause, which evaluates it only when something was raised: importing this module loads no SDK."""
    return (openai.APIError, outbound.AnswerTooLarge, outbound.AnswerEncoded, RecursionError)


def _failure(endpoint: Endpoint, failed: BaseException) -> ModelError:
    """What the task is told of a failed model call: the status and the kind of failure, never the endpoint's body —
    a refused or failing service behind a redirect once had its 500 page relayed into the task's statusMessage."""
    if isinstance(failed, (openai.BadRequestError, openai.AuthenticationError, openai.PermissionDeniedError,
                           openai.NotFoundError, openai.UnprocessableEntityError)):
        return ModelRefused(f"{endpoint.describe()} refused the request: HTTP {failed.status_code}")
    if isinstance(failed, openai.APIStatusError):  # a redirect (not followed), or 429 / 5xx past the SDK's retries
        if 300 <= failed.status_code < 400:
            return ModelRefused(f"{endpoint.describe()} answered HTTP {failed.status_code}, a redirect: not followed "
                                f"(point the endpoint at where it leads)")
        return ModelUnavailable(f"{endpoint.describe()} answered HTTP {failed.status_code} (after "
                                f"{endpoint.max_retries} retries)")
    if isinstance(failed, RecursionError):  # (the SDK's json.loads of a chunk nested thousands of levels: hostile)
        return ModelRefused(f"{endpoint.describe()} answered JSON nested too deeply to read")
    # (a timeout is a connection error here; a cut answer may come raw out of the stream's iteration)
    refusal, cut = outbound.refusal_in(failed), outbound.cut_in(failed)
    if refusal is not None:
        return ModelRefused(f"{endpoint.describe()} was not called: {refusal}")
    if cut is not None:
        return ModelRefused(f"{endpoint.describe()}: {cut}")
    return ModelUnavailable(f"{endpoint.describe()} could not be used: {type(failed).__name__}")
