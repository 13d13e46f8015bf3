"""The call itself: tool_call, in the order the package's docstring gives — the policy and the host decided at its
moment (decide), the call made as an effect of the ledger and tried again here while nothing was sent (_call,
NOT_SENT_TRIES), a server not reached waited for without a worker (unreachable_wait), the result handed on to be
screened. And a tenant's own model endpoint's host, checked as a tool server's is (model_host_check)."""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

from django.conf import settings

from agents_app import limits, outbound, policy, selectors
from agents_app.gateway.catalogue import (arguments_errors, credential_value, endpoint, known_era, recorded_result,
                                          runs_as_task, server_get, task_facts, tool_calls_made, tool_recovery,
                                          tool_spec)
from agents_app.gateway.downstream import downstream_result
from agents_app.gateway.errors import ToolArgumentsInvalid, ToolDenied, ToolRefused, ToolUnavailable, denied_event
from agents_app.gateway.results import loaded, screened, stored_if_large
from agents_app.hosts import HostVerdict, host_check_for_tenant
from agents_app.models import ToolServer
from checkpoints_app.models import SideEffect
from config.base.lazy_imports import lazy_module
from tasks_app.engine import waits
from tasks_app.engine.effects import effect_key
from tasks_app.observability import metrics
from tasks_app.redaction import redact_json
from tasks_app.registry import ToolTimeout

if TYPE_CHECKING:
    from tasks_app.engine.context import StepContext

# The MCP SDK, loaded by the first call of a downstream tool (config/base/lazy_imports.py: a worker that never calls one
# does not pay its import).
mcp_client = lazy_module("agents_app.mcp_client")

NOT_SENT_TRIES = 3  # a request that never reached the server: tried this often within one attempt
NOT_SENT_BACKOFF_SECONDS = 0.5  # then 1 s, 2 s…
TIMEOUT_GRACE_SECONDS = 5  # the step's own guard, beyond the client's timeout
UNREACHABLE_BACKOFF_MAX_SECONDS = 30  # a server not reached is tried after 1 s, 2 s, 4 s … then every 30 s


# -- 2. the policy and the host, at the moment of the call ----------------------------------------------------------
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


# -- 4, 5. the call -------------------------------------------------------------------------------------------------
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


def _never_called(key: str) -> Any:
    raise AssertionError(f"{key} has a recorded result: the ledger returns it without a call")


def _bounded(value: Any, limit: int = 2000) -> Any:
    """Arguments as an event carries them: whole when small, else a note of their size."""
    text = json.dumps(value, ensure_ascii=False, default=str)
    return value if len(text) <= limit else {"omitted": f"{len(text)} characters, too large for an event"}
