"""Admin: read-only tasks with their steps, events and effects, for operators and auditors (steering_app's admin
adds the steering history, the open wait and the forms to steer and answer).

Tasks change only through services (steering, the engine), never by editing rows here.
"""

from dataclasses import dataclass

from django import forms
from django.contrib import admin, messages
from django.core.paginator import Paginator
from django.http import Http404
from django.shortcuts import get_object_or_404, redirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html, format_html_join

from checkpoints_app.models import EffectStatus, SideEffect
from config.admin_base import ReadOnlyAdmin
from tasks_app import events, recovery, selectors
from tasks_app.artifacts import ArtifactNotFound, artifact_response
from tasks_app.models import ApiToken, Step, Task, TaskEvent, Tenant, TenantMembership
from tasks_app.services import api_token_revoke


@admin.register(Task)
class TaskAdmin(ReadOnlyAdmin):
    list_display = ("id", "tenant", "workflow_name", "status", "progress", "phase", "priority", "steps_completed",
                    "recoveries", "lease_owner", "created_at", "updated_at")
    list_filter = ("status", "workflow_name", "tenant", "priority", "created_at")
    search_fields = ("=id", "workflow_name", "phase", "status_message", "idempotency_key", "lease_owner")
    date_hierarchy = "created_at"
    list_select_related = ("tenant",)
    show_full_result_count = False  # COUNT(*) over millions of tasks is slow; the list does not need it
    actions = ["retry_dead_letters", "abandon_dead_letters"]
    readonly_fields = ("history",)

    @admin.display(description="History")
    def history(self, task):
        # Links to paged tables rather than inlines: a long task has many thousands of steps and events.
        links = [(reverse("admin:tasks_app_task_history", args=[task.id, kind]), table.label)
                 for kind, table in HISTORY_TABLES.items()]
        links.append((reverse("admin:checkpoints_app_checkpoint_changelist") + f"?task__id__exact={task.id}",
                      "Checkpoints"))
        links.append((reverse("admin:tasks_app_task_artifacts", args=[task.id]), "Artifacts"))
        if task.status == "dead_lettered":
            links.append((reverse("admin:tasks_app_task_retry", args=[task.id]), "Retry (answer each open effect)"))
        return format_html_join(" · ", '<a href="{}">{}</a>', links)

    def get_urls(self):
        return [path("<uuid:task_id>/retry/", self.admin_site.admin_view(self.retry_view),
                     name="tasks_app_task_retry"),
                path("<uuid:task_id>/history/<slug:kind>/", self.admin_site.admin_view(self.history_view),
                     name="tasks_app_task_history"),
                path("<uuid:task_id>/artifacts/", self.admin_site.admin_view(self.artifacts_view),
                     name="tasks_app_task_artifacts"),
                path("<uuid:task_id>/artifacts/<str:name>", self.admin_site.admin_view(self.artifact_view),
                     name="tasks_app_task_artifact"),
                *super().get_urls()]

    def history_view(self, request, task_id, kind):
        """One task's steps, events or effects, in order, a page at a time, filtered by status or type.

        Served here rather than by admin classes of their own: those rows are keyed by (task, seq), a composite
        primary key, which Django's admin does not register."""
        table = HISTORY_TABLES.get(kind)
        if table is None or not self.has_view_permission(request):
            raise Http404("No such history table.")
        task = get_object_or_404(Task, id=task_id)
        choice = {name: request.GET[name] for name in table.filters if request.GET.get(name)}
        rows = table.model.objects.filter(task_id=task.id, **choice).order_by(*table.order)
        page = Paginator(rows.values_list(*table.columns), HISTORY_PAGE_ROWS).get_page(request.GET.get("page"))
        filters = [(name, [(value, value == choice.get(name)) for value in values])
                   for name, values in table.filters.items()]
        return TemplateResponse(request, "admin/tasks_app/task/history.html", {
            **self.admin_site.each_context(request), "title": f"{table.label} of {task}", "task": task,
            "opts": self.model._meta, "columns": table.columns, "page": page, "filters": filters,
            "chosen": choice})

    def artifact_view(self, request, task_id, name):
        """One artifact's file, for an operator (of any tenant, as the admin shows every task)."""
        if not self.has_view_permission(request):
            raise Http404("No such task.")
        task = get_object_or_404(Task, id=task_id)
        try:
            return artifact_response(task_id=task.id, name=name)
        except ArtifactNotFound as missing:
            raise Http404(str(missing)) from None

    def artifacts_view(self, request, task_id):
        """The files the task's committed steps wrote, each linked to its download."""
        if not self.has_view_permission(request):
            raise Http404("No such task.")
        task = get_object_or_404(Task, id=task_id)
        artifacts = [{**artifact, "url": reverse("admin:tasks_app_task_artifact", args=[task.id, artifact["name"]])}
                     for artifact in selectors.task_artifacts(task_id=task.id).values()]
        return TemplateResponse(request, "admin/tasks_app/task/artifacts.html", {
            **self.admin_site.each_context(request), "title": f"Artifacts of {task}", "task": task,
            "opts": self.model._meta, "artifacts": artifacts})

    def retry_view(self, request, task_id):
        """Retry one dead letter, with the operator's answer for each effect of unknown outcome."""
        if not self.has_view_permission(request):
            return redirect("admin:index")
        task = get_object_or_404(Task, id=task_id)
        open_effects = recovery.dead_letter_open_effects(task_id=task.id)
        form = EffectAnswersForm(request.POST or None, effects=open_effects)
        if request.method == "POST" and form.is_valid():
            try:
                recovery.dead_letter_retry(task_id=task.id, answers=form.answers(), requested_by=request.user.username)
            except recovery.DeadLetterError as error:
                self.message_user(request, str(error), level=messages.WARNING)
            else:
                self.message_user(request, "Retried: a worker resumes it from its last good checkpoint.",
                                  level=messages.SUCCESS)
                return redirect("admin:tasks_app_task_change", task.id)
        return TemplateResponse(request, "admin/tasks_app/task/dead_letter_retry.html", {
            **self.admin_site.each_context(request), "title": f"Retry {task}", "task": task, "form": form,
            "opts": self.model._meta, "open_effects": open_effects})

    @admin.action(description="Retry dead-lettered tasks from their last good checkpoint (no open effects)")
    def retry_dead_letters(self, request, queryset):
        for task_id in queryset.values_list("id", flat=True):
            if recovery.dead_letter_open_effects(task_id=task_id):
                url = reverse("admin:tasks_app_task_retry", args=[task_id])
                self.message_user(request, format_html(
                    'Task {} has effects with unknown outcome: <a href="{}">answer each one, then retry</a>.',
                    task_id, url), level=messages.WARNING)
                queryset = queryset.exclude(id=task_id)
        self._each_dead_letter(request, queryset, lambda task_id: recovery.dead_letter_retry(
            task_id=task_id, requested_by=request.user.username), "retried")

    @admin.action(description="Abandon dead-lettered tasks (mark them failed)")
    def abandon_dead_letters(self, request, queryset):
        self._each_dead_letter(request, queryset, lambda task_id: recovery.dead_letter_abandon(
            task_id=task_id, requested_by=request.user.username), "abandoned")

    def _each_dead_letter(self, request, queryset, operation, verb):
        done = 0
        for task_id in queryset.values_list("id", flat=True):
            try:
                operation(task_id)
                done += 1
            except recovery.DeadLetterError as error:
                self.message_user(request, str(error), level=messages.WARNING)
        if done:
            self.message_user(request, f"{done} task(s) {verb}.", level=messages.SUCCESS)


@dataclass(frozen=True)
class HistoryTable:
    label: str
    model: type
    columns: tuple[str, ...]
    order: tuple[str, ...]
    filters: dict[str, tuple[str, ...]]


HISTORY_PAGE_ROWS = 100
HISTORY_TABLES = {
    "steps": HistoryTable("Steps", Step, ("seq", "name", "status", "attempt", "plan_version", "lease_epoch",
                                          "started_at", "finished_at"), ("seq",),
                          {"status": tuple(Step.Status.values)}),
    "events": HistoryTable("Events", TaskEvent, ("seq", "type", "at", "hash"), ("seq",),
                           {"type": events.EVENT_TYPES}),
    "effects": HistoryTable("Side effects", SideEffect, ("step_seq", "name", "key", "status", "attempts",
                                                         "lease_epoch", "started_at", "finished_at"),
                            ("step_seq", "key"), {"status": tuple(EffectStatus.values)}),
}


class EffectAnswersForm(forms.Form):
    """One answer per effect of unknown outcome: did it happen (with the result the step should get), or not."""

    ANSWERS = [("", "— check the remote system first —"), ("applied", "It happened"),
               ("not_applied", "It did not happen: call it again with the same key")]

    def __init__(self, *args, effects, **kwargs):
        super().__init__(*args, **kwargs)
        self.effects = effects
        for number, effect in enumerate(effects):
            self.fields[f"answer_{number}"] = forms.ChoiceField(
                label=f"{effect.name} (step {effect.step_seq}) — key {effect.key}", choices=self.ANSWERS)
            self.fields[f"result_{number}"] = forms.JSONField(
                required=False, label="Its result, as the step should receive it (JSON; only if it happened)")

    def answers(self) -> dict[str, recovery.EffectAnswer]:
        return {effect.key: recovery.EffectAnswer(applied=self.cleaned_data[f"answer_{number}"] == "applied",
                                                  result=self.cleaned_data.get(f"result_{number}"))
                for number, effect in enumerate(self.effects)}


@admin.register(Tenant)
class TenantAdmin(admin.ModelAdmin):
    list_display = ("slug", "name", "created_at")
    search_fields = ("slug", "name")


@admin.register(TenantMembership)
class TenantMembershipAdmin(admin.ModelAdmin):
    list_display = ("user", "tenant", "created_at")
    list_filter = ("tenant",)
    search_fields = ("user__username", "tenant__slug")
    raw_id_fields = ("user",)


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    """Tokens are created with `manage.py create_api_token` (the raw value is shown once); here, only revoked."""

    list_display = ("prefix", "name", "user", "tenant", "created_at", "revoked_at")
    list_filter = ("tenant", "revoked_at")
    search_fields = ("prefix", "name", "user__username")
    readonly_fields = ("prefix", "token_hash", "tenant", "user", "name", "created_at")
    actions = ["revoke"]

    def has_add_permission(self, request):
        return False

    @admin.action(description="Revoke selected tokens")
    def revoke(self, request, queryset):
        for token in queryset:
            api_token_revoke(token=token)
