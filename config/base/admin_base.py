"""Shared admin building blocks: refusals that say why, and read-only admins."""

from contextlib import contextmanager

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.db import models

from config.base.json_input import JsonFormField

# The words a refusal uses for a permission an action needs (the admin's own, and the console's).
PERMISSION_VERBS = {"view": "read", "add": "add", "change": "change", "delete": "delete"}


class ExplainedRefusalsAdmin(admin.ModelAdmin):
    """Every refusal of this admin says why, on the styled 403 page (templates/403.html shows the PermissionDenied's
    message). Django's own views raise a bare PermissionDenied (the page could only say "not allowed"); here each gets
    the reason its view implies ("Your account may read tenants but not change them"). And a bulk action this
    account is not offered (get_actions leaves out what its permissions do not allow) is refused with a 403 saying
    why when it is posted anyway, where Django would answer "No action selected", or, with no action offered at
    all, show the list again as if nothing had been asked."""

    # Words for the permissions this admin's actions name (@admin.action(permissions=[…])) beyond PERMISSION_VERBS.
    permission_verbs: dict[str, str] = {}
    # Every JSON field of every admin reads its text through config.base.json_input (the nesting cap, no lone
    # surrogates: a form error, where Django's field let a 10,000-deep value through as a RecursionError 500).
    formfield_overrides = {models.JSONField: {"form_class": JsonFormField}}

    def refusal(self, request, verb: str) -> str:
        """Why this account may not ``verb`` (read, add, change, delete, steer, …) this admin's objects."""
        plural = self.opts.verbose_name_plural
        if verb == "read":
            return f"Your account may not read {plural}."
        if self.has_view_permission(request):
            return f"Your account may read {plural} but not {verb} them."
        return f"Your account may not {verb} {plural}, nor read them."

    def action_refusal(self, request, name: str) -> str:
        """Why this account may not run the bulk action ``name``: by the first permission it needs."""
        func = {action_name: func for func, action_name, _ in self._get_base_actions()}[name]
        permissions = getattr(func, "allowed_permissions", ()) or ("change",)
        verb = {**PERMISSION_VERBS, **self.permission_verbs}.get(permissions[0], permissions[0])
        return self.refusal(request, verb)

    @contextmanager
    def _refusal_said(self, request, verb: str):
        try:
            yield
        except PermissionDenied as refused:
            if str(refused):
                raise
            raise PermissionDenied(self.refusal(request, verb)) from None

    @staticmethod
    def posted_action(request) -> str | None:
        """The bulk action a POST to the list asks for (the one of the two action bars whose button was pushed)."""
        if request.method != "POST" or "action" not in request.POST:
            return None
        names = request.POST.getlist("action")
        try:
            index = int(request.POST.get("index", 0))
        except ValueError:
            index = 0
        return names[index] if 0 <= index < len(names) else None

    def changelist_view(self, request, extra_context=None):
        name = self.posted_action(request)
        own = {action_name for _, action_name, _ in self._get_base_actions()}
        if name and name in own and name not in self.get_actions(request):
            raise PermissionDenied(self.action_refusal(request, name))
        verb = "delete" if name == "delete_selected" else "change" if request.method == "POST" else "read"
        with self._refusal_said(request, verb):
            return super().changelist_view(request, extra_context)

    def changeform_view(self, request, object_id=None, form_url="", extra_context=None):
        adding = object_id is None or "_saveasnew" in request.POST
        verb = "add" if adding else "change" if request.method == "POST" else "read"
        with self._refusal_said(request, verb):
            return super().changeform_view(request, object_id, form_url, extra_context)

    def delete_view(self, request, object_id, extra_context=None):
        with self._refusal_said(request, "delete"):
            return super().delete_view(request, object_id, extra_context)

    def history_view(self, request, object_id, extra_context=None):
        with self._refusal_said(request, "read"):
            return super().history_view(request, object_id, extra_context)


class ReadOnlyAdmin(ExplainedRefusalsAdmin):
    """History and ledgers are written by services only; admin shows them, never edits them."""

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    def refusal(self, request, verb: str) -> str:
        if verb in ("add", "change", "delete"):
            return (f"{self.opts.verbose_name_plural.capitalize()} are written by the runtime's services only: the "
                    f"admin shows them and never lets anyone {verb} them.")
        return super().refusal(request, verb)
