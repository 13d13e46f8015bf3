"""Admin: a tenant's downstream MCP tool servers and its tool policy, each change in the audit trail (AuditedAdmin).

A server's tool list is read by `manage.py tool_servers check NAME` (and refreshed on change at call time), never
typed in here; its credential is the NAME of an environment variable, never the token."""

from django.contrib import admin

from agents_app.models import TenantToolPolicy, ToolServer
from tasks_app.web.admin_audit import AuditedAdmin


@admin.register(ToolServer)
class ToolServerAdmin(AuditedAdmin):
    list_display = ("name", "tenant", "url", "credential", "protocol_version", "tools_read_at")
    list_filter = ("tenant",)
    search_fields = ("name", "url")
    readonly_fields = ("protocol_version", "tools_version", "tools_read_at", "tools", "created_at", "updated_at")
    fields = ("tenant", "name", "url", "credential", "enabled_tools", "timeout_seconds", "max_concurrent_calls",
              "rate_per_minute", *readonly_fields)


@admin.register(TenantToolPolicy)
class TenantToolPolicyAdmin(AuditedAdmin):
    list_display = ("tenant", "deny", "allow", "require_approval", "allowed_hosts", "max_calls_per_task")
    readonly_fields = ("updated_at",)
