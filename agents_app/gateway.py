"""The tool gateway: every downstream MCP tool call a workflow makes (ctx.tool, the mcp_tool workflow, the agent
loop) goes through `tool_call`, in this order (docs/tools.md):

1. the server, by name, among the task's tenant's (ToolServer); the tool, from the server's tool list (read again
   when the tool is missing from it or the list is older than TOOLS_FRESH_SECONDS);
2. the policy, decided at the moment of the call — a policy changed mid-task applies to the next call — and the
   server's host, resolved and checked before any connection (agents_app.policy);
3. the arguments against the tool's inputSchema, before anything is sent;
4. the call, as an effect of the ledger (ctx.effect): its key `<task>:<step>:<server>.<tool>:<n>` committed as
   `started` before the request and sent with it (_meta and the Idempotency-Key header); the token read from the
   environment by its credential's name at this moment, never stored or logged;
5. an unknown outcome (the worker died mid-call, no answer in time) decided by the rule the call's ledger row
   records when it starts (tool_recovery → tasks_app.engine.effects.decide): readOnlyHint, idempotentHint or a
   server that honours the key → called again with the same key; otherwise the caller's `reconcile` hook, else the
   workflow's, else a person — after the call's deadline only (the task never calls it again blindly);
6. the result (isError included: a tool's own failure is a result, not an exception), screened before the
   workflow sees it (agents_app.screening), recorded with the step.

A request that never reached the server (connection refused, a 502/503/504/429 in front of it, its concurrency cap
full) is tried again here, a few times with backoff: nothing can be duplicated by that. Still not reached, the step
lets go of its worker and waits (ExternalWait, backoff 1 s … 30 s) and calls again — a restart or a deploy of the
server is ridden out — until `tools.unreachable_wait_seconds` has been waited, then fails with tool_unavailable.
A denied call never reaches the server: the step fails at once (no retry: it would be denied again) with
`tool_denied` naming the rule, and a `tool.denied` event.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.core.files.storage import default_storage
from django.db.models import F, Q
from django.db.models.functions import Now
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from agents_app import credentials, limits, outbound, policy, selectors
from agents_app.hosts import HostVerdict, host_check_for_tenant
from agents_app.models import DownstreamTask, ToolServer
from agents_app.screening import screen
from checkpoints_app.models import EffectStatus, Recovery, SideEffect
from config.base.lazy_imports import lazy_module
from tasks_app.engine import waits
from tasks_app.engine.effects import effect_key
from tasks_app.models import Task
from tasks_app.observability import metrics
from tasks_app.redaction import redact_json
from tasks_app.registry import ToolTimeout

if TYPE_CHECKING:
    from tasks_app.engine.context import StepContext

# The MCP SDK, loaded by the first call of a downstream tool (config/base/lazy_imports.py: a worker that never calls one
# does not pay its import).
mcp_client = lazy_module("agents_app.mcp_client")
logger = logging.getLogger(__name__)

TOOLS_FRESH_SECONDS = 300  # a tool list older than this is read again before a call checks against it
NOT_SENT_TRIES = 3  # a request that never reached the server: tried this often within one attempt
NOT_SENT_BACKOFF_SECONDS = 0.5  # then 1 s, 2 s…
TIMEOUT_GRACE_SECONDS = 5  # the step's own guard, beyond the client's timeout
UNREACHABLE_BACKOFF_MAX_SECONDS = 30  # a server not reached is tried after 1 s, 2 s, 4 s … then every 30 s


class ToolError(Exception):
    """A tool call the gateway could not make; `reason` is the typed reason the task's error carries."""

    reason = "tool_error"
    retryable = True

    def __init__(self, message: str, *, events: list | tuple = ()):
        super().__init__(message)
        self.events = list(events)


class ToolDenied(ToolError):
    """The policy (or the server's list of enabled tools, or its host) refuses the call: it never reaches the
    server, and trying again would be refused the same way."""

    reason = "tool_denied"
    retryable = False


class ToolUnknown(ToolError):
    """No such server for this tenant, or no such tool on the server."""

    reason = "tool_unknown"
    retryable = False


class ToolArgumentsInvalid(ToolError):
    reason = "tool_arguments_invalid"
    retryable = False

    def __init__(self, message: str, errors: list[dict]):
        super().__init__(message)
        self.errors = errors


class ToolUnavailable(ToolError):
    """The server could not be reached (every try): nothing was sent, so the step may try again later.
    ``transient``: worth waiting for (see mcp_client.NotSent); a 401 or a 404 is not. ``detail``: how it failed,
    for the log when the message shown leaves it out (tools_refresh)."""

    reason = "tool_unavailable"

    def __init__(self, message: str, *, transient: bool = True, events: list | tuple = (), detail: str = ""):
        super().__init__(message, events=events)
        self.transient = transient
        self.detail = detail


class ToolRefused(ToolError):
    """The server answered the call with a protocol error (no such method, invalid params): it did not run the tool,
    and the same request would be refused again — no retry."""

    reason = "tool_refused"
    retryable = False


class CredentialMissing(ToolError):
    reason = "credential_missing"
    retryable = False


class CredentialNotGranted(CredentialMissing):
    """The server's credential is not granted to its tenant for its host (agents_app.credentials): nothing is sent."""

    reason = "credential_not_granted"


# -- 1. the server and its tools ------------------------------------------------------------------------------------
def task_facts(ctx: StepContext) -> dict[str, Any]:
    """The task's tenant and tool policy, read once per attempt (the policy itself is read at each call)."""
    facts = ctx.gateway_cache.get("task")
    if facts is None:
        # (the tenant's slug in the same statement: the model and tool metrics are labelled by it)
        facts = Task.objects.values("tenant_id", "tool_policy", "tenant__slug").get(id=ctx.task_id)
        ctx.gateway_cache["task"] = facts
    return facts


def server_get(*, tenant_id, name: str) -> ToolServer:
    """The server row, with `tools_fresh`: whether its tool list was read within TOOLS_FRESH_SECONDS by the
    database's clock (one query for both)."""
    try:
        return ToolServer.objects.annotate(tools_fresh=Q(tools_read_at__gte=Now() - _seconds(TOOLS_FRESH_SECONDS))) \
            .get(tenant_id=tenant_id, name=name)
    except ToolServer.DoesNotExist:
        raise ToolUnknown(f"no tool server {name!r} in this task's tenant (python3.11 deploy/dev.py manage "
                          f"tool_servers list)") from None


def credential_value(server: ToolServer) -> str | None:
    """The server's bearer token, read now by its credential's name (never stored) — only if the deployment grants
    that credential to the server's tenant for the host of the server's URL (agents_app.credentials): a row naming
    any other (written past ToolServer.clean(), or its grant taken away since) fails closed, before anything is
    sent, with credential_not_granted. Every request to the server asks here first."""
    if not server.credential:
        return None
    try:
        return credentials.value(name=server.credential, tenant_slug=server.tenant.slug, url=server.url)
    except credentials.CredentialNotGranted as refused:
        raise CredentialNotGranted(f"tool server {server.name!r}: {refused} Nothing was sent.") from None
    except credentials.CredentialUnavailable as missing:
        raise CredentialMissing(f"tool server {server.name!r} needs the credential {server.credential!r}: "
                                f"{missing}") from None


def tools_refresh(server: ToolServer, *, where: outbound.Policy | None = None) -> ServerTools:
    """Read the server's tool list now and keep it (with its digest as the version) on the row. Through the outbound
    connector (``where``: the tenant's policy, read now unless given): every connection's address is checked where
    it is opened — a refused one is ToolDenied, nothing sent, nothing kept.

    Not reached, the message says only that (the admin's "Call a tool" page shows it): whether the port was closed,
    filtered or open to something else is the log's (``detail``), or the page would map a network for its reader."""
    try:
        described = mcp_client.run(mcp_client.describe(server.url, token=credential_value(server),
                                                       timeout=min(server.timeout_seconds, 30),
                                                       mode=server.protocol,
                                                       policy=where or outbound.policy_for_tenant(server.tenant_id)))
    except mcp_client.HostRefused as refused:
        raise ToolDenied(f"tool server {server.name!r} was not read: {refused.detail}",
                         events=[denied_event(f"{server.name}.*", rule=f"allowed_hosts: {refused.detail}")]) from None
    except mcp_client.ServerUnusable as unusable:  # (it answered: saying why maps no network, unlike not reached)
        raise ToolUnavailable(f"tool server {server.name!r} is unusable: {unusable.detail}", transient=False,
                              detail=unusable.detail) from None
    except mcp_client.ToolCallError as failed:
        logger.warning("tool server %s could not be read: %s", server.name, failed.detail)
        raise ToolUnavailable(f"tool server {server.name!r} could not be reached",
                              transient=getattr(failed, "transient", True), detail=failed.detail) from None
    ToolServer.objects.filter(id=server.id).update(
        tools=described.tools, tools_version=described.version, protocol_version=described.protocol_version,
        tools_read_at=Now(), updated_at=F("updated_at"))
    server.tools, server.tools_version = described.tools, described.version
    server.protocol_version = described.protocol_version
    return ServerTools(server)


class ServerTools:
    def __init__(self, server: ToolServer):
        self.server = server
        self.by_name = {tool["name"]: tool for tool in server.tools or []}

    def get(self, name: str) -> dict | None:
        return self.by_name.get(name)


def tool_spec(server: ToolServer, name: str) -> dict:
    """The tool as the server lists it now (read again when missing or stale, by the database's clock)."""
    fresh = server.tools is not None and bool(getattr(server, "tools_fresh", False))
    spec = ServerTools(server).get(name) if fresh else None
    if spec is None:
        try:
            spec = tools_refresh(server).get(name)
        except ToolUnavailable:
            # Not reached: the list it had (older than TOOLS_FRESH_SECONDS, but the server's own) still says what the
            # tool takes; the call itself then meets the unreachable server and waits for it (unreachable_wait).
            spec = ServerTools(server).get(name)
            if spec is None:
                raise
    if spec is None:
        raise ToolUnknown(f"tool server {server.name!r} has no tool {name!r}")
    return spec


def _seconds(seconds: float) -> timedelta:
    return timedelta(seconds=seconds)


# -- 3. the arguments -----------------------------------------------------------------------------------------------
def arguments_errors(spec: dict, arguments: Any) -> list[dict[str, str]]:
    """The arguments against the tool's inputSchema, every error with where it is."""
    if not isinstance(arguments, dict):
        return [{"field": "arguments", "message": "Must be an object."}]
    try:
        validator = Draft202012Validator(spec.get("inputSchema") or {"type": "object"})
    except SchemaError as bad:
        return [{"field": "inputSchema", "message": f"The server's schema for this tool is invalid: {bad.message}"}]
    return [{"field": "arguments" + "".join(f"[{part!r}]" if isinstance(part, str) else f"[{part}]"
                                            for part in error.absolute_path),
             "message": error.message[:300]} for error in validator.iter_errors(arguments)][:20]


# -- 4, 5. the call -------------------------------------------------------------------------------------------------
def tool_recovery(spec: dict, server: ToolServer) -> str | None:
    """How an unknown outcome of a call of this tool is decided (checkpoints_app.models.Recovery), by the tool's own
    declaration and its server's: read-only → REPEAT; idempotent, or a server that honours the Idempotency-Key
    (ToolServer.honours_idempotency_key) → REPEAT_WITH_KEY — called again with the same key, which is also how the
    status of a downstream task the lost answer would have named is asked (a server honouring the key answers with
    the task it made for it); None — the caller's reconcile hook, the workflow's, else a person (ctx.effect decides).
    MCP's defaults are neither read-only nor idempotent."""
    annotations = spec.get("annotations") or {}
    if annotations.get("readOnlyHint") is True:
        return Recovery.REPEAT.value
    if annotations.get("idempotentHint") is True or server.honours_idempotency_key:
        return Recovery.REPEAT_WITH_KEY.value
    return None


def endpoint(server: ToolServer, where: HostVerdict) -> tuple[str, str | None]:
    """Where to connect, and a Host header to send (none: the URL's own). The server's URL as it is: the outbound
    connector (agents_app.outbound) resolves its name once where the socket is opened, checks that address and dials
    it, so the Host header and the TLS name stay the name's, for http and https alike (docs/tool-policy.md)."""
    return server.url, None


def runs_as_task(spec: dict) -> bool:
    """A tool that can run as a task (2025-11-25 `execution.taskSupport` optional or required) is called as one: it
    is then waited for without a worker, whatever it takes."""
    return ((spec.get("execution") or {}).get("taskSupport") or "forbidden") in ("optional", "required")


def _call(server: ToolServer, tool: str, arguments: dict, key: str, where: HostVerdict, *,
          as_task: bool = False) -> dict:
    token = credential_value(server)
    url, host = endpoint(server, where)
    mode = known_era(server)
    checked = outbound.policy_for_tenant(server.tenant_id)
    for attempt in range(1, NOT_SENT_TRIES + 1):
        try:
            with limits.server_slot(server):
                return mcp_client.run(mcp_client.call(url, tool, arguments, token=token, key=key,
                                                      timeout=server.timeout_seconds, host=host, as_task=as_task,
                                                      mode=mode, policy=checked))
        except mcp_client.HostRefused as refused:  # (resolved again at the connection, to a refused address)
            name = policy.tool_name(server.name, tool)
            raise ToolDenied(f"The tool {name} was not called: {refused.detail}",
                             events=[denied_event(name, rule=f"allowed_hosts: {refused.detail}")]) from None
        except (mcp_client.NotSent, limits.ToolBusy) as failed:
            if isinstance(failed, mcp_client.NotSent) and mode != server.protocol:
                mode = server.protocol  # the era it spoke may be what it refused (nothing ran): negotiate again
                continue
            detail = failed.detail if isinstance(failed, mcp_client.NotSent) else str(failed)
            transient = getattr(failed, "transient", True)
            if attempt == NOT_SENT_TRIES or not transient:
                raise ToolUnavailable(f"tool server {server.name!r} was not reached ({detail}); nothing was "
                                      f"sent", transient=transient) from None
            wait = getattr(failed, "retry_after", 0) or NOT_SENT_BACKOFF_SECONDS * 2 ** (attempt - 1)
            time.sleep(min(wait, NOT_SENT_BACKOFF_SECONDS * 2 ** attempt))
        except mcp_client.OutcomeUnknown as unknown:
            # The ledger records the call as unknown (ToolTimeout is what ctx.effect treats so): the step runs
            # again, and the unknown outcome is decided then — never by calling again here.
            raise ToolTimeout(f"{server.name}.{tool}: {unknown.detail}; whether it ran is not known",
                              why=unknown.why) from None
        except mcp_client.Refused as refused:
            if mode != server.protocol and refused.code == mcp_client.UNSUPPORTED_PROTOCOL_VERSION:
                mode = server.protocol  # the era it had is what it refused (nothing ran): negotiate again
                continue
            raise ToolRefused(f"{server.name}.{tool}: {refused.detail}") from None
    raise AssertionError("unreachable")


def unreachable_backoff(tries: int) -> float:
    """Seconds to wait after the ``tries``-th try that did not reach the server: 1, 2, 4, 8, 16, then 30."""
    return float(min(UNREACHABLE_BACKOFF_MAX_SECONDS, 2 ** max(tries - 1, 0)))


def unreachable_wait(ctx: StepContext, row: ToolServer, name: str, key: str,
                     unreachable: ToolUnavailable) -> BaseException:
    """A call whose server was not reached (nothing sent; its ledger row `failed`): wait for the server without a
    worker — the step runs again after a backoff and calls again with the same key — while the waits so far stay
    within tools.unreachable_wait_seconds; past it, the ToolUnavailable itself (the step's retry policy, then the
    task fails). The waits so far are counted from the ledger row's tries (each re-run's call is one more), not from
    a clock: no worker's clock is trusted, and a re-run sooner than its backoff only spends the budget sooner."""
    if not unreachable.transient:
        return unreachable  # (a credential or a URL to mend: the step's retries, then the task fails, saying so)
    tries = SideEffect.objects.filter(task_id=ctx.task_id, step_seq=ctx.step_seq, key=key) \
        .values_list("attempts", flat=True).first() or 1
    budget = settings.RUNTIME.tools.unreachable_wait_seconds
    waited = 0.0
    for n in range(1, tries):  # the waits after the tries before this one, the last of them cut to the budget
        waited += max(min(unreachable_backoff(n), budget - waited), 0)
    if waited >= budget:
        if waited:
            unreachable.args = (f"{unreachable}; waited about {waited:g} s for it in {tries} tries "
                                f"(tools.unreachable_wait_seconds: {budget:g})",)
        return unreachable
    seconds = min(unreachable_backoff(tries), budget - waited)
    return waits.ExternalWait(seconds, f"Waiting for {row.name} to answer: {unreachable} (try {tries}); "
                                       f"calling {name} again in {seconds:g} s")


def known_era(server: ToolServer) -> str:
    """The era to speak: the server's pin, or — when it negotiates — the 2026-07-28 version it negotiated when its
    tools were last read, which spares each call a server/discover round trip (a server that no longer speaks it
    refuses the call or does not take it — nothing ran either way — and the call is made again after negotiating)."""
    if server.protocol == ToolServer.Protocol.AUTO and server.protocol_version in mcp_client.MODERN_PROTOCOL_VERSIONS:
        return server.protocol_version
    return server.protocol


def recorded_result(ctx: StepContext, effect_name: str) -> tuple[bool, Any]:
    """A call this step already made and the ledger holds the result of (a re-run after a crash or a retry): it is
    not a call, so the policy of now does not stand between the step and the result it already has."""
    row = SideEffect.objects.filter(task_id=ctx.task_id, step_seq=ctx.step_seq,
                                    key=effect_key(ctx.task_id, ctx.step_seq, effect_name),
                                    status=EffectStatus.SUCCEEDED).values("result").first()
    return (row is not None), (row or {}).get("result")


def tool_calls_made(task_id) -> int:
    """The task's tool calls so far (ledger rows of `server.tool:n` effects), for max_calls_per_task — counted up to
    the deployment's limit only (every other layer's is lower), so the count costs at most that many rows however
    long the task runs."""
    limit = settings.RUNTIME.tools.max_calls_per_task
    return SideEffect.objects.filter(task_id=task_id,
                                     name__regex=r"^[a-z0-9][a-z0-9_-]*\.[^:]+:[0-9]+$")[:limit].count()


def tools_offered(ctx: StepContext, servers: list[str] | None) -> list[tuple[ToolServer, dict]]:
    """The tools a model may be shown for this task now: those of the named servers of its tenant (None: all of
    them), as each server lists them (read again when stale), minus what the policy denies outright (the server's
    enabled_tools, deny and allow lists of every layer) — a tool behind an approval is shown: the call then waits.
    Showing is not allowing: every call is decided again when it is made (tool_call). A server that cannot be read
    and has no list yet is left out, not fatal: the model works with the others."""
    facts = task_facts(ctx)
    rows = ToolServer.objects.filter(tenant_id=facts["tenant_id"]).annotate(
        tools_fresh=Q(tools_read_at__gte=Now() - _seconds(TOOLS_FRESH_SECONDS))).order_by("name")
    if servers is not None:
        rows = rows.filter(name__in=servers)
    tenant_policy = selectors.tenant_tool_policy_get(tenant_id=facts["tenant_id"])
    offered = []
    where = outbound.tenant_policy(tenant_policy)
    for row in rows:
        # A server whose host the policy refuses now offers nothing, whatever list its row kept: no tool of it could
        # be called, and the list may be what a refused address said (read before the connector checked it).
        verdict = host_check_for_tenant(row.url, config_policy=settings.RUNTIME.tools, tenant_policy=tenant_policy)
        if not verdict.allowed:
            logger.info("tool server %s is not offered: its host is refused: %s", row.name, verdict.reason)
            continue
        listed = row.tools if row.tools is not None and row.tools_fresh else None
        if listed is None:
            try:
                listed = tools_refresh(row, where=where).server.tools
            except ToolDenied:
                continue  # (its name resolved to a refused address at the connection: nothing was read)
            except ToolUnavailable:
                listed = row.tools or []  # (stale or none: the call meets the server when it is made)
        for spec in listed or []:
            decision = policy.tool_decision(server=row.name, tool=spec["name"], config_policy=settings.RUNTIME.tools,
                                            tenant_policy=tenant_policy, task_policy=facts.get("tool_policy"),
                                            calls_made=0, enabled_tools=row.enabled_tools)
            if decision.verdict != policy.Verdict.DENY:
                offered.append((row, spec))
    return offered


def model_host_check(ctx: StepContext, url: str) -> None:
    """A tenant's own model endpoint goes where its tool servers may go (tools.allowed_hosts, narrowed by the tenant):
    checked before each request, like a tool server's; refused → ModelRefused (the step fails, saying why). The
    deployment's own endpoint (config/runtime.yaml) is the operator's and is not checked."""
    from agents_app.llm import ModelRefused  # (llm imports nothing of the gateway; the gateway only needs this)

    facts = task_facts(ctx)
    tenant_policy = selectors.tenant_tool_policy_get(tenant_id=facts["tenant_id"])
    where = host_check_for_tenant(url, config_policy=settings.RUNTIME.tools, tenant_policy=tenant_policy)
    if not where.allowed:
        raise ModelRefused(f"the tenant's model endpoint is not called: its host is refused: {where.reason} "
                           f"(tools.allowed_hosts)")


def decide(ctx: StepContext, facts: dict, row: ToolServer, tool: str) -> tuple[policy.ToolDecision, HostVerdict]:
    """The policy and the host, at the moment of the call (the tenant's policy read now: a change applies to the
    next call). Denied: ToolDenied, with its tool.denied event, before anything is sent."""
    tenant_policy = selectors.tenant_tool_policy_get(tenant_id=facts["tenant_id"])
    config_policy = settings.RUNTIME.tools
    decision = policy.tool_decision(server=row.name, tool=tool, config_policy=config_policy,
                                    tenant_policy=tenant_policy, task_policy=facts.get("tool_policy"),
                                    calls_made=tool_calls_made(ctx.task_id), enabled_tools=row.enabled_tools)
    name = policy.tool_name(row.name, tool)
    if decision.verdict == policy.Verdict.DENY:
        metrics.policy_denied(server=row.name, rule=decision.rule)
        raise ToolDenied(decision.error()["message"], events=[denied_event(name, rule=decision.rule)])
    where = host_check_for_tenant(row.url, config_policy=config_policy, tenant_policy=tenant_policy)
    if not where.allowed:
        metrics.policy_denied(server=row.name, rule="allowed_hosts")
        raise ToolDenied(f"The tool {name} was not called: its server's host is refused: {where.reason}",
                         events=[denied_event(name, rule=f"allowed_hosts: {where.reason}")])
    return decision, where


def tool_call(ctx: StepContext, *, server: str, tool: str, arguments: dict, number: int, reconcile=None,
              approval: bool = False) -> dict:
    facts = task_facts(ctx)
    row = server_get(tenant_id=facts["tenant_id"], name=server)
    name = policy.tool_name(server, tool)
    effect_name = f"{name}:{number}"
    done, _ = recorded_result(ctx, effect_name)
    if done:
        result = loaded(ctx.effect(effect_name, _never_called, arguments=None))  # the ledger's, as a re-run gets it
        handle = mcp_client.downstream_task(result)
        key = effect_key(ctx.task_id, ctx.step_seq, effect_name)
        # The attempt that made the call did not commit (a crash, an approval gate, a wait for a downstream task):
        # its events went with it. Only a committing attempt's events are written, so the call is told here — once
        # in the chain, marked as taken from the ledger.
        ctx.events.append(("tool.call", {"tool": name, "key": key, "arguments": _bounded(redact_json(arguments)),
                                         "recorded": True}))
        ctx.events.append(("tool.result", {"tool": name, "key": key, "ms": None, "recorded": True,
                                           "outcome": "task created" if handle else
                                           "tool error" if result.get("isError") else "ok"}))
        if handle is None:
            return screened(ctx, name, key, result)
        # A downstream task this call created: asking how it stands is not a call (no policy decision), but it is a
        # connection, so the host is checked again.
        tenant_policy = selectors.tenant_tool_policy_get(tenant_id=facts["tenant_id"])
        where = host_check_for_tenant(row.url, config_policy=settings.RUNTIME.tools, tenant_policy=tenant_policy)
        if not where.allowed:
            raise ToolDenied(f"The downstream task of {name} cannot be asked about: its server's host is refused: "
                             f"{where.reason}", events=[denied_event(name, rule=f"allowed_hosts: {where.reason}")])
        return screened(ctx, name, key, downstream_result(ctx, row, name, handle, where, effect_name=effect_name))
    decision, where = decide(ctx, facts, row, tool)
    spec = tool_spec(row, tool)
    errors = arguments_errors(spec, arguments)
    if errors:
        raise ToolArgumentsInvalid(f"the arguments of {name} do not match its inputSchema: "
                                   + "; ".join(f"{e['field']}: {e['message']}" for e in errors), errors)
    shown = redact_json(arguments)
    made: dict[str, Any] = {}

    def call(key: str) -> dict:
        made["key"], began = key, time.monotonic()
        outcome = "error"  # (not reached, timed out, refused: the ledger and the step decide what follows)
        try:
            answer = _call(row, tool, arguments, key, where, as_task=runs_as_task(spec))
            outcome = "task_created" if mcp_client.downstream_task(answer) else \
                "tool_error" if answer.get("isError") else "ok"
            return stored_if_large(ctx, effect_name, answer)
        finally:
            made["ms"] = round((time.monotonic() - began) * 1000)
            metrics.tool_called(server=row.name, tool=tool, outcome=outcome)

    try:
        timeout = row.timeout_seconds * NOT_SENT_TRIES + TIMEOUT_GRACE_SECONDS
        result = ctx.effect(effect_name, call, reconcile=reconcile, timeout=timeout,
                            approval=approval or decision.verdict == policy.Verdict.APPROVAL,
                            arguments={"server": server, "tool": tool, "arguments": shown}, ask=True,
                            # How an unknown outcome of this call is decided, recorded on its ledger row now, from
                            # the tool list and the server row this call was checked against (issue 38): never a
                            # re-read of the server's list, never parsed back out of the effect's name.
                            recovery=tool_recovery(spec, row),
                            about={"server": server, "tool": tool, "annotations": spec.get("annotations") or {},
                                   "timeoutSeconds": timeout})
    except ToolUnavailable as unreachable:  # (the ledger has it `failed`: nothing was sent)
        raise unreachable_wait(ctx, row, name, effect_key(ctx.task_id, ctx.step_seq, effect_name),
                               unreachable) from None
    result = loaded(result)
    if result is None:  # a person answered "applied" without giving its result (the question's result is optional)
        result = {"content": [{"type": "text", "text": f"{name} happened, a person said; they gave no result"}],
                  "isError": False}
    handle = mcp_client.downstream_task(result)
    key = effect_key(ctx.task_id, ctx.step_seq, effect_name)
    outcome = "task created" if handle else "tool error" if result.get("isError") else "ok"
    if made:  # called now (not a result the ledger already held): the call and its outcome, in the hash chain
        ctx.events.append(("tool.call", {"tool": name, "key": made["key"], "arguments": _bounded(shown)}))
        ctx.events.append(("tool.result", {"tool": name, "key": made["key"], "ms": made["ms"], "outcome": outcome}))
    else:  # an earlier attempt made it and a person or the reconcile hook said it landed: told once, as above
        ctx.events.append(("tool.call", {"tool": name, "key": key, "arguments": _bounded(shown), "recorded": True}))
        ctx.events.append(("tool.result", {"tool": name, "key": key, "ms": None, "outcome": outcome,
                                           "recorded": True}))
    if handle:
        return screened(ctx, name, key, downstream_result(ctx, row, name, handle, where, effect_name=effect_name))
    return screened(ctx, name, key, result)


def downstream_result(ctx: StepContext, row: ToolServer, name: str, handle: dict, where: HostVerdict, *,
                      effect_name: str) -> dict:
    """The server answered the call with a task (MCP Tasks): its id is in the ledger (the call's recorded result), so
    it is never created again. Ask how it stands: finished → its result is the call's; still running → the step
    waits without a worker (ExternalWait) and asks again after the server's pollInterval."""
    url, host = endpoint(row, where)
    interval = max((handle.get("pollIntervalMs") or 2000) / 1000, 1.0)
    key = effect_key(ctx.task_id, ctx.step_seq, effect_name)
    # (an index row, not the truth: the ledger holds the handle; this lets the reaper cancel it if our task ends)
    DownstreamTask.objects.get_or_create(task_id=ctx.task_id, effect_key=key,
                                         defaults={"server": row, "downstream_id": handle["taskId"]})
    try:
        task = mcp_client.run(mcp_client.task_get(url, handle["taskId"], token=credential_value(row),
                                                  timeout=min(row.timeout_seconds, 30), host=host,
                                                  mode=row.protocol, policy=outbound.policy_for_tenant(row.tenant_id)))
    except mcp_client.ToolCallError as failed:  # asking is always safe to repeat: ask again later
        raise waits.ExternalWait(interval, f"Waiting for {name} (downstream task {handle['taskId']}): "
                                     f"{failed.detail}; asking again") from None
    status = task.get("status")
    if status in ("completed", "failed", "cancelled"):
        DownstreamTask.objects.filter(task_id=ctx.task_id, effect_key=key).update(
            state=DownstreamTask.State.FINISHED, updated_at=Now())
    if status == "completed" and task.get("result") is not None:
        return task["result"]
    if status in ("failed", "cancelled"):
        error = task.get("error") or {}
        text = f"The downstream task {handle['taskId']} on {row.name} {status}"
        if error.get("message"):
            text += f": {error['message']}"
        return {"content": [{"type": "text", "text": text}], "isError": True,
                "_meta": {mcp_client.DOWNSTREAM_TASK_META: {**handle, "status": status}}}
    interval = max((task.get("pollIntervalMs") or handle.get("pollIntervalMs") or 2000) / 1000, 1.0)
    if status == "input_required" and task.get("inputRequests"):
        relay_question(ctx, row, name, handle["taskId"], task["inputRequests"], url=url, host=host)
    if status == "input_required" and handle.get("era") == mcp_client.LEGACY_VERSION:
        finished = relay_legacy_question(ctx, row, name, handle["taskId"], key, url=url, host=host)
        if finished is not None:
            DownstreamTask.objects.filter(task_id=ctx.task_id, effect_key=key).update(
                state=DownstreamTask.State.FINISHED, updated_at=Now())
            return finished
    shown = f" ({task['statusMessage']})" if task.get("statusMessage") else ""
    raise waits.ExternalWait(interval, f"Waiting for {name}: downstream task {handle['taskId']} is {status}{shown}")


def relay_question(ctx: StepContext, row: ToolServer, name: str, downstream_id: str, requests: dict, *, url: str,
                   host: str | None) -> None:
    """A downstream task asks for input: the first question it asks becomes our task's input wait (the operator sees
    it in the console, REST and our own MCP inputRequests); once answered, the answer goes to the downstream task
    (tasks/update) and the step waits for it again. Only form elicitations can be relayed; anything else (sampling,
    roots, a URL elicitation) leaves the task waiting, its status message saying so."""
    key = sorted(requests)[0]
    request = requests[key] or {}
    params = request.get("params") or {}
    if request.get("method", "elicitation/create") != "elicitation/create" or "requestedSchema" not in params:
        raise waits.ExternalWait(5, f"Waiting for {name}: downstream task {downstream_id} asks for "
                              f"{request.get('method', 'input')}, which cannot be relayed to a person here")
    wait = waits.downstream_question_wait(task_id=ctx.task_id, step_seq=ctx.step_seq, plan_version=ctx.plan_version,
                                          tool=name, downstream_task=downstream_id, request_key=key,
                                          message=str(params.get("message", "")), schema=params["requestedSchema"])
    answer = ctx.answer_for(wait["waitId"])
    if answer is None:
        raise waits.QuestionRequired(wait)  # our task waits for a person (input_required)
    try:
        mcp_client.run(mcp_client.task_update(url, downstream_id, {key: {"action": "accept",
                                                                         "content": answer.get("value")}},
                                              token=credential_value(row), timeout=min(row.timeout_seconds, 30),
                                              host=host, mode=row.protocol,
                                              policy=outbound.policy_for_tenant(row.tenant_id)))
    except mcp_client.ToolCallError as failed:  # refused (already answered?) or not reached: ask again soon
        raise waits.ExternalWait(2, f"Waiting for {name}: the answer to downstream task {downstream_id} was not taken "
                              f"({failed.detail}); asking again") from None
    raise waits.ExternalWait(1, f"Waiting for {name}: answered downstream task {downstream_id}'s question")


def relay_legacy_question(ctx: StepContext, row: ToolServer, name: str, downstream_id: str, key: str, *, url: str,
                          host: str | None) -> dict | None:
    """A 2025-11-25 downstream task waiting for input asks its question only on a tasks/result stream: take it from
    there (mcp_client.legacy_question) and keep it on the DownstreamTask row; it becomes our task's input wait like a
    2026 one. Once a person answered, the answer goes back as the JSON-RPC response to that very request
    (mcp_client.legacy_answer), in the session it was asked in. A request the server no longer knows (expired, its
    session gone) is asked for again: the same question is the same wait (its key is the question's content and how
    many questions were answered before), so the person's answer is used, not asked for twice.
    Returns the downstream result when the task finished meanwhile (tasks/result answered it), else raises a wait."""
    row_of = DownstreamTask.objects.filter(task_id=ctx.task_id, effect_key=key)
    index = row_of.values("question", "questions_answered").first() or {"question": None, "questions_answered": 0}
    question = index["question"]
    timeout = min(row.timeout_seconds, 30)
    if question is None:
        try:
            got = mcp_client.run(mcp_client.legacy_question(url, downstream_id, token=credential_value(row),
                                                            timeout=timeout + mcp_client.QUESTION_WINDOW_SECONDS,
                                                            host=host,
                                                            policy=outbound.policy_for_tenant(row.tenant_id)))
        except mcp_client.ToolCallError as failed:  # asking is safe to repeat
            raise waits.ExternalWait(2, f"Waiting for {name}: downstream task {downstream_id} needs input; its "
                                        f"question could not be read ({failed.detail}); asking again") from None
        if "result" in got:
            return got["result"]
        if "error" in got:
            message = (got["error"] or {}).get("message") or "failed"
            return {"content": [{"type": "text", "text": f"The downstream task {downstream_id} on {row.name} failed: "
                                                         f"{message}"}], "isError": True}
        if "question" not in got:
            raise waits.ExternalWait(5, f"Waiting for {name}: downstream task {downstream_id} needs input but asked "
                                        f"nothing on tasks/result; asking again")
        question = got["question"]
        row_of.update(question=question, updated_at=Now())
    params = {k: v for k, v in (question.get("params") or {}).items() if k != "_meta"}
    if "requestedSchema" not in params:
        raise waits.ExternalWait(30, f"Waiting for {name}: downstream task {downstream_id} asks for input that cannot "
                                     f"be relayed to a person here ({params.get('mode', 'not a form')})")
    digest = hashlib.sha256(json.dumps(params, sort_keys=True).encode()).hexdigest()[:16]
    wait = waits.downstream_question_wait(task_id=ctx.task_id, step_seq=ctx.step_seq, plan_version=ctx.plan_version,
                                          tool=name, downstream_task=downstream_id,
                                          request_key=f"{digest}:{index['questions_answered']}",
                                          message=str(params.get("message", "")), schema=params["requestedSchema"])
    answer = ctx.answer_for(wait["waitId"])
    if answer is None:
        raise waits.QuestionRequired(wait)  # our task waits for a person (input_required)
    try:
        mcp_client.run(mcp_client.legacy_answer(url, question["id"], {"action": "accept",
                                                                     "content": answer.get("value")},
                                                session=question.get("session"), token=credential_value(row),
                                                timeout=timeout, host=host,
                                                policy=outbound.policy_for_tenant(row.tenant_id)))
    except mcp_client.NotSent as failed:
        raise waits.ExternalWait(2, f"Waiting for {name}: the answer to downstream task {downstream_id} could not be "
                                    f"sent ({failed.detail}); trying again") from None
    except mcp_client.ToolCallError as failed:
        # Not taken (the request is gone there) or not known: take the question again; it is the same wait, so the
        # answer already given is sent to it — never a person asked twice for one question.
        logger.warning("%s: downstream task %s did not take the answer to its question (%s); asking for it again",
                       name, downstream_id, failed.detail)
        row_of.update(question=None, updated_at=Now())
        raise waits.ExternalWait(1, f"Waiting for {name}: the answer to downstream task {downstream_id} was not taken "
                                    f"({failed.detail}); asking for its question again") from None
    row_of.update(question=None, questions_answered=F("questions_answered") + 1, updated_at=Now())
    raise waits.ExternalWait(1, f"Waiting for {name}: answered downstream task {downstream_id}'s question")


class ToolResultRejected(ToolError):
    """A person rejected a flagged tool result (tools.screening: hold): the step fails, it never saw the result."""

    reason = "tool_result_rejected"
    retryable = False


def screened(ctx: StepContext, name: str, key: str, result: dict) -> dict:
    """The result as the workflow (or model) may see it: screened for prompt injection (agents_app.screening), and
    per tools.screening passed as it is or redacted — both with a tool.flagged event — or held for a person. The
    same result screens the same way on a re-run, so a held result asks once and the answer decides it after."""
    screening = screen(result)
    if not screening.flagged:
        return result
    flagged = screening.as_event()
    rules = sorted({finding["rule"] for finding in flagged["findings"]})
    mode = settings.RUNTIME.tools.screening
    decision = "redact" if mode == "redact" else "pass"
    if mode == "hold":
        wait = waits.tool_result_review_wait(task_id=ctx.task_id, step_seq=ctx.step_seq,
                                             plan_version=ctx.plan_version, tool=name, effect_key=key,
                                             findings=flagged["findings"])
        answer = ctx.answer_for(wait["waitId"])
        if answer is None:
            raise waits.QuestionRequired(wait)
        decision = (answer.get("value") or {}).get("decision", "reject")
        if decision == "reject":
            raise ToolResultRejected(f"a person rejected the result of {name} after the injection screen flagged it "
                                     f"({', '.join(rules)})",
                                     events=[("tool.flagged", {"tool": name, "key": key, "rules": rules,
                                                               "action": "rejected by a person"})])
    action = {"pass": "passed", "redact": "redacted"}[decision] + (" by a person" if mode == "hold" else "")
    ctx.events.append(("tool.flagged", {"tool": name, "key": key, "rules": rules, "action": action,
                                        "findings": flagged["findings"][:20]}))
    return screening.cleaned if decision == "redact" else result


# A result larger than this is kept in storage (an artifact of the task) and the ledger holds its reference: a
# ledger row stays small whatever a tool answers, and the workflow still gets the whole result.
RESULT_INLINE_BYTES = 64 * 1024
RESULT_REF_META = "io.agentruntime/result-artifact"


def stored_if_large(ctx: StepContext, effect_name: str, result: dict) -> dict:
    text = json.dumps(result, ensure_ascii=False, separators=(",", ":"))
    if len(text.encode()) <= RESULT_INLINE_BYTES:
        return result
    name = "tool-" + effect_name.replace(":", "-") + ".json"
    ref = ctx.artifact(name, text)
    return {"content": [{"type": "text", "text": f"The result ({len(text.encode()):,} bytes) is the task's artifact "
                                                 f"{name}."}],
            "isError": bool(result.get("isError")),
            "_meta": {RESULT_REF_META: {"name": name, "ref": ref, "bytes": len(text.encode())}}}


def loaded(result: Any) -> Any:
    """A result kept by reference (stored_if_large), read back whole for the workflow."""
    ref = ((result or {}).get("_meta") or {}).get(RESULT_REF_META) if isinstance(result, dict) else None
    if not ref:
        return result
    with default_storage.open(ref["ref"]) as stored:
        return json.loads(stored.read().decode())


def _never_called(key: str) -> Any:
    raise AssertionError(f"{key} has a recorded result: the ledger returns it without a call")


def _bounded(value: Any, limit: int = 2000) -> Any:
    """Arguments as an event carries them: whole when small, else a note of their size."""
    text = json.dumps(value, ensure_ascii=False, default=str)
    return value if len(text) <= limit else {"omitted": f"{len(text)} characters, too large for an event"}


def denied_event(name: str, *, rule: str) -> tuple[str, dict]:
    return "tool.denied", {"tool": name, "rule": rule}


# -- the reaper's sweep: downstream tasks nobody waits for any more -----------------------------------------------
RELEASE_BATCH = 20
ENDED_STATUSES = ("cancelled", "failed", "dead_lettered")


def downstream_tasks_release() -> int:
    """Cancel downstream the tasks our ended tasks (cancelled, failed, dead-lettered) no longer wait for; run by the
    reaper (registered in agents_app.apps). Each is asked once: state cancel_sent whatever the answer (a task that
    had finished meanwhile refuses the cancel, which is fine). Slow I/O with no lock or transaction held."""
    open_rows = list(DownstreamTask.objects.filter(state=DownstreamTask.State.OPEN, task__status__in=ENDED_STATUSES)
                     .select_related("server")[:RELEASE_BATCH])
    for row in open_rows:
        server = row.server
        tenant_policy = server and selectors.tenant_tool_policy_get(tenant_id=server.tenant_id)
        where = server and host_check_for_tenant(server.url, config_policy=settings.RUNTIME.tools,
                                                 tenant_policy=tenant_policy)
        if server is not None and where.allowed:  # (a host refused now is not connected to, even to cancel)
            try:
                mcp_client.run(mcp_client.task_cancel(server.url, row.downstream_id, token=credential_value(server),
                                                      timeout=min(server.timeout_seconds, 10), mode=server.protocol,
                                                      policy=outbound.tenant_policy(tenant_policy)))
            except (mcp_client.ToolCallError, ToolError) as failed:
                detail = getattr(failed, "detail", str(failed))
                logger.info("downstream task %s on %s: cancel not taken (%s)", row.downstream_id, server.name,
                            detail)
        DownstreamTask.objects.filter(id=row.id, state=DownstreamTask.State.OPEN).update(
            state=DownstreamTask.State.CANCEL_SENT, updated_at=Now())
    return len(open_rows)
