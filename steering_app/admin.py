"""Steering in the operators' console: the task page gains its steering history and a form to steer it.

tasks_app's admin does not know steering (dependencies point down), so this module re-registers the task's admin
with these additions. Every command goes through steering_app.services, as from the API; a stale version or a
command that does not apply is shown as a message on the page, never as a server error.
"""

from __future__ import annotations

from django import forms
from django.contrib import admin, messages
from django.shortcuts import get_object_or_404, redirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html, format_html_join

from config.problems import Problem
from steering_app import services
from steering_app.models import CommandType
from tasks_app.admin import TaskAdmin
from tasks_app.models import Task

STEER_PERMISSION = "steering_app.add_steeringcommand"


class ReasonForm(forms.Form):
    reason = forms.CharField(max_length=500, help_text="Kept with each command and in each task's audit trail")


class SteerForm(forms.Form):
    type = forms.ChoiceField(choices=[(t.value, t.label) for t in services.SUPPORTED])
    priority = forms.IntegerField(min_value=0, max_value=9, required=False, help_text="For set_priority: 0–9")
    reason = forms.CharField(max_length=500, help_text="Kept with the command and in the task's audit trail")
    expected_version = forms.IntegerField(widget=forms.HiddenInput)

    def clean(self):
        data = super().clean()
        if data.get("type") == CommandType.SET_PRIORITY and data.get("priority") is None:
            self.add_error("priority", "set_priority needs a priority.")
        return data


class SteeringTaskAdmin(TaskAdmin):
    readonly_fields = (*TaskAdmin.readonly_fields, "steering")
    actions = [*TaskAdmin.actions, "pause_tasks", "resume_tasks", "cancel_tasks"]

    @admin.action(description="Pause the selected tasks (at their next safe point)")
    def pause_tasks(self, request, queryset):
        return self._steer_many(request, queryset, CommandType.PAUSE, "pause_tasks")

    @admin.action(description="Resume the selected paused tasks")
    def resume_tasks(self, request, queryset):
        return self._steer_many(request, queryset, CommandType.RESUME, "resume_tasks")

    @admin.action(description="Cancel the selected tasks (at their next safe point)")
    def cancel_tasks(self, request, queryset):
        return self._steer_many(request, queryset, CommandType.CANCEL, "cancel_tasks")

    def _steer_many(self, request, queryset, command_type: str, action: str):
        """Ask for a reason first (an intermediate page), then send one command per task at its current version;
        what does not apply to a task is reported for that task, the others go ahead."""
        if not request.user.has_perm(STEER_PERMISSION):
            self.message_user(request, "Your account may read tasks but not steer them.", level=messages.ERROR)
            return None
        form = ReasonForm(request.POST if "reason" in request.POST else None)
        if not form.is_valid():
            return TemplateResponse(request, "admin/steering_app/steer_many.html", {
                **self.admin_site.each_context(request), "title": f"{command_type}: why?", "tasks": queryset,
                "form": form, "action": action, "opts": self.model._meta,
                "action_checkbox_name": admin.helpers.ACTION_CHECKBOX_NAME})
        sent = 0
        for task in queryset:
            try:
                services.steering_submit(task=task, command_type=command_type, expected_version=task.state_version,
                                         reason=form.cleaned_data["reason"],
                                         requested_by=f"user:{request.user.username}")
                sent += 1
            except Problem as refused:
                self.message_user(request, f"{task.id}: {refused.detail}", level=messages.WARNING)
        if sent:
            self.message_user(request, f"{command_type} sent to {sent} task(s).", level=messages.SUCCESS)
        return None

    @admin.display(description="Steering")
    def steering(self, task):
        rows = services.steering_history(task=task)[:10]
        lines = format_html_join("", "<li>{} — {} by {} ({}){}</li>", (
            (c["type"], c["status"], c["requestedBy"], c["reason"] or "no reason",
             f": {c['rejection']}" if c["rejection"] else "") for c in rows)) or "No command yet."
        return format_html('<ul>{}</ul><a href="{}">Steer this task</a> (version {})', lines,
                           reverse("admin:steering_app_task_steer", args=[task.id]), task.state_version)

    def get_urls(self):
        return [path("<uuid:task_id>/steer/", self.admin_site.admin_view(self.steer_view),
                     name="steering_app_task_steer"), *super().get_urls()]

    def steer_view(self, request, task_id):
        task = get_object_or_404(Task, id=task_id)
        if not request.user.has_perm(STEER_PERMISSION):
            self.message_user(request, "Your account may read tasks but not steer them.", level=messages.ERROR)
            return redirect("admin:tasks_app_task_change", task.id)
        may_kill = request.user.has_perm(services.KILL_PERMISSION)
        form = SteerForm(request.POST or None, initial={"expected_version": task.state_version})
        if not may_kill:
            form.fields["type"].choices = [c for c in form.fields["type"].choices if c[0] != CommandType.KILL]
        if request.method == "POST" and form.is_valid():
            data = form.cleaned_data
            try:
                submitted = services.steering_submit(
                    task=task, command_type=data["type"], expected_version=data["expected_version"],
                    payload={"priority": data["priority"]} if data["type"] == CommandType.SET_PRIORITY else {},
                    reason=data["reason"], requested_by=f"user:{request.user.username}", may_kill=may_kill)
            except Problem as refused:  # 409 (the task moved on) or 422 (does not apply): say so on the page
                self.message_user(request, str(refused.detail), level=messages.WARNING)
            else:
                self.message_user(request, f"Command {data['type']} accepted at version {submitted.state_version}: "
                                           f"applied at once when no worker holds the task, else at its next safe "
                                           f"point (see Steering).", level=messages.SUCCESS)
                return redirect("admin:tasks_app_task_change", task.id)
        return TemplateResponse(request, "admin/steering_app/steer.html", {
            **self.admin_site.each_context(request), "title": f"Steer {task}", "task": task, "form": form,
            "opts": self.model._meta, "history": services.steering_history(task=task)})


admin.site.unregister(Task)
admin.site.register(Task, SteeringTaskAdmin)
