"""The tenant's tool servers and their tools, as a call checks against them: the server by name (task_facts,
server_get), how it is reached (endpoint, credential_value, known_era), its tool list read and kept (tools_refresh,
tool_spec, TOOLS_FRESH_SECONDS), what a tool declares (arguments_errors against its inputSchema, tool_recovery from its
annotations, runs_as_task), the ledger's record of calls made (recorded_result, tool_calls_made), and the tools a model
is offered (tools_offered)."""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.db.models import F, Q
from django.db.models.functions import Now
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from agents_app import credentials, outbound, policy, selectors
from agents_app.gateway.errors import (CredentialMissing, CredentialNotGranted, ToolDenied, ToolUnavailable,
                                       ToolUnknown, denied_event)
from agents_app.hosts import HostVerdict, host_check_for_tenant
from agents_app.models import ToolServer
from checkpoints_app.models import EffectStatus, Recovery, SideEffect
from config.base.lazy_imports import lazy_module
from tasks_app.engine.effects import effect_key
from tasks_app.models import Task

if TYPE_CHECKING:
    from tasks_app.engine.context import StepContext

# The MCP SDK, loaded by the first read of a server's tool list (config/base/lazy_imports.py: a worker that never
# calls a tool does not pay its import).
mcp_client = lazy_module("agents_app.mcp_client")
logger = logging.getLogger(__name__)

TOOLS_FRESH_SECONDS = 300  # a tool list older than this is read again before a call checks against it


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


def endpoint(server: ToolServer, where: HostVerdict) -> tuple[str, str | None]:
    """Where to connect, and a Host header to send (none: the URL's own). The server's URL as it is: the outbound
    connector (agents_app.outbound) resolves its name once where the socket is opened, checks that address and dials
    it, so the Host header and the TLS name stay the name's, for http and https alike (docs/tool-policy.md)."""
    return server.url, None


def known_era(server: ToolServer) -> str:
    """The era to speak: the server's pin, or — when it negotiates — the 2026-07-28 version it negotiated when its
    tools were last read, which spares each call a server/discover round trip (a server that no longer speaks it
    refuses the call or does not take it — nothing ran either way — and the call is made again after negotiating)."""
    if server.protocol == ToolServer.Protocol.AUTO and server.protocol_version in mcp_client.MODERN_PROTOCOL_VERSIONS:
        return server.protocol_version
    return server.protocol


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


# -- what a tool declares, and the calls the ledger holds -----------------------------------------------------------
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


def runs_as_task(spec: dict) -> bool:
    """A tool that can run as a task (2025-11-25 `execution.taskSupport` optional or required) is called as one: it
    is then waited for without a worker, whatever it takes."""
    return ((spec.get("execution") or {}).get("taskSupport") or "forbidden") in ("optional", "required")


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


# -- the tools a model is offered -----------------------------------------------------------------------------------
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
