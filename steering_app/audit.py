"""Audit review in the operators' console: read-only pages over TaskEvents and steering commands, each task's chain
verification, and CSV exports of the same filters (ARCHITECTURE §8).

Pages (under /admin/audit/, staff only through the admin site's login), each decided by the one access rule
(tasks_app.access): every page needs Action.READ_AUDIT — an auditor's and a tenant admin's, not an operator's nor a
viewer's (they read a task's own history on its page) — and shows only the tenant the person belongs to (every
tenant for staff of none); an export needs Action.EXPORT (an auditor's).
- ``events/``      TaskEvents, filtered by task, tenant, type, actor (requestedBy: of steering outcomes and of
                   dead-letter retries and abandons) and time;
- ``commands/``    steering commands with what became of each (pending / applied / rejected), same filters;
- ``admin-actions/`` the writes people made through the admin (tasks_app.models.AdminAction: tenants, memberships,
                   tokens revoked, accounts, groups, schedules), same filters;
- ``verify/``      the hash-chain verification of one task, or of the tasks of a page (?task=…&task=…);
- ``events.csv``, ``commands.csv``, ``admin-actions.csv``: the current filter, streamed (Action.EXPORT).

The actor filter (user:<name>, token:<prefix>: tasks_app.web.authentication.requested_by_of) finds every decision a
person made: their steering commands (commands/), the outcomes of those and their dead-letter retries and abandons
(events/), and their admin writes (admin-actions/); each page links the same filter on the others.

Nothing here writes. Every value drawn from an event or a command is redacted (tasks_app.redaction) and escaped
(no template marks anything safe); CSV cells that a spreadsheet would run as a formula are quoted. An actor's name
is shown by tasks_app.audit.actors.actor_shown, as the task page shows it (`token:art_1a2b3c4d`; the redaction's
`token: <value>` pattern once made it `token=[redacted]` here and in the CSV), and links to the actor filter.
"""

from __future__ import annotations

import csv
import json
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from itertools import islice
from urllib.parse import urlencode

from asgiref.sync import sync_to_async
from django import forms
from django.apps import apps
from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.core.handlers.asgi import ASGIRequest
from django.http import HttpResponse, StreamingHttpResponse
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone

from steering_app import audit_selectors as selectors
from steering_app.audit_selectors import AuditFilter, Cursor
from steering_app.models import CommandType
from tasks_app import access
from tasks_app.audit.actors import actor_shown
from tasks_app.events import EVENT_TYPES
from tasks_app.models import Task, Tenant
from tasks_app.redaction import redact, redact_json

# What each part of the audit trail is, for a refusal that says what was asked for.
EVENTS, COMMANDS, ADMIN_ACTIONS = "the events of the audit trail", "the steering commands of the audit trail", \
    "the admin actions of the audit trail"
# An admin action's verb, for the sentence a row says ("user:alice revoked api token art_1a2b…").
ADMIN_VERBS = {"add": "added", "change": "changed", "delete": "deleted", "revoke": "revoked"}
# Without any filter a page shows the last day: a bounded window, never "everything".
DEFAULT_WINDOW = timedelta(days=1)
DATA_SHOWN_CHARS = 300  # of an event's data on a page (the export has all of it)
# A cell a spreadsheet would run as a formula (OWASP "CSV injection"): = + - @, and tab / CR, which some read past.
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
_FILTER_KEYS = ("task", "tenant", "type", "actor", "from", "to")


def _require(request, action: access.Action, what: str) -> None:
    """The one access rule decides (READ_AUDIT for a page, EXPORT for a CSV); the refusal says what was asked and
    why. Which tenant's rows: _filter_form narrows every query to the actor's."""
    actor = access.actor_for_request(request)
    if not access.allows(actor, action):
        verb = "export" if action is access.Action.EXPORT else "read"
        raise PermissionDenied(f"Your account may not {verb} {what}: {access.refusal(actor, action)}")


def _may(request, action: access.Action) -> bool:
    return access.allows(access.actor_for_request(request), action)


class AuditFilterForm(forms.Form):
    """The filters of every audit page, from its query string: ?task= &tenant=<slug> &type= &actor= &from= &to=
    &after=<cursor>. Without a task, a window of at most MAX_WINDOW is required (``to`` defaults to now)."""

    task = forms.UUIDField(required=False)
    tenant = forms.ModelChoiceField(queryset=Tenant.objects.order_by("slug"), to_field_name="slug", required=False,
                                    empty_label="all")
    type = forms.ChoiceField(required=False)
    actor = forms.CharField(required=False, max_length=200, help_text="user:<name>, token:<prefix> or "
                                                                      "oauth:<client>: every decision of theirs, "
                                                                      "on each page")
    after = forms.CharField(required=False, widget=forms.HiddenInput)

    def __init__(self, data, *, types: list[str], tenant: Tenant | None = None):
        super().__init__(data)
        # A tenant's own staff read its audit trail only (tasks_app.access: one tenant, unless staff without one).
        self.scope_tenant = tenant
        if tenant is not None:
            self.fields["tenant"].queryset = Tenant.objects.filter(id=tenant.id)
        self.fields["type"].choices = [("", "all"), *((t, t) for t in types)]
        # "from" is a keyword in Python: these two are added by name.
        widget = forms.DateTimeInput(attrs={"type": "datetime-local", "step": "1"}, format="%Y-%m-%dT%H:%M:%S")
        self.fields["from"] = forms.DateTimeField(required=False, widget=widget, help_text="UTC, inclusive")
        self.fields["to"] = forms.DateTimeField(required=False, widget=widget, help_text="UTC, exclusive; now if "
                                                                                          "empty")
        self.order_fields(_FILTER_KEYS)

    def clean(self):
        data = super().clean()
        if self.errors:
            return data
        since, until = data.get("from"), data.get("to")
        if data.get("task") is None:
            if since is None:
                raise forms.ValidationError(
                    f"Choose a task, or a time window (from, and to or now) of at most "
                    f"{selectors.MAX_WINDOW.days} days: a query over every task must be bounded.")
            until = until or timezone.now()
            data["to"] = until
            if until - since > selectors.MAX_WINDOW:
                raise forms.ValidationError(f"The window is longer than {selectors.MAX_WINDOW.days} days; narrow it, "
                                            f"or choose a task (one task's events have no window limit).")
        if since is not None and until is not None and until <= since:
            self.add_error("to", "Must be after from.")
        try:
            data["after"] = Cursor.decode(data["after"]) if data.get("after") else None
        except ValueError:
            self.add_error("after", "Not a page cursor of this page: start from the first page.")
        return data

    def filters(self) -> AuditFilter:
        data = self.cleaned_data
        tenant = self.scope_tenant or data.get("tenant")
        return AuditFilter(task_id=data.get("task"), tenant_id=tenant.id if tenant else None,
                           type=data.get("type") or "", actor=data.get("actor") or "", since=data.get("from"),
                           until=data.get("to"))


def _filter_form(request, types: list[str]) -> AuditFilterForm:
    actor = access.actor_for_request(request)
    tenant = None if actor.every_tenant else actor.tenant
    if not any(request.GET.get(key) for key in _FILTER_KEYS):
        # No filter at all: the last day, every tenant (the actor sees).
        start = (timezone.now() - DEFAULT_WINDOW).replace(microsecond=0)
        return AuditFilterForm({"from": start.strftime("%Y-%m-%dT%H:%M:%S")}, types=types, tenant=tenant)
    return AuditFilterForm(request.GET, types=types, tenant=tenant)


def _query(form: AuditFilterForm, **changes) -> str:
    """The query string of this filter (as typed, so a page link keeps an empty "to" as now), with ``changes``."""
    query = {key: form.data.get(key) for key in _FILTER_KEYS if form.data.get(key)}
    query.update({key: value for key, value in changes.items() if value})
    return urlencode(query)


def _actor_query(form: AuditFilterForm, actor) -> str:
    """This filter narrowed to ``actor`` (the actor column's link), or "" for a name shown otherwise than stored —
    one whose value the redaction masked — which a link would carry unmasked."""
    actor = "" if actor is None else str(actor)
    return _query(form, actor=actor) if actor and actor_shown(actor) == actor else ""


def _same_filter_query(form: AuditFilterForm | None) -> str:
    """This filter for the other audit pages (their links under the form): without its type, which names an event,
    a command or an admin action type and would not fit the other pages."""
    if form is None:
        return ""
    return urlencode({key: form.data.get(key) for key in _FILTER_KEYS if key != "type" and form.data.get(key)})


def _context(request, title: str, **context) -> dict:
    return {**admin.site.each_context(request), "title": title, "max_window_days": selectors.MAX_WINDOW.days,
            "same_filter_query": _same_filter_query(context.get("form")),
            "may_read_events": _may(request, access.Action.READ_AUDIT),
            "may_read_commands": _may(request, access.Action.READ_AUDIT),
            "may_read_admin_actions": _may(request, access.Action.READ_AUDIT),
            "may_export": _may(request, access.Action.EXPORT), **context}


def _task_url(task_id) -> str:
    return reverse("admin:tasks_app_task_change", args=[task_id])


# The keys of an event's data that hold an actor's name (steering outcomes, dead-letter decisions): shown as the
# actor column shows them, not as redacted text.
_ACTOR_KEYS = ("requestedBy", "abandonedBy")


def _json_text(value) -> str:
    shown = redact_json(value)
    if isinstance(value, dict) and isinstance(shown, dict):
        shown.update({key: actor_shown(value[key]) for key in _ACTOR_KEYS if isinstance(value.get(key), str)})
    return json.dumps(shown, sort_keys=True, ensure_ascii=False, default=str)


def _shown(text: str, limit: int = DATA_SHOWN_CHARS) -> str:
    return text if len(text) <= limit else text[:limit] + "…"


def _verify_query(task_ids) -> str:
    task_ids = list(dict.fromkeys(str(t) for t in task_ids))[:selectors.MAX_VERIFY_TASKS]
    return urlencode([("task", t) for t in task_ids])


# --- pages ---


def index_view(request):
    _require(request, access.Action.READ_AUDIT, "the audit trail")
    return TemplateResponse(request, "admin/audit/index.html", _context(
        request, "Audit", max_verify=selectors.MAX_VERIFY_TASKS))


def events_view(request):
    _require(request, access.Action.READ_AUDIT, EVENTS)
    form = _filter_form(request, list(EVENT_TYPES))
    rows, next_cursor = [], None
    if form.is_valid():
        page, next_cursor = selectors.audit_events_page(filters=form.filters(), after=form.cleaned_data.get("after"),
                                                        limit=selectors.PAGE_ROWS)
        rows = [{**row, "task_url": _task_url(row["task_id"]), "actor": actor_shown(row["actor"]),
                 "actor_query": _actor_query(form, row["actor"]),
                 "data": _shown(_json_text(row["data"]))} for row in page]
    return TemplateResponse(request, "admin/audit/events.html", _context(
        request, "Audit: events", form=form, rows=rows,
        next_query=_query(form, after=next_cursor.encode()) if next_cursor else "",
        first_query=_query(form), csv_url=reverse("audit:events_csv") + "?" + _query(form),
        verify_query=_verify_query(row["task_id"] for row in rows),
        scan_warning=form.is_valid() and _scans_every_event(form.filters())),
        status=200 if form.is_valid() else 400)


def _scans_every_event(filters: AuditFilter) -> bool:
    """No index narrows this query (audit_selectors): say so on the page, to suggest a narrower one."""
    return filters.task_id is None and filters.tenant_id is None and not filters.actor and filters.type not in (
        "artifact", "steering.applied", "steering.rejected")


def commands_view(request):
    _require(request, access.Action.READ_AUDIT, COMMANDS)
    form = _filter_form(request, list(CommandType.values))
    rows, next_cursor = [], None
    if form.is_valid():
        page, next_cursor = selectors.audit_commands_page(filters=form.filters(),
                                                          after=form.cleaned_data.get("after"),
                                                          limit=selectors.PAGE_ROWS)
        rows = [{**row, "task_url": _task_url(row["task_id"]), "requested_by": actor_shown(row["requested_by"]),
                 "actor_query": _actor_query(form, row["requested_by"]),
                 "reason": redact(row["reason"]), "payload": _shown(_json_text(row["payload"])),
                 "rejection": redact(str(row["rejection"])) if row["rejection"] is not None else ""}
                for row in page]
    return TemplateResponse(request, "admin/audit/commands.html", _context(
        request, "Audit: steering commands", form=form, rows=rows,
        next_query=_query(form, after=next_cursor.encode()) if next_cursor else "",
        first_query=_query(form), csv_url=reverse("audit:commands_csv") + "?" + _query(form),
        verify_query=_verify_query(row["task_id"] for row in rows)),
        status=200 if form.is_valid() else 400)


def _admin_model_name(label: str) -> str:
    try:
        return str(apps.get_model(label)._meta.verbose_name)
    except LookupError:
        return label


def admin_action_said(row: dict) -> str:
    """What a row records, as a sentence: "user:alice revoked api token “art_1a2b… (alice, acme)”"."""
    verb = ADMIN_VERBS.get(row["action"], f"ran “{row['action']}” on")
    return f"{row['actor']} {verb} {_admin_model_name(row['model'])} “{row['object_repr']}”"


def admin_actions_view(request):
    _require(request, access.Action.READ_AUDIT, ADMIN_ACTIONS)
    form = _filter_form(request, admin_action_types())
    rows, next_cursor = [], None
    if form.is_valid():
        page, next_cursor = selectors.audit_admin_actions_page(
            filters=form.filters(), after=form.cleaned_data.get("after"), limit=selectors.PAGE_ROWS)
        rows = [{**row, "actor": actor_shown(row["actor"]), "actor_query": _actor_query(form, row["actor"]),
                 "object_repr": redact(row["object_repr"]),
                 "message": redact(row["message"])} for row in page]
        rows = [{**row, "said": admin_action_said(row)} for row in rows]
    return TemplateResponse(request, "admin/audit/admin_actions.html", _context(
        request, "Audit: admin actions", form=form, rows=rows,
        next_query=_query(form, after=next_cursor.encode()) if next_cursor else "",
        first_query=_query(form), csv_url=reverse("audit:admin_actions_csv") + "?" + _query(form)),
        status=200 if form.is_valid() else 400)


def admin_action_types() -> list[str]:
    """The type filter's choices on the admin actions page: add, change, delete and every bulk action recorded."""
    names = set()
    for model_admin in admin.site._registry.values():
        names.update(getattr(model_admin, "audited_actions", ()))
        names.update(getattr(model_admin, "actions_recorded_by_services", ()))
    return ["add", "change", "delete", *sorted(names)]


def verify_view(request):
    """The chain state of the tasks named (?task=<id>, repeated): each reads its task's whole chain, so at most
    MAX_VERIFY_TASKS, and only when asked — never for a listing."""
    _require(request, access.Action.READ_AUDIT, "the chain verification of the audit trail")
    error = ""
    states = []
    try:
        task_ids = [uuid.UUID(value) for value in request.GET.getlist("task") if value]
    except ValueError:
        task_ids, error = [], "A task is named by its id (a UUID)."
    if len(task_ids) > selectors.MAX_VERIFY_TASKS:
        task_ids, error = [], (f"At most {selectors.MAX_VERIFY_TASKS} tasks at once: each verification reads the "
                               f"task's whole event chain.")
    if task_ids:  # (another tenant's is missing, as an unknown id is — tasks_app.access)
        seen = access.visible(access.actor_for_request(request), Task.objects.filter(id__in=task_ids))
        states = [{"state": state, "task_url": _task_url(state.task_id),
                   "events_query": urlencode({"task": state.task_id})}
                  for state in selectors.audit_chains_verify(task_ids=list(seen.values_list("id", flat=True)))]
        missing = len(task_ids) - len(states)
        if missing:
            error = f"{missing} of these tasks do not exist (any more)."
    return TemplateResponse(request, "admin/audit/verify.html", _context(
        request, "Audit: chain verification", states=states, error=error, task_ids=task_ids),
        status=400 if error and not states else 200)


# --- CSV ---


class _Echo:
    """csv.writer writes each row here and returns it: one line per row, for a streamed response."""

    def write(self, value: str) -> str:
        return value


def csv_cell(value) -> str:
    """A cell a spreadsheet shows as text: one starting like a formula gets a leading quote."""
    text = "" if value is None else value.isoformat() if hasattr(value, "isoformat") else str(value)
    return "'" + text if text.startswith(_FORMULA_START) else text


def _csv_lines(header: list[str], rows: Iterator[dict], cells: Callable[[dict], list]) -> Iterator[str]:
    writer = csv.writer(_Echo())
    yield writer.writerow(header)
    for row in rows:
        if "truncated" in row:
            yield writer.writerow([csv_cell(
                f"[truncated after {selectors.EXPORT_MAX_ROWS} rows: narrow the filter, or go on with "
                f"after={row['truncated'].encode()}]")])
            return
        yield writer.writerow([csv_cell(cell) for cell in cells(row)])


async def _async_chunks(lines: Iterator[str]):
    """Under ASGI Django would read a sync iterator to its end before sending a byte (holding the whole export in
    memory); this hands it over in chunks, each read on the request's thread (its database connection, where the
    export's server-side cursor is)."""
    iterator = iter(lines)
    next_chunk = sync_to_async(lambda: "".join(islice(iterator, 500)), thread_sensitive=True)
    try:
        while chunk := await next_chunk():
            yield chunk
    finally:  # the client went away mid-export: close the query's server-side cursor now, not at garbage collection
        await sync_to_async(iterator.close, thread_sensitive=True)()


def _csv_response(request, name: str, lines: Iterator[str]) -> HttpResponse:
    content = _async_chunks(lines) if isinstance(request, ASGIRequest) else lines
    response = StreamingHttpResponse(content, content_type="text/csv; charset=utf-8")
    stamp = timezone.now().strftime("%Y%m%dT%H%M%SZ")
    response["Content-Disposition"] = f'attachment; filename="audit-{name}-{stamp}.csv"'
    response["Cache-Control"] = "no-store"
    return response


def _csv_form_errors(form: AuditFilterForm) -> HttpResponse:
    errors = "; ".join(f"{field}: {' '.join(messages)}" if field != "__all__" else " ".join(messages)
                       for field, messages in form.errors.items())
    return HttpResponse(f"The filter is not valid: {errors}\n", status=400, content_type="text/plain; charset=utf-8")


EVENT_CSV_HEADER = ["at", "tenant", "task", "seq", "type", "actor", "data", "hash"]
ADMIN_ACTION_CSV_HEADER = ["at", "tenant", "actor", "action", "model", "object_id", "object", "message"]
COMMAND_CSV_HEADER = ["created_at", "tenant", "task", "command", "type", "status", "decided_at", "rejection",
                      "requested_by", "reason", "payload", "expected_version", "old_version", "new_version"]


def events_csv_view(request):
    _require(request, access.Action.EXPORT, EVENTS)
    form = _filter_form(request, list(EVENT_TYPES))
    if not form.is_valid():
        return _csv_form_errors(form)
    rows = selectors.audit_events_export(filters=form.filters(), after=form.cleaned_data.get("after"))
    return _csv_response(request, "events", _csv_lines(EVENT_CSV_HEADER, rows, lambda row: [
        row["at"], row["tenant"], row["task_id"], row["seq"], row["type"], actor_shown(row["actor"]),
        _json_text(row["data"]), row["hash"]]))


def commands_csv_view(request):
    _require(request, access.Action.EXPORT, COMMANDS)
    form = _filter_form(request, list(CommandType.values))
    if not form.is_valid():
        return _csv_form_errors(form)
    rows = selectors.audit_commands_export(filters=form.filters(), after=form.cleaned_data.get("after"))
    return _csv_response(request, "commands", _csv_lines(COMMAND_CSV_HEADER, rows, lambda row: [
        row["created_at"], row["tenant"], row["task_id"], row["id"], row["type"], row["status"], row["decided_at"],
        redact(str(row["rejection"])) if row["rejection"] is not None else "", actor_shown(row["requested_by"]),
        redact(row["reason"]), _json_text(row["payload"]), row["expected_version"], row["old_version"],
        row["new_version"]]))


def admin_actions_csv_view(request):
    _require(request, access.Action.EXPORT, ADMIN_ACTIONS)
    form = _filter_form(request, admin_action_types())
    if not form.is_valid():
        return _csv_form_errors(form)
    rows = selectors.audit_admin_actions_export(filters=form.filters(), after=form.cleaned_data.get("after"))
    return _csv_response(request, "admin-actions", _csv_lines(ADMIN_ACTION_CSV_HEADER, rows, lambda row: [
        row["at"], row["tenant"], actor_shown(row["actor"]), row["action"], row["model"], row["object_id"],
        redact(row["object_repr"]), redact(row["message"])]))
