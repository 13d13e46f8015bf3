"""Every write a person makes through the admin is in the audit trail (tasks_app.models.AdminAction), under the actor
naming every other decision uses (`user:<name>`): the audit pages' actor filter finds "user:alice revoked token
art_1a2b…" beside her steering commands and dead-letter decisions.

Admins that can write derive from AuditedAdmin. It records where Django's admin already reports each write —
log_addition, log_change and log_deletions, called by the add, change and delete pages and the delete_selected
action, inside the same transaction as the write (the admin's own atomic block) — and each bulk action named in
`audited_actions` (one that writes without a record of its own), run in one transaction with its records.
Django's LogEntry rows are still written (the admin's "Recent actions" and object history read them); they are not
the audit trail: a LogEntry is deleted with its user.

The admins other apps register (accounts, groups, the beat schedules: who may steer, and whether the lease reaper
runs, are decisions too) are registered again here as audited subclasses (audit_other_admins).
"""

from __future__ import annotations

import functools

from django.contrib import admin
from django.contrib.admin.utils import model_format_dict
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.db import transaction

from config.admin_base import ExplainedRefusalsAdmin
from tasks_app import access
from tasks_app.models import Tenant
from tasks_app.services import admin_action_record
from tasks_app.web.authentication import requested_by_of


class AuditedAdmin(ExplainedRefusalsAdmin):
    # Bulk actions that write without a record of their own: each selected object gets one, after the action ran,
    # in the action's transaction.
    audited_actions: tuple[str, ...] = ()
    # Bulk actions whose service records what it did (so they are not recorded twice).
    actions_recorded_by_services: tuple[str, ...] = ()

    # -- the access rule (tasks_app.access): a tenant's rows (tokens, members, tool servers, its policy and model)
    # are seen and chosen only by staff of that tenant (a tenant admin), every tenant's by staff without one ----
    def get_queryset(self, request):
        return _tenant_scoped(request, super().get_queryset(request))

    # The action of the rule that decides this admin's writes (add, change, delete, and the bulk actions, which
    # need one of those): tokens, members, tool servers, the policy. None: Django's permissions alone.
    rule_action: access.Action | None = None

    def _rule_allows(self, request, obj=None) -> bool:
        if self.rule_action is None:
            return True
        tenant = getattr(obj, "tenant", None) if obj is not None else None
        return access.allows(access.actor_for_request(request), self.rule_action, tenant=tenant)

    # Each write needs Django's permission for its verb (a tenant admin deletes members, not tokens) *and* the rule:
    # the tenant first (another tenant's row: not this actor's — the querysets hide it already), then the role.
    def has_add_permission(self, request):
        return super().has_add_permission(request) and self._rule_allows(request)

    def has_change_permission(self, request, obj=None):
        return super().has_change_permission(request, obj) and self._rule_allows(request, obj)

    def has_delete_permission(self, request, obj=None):
        return super().has_delete_permission(request, obj) and self._rule_allows(request, obj)

    def has_view_permission(self, request, obj=None):
        # Reading needs the view permission and, for a row, its tenant to be the actor's (rule 1).
        if not super().has_view_permission(request, obj):
            return False
        tenant = getattr(obj, "tenant", None) if obj is not None else None
        actor = access.actor_for_request(request)
        return tenant is None or actor.every_tenant or (actor.tenant is not None and actor.tenant.id == tenant.id)

    def formfield_for_foreignkey(self, db_field, request, **kwargs):
        if db_field.name == "tenant":
            kwargs["queryset"] = _tenant_scoped(request, db_field.remote_field.model.objects.all())
        return super().formfield_for_foreignkey(db_field, request, **kwargs)

    def audit_record(self, request, action: str, obj, message: str = "") -> None:
        admin_action_record(actor=requested_by_of(request), action=action, obj=obj, message=message)

    def log_addition(self, request, obj, message):
        entry = super().log_addition(request, obj, message)
        self.audit_record(request, "add", obj, entry.get_change_message())
        return entry

    def log_change(self, request, obj, message):
        entry = super().log_change(request, obj, message)
        self.audit_record(request, "change", obj, entry.get_change_message())
        return entry

    def log_deletions(self, request, queryset):
        # Called before the delete: the objects are still there to be named.
        for obj in queryset:
            self.audit_record(request, "delete", obj, "Deleted.")
        return super().log_deletions(request, queryset)

    def get_actions(self, request):
        actions = super().get_actions(request)
        if not self.has_change_permission(request):
            # Django offers an action that names no permission to whoever may view the list (django_celery_beat's
            # enable / disable / run: a read-only account could stop the lease reaper). Every bulk action here
            # writes: without a permission of its own it needs the change permission.
            actions = {name: action for name, action in actions.items()
                       if getattr(action[0], "allowed_permissions", None)}
        return {name: (self._in_one_transaction(func, name, description), name, description)
                for name, (func, _, description) in actions.items()}

    def _in_one_transaction(self, func, name: str, description):
        """The action and its records commit together (delete_selected's deletes and their records too: Django runs
        an action outside any transaction)."""
        audited = name in self.audited_actions
        said = f"Ran the bulk action “{str(description) % model_format_dict(self.opts)}”."

        @functools.wraps(func)
        def run(modeladmin, request, queryset):
            with transaction.atomic():
                objects = list(queryset) if audited else []
                response = func(modeladmin, request, queryset)
                for obj in objects:
                    modeladmin.audit_record(request, name, obj, said)
            return response

        return run


def _tenant_scoped(request, queryset):
    """``queryset`` narrowed to the tenants the request's actor sees, for a model with a ``tenant`` or the tenants."""
    actor = access.actor_for_request(request)
    if actor.every_tenant:
        return queryset
    if queryset.model is Tenant:
        return queryset.filter(id=actor.tenant.id) if actor.tenant else queryset.none()
    if any(field.name == "tenant" for field in queryset.model._meta.get_fields()):
        return access.visible(actor, queryset)
    return queryset


def audited(admin_class: type[admin.ModelAdmin], **attributes) -> type[AuditedAdmin]:
    """``admin_class`` with its writes recorded (AuditedAdmin first in the MRO, so its hooks wrap the class's own)."""
    return type(f"Audited{admin_class.__name__}", (AuditedAdmin, admin_class),
                {"__module__": __name__, **attributes})


def audit_other_admins(site: admin.AdminSite) -> None:
    """Register again, audited, the writing admins that Django's auth app and django_celery_beat registered (their
    admin modules come before ours in INSTALLED_APPS, so autodiscovery has imported them). A test checks that no
    writing admin of the site is left out (tests/test_admin_audit.py)."""
    from django_celery_beat.models import (
        ClockedSchedule,
        CrontabSchedule,
        IntervalSchedule,
        PeriodicTask,
        SolarSchedule,
    )

    beat_actions = ("enable_tasks", "disable_tasks", "toggle_tasks", "run_tasks")
    for model, attributes in ((get_user_model(), {}), (Group, {}), (PeriodicTask, {"audited_actions": beat_actions}),
                              (IntervalSchedule, {}), (CrontabSchedule, {}), (SolarSchedule, {}),
                              (ClockedSchedule, {})):
        registered = site._registry.get(model)
        if registered is None or isinstance(registered, AuditedAdmin):
            continue
        site.unregister(model)
        site.register(model, audited(type(registered), **attributes))
