"""Reads of the agent layer."""

from __future__ import annotations

from agents_app.models import TenantToolPolicy, ToolServer


def tenant_tool_policy_get(*, tenant_id) -> TenantToolPolicy | None:
    """The tenant's tool policy as it is now, with its tenant (so a decision's rule can name it). Read for every
    call, never kept: an edit in admin applies to the next call of every running task."""
    return TenantToolPolicy.objects.select_related("tenant").filter(tenant_id=tenant_id).first()


def task_tool_server_exists(*, task_id, name: str) -> bool:
    """Whether the task's tenant has a downstream tool server called ``name`` (one query, the task's row joined)."""
    return ToolServer.objects.filter(name=name, tenant__tasks__id=task_id).exists()
