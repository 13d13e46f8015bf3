"""Admin: read-only task, step and event lists for operators and auditors (the operator console comes later).

Tasks change only through services (steering, the engine), never by editing rows here.
"""

from django.contrib import admin, messages
from django.urls import reverse
from django.utils.html import format_html_join

from config.admin_base import ReadOnlyAdmin
from tasks_app import recovery
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
    actions = ["retry_dead_letters", "retry_effects_applied", "retry_effects_not_applied", "abandon_dead_letters"]
    readonly_fields = ("history",)

    @admin.display(description="History")
    def history(self, task):
        # Links rather than inlines: a long task has many thousands of steps and events.
        links = [(reverse(f"admin:{app}_{model}_changelist") + f"?task__id__exact={task.id}", label)
                 for app, model, label in (("tasks_app", "step", "Steps"), ("tasks_app", "taskevent", "Events"),
                                           ("checkpoints_app", "checkpoint", "Checkpoints"),
                                           ("checkpoints_app", "sideeffect", "Side effects"))]
        return format_html_join(" · ", '<a href="{}">{}</a>', links)

    @admin.action(description="Retry dead-lettered tasks from their last good checkpoint")
    def retry_dead_letters(self, request, queryset):
        self._each_dead_letter(request, queryset, lambda task_id: recovery.dead_letter_retry(
            task_id=task_id, requested_by=request.user.username), "retried")

    @admin.action(description="Retry dead-lettered tasks; their unknown effects DID happen (checked remotely)")
    def retry_effects_applied(self, request, queryset):
        self._each_dead_letter(request, queryset, lambda task_id: recovery.dead_letter_retry(
            task_id=task_id, effects="applied", requested_by=request.user.username), "retried")

    @admin.action(description="Retry dead-lettered tasks; their unknown effects did NOT happen (call them again)")
    def retry_effects_not_applied(self, request, queryset):
        self._each_dead_letter(request, queryset, lambda task_id: recovery.dead_letter_retry(
            task_id=task_id, effects="not_applied", requested_by=request.user.username), "retried")

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


@admin.register(Step)
class StepAdmin(ReadOnlyAdmin):
    list_display = ("task", "seq", "name", "status", "attempt", "plan_version", "lease_epoch", "finished_at")
    list_filter = ("status", "name")
    search_fields = ("=task__id", "name")
    raw_id_fields = ("task",)
    show_full_result_count = False


@admin.register(TaskEvent)
class TaskEventAdmin(ReadOnlyAdmin):
    list_display = ("task", "seq", "type", "at", "hash")
    list_filter = ("type", "at")
    search_fields = ("=task__id", "type")
    raw_id_fields = ("task",)
    show_full_result_count = False


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
