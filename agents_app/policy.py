"""The policy gateway's decision: may this task call this tool now? (docs/tool-policy.md, docs/architecture.md §11)

One pure function, `tool_decision`, for every caller (ctx.tool, the agent loop, mcp_tool), evaluated right before
each call and never at plan time: the caller reads the tenant's policy afresh for every call
(selectors.tenant_tool_policy_get), so a policy changed while a task runs applies to its next call. It reads no row
and opens no connection; hosts (agents_app.hosts) and per-server limits (agents_app.limits) are checked after it.

Three layers, each only narrowing the one before: the deployment (config/runtime.yaml `tools`), the tenant
(TenantToolPolicy, in admin) and the task (its toolPolicy, given at create). The order of the rules:

1. a tool server's enabled_tools, if the caller passes them: a tool not enabled is denied;
2. deny lists, deployment → tenant → task: the first matching pattern denies;
3. allow lists: every layer that has one must match, or the first that does not denies;
4. max calls per task: the smallest of the layers' limits; reached → denied;
5. require_approval: any layer's matching pattern makes the call wait for a person (unless approved already);
6. otherwise allowed.

A layer can add denials, drop allowed tools, add approvals and lower the limit; nothing in a later layer removes
what an earlier one decided, so a task's toolPolicy cannot widen its tenant's, nor a tenant the deployment's.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase

from config.base.runtime import ToolsPolicy
from tasks_app.models import task_tool_policy_errors

__all__ = ["ToolDecision", "Verdict", "task_tool_policy_errors", "tool_decision", "tool_name"]

# The error type of a step a denied call fails (its task's error.type, its event's data.type).
TOOL_DENIED = "tool_denied"


class Verdict(enum.StrEnum):
    ALLOW = "allow"
    DENY = "deny"
    APPROVAL = "approval"  # wait for a person's approval, then call


@dataclass(frozen=True)
class ToolDecision:
    """What the gateway decided about one call and which rule decided it (`rule`, in words a person can find in
    the configuration, admin or the task's toolPolicy: "tools.deny 'shell.*' (deployment)")."""

    verdict: Verdict
    tool: str  # the policy name, "server.tool"
    rule: str

    @property
    def allowed(self) -> bool:
        return self.verdict == Verdict.ALLOW

    def error(self) -> dict:
        """A denied call's typed failure, for the step's error and its event: {type: tool_denied, tool, rule,
        message}."""
        return {"type": TOOL_DENIED, "tool": self.tool, "rule": self.rule,
                "message": f"The tool {self.tool} was not called: denied by {self.rule}."}


def tool_name(server: str, tool: str) -> str:
    """A tool's name in the policy: the server's name (no dots: agents_app.models.SERVER_NAME), a dot, the tool's."""
    return f"{server}.{tool}"


@dataclass(frozen=True)
class _Layer:
    """One layer's lists, with the words its rules are named by."""

    deny: Sequence[str]
    allow: Sequence[str] | None
    require_approval: Sequence[str]
    max_calls: int | None
    deny_label: str  # "{pattern}" is filled in
    allow_label: str
    approval_label: str
    max_calls_label: str  # "{n}" is filled in


def _layers(config_policy: ToolsPolicy, tenant_policy, task_policy: dict | None) -> list[_Layer]:
    layers = [_Layer(
        deny=config_policy.deny, allow=config_policy.allow, require_approval=config_policy.require_approval,
        max_calls=config_policy.max_calls_per_task,
        deny_label="tools.deny {pattern} (deployment)", allow_label="tools.allow (deployment)",
        approval_label="tools.require_approval {pattern} (deployment)",
        max_calls_label="tools.max_calls_per_task {n} (deployment)",
    )]
    if tenant_policy is not None:
        tenant = tenant_label(tenant_policy)
        layers.append(_Layer(
            deny=tenant_policy.deny or (), allow=tenant_policy.allow, require_approval=tenant_policy.require_approval
            or (), max_calls=tenant_policy.max_calls_per_task,
            deny_label=f"{tenant} deny {{pattern}}", allow_label=f"{tenant} allow list",
            approval_label=f"{tenant} require_approval {{pattern}}",
            max_calls_label=f"{tenant} max_calls_per_task {{n}}",
        ))
    if task_policy:
        layers.append(_Layer(
            deny=task_policy.get("deny") or (), allow=task_policy.get("allow"),
            require_approval=task_policy.get("requireApproval") or (), max_calls=task_policy.get("maxCalls"),
            deny_label="task toolPolicy.deny {pattern}", allow_label="task toolPolicy.allow",
            approval_label="task toolPolicy.requireApproval {pattern}", max_calls_label="task toolPolicy.maxCalls {n}",
        ))
    return layers


def tenant_label(tenant_policy) -> str:
    """How a rule names the tenant: by slug if the row came with its tenant (select_related); the decision never
    queries."""
    if type(tenant_policy).tenant.is_cached(tenant_policy):
        return f"tenant {tenant_policy.tenant.slug}"
    return f"tenant #{tenant_policy.tenant_id}"


def _first_match(name: str, patterns: Sequence[str]) -> str | None:
    # fnmatchcase: case-sensitive everywhere (fnmatch would fold case on some platforms); '*' also matches dots.
    return next((pattern for pattern in patterns if fnmatchcase(name, pattern)), None)


def tool_decision(*, server: str, tool: str, config_policy: ToolsPolicy, tenant_policy, task_policy: dict | None,
                  calls_made: int, enabled_tools: Sequence[str] | None = None, approved: bool = False) -> ToolDecision:
    """Decide one call of ``tool`` on ``server`` (module docstring: the rules and their order).

    ``config_policy``: settings.RUNTIME.tools. ``tenant_policy``: the tenant's TenantToolPolicy read for this call
    (None: it has none), with its tenant loaded so the rule can name it. ``task_policy``: the task's toolPolicy as
    created (task_tool_policy_errors has checked its shape). ``calls_made``: the task's tool calls so far, this one
    not counted. ``enabled_tools``: the server's enabled_tools (None or empty: all). ``approved``: a person approved
    this very call: a require_approval rule is then satisfied, but every deny rule still applies (a policy that
    changed while the call waited for approval still denies it)."""
    name = tool_name(server, tool)

    def decided(verdict: Verdict, rule: str) -> ToolDecision:
        return ToolDecision(verdict=verdict, tool=name, rule=rule)

    if enabled_tools and tool not in enabled_tools:
        return decided(Verdict.DENY, f"tool server {server} enabled_tools (it is not one of them)")
    layers = _layers(config_policy, tenant_policy, task_policy)
    for layer in layers:
        if (pattern := _first_match(name, layer.deny)) is not None:
            return decided(Verdict.DENY, layer.deny_label.format(pattern=repr(pattern)))
    for layer in layers:
        if layer.allow is not None and _first_match(name, layer.allow) is None:
            return decided(Verdict.DENY, f"{layer.allow_label} (no pattern matches)")
    limits = [layer for layer in layers if layer.max_calls is not None]
    smallest = min(limits, key=lambda layer: layer.max_calls)  # the deployment's is always set
    if calls_made >= smallest.max_calls:
        return decided(Verdict.DENY, smallest.max_calls_label.format(n=smallest.max_calls) +
                       f" (reached: {calls_made} calls made)")
    for layer in layers:
        if (pattern := _first_match(name, layer.require_approval)) is not None:
            rule = layer.approval_label.format(pattern=repr(pattern))
            return decided(Verdict.ALLOW, f"approved ({rule})") if approved else decided(Verdict.APPROVAL, rule)
    return decided(Verdict.ALLOW, "no rule denies it or asks for approval")
