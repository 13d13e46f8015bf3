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

Every admin of a tenant's rows also derives from TenantScopedAdmin (AuditedAdmin does; the read-only task and
checkpoint admins too): the one access rule (tasks_app.access.visible) narrows its rows, the objects its pages
open, the choices of its foreign keys *and of its list filters* — Django's filter on a relation lists every row of
the related table (every tenant's slug, every person's name) whatever the list shows. tests/test_console_tenants.py
visits every admin URL as each role of a tenant with another tenant's objects present.
"""

from __future__ import annotations

import functools

from django.contrib import admin
from django.contrib.admin.utils import model_format_dict
from django.core.exceptions import FieldDoesNotExist
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.db import transaction

from config.base.admin_base import ExplainedRefusalsAdmin
from tasks_app import access
from tasks_app.models import Tenant, TenantMembership
from tasks_app.services import admin_action_record
from tasks_app.web.authentication import requested_by_of


class TenantScopedRelatedFilter(admin.RelatedFieldListFilter):
    """A list filter on a relation offering only what the actor sees (its tenant, its tenant's people and tasks).
    Django's offers every row of the related table, whatever the list shows: a tenant's viewer read every tenant's
    slug and every person's name in the task list's filters."""

    def field_choices(self, field, request, model_admin):
        ordering = self.field_admin_ordering(field, request, model_admin)
        if access.actor_for_request(request).every_tenant:
            return field.get_choices(include_blank=False, ordering=ordering)
        seen = _tenant_scoped(request, field.related_model._default_manager.all(), people=True)
        return field.get_choices(include_blank=False, ordering=ordering,
                                 limit_choices_to={"pk__in": seen.values("pk")})


class TenantScopedAdmin(ExplainedRefusalsAdmin):
    """The access rule (tasks_app.access) for an admin of a tenant's rows: tasks and what hangs off them
    (checkpoints), tokens, members, tool servers, its policy and model are seen and chosen only by staff of that
    tenant, every tenant's by staff without one — in the list, on an object's pages (another tenant's is not found:
    Django's "does not exist" redirect), in a foreign key's choices and in the list's filters."""

    def get_queryset(self, request):
        return _tenant_scoped(request, super().get_queryset(request))

    def get_list_filter(self, request):
        """Each filter on a relation ("tenant", "owner", "task") offers only what the actor sees."""
        filters = []
        for entry in super().get_list_filter(request):
            if isinstance(entry, str) and "__" not in entry:
                try:
                    if self.model._meta.get_field(entry).is_relation:
                        entry = (entry, TenantScopedRelatedFilter)
                except FieldDoesNotExist:
                    pass
            filters.append(entry)
        return filters

    def has_view_permission(self, request, obj=None):
        # Reading needs the view permission and, for a row, its tenant to be the actor's (rule 1).
        if not super().has_view_permission(request, obj):
            return False
        tenant_id = _tenant_id_of_row(obj)
        actor = access.actor_for_request(request)
        return tenant_id is None or actor.every_tenant or (actor.tenant is not None and actor.tenant.id == tenant_id)

    def formfield_for_foreignkey(self, db_field, request, **kwargs):
        if db_field.name in ("tenant", "task"):
            kwargs["queryset"] = _tenant_scoped(request, db_field.remote_field.model.objects.all())
        return super().formfield_for_foreignkey(db_field, request, **kwargs)


class AuditedAdmin(TenantScopedAdmin):
    # Bulk actions that write without a record of their own: each selected object gets one, after the action ran,
    # in the action's transaction.
    audited_actions: tuple[str, ...] = ()
    # Bulk actions whose service records what it did (so they are not recorded twice).
    actions_recorded_by_services: tuple[str, ...] = ()

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


def _tenant_scoped(request, queryset, *, people: bool = False):
    """``queryset`` narrowed to the tenants the request's actor sees: the tenants, or rows with a ``tenant``, or
    rows of a ``task`` (checkpoints: through their task's tenant); with ``people``, the accounts, to the members of
    the actor's tenant (a filter's choices). Rows of any other model are left as they are (their admins need
    permissions no tenant role holds: accounts, groups, schedules, OAuth clients)."""
    actor = access.actor_for_request(request)
    if actor.every_tenant:
        return queryset
    model = queryset.model
    if actor.tenant is None:
        return queryset.none()
    if model is Tenant:
        return queryset.filter(id=actor.tenant.id)
    fields = {field.name for field in model._meta.get_fields()}
    if "tenant" in fields:
        return access.visible(actor, queryset)
    if "task" in fields:
        return queryset.filter(task__tenant_id=actor.tenant.id)
    if people and model is get_user_model():
        return queryset.filter(pk__in=TenantMembership.objects.filter(tenant_id=actor.tenant.id).values("user_id"))
    return queryset.none() if people else queryset


def _tenant_id_of_row(obj) -> int | None:
    """The tenant a row belongs to: its own, or its task's (a checkpoint); None for a row of no tenant."""
    if obj is None:
        return None
    if isinstance(obj, Tenant):
        return obj.pk
    if hasattr(obj, "tenant_id"):
        return obj.tenant_id
    task = getattr(obj, "task", None)
    return getattr(task, "tenant_id", None)


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
