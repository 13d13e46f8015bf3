"""Admin: a tenant's downstream MCP tool servers and its tool policy, each change in the audit trail (AuditedAdmin);
an agent task's conversation on its task page.

A server's tool list is read by `manage.py tool_servers check NAME` (and refreshed on change at call time), never
typed in here; its credential is the NAME of an environment variable, never the token.

The task page: tasks_app's and steering_app's admins do not know agents (dependencies point down), so this module
re-registers the task's admin once more (as steering_app's does) with the conversation part for an agent task
(templates/console/conversation.html): the goal, the model's answers, each tool call with its outcome, questions
to people and their answers, approvals, the running token and cost counters — re-read with the panel's other live
parts, and the model's text as it streams (llm.delta) written live by static/console/task.js."""

import json

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.shortcuts import get_object_or_404, redirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html

from agents_app import selectors
from agents_app.gateway.catalogue import tools_refresh
from agents_app.gateway.errors import ToolError
from agents_app.models import TenantModel, TenantToolPolicy, ToolServer
from config.base.json_input import JsonFormField
from config.base.problems import Problem
from steering_app.admin import SteeringTaskAdmin
from tasks_app import access
from tasks_app.models import Task
from tasks_app.services import task_create
from tasks_app.web.admin_audit import AuditedAdmin
from tasks_app.web.admin_limits import admin_rate_refusal
from tasks_app.web.authentication import requested_by_of

CALL_PERMISSION = "agents_app.change_toolserver"  # (tasks_app.access.Action.MANAGE_TOOL_SERVERS)


class ToolCallForm(forms.Form):
    tool = forms.ChoiceField()
    arguments = JsonFormField(initial=dict, help_text="The tool's arguments, checked against its inputSchema "
                                                      "before anything is sent.")

    def __init__(self, *args, tools: list[dict], **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["tool"].choices = [(tool["name"], tool["name"]) for tool in tools]

    def clean_arguments(self):
        value = self.cleaned_data["arguments"]
        if not isinstance(value, dict):
            raise forms.ValidationError("The arguments are a JSON object, e.g. {\"key\": \"colour\"}.")
        return value


@admin.register(ToolServer)
class ToolServerAdmin(AuditedAdmin):
    list_display = ("name", "tenant", "url", "credential", "protocol_version", "tools_read_at")
    list_filter = ("tenant",)
    search_fields = ("name", "url")
    readonly_fields = ("protocol_version", "tools_version", "tools_read_at", "tools", "created_at", "updated_at")
    fields = ("tenant", "name", "url", "credential", "protocol", "enabled_tools", "timeout_seconds",
              "honours_idempotency_key", "max_concurrent_calls", "rate_per_minute", *readonly_fields)
    rule_action = access.Action.MANAGE_TOOL_SERVERS
    list_display = (*list_display, "call_link")

    @admin.display(description="")
    def call_link(self, server):
        url = reverse("admin:agents_app_toolserver_call", args=[server.pk])
        return format_html('<a href="{}">Call a tool</a>', url)

    def get_urls(self):
        return [path("<int:server_id>/call/", self.admin_site.admin_view(self.call_view),
                     name="agents_app_toolserver_call"), *super().get_urls()]

    def call_view(self, request, server_id):
        """One durable tool call from the admin: an `mcp_tool` task of the server's tenant (the same path as the REST
        API's and MCP's — the policy, the ledger, the audit trail), then its task page."""
        if not access.allows(access.actor_for_request(request), access.Action.MANAGE_TOOL_SERVERS):
            raise PermissionDenied("Your account may read tool servers but not call their tools.")
        server = get_object_or_404(self.get_queryset(request), pk=server_id)  # (another tenant's: 404)
        if request.method == "POST":
            # A call creates a task: counted as a REST create is (the person's and the tenant's limits), first.
            refused = admin_rate_refusal(request, "create", tenant=server.tenant)
            if refused is not None:
                return refused
        try:
            tools = tools_refresh(server).by_name.values() if request.method == "GET" else (server.tools or [])
        except ToolError as unreachable:
            messages.warning(request, f"The tool list could not be read now: {unreachable}")
            tools = server.tools or []
        form = ToolCallForm(request.POST if request.method == "POST" else None, tools=list(tools))
        if request.method == "POST" and form.is_valid():
            try:
                task = task_create(tenant=server.tenant, owner=request.user, workflow="mcp_tool",
                                   input={"server": server.name, "tool": form.cleaned_data["tool"],
                                          "arguments": form.cleaned_data["arguments"]}).task
            except Problem as refused:
                form.add_error(None, str(refused.detail))
            else:
                self.audit_record(request, "call", server, f"Called {form.cleaned_data['tool']} as task {task.id}")
                messages.success(request, f"Task {task.id} calls {server.name}.{form.cleaned_data['tool']} once.")
                return redirect("admin:tasks_app_task_change", task.id)
        schemas = {tool["name"]: json.dumps(tool.get("inputSchema") or {}, indent=2) for tool in tools}
        return TemplateResponse(request, "admin/agents_app/toolserver/call.html", {
            **self.admin_site.each_context(request), "title": f"Call a tool of {server.name}", "server": server,
            "form": form, "schemas": schemas, "opts": self.model._meta, "by": requested_by_of(request)})


@admin.register(TenantToolPolicy)
class TenantToolPolicyAdmin(AuditedAdmin):
    list_display = ("tenant", "deny", "allow", "require_approval", "allowed_hosts", "max_calls_per_task")
    readonly_fields = ("updated_at",)
    rule_action = access.Action.MANAGE_POLICY


@admin.register(TenantModel)
class TenantModelAdmin(AuditedAdmin):
    """A tenant's own model endpoint for its agents; every change in the audit trail. The credential is a NAME."""

    list_display = ("tenant", "name", "base_url", "credential", "context_window", "input_price", "output_price")
    readonly_fields = ("updated_at",)
    rule_action = access.Action.MANAGE_POLICY  # (its model endpoint: the tenant's policy on which model runs)


# How much of a conversation the task page shows: its newest messages (the transcript API pages through the rest).
CONVERSATION_ON_TASK_PAGE = 60
# An outcome's colour on the task page (console.css .console-call-<css>).
OUTCOME_CSS = {"ok": "ok", "finished": "ok", "answered": "ok", "task created": "ok", "denied": "bad",
               "rejected": "bad", "tool error": "bad", "failed": "bad", "unknown": "bad",
               "waiting for approval": "wait", "waiting for an answer": "wait", "calling": "wait"}


def conversation_context(conversation: selectors.Conversation) -> list[dict]:
    """The conversation's messages as the page shows them: each tool result under the call it answers (a result
    whose call is outside the window stands alone), each call with its outcome's colour."""
    by_index = {message["index"]: message for message in conversation.messages}
    placed = set()
    for message in conversation.messages:
        for call in message.get("toolCalls", ()):
            call["css"] = OUTCOME_CSS.get(call["outcome"]["status"], "plain")
            if call["resultIndex"] in by_index:
                call["result"] = by_index[call["resultIndex"]]
                placed.add(call["resultIndex"])
    return [message for message in conversation.messages if message["index"] not in placed]


class AgentTaskAdmin(SteeringTaskAdmin):
    def console_context(self, request, task):
        """For an agent task, the conversation part (templates/console/conversation.html), as of now."""
        context = super().console_context(request, task)
        if selectors.is_agent_task(task):
            conversation = selectors.task_conversation(task=task, last=CONVERSATION_ON_TASK_PAGE)
            steering = context.get("steering") or {}
            context["conversation"] = {
                "conversation": conversation, "entries": conversation_context(conversation),
                "budget": task.budget_cost, "transcript_url": f"/runtime/tasks/{task.id}/transcript",
                "may_steer": steering.get("may_steer", False), "wait_url": steering.get("wait_url", "")}
        return context


admin.site.unregister(Task)
admin.site.register(Task, AgentTaskAdmin)
