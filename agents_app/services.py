"""Writes of the agent layer's rows, each audited like an admin write (tasks_app.services.admin_action_record), so a
tool server added from the shell is in the same trail as one added in the admin."""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction

from agents_app.gateway.catalogue import ServerTools, tools_refresh
from agents_app.models import ToolServer
from tasks_app.models import Tenant
from tasks_app.services import admin_action_record


class ToolServerError(Exception):
    pass


def tool_server_add(*, tenant_slug: str, name: str, url: str, credential: str = "", actor: str,
                    timeout_seconds: float | None = None, enabled_tools: list[str] | None = None) -> ToolServer:
    tenant = Tenant.objects.filter(slug=tenant_slug).first()
    if tenant is None:
        raise ToolServerError(f"no tenant {tenant_slug!r}")
    server = ToolServer(tenant=tenant, name=name, url=url, credential=credential or "", enabled_tools=enabled_tools)
    if timeout_seconds is not None:
        server.timeout_seconds = timeout_seconds
    try:
        server.full_clean()
    except ValidationError as invalid:
        raise ToolServerError("; ".join(f"{field}: {' '.join(messages)}"
                                        for field, messages in invalid.message_dict.items())) from None
    with transaction.atomic():
        server.save()
        admin_action_record(actor=actor, action="add", obj=server, message=f"Added from the shell: {url}")
    return server


def tool_server_ensure(*, tenant_slug: str, name: str, url: str, actor: str, **options) -> tuple[ToolServer, bool]:
    """The tenant's server ``name``, added (by tool_server_add, audited; ``options``: its credential, timeout_seconds)
    if it has none of that name: (server, added). One it has already is kept as it is, whatever its URL: someone may
    have pointed it elsewhere on purpose."""

    def existing() -> ToolServer | None:
        return ToolServer.objects.select_related("tenant").filter(tenant__slug=tenant_slug, name=name).first()

    if (server := existing()) is not None:
        return server, False
    try:
        return tool_server_add(tenant_slug=tenant_slug, name=name, url=url, actor=actor, **options), True
    except (ToolServerError, IntegrityError):
        # Another command added it between the read above and the insert (its uniqueness check, or the constraint).
        if (server := existing()) is not None:
            return server, False
        raise


def tool_server_remove(*, server: ToolServer, actor: str) -> None:
    with transaction.atomic():
        admin_action_record(actor=actor, action="delete", obj=server, message="Removed from the shell.")
        server.delete()


def tool_server_check(*, server: ToolServer) -> ServerTools:
    """Connect, negotiate, list the tools, and keep the list (a change of it is a new version)."""
    return tools_refresh(server)
