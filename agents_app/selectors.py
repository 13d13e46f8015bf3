"""Reads of the agent layer."""

from __future__ import annotations

from agents_app.models import TenantToolPolicy


def tenant_tool_policy_get(*, tenant_id) -> TenantToolPolicy | None:
    """The tenant's tool policy as it is now, with its tenant (so a decision's rule can name it). Read for every
    call, never kept: an edit in admin applies to the next call of every running task."""
    return TenantToolPolicy.objects.select_related("tenant").filter(tenant_id=tenant_id).first()
