"""Admin: the operators' console. Read-only tasks with their steps, events and effects, for operators and auditors
(steering_app's admin adds the steering history, the open wait and the forms to steer and answer).

Tasks change only through services (steering, the engine, recovery), never by editing rows here.

Pages (under admin/tasks_app/task/), each a thin view over tasks_app.web.console (reads) and tasks_app.engine.reaper:
- (the list)        live status and progress (static/console/list.js on the tenant-wide stream), filters, search;
- <id>/change/      the task page: a live progress bar, phase and event tail (static/console/task.js on the task's
                    stream), steps, checkpoints, the effect ledger, artifacts, the open wait;
- overview/         tasks per status, steps/s over the last minutes (inline SVG), recoveries, dead letters, the
                    lease reaper's schedule;
- dead-letters/     each dead letter's reason and effects of unknown outcome, with retry and abandon;
- <id>/retry/, <id>/abandon/   the two things an operator does with a dead letter.
Without JavaScript, or without the stream, every page is still correct as of when it was loaded.
"""

from dataclasses import dataclass
from datetime import datetime

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.admin.utils import unquote
from django.core.exceptions import PermissionDenied, ValidationError
from django.core.paginator import Paginator
from django.db.models import CharField
from django.db.models.functions import Cast
from django.db.models.lookups import EndsWith
from django.http import Http404, JsonResponse
from django.shortcuts import redirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html, format_html_join

from checkpoints_app.admin import CheckpointAdmin
from checkpoints_app.models import Checkpoint, EffectStatus, SideEffect
from config.base.admin_base import ReadOnlyAdmin
from config.base.problems import Problem
from tasks_app import access, events, forks, selectors
from tasks_app.db.dispatch import hint_queue_depth
from tasks_app.engine import dead_letters
from tasks_app.models import TERMINAL_STATUSES, ApiToken, Step, Task, TaskEvent, TaskStatus, Tenant, TenantMembership
from tasks_app.redaction import redact
from tasks_app.registry import registry
from tasks_app.services import api_token_revoke
from tasks_app.streaming import LIVE_ONLY_TYPES
from tasks_app.templatetags import console_time
from tasks_app.web import console
from tasks_app.web.admin_audit import AuditedAdmin, TenantScopedAdmin, audit_other_admins
from tasks_app.web.artifacts import ArtifactNotFound, artifact_response
from tasks_app.web.admin_limits import admin_rate_refusal
from tasks_app.web.authentication import requested_by_of
from tasks_app.web.outcome_form import OutcomeForm, database_now, open_effect_shown

# Retrying or abandoning a dead letter changes a task: here it needs the change permission, which the admin never
# uses to edit rows (ReadOnlyAdmin); steering_app's admin also lets steerers (operators) do it. view_task only reads.
OPERATE_PERMISSION = "tasks_app.change_task"
DEAD_LETTERS_PAGE_ROWS = 20
# The task page verifies the task's chain as it loads (one indexed read of its events) up to this many events.
VERIFY_ON_PAGE_MAX_EVENTS = 5000


class ExternalStatusFilter(admin.SimpleListFilter):
    """The status the API and MCP clients see (working, input_required, completed, failed, cancelled)."""

    title = "status (as clients see it)"
    parameter_name = "status"

    def lookups(self, request, model_admin):
        return [(status, status) for status in selectors.EXTERNAL_STATUSES]

    def queryset(self, request, queryset):
        if self.value() in selectors.EXTERNAL_STATUSES:
            return queryset.filter(status__in=selectors.internal_statuses_for(self.value()))
        return queryset


class InternalStatusFilter(admin.ChoicesFieldListFilter):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.title = "internal status"


def _pretty_json(value) -> str:
    """A JSON value for people: redacted, then pretty-printed (escaped by the template like any text)."""
    return console.pretty_json(value) or "null"


@admin.register(Task)
class TaskAdmin(TenantScopedAdmin, ReadOnlyAdmin):
    # Seven columns that fit a 1,366 px screen between the admin's app list and the filters
    # (tests/test_console_browser.py measures it): the tenant under the workflow, recoveries in the status cell when
    # there were any; the owner, lease and exact times are on the task page; the id is shortened (its title holds
    # it whole).
    list_display = ("short_id", "workflow", "live_status", "live_progress", "live_phase", "priority", "created")
    list_filter = (ExternalStatusFilter, ("status", InternalStatusFilter), "workflow_name", "tenant", "owner",
                   "priority", "created_at")
    # An id's prefix (what a person copies from a log line: "3f2a9c1e") is searched as a range of the primary key
    # (get_search_results); the goal is searched as text (a scan, like every icontains here).
    search_fields = ("workflow_name", "phase", "status_message", "goal", "idempotency_key", "lease_owner",
                     "owner__username")
    search_help_text = "An id or its first characters, or words of the goal, workflow, phase, status message or owner."
    date_hierarchy = "created_at"
    list_select_related = ("tenant", "owner")
    show_full_result_count = False  # COUNT(*) over millions of tasks is slow; the list does not need it
    actions = ["retry_dead_letters", "abandon_dead_letters"]
    # The JSON a task carries is shown redacted (shown_*), never as the raw column: input, answers and results
    # may hold whatever a client or a remote system sent.
    # The live panel above (templates/console/task_panel.html) shows status, progress and phase as they change;
    # the fields below are the row as it was when the page was rendered, for the record (their titles say so).
    fieldsets = [
        ("Task (as of page load)", {"fields": ("id", "tenant", "owner", "agent_identity", "workflow_name",
                                               "workflow_version",
                                               "status", "shown_status_message", "priority", "created_at",
                                               "updated_at", "completed_at", "deadline_at")}),
        ("Progress (as of page load)", {"fields": ("shown_progress", "phase", "steps_completed", "plan_version",
                                                   "plan_length", "next_step_index", "state_version",
                                                   "steering_cursor", "checkpoint_sequence", "checkpoint_at")}),
        ("Lease and recovery (as of page load)", {"fields": ("lease_owner", "lease_epoch", "lease_expires_at",
                                                             "hint_at", "recoveries", "recoveries_since_progress")}),
        ("Data (redacted)", {"fields": ("shown_input", "shown_goal", "shown_result", "result_ref", "shown_error",
                                        "shown_answers", "shown_policies", "shown_cost")}),
        ("History", {"fields": ("history",)}),
    ]
    readonly_fields = ("history", "shown_status_message", "shown_input", "shown_goal", "shown_result", "shown_error",
                       "shown_answers", "shown_policies", "shown_cost", "shown_progress")

    # "Your account may read tasks but not retry or abandon them" (config.base.admin_base.ExplainedRefusalsAdmin).
    permission_verbs = {"operate": "retry or abandon"}

    def has_operate_permission(self, request) -> bool:
        return request.user.has_perm(OPERATE_PERMISSION)

    def _require_view(self, request) -> None:
        if not self.has_view_permission(request):
            raise PermissionDenied(self.refusal(request, "read"))

    def _require_operate(self, request) -> None:
        self._require_view(request)
        if not self.has_operate_permission(request):
            raise PermissionDenied(self.refusal(request, "retry or abandon"))

    # --- the list: static/console/list.js finds the live cells by data-task-id and updates them ---

    def get_queryset(self, request):
        # The one access rule (tasks_app.access, through TenantScopedAdmin): staff without a tenant see every
        # tenant's tasks, a member only their tenant's.
        return console.with_status_since(super().get_queryset(request))

    def task_or_404(self, request, task_id) -> Task:
        """The task of a page, if the actor may see it: another tenant's is a 404, as an unknown id."""
        try:
            # (visibility only: what the page then allows is the page's own check, as before)
            return access.task_visible(access.actor_for_request(request), task_id)
        except (access.AccessNotFound, ValidationError):
            raise Http404("No such task.") from None

    def get_search_results(self, request, queryset, search_term):
        found, may_have_duplicates = super().get_search_results(request, queryset, search_term)
        term = search_term.strip().lower()
        bounds = selectors.task_id_prefix_bounds(term)
        if bounds is not None:
            found = found | queryset.filter(id__gte=bounds[0], id__lte=bounds[1])
            # …or its end, as the list shows it (a version-7 id starts with its creation time: tasks made in the same
            # minute share their first eight digits, so the list shows the random end too).
            found = found | queryset.filter(EndsWith(Cast("id", CharField()), term))
        return found, may_have_duplicates

    @admin.display(description="task", ordering="id")
    def short_id(self, task):
        text = str(task.id)
        return format_html('<code title="{}">{}…{}</code>', text, text[:13], text[-4:])

    @admin.display(description="workflow", ordering="workflow_name")
    def workflow(self, task):
        return format_html('{}<br><small class="console-steps">{}</small>', task.workflow_name, task.tenant)

    @admin.display(description="status", ordering="status")
    def live_status(self, task):
        shown = console.status_shown(status=task.status, message=task.status_message, wait=task.wait)
        since = getattr(task, "status_since", None)
        age = format_html(' <time class="console-age" datetime="{}" title="in this status since {}" data-age>{}</time>',
                          since.isoformat(), console_time.time_text(since),
                          console_time.age_text((task.read_at - since).total_seconds())) if since else ""
        recovered = format_html('<br><small class="console-steps">recovered {}×</small>', task.recoveries) \
            if task.recoveries else ""
        return format_html('<span class="console-status" data-task-id="{}" title="{}"><span class="console-badge {}">'
                           '{}</span>{}</span>{}', task.id, redact(task.status_message), shown["css"], shown["label"],
                           age, recovered)

    @admin.display(description="progress", ordering="progress")
    def live_progress(self, task):
        steps = f"{task.steps_completed} of {task.plan_length}" if task.plan_length else f"{task.steps_completed}"
        return format_html('<span class="console-progress" data-task-id="{}"><progress max="1" value="{}"></progress> '
                           '<span class="console-percent">{}%</span> <small class="console-steps">{} steps</small>'
                           '</span>', task.id, task.progress, console.percent_of(task.progress), steps)

    @admin.display(description="phase", ordering="phase")
    def live_phase(self, task):
        return format_html('<span class="console-phase" data-task-id="{}">{}</span>', task.id, task.phase)

    @admin.display(description="created", ordering="created_at")
    def created(self, task):
        age = console_time.age_text((task.read_at - task.created_at).total_seconds()) if hasattr(task, "read_at") \
            else ""
        return format_html('<time class="console-age" datetime="{}" title="{}" data-age data-suffix=" ago">{} ago'
                           '</time>', task.created_at.isoformat(), console_time.time_text(task.created_at), age)

    # --- the task page's redacted values ---

    @admin.display(description="status message")
    def shown_status_message(self, task):
        return redact(task.status_message)

    @admin.display(description="input")
    def shown_input(self, task):
        return format_html("<pre>{}</pre>", _pretty_json(task.input))

    @admin.display(description="goal")
    def shown_goal(self, task):
        if isinstance(task.goal, str):  # a goal in words reads as words (wrapped), not as a quoted JSON string
            return format_html('<p class="console-goal">{}</p>', redact(task.goal))
        return format_html("<pre>{}</pre>", _pretty_json(task.goal))

    @admin.display(description="result")
    def shown_result(self, task):
        return format_html("<pre>{}</pre>", _pretty_json(task.result))

    @admin.display(description="error")
    def shown_error(self, task):
        # A traceback is text with line breaks: shown as such, not as one JSON string full of \n.
        error = dict(task.error) if isinstance(task.error, dict) else task.error
        trace = error.pop("traceback", None) if isinstance(error, dict) else None
        shown = format_html("<pre>{}</pre>", _pretty_json(error))
        if isinstance(trace, str) and trace:
            shown += format_html('<p>Traceback (the last frames):</p><pre class="console-trace">{}</pre>',
                                 redact(trace))
        return shown

    @admin.display(description="cost and tokens")
    def shown_cost(self, task):
        spent = f"{task.cost_spent:,.4f}"
        budget = f" of a budget of {task.budget_cost:,.4f}" if task.budget_cost is not None else " (no cost budget)"
        tokens = f"; {task.tokens_spent:,} tokens used" + (f" of {task.budget_tokens:,}" if task.budget_tokens
                                                            is not None else " (no token budget)")
        steps = f"; at most {task.budget_steps:,} steps" if task.budget_steps is not None else ""
        return f"{spent} spent{budget}{tokens}{steps}"

    @admin.display(description="progress")
    def shown_progress(self, task):
        return f"{console.percent_of(task.progress)}%"

    @admin.display(description="answers to waits")
    def shown_answers(self, task):
        return format_html("<pre>{}</pre>", _pretty_json(task.answers))

    @admin.display(description="policies")
    def shown_policies(self, task):
        return format_html("<pre>{}</pre>", _pretty_json({"approvalPolicy": task.approval_policy,
                                                          "checkpointPolicy": task.checkpoint_policy,
                                                          "toolPolicy": task.tool_policy}))

    @admin.display(description="History")
    def history(self, task):
        # Links to paged tables rather than inlines: a long task has many thousands of steps and events.
        links = [(reverse("admin:tasks_app_task_history", args=[task.id, kind]), table.label)
                 for kind, table in HISTORY_TABLES.items()]
        links.append((reverse("admin:checkpoints_app_checkpoint_changelist") + f"?task__id__exact={task.id}",
                      "Checkpoints"))
        links.append((reverse("admin:tasks_app_task_artifacts", args=[task.id]), "Artifacts"))
        # (Retry and abandon are offered by the console panel's dead-letter box, to an account that may.)
        return format_html_join(" · ", '<a href="{}">{}</a>', links)

    def get_urls(self):
        return [path("overview/", self.admin_site.admin_view(self.overview_view), name="tasks_app_task_overview"),
                path("dead-letters/", self.admin_site.admin_view(self.dead_letters_view),
                     name="tasks_app_task_dead_letters"),
                path("<uuid:task_id>/abandon/", self.admin_site.admin_view(self.abandon_view),
                     name="tasks_app_task_abandon"),
                path("<uuid:task_id>/retry/", self.admin_site.admin_view(self.retry_view),
                     name="tasks_app_task_retry"),
                path("<uuid:task_id>/fork/", self.admin_site.admin_view(self.fork_view), name="tasks_app_task_fork"),
                path("<uuid:task_id>/history/<slug:kind>/", self.admin_site.admin_view(self.task_history_view),
                     name="tasks_app_task_history"),
                path("<uuid:task_id>/snapshot/", self.admin_site.admin_view(self.snapshot_view),
                     name="tasks_app_task_snapshot"),
                path("<uuid:task_id>/panel/", self.admin_site.admin_view(self.panel_view),
                     name="tasks_app_task_panel"),
                path("<uuid:task_id>/artifacts/", self.admin_site.admin_view(self.artifacts_view),
                     name="tasks_app_task_artifacts"),
                path("<uuid:task_id>/artifacts/<str:name>", self.admin_site.admin_view(self.artifact_view),
                     name="tasks_app_task_artifact"),
                *super().get_urls()]

    # --- the task page ---

    def changelist_view(self, request, extra_context=None):
        return super().changelist_view(request, {**(extra_context or {}), **self._console_links()})

    def change_view(self, request, object_id, form_url="", extra_context=None):
        task = self.get_object(request, unquote(object_id))
        if task is not None and self.has_view_permission(request, task):
            extra_context = {**(extra_context or {}), "console": self.console_context(request, task),
                             **self._console_links()}
        return super().change_view(request, object_id, form_url, extra_context)

    def console_context(self, request, task: Task) -> dict:
        """What the task page's console panel shows, as of now; its JS keeps the live parts (status, progress,
        phase, event tail) current from the task's stream. steering_app's admin adds the steering part."""
        artifacts = [{**artifact, "url": reverse("admin:tasks_app_task_artifact", args=[task.id, artifact["name"]])}
                     for artifact in selectors.task_artifacts(task_id=task.id).values()]
        dead_letter = None
        if task.status == TaskStatus.DEAD_LETTERED:
            dead_letter = console.dead_letter_rows([task])[0]
        steps = console.task_recent_steps(task=task)
        since = console.with_status_since(Task.objects.filter(id=task.id)).values("status_since", "read_at").first()
        return {
            "task": task,
            "shown": console.status_shown(status=task.status, message=task.status_message, wait=task.wait),
            "status_since": since and since["status_since"],
            "status_message": redact(task.status_message or selectors.DEFAULT_STATUS_MESSAGE[TaskStatus(task.status)]),
            "event_types": events.EVENT_TYPES,
            "live_types": sorted(LIVE_ONLY_TYPES),  # (never stored: no seq; task.js shows them as they come)
            "timeline": console.step_timeline(steps),
            "panel_url": reverse("admin:tasks_app_task_panel", args=[task.id]),
            "percent": console.percent_of(task.progress),
            "terminal": task.status in TERMINAL_STATUSES,
            # The stream and the snapshot the JS reads; the same paths the REST snapshot names (streamUrl, statusUrl).
            "stream_url": f"/runtime/tasks/{task.id}/events",
            "snapshot_url": reverse("admin:tasks_app_task_snapshot", args=[task.id]),
            "artifact_url_prefix": reverse("admin:tasks_app_task_artifacts", args=[task.id]),
            "events": console.task_event_tail(task=task),
            "steps": steps,
            "checkpoints": console.task_recent_checkpoints(task=task),
            "effects": console.task_recent_effects(task=task),
            "tool_calls": console.task_tool_calls(task=task),
            "wait": console.task_open_wait(task=task),
            "artifacts": artifacts,
            "dead_letter": dead_letter,
            "may_operate": self.has_operate_permission(request),
            "history_urls": {kind: reverse("admin:tasks_app_task_history", args=[task.id, kind])
                             for kind in HISTORY_TABLES},
            "checkpoints_url": reverse("admin:checkpoints_app_checkpoint_changelist") + f"?task__id__exact={task.id}",
            "lineage": forks.fork_lineage(task),
            "repeats": forks.fork_repeats(task),
            "fork_url": reverse("admin:tasks_app_task_fork", args=[task.id]),
            # verified / broken at seq N / sealed up to seq M; a chain too long to walk per page view is left to
            # verify_events (the page says so).
            "verification": (selectors.task_verification(task) if task.event_seq <= VERIFY_ON_PAGE_MAX_EVENTS
                             else None),
        }

    def _console_links(self) -> dict:
        return {"console_links": {"overview": reverse("admin:tasks_app_task_overview"),
                                  "dead_letters": reverse("admin:tasks_app_task_dead_letters")}}

    # --- the overview and the dead letters ---

    def overview_view(self, request):
        """Tasks per status, steps/s over the last minutes, recent recoveries, dead letters, the reaper's schedule."""
        self._require_view(request)
        # The one access rule (tasks_app.access): counts, waits and recoveries of the tasks the actor sees — a
        # tenant's member its tenant's. The fleet's figures (steps/s of every tenant, the broker's queue) are the
        # deployment's, shown to staff of no tenant only: to a tenant they would tell other tenants' load.
        actor = access.actor_for_request(request)
        counts = console.task_counts_by_status(actor=actor)
        fleet = actor.every_tenant
        reaper = console.reaper_schedule()
        return TemplateResponse(request, "admin/tasks_app/task/overview.html", {
            **self.admin_site.each_context(request), **self._console_links(), "title": "Runtime overview",
            "opts": self.model._meta, "counts": status_bars(counts), "total": sum(counts.values()),
            "fleet": fleet, "chart": throughput_chart(console.steps_throughput()) if fleet else None,
            "recoveries": console.recent_recoveries(actor=actor),
            # (what /metrics also reports, read by the same functions)
            "waits": console.waits_open(actor=actor), "queue_depth": hint_queue_depth() if fleet else None,
            "dead_letter_count": counts[TaskStatus.DEAD_LETTERED],
            # (linked only for an account that may open the schedule: an auditor reads it here, on this page)
            "reaper": reaper, "reaper_url": reaper and request.user.has_perm("django_celery_beat.view_periodictask")
            and reverse("admin:django_celery_beat_periodictask_change", args=[reaper.pk])})

    def dead_letters_view(self, request):
        """Each dead letter with why it stopped and the effects nobody knows the outcome of; retry or abandon."""
        self._require_view(request)
        page = Paginator(dead_letters.dead_letters(actor=access.actor_for_request(request)),
                         DEAD_LETTERS_PAGE_ROWS).get_page(request.GET.get("page"))
        return TemplateResponse(request, "admin/tasks_app/task/dead_letters.html", {
            **self.admin_site.each_context(request), **self._console_links(), "title": "Dead letters",
            "opts": self.model._meta, "page": page, "rows": console.dead_letter_rows(page),
            "may_operate": self.has_operate_permission(request),
            "bulk_url": reverse("admin:tasks_app_task_changelist") + f"?status__exact={TaskStatus.DEAD_LETTERED}"})

    def abandon_view(self, request, task_id):
        """Abandon one dead letter (it fails, keeping the dead-letter reason), after a confirmation page."""
        self._require_operate(request)
        task = self.task_or_404(request, task_id)
        reason = request.POST.get("reason", "").strip()[:500]
        if request.method == "POST" and not reason:
            self.message_user(request, "Say why you abandon it: the reason is kept in its error and the audit trail.",
                              level=messages.WARNING)
        elif request.method == "POST":
            try:
                dead_letters.dead_letter_abandon(task_id=task.id, requested_by=requested_by_of(request),
                                                 reason=reason)
            except dead_letters.DeadLetterError as error:
                self.message_user(request, str(error), level=messages.WARNING)
            else:
                self.message_user(request, f"Abandoned {task.id}: it is failed now.", level=messages.SUCCESS)
            return redirect("admin:tasks_app_task_dead_letters")
        return TemplateResponse(request, "admin/tasks_app/task/abandon.html", {
            **self.admin_site.each_context(request), "title": f"Abandon {task}", "task": task,
            "opts": self.model._meta, "reason": console.dead_letter_reason(task)})

    def fork_view(self, request, task_id):
        """Fork the task from a step (tasks_app.forks): a form for the step (or the agent's turn) and, if it is to
        change, the goal; on POST the fork is made and its page opens. Forking a running task needs no pause."""
        self._require_operate(request)
        task = self.task_or_404(request, task_id)
        form = {"from_step": request.POST.get("from_step", "").strip(), "from_turn": request.POST.get("from_turn", "")
                .strip(), "goal": request.POST.get("goal", "")}
        error = None
        if request.method == "POST":
            # A fork creates a task: counted as the REST fork is (the person's and the tenant's create limits).
            refused = admin_rate_refusal(request, "create", tenant=task.tenant)
            if refused is not None:
                return refused
            try:
                step = int(form["from_step"]) if form["from_step"] else None
                turn = int(form["from_turn"]) if form["from_turn"] else None
                goal = {"goal": form["goal"].strip()} if form["goal"].strip() else {}
                fork = forks.fork_create(original=task, owner=request.user, actor=requested_by_of(request),
                                         from_step=step, from_turn=turn, **goal)
            except ValueError:
                error = "The step and the turn are whole numbers."
            except Problem as refused:
                error = str(refused.detail)
            else:
                self.message_user(request, f"Forked {task.id} at step {fork.forked_from_step}: this is the fork.",
                                  level=messages.SUCCESS)
                return redirect("admin:tasks_app_task_change", fork.id)
        return TemplateResponse(request, "admin/tasks_app/task/fork.html", {
            **self.admin_site.each_context(request), "title": f"Fork {task}", "task": task, "form": form,
            "error": error, "opts": self.model._meta,
            "turns": getattr(registry.get(task.workflow_name), "turn_step", None)
            if task.workflow_name in registry.names() else None})

    def task_history_view(self, request, task_id, kind):
        """One task's steps, events or effects, in order, a page at a time, filtered by status or type.

        (Not named history_view: that is Django's page of an object's admin changes, <id>/history/, which a method
        of that name here once replaced — a 500 for every task.)

        Served here rather than by admin classes of their own: those rows are keyed by (task, seq), a composite
        primary key, which Django's admin does not register."""
        table = HISTORY_TABLES.get(kind)
        if table is None or not self.has_view_permission(request):
            raise Http404("No such history table.")
        task = self.task_or_404(request, task_id)
        choice = {name: request.GET[name] for name in table.filters if request.GET.get(name)}
        rows = table.model.objects.filter(task_id=task.id, **choice).order_by(*table.order)
        page = Paginator(rows.values(*table.columns), HISTORY_PAGE_ROWS).get_page(request.GET.get("page"))
        filters = [(name, [(value, value == choice.get(name)) for value in values])
                   for name, values in table.filters.items()]
        columns = [*table.columns, *(("what",) if kind == "events" else ())]
        return TemplateResponse(request, "admin/tasks_app/task/history.html", {
            **self.admin_site.each_context(request), "title": f"{table.label} of {task}", "task": task,
            "opts": self.model._meta, "columns": columns, "page": page, "filters": filters, "chosen": choice,
            "rows": [history_cells(row, kind=kind) for row in page]})

    def snapshot_view(self, request, task_id):
        """The task's snapshot for the console's live page, for staff who may view tasks — of any tenant, as the admin
        shows every task. (The REST snapshot is a tenant's: an operator or auditor who belongs to no tenant got a 403
        there, and the page then never learned the current version.)"""
        if not self.has_view_permission(request):
            raise Http404("No such task.")
        task = self.task_or_404(request, task_id)
        return JsonResponse(selectors.task_snapshot(task, url_for=request.build_absolute_uri))

    def panel_view(self, request, task_id):
        """The task page's console panel alone, as of now: task.js re-reads it (at most every couple of seconds,
        when events say something changed) and swaps in its live parts — steps, timeline, ledger, checkpoints,
        artifacts, the open wait, the steering history — so the page is live throughout, rendered by the one
        template that renders it at load. Never the steering form: it keeps the version the person saw."""
        if not self.has_view_permission(request):
            raise Http404("No such task.")
        task = self.task_or_404(request, task_id)
        return TemplateResponse(request, "console/task_panel.html", {"console": self.console_context(request, task)})

    def artifact_view(self, request, task_id, name):
        """One artifact's file, for an operator (of any tenant, as the admin shows every task)."""
        if not self.has_view_permission(request):
            raise Http404("No such task.")
        task = self.task_or_404(request, task_id)
        try:
            return artifact_response(task_id=task.id, name=name)
        except ArtifactNotFound as missing:
            raise Http404(str(missing)) from None

    def artifacts_view(self, request, task_id):
        """The files the task's committed steps wrote, each linked to its download."""
        if not self.has_view_permission(request):
            raise Http404("No such task.")
        task = self.task_or_404(request, task_id)
        artifacts = [{**artifact, "url": reverse("admin:tasks_app_task_artifact", args=[task.id, artifact["name"]])}
                     for artifact in selectors.task_artifacts(task_id=task.id).values()]
        return TemplateResponse(request, "admin/tasks_app/task/artifacts.html", {
            **self.admin_site.each_context(request), "title": f"Artifacts of {task}", "task": task,
            "opts": self.model._meta, "artifacts": artifacts})

    def retry_view(self, request, task_id):
        """Retry one dead letter, with the operator's answer for each effect of unknown outcome."""
        self._require_operate(request)
        task = self.task_or_404(request, task_id)
        open_effects = dead_letters.dead_letter_open_effects(task_id=task.id)
        # (request.POST itself is falsy when a dead letter with no open effect is retried: the form has no field)
        form = EffectAnswersForm(request.POST if request.method == "POST" else None, effects=open_effects,
                                 now=database_now() if open_effects else None)
        if request.method == "POST" and form.is_valid():
            try:
                if form.abandons():
                    dead_letters.dead_letter_abandon(task_id=task.id, requested_by=requested_by_of(request),
                                                     reason=form.cleaned_data.get("reason", ""))
                    self.message_user(request, "Abandoned: the task failed.", level=messages.SUCCESS)
                    return redirect("admin:tasks_app_task_change", task.id)
                dead_letters.dead_letter_retry(task_id=task.id, answers=form.answers(),
                                               requested_by=requested_by_of(request),
                                               reason=form.cleaned_data.get("reason", ""))
            except dead_letters.DeadLetterError as error:
                self.message_user(request, str(error), level=messages.WARNING)
            else:
                self.message_user(request, "Retried: a worker resumes it from its last good checkpoint.",
                                  level=messages.SUCCESS)
                return redirect("admin:tasks_app_task_change", task.id)
        return TemplateResponse(request, "admin/tasks_app/task/dead_letter_retry.html", {
            **self.admin_site.each_context(request), "title": f"Retry {task}", "task": task, "form": form,
            "opts": self.model._meta, "open_effects": open_effects, "reason": console.dead_letter_reason(task)})

    @admin.action(description="Retry dead-lettered tasks from their last good checkpoint (no open effects)",
                  permissions=["operate"])
    def retry_dead_letters(self, request, queryset):
        for task_id in queryset.values_list("id", flat=True):
            if dead_letters.dead_letter_open_effects(task_id=task_id):
                url = reverse("admin:tasks_app_task_retry", args=[task_id])
                self.message_user(request, format_html(
                    'Task {} has effects with unknown outcome: <a href="{}">answer each one, then retry</a>.',
                    task_id, url), level=messages.WARNING)
                queryset = queryset.exclude(id=task_id)
        self._each_dead_letter(request, queryset, lambda task_id: dead_letters.dead_letter_retry(
            task_id=task_id, requested_by=requested_by_of(request), reason="a bulk action of the task list"), "retried")

    @admin.action(description="Abandon dead-lettered tasks (mark them failed)", permissions=["operate"])
    def abandon_dead_letters(self, request, queryset):
        self._each_dead_letter(request, queryset, lambda task_id: dead_letters.dead_letter_abandon(
            task_id=task_id, requested_by=requested_by_of(request), reason="a bulk action of the task list"),
            "abandoned")

    def _each_dead_letter(self, request, queryset, operation, verb):
        done = 0
        for task_id in queryset.values_list("id", flat=True):
            try:
                operation(task_id)
                done += 1
            except dead_letters.DeadLetterError as error:
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


def history_cells(row: dict, *, kind: str) -> list[dict]:
    """One history row for people: times as the console writes them, JSON redacted and folded (<details>), and
    for an event, its line (the task page's wording) after its data."""
    cells = []
    for column, value in row.items():
        if isinstance(value, datetime):
            cells.append({"time": value})
        elif isinstance(value, (dict, list)):
            cells.append({"json": console.pretty_json(value), "summary": console.json_summary(value)})
        else:
            cells.append({"text": "" if value is None else value})
    if kind == "events":
        cells.append({"text": console.event_summary(row["type"], row["data"])})
    return cells


HISTORY_PAGE_ROWS = 100
HISTORY_TABLES = {
    "steps": HistoryTable("Steps", Step, ("seq", "name", "status", "attempt", "plan_version", "lease_epoch",
                                          "started_at", "finished_at"), ("seq",),
                          {"status": tuple(Step.Status.values)}),
    "events": HistoryTable("Events", TaskEvent, ("seq", "type", "at", "data", "hash"), ("seq",),
                           {"type": events.EVENT_TYPES}),
    "effects": HistoryTable("Side effects", SideEffect, ("step_seq", "name", "key", "status", "attempts",
                                                         "lease_epoch", "started_at", "finished_at"),
                            ("step_seq", "key"), {"status": tuple(EffectStatus.values)}),
}


def status_bars(counts: dict[str, int]) -> list[dict]:
    """The overview's tasks-per-status rows, each with its bar's share of the largest count (0–100)."""
    largest = max(counts.values(), default=0) or 1
    return [{"status": status, "count": count, "percent": round(100 * count / largest)}
            for status, count in counts.items()]


CHART_WIDTH, CHART_HEIGHT, CHART_LEFT, CHART_BOTTOM = 640, 180, 48, 22


def throughput_chart(throughput: console.Throughput) -> dict:
    """The geometry of the overview's steps/s bar chart, drawn as inline SVG by the template (no script, no
    library): one bar per minute, the y axis from 0 to the busiest minute."""
    rates = throughput.per_second
    top = max(rates, default=0) or 1
    plot_width, plot_height = CHART_WIDTH - CHART_LEFT, CHART_HEIGHT - CHART_BOTTOM
    slot = plot_width / max(len(rates), 1)
    bars = []
    for number, (minute, rate) in enumerate(zip(throughput.minutes, rates)):
        height = plot_height * rate / top
        bars.append({"x": round(CHART_LEFT + number * slot + 1, 1), "y": round(plot_height - height, 1),
                     "width": round(max(slot - 2, 1), 1), "height": round(height, 1), "rate": round(rate, 2),
                     "steps": throughput.steps[number], "minute": minute,
                     "label": minute.strftime("%H:%M") if number % 5 == 0 or number == len(rates) - 1 else ""})
    return {"width": CHART_WIDTH, "height": CHART_HEIGHT, "left": CHART_LEFT, "plot_height": plot_height,
            "label_y": CHART_HEIGHT - 6, "top": round(top, 2), "bars": bars,
            "now": round(rates[-1], 2) if rates else 0, "total": sum(throughput.steps)}


class EffectAnswersForm(forms.Form):
    """A dead letter's retry: for each effect of unknown outcome the one "did this happen?" form (outcome_form.
    OutcomeForm, the task page's too: the facts, no answer chosen), and one reason for them all, kept in the audit
    trail with the retry (or the abandon: abandon as any effect's answer gives the task up)."""

    reason = forms.CharField(required=False, max_length=500, help_text="Why (kept in the audit trail)")

    def __init__(self, data=None, *, effects, now=None):
        super().__init__(data)
        self.effects = effects
        self.outcome_forms = [OutcomeForm(data, effect=open_effect_shown(effect, now=now), number=number)
                              for number, effect in enumerate(effects)]

    def is_valid(self) -> bool:
        return all([super().is_valid(), *(form.is_valid() for form in self.outcome_forms)])

    def abandons(self) -> bool:
        return any(form.cleaned_data["outcome"] == "abandon" for form in self.outcome_forms)

    def answers(self) -> dict[str, dead_letters.EffectAnswer]:
        return {effect.key: dead_letters.EffectAnswer(applied=form.cleaned_data["outcome"] == "applied",
                                                      result=form.cleaned_data.get("result"))
                for effect, form in zip(self.effects, self.outcome_forms)}


@admin.register(Tenant)
class TenantAdmin(AuditedAdmin):
    list_display = ("slug", "name", "workflows", "max_running_tasks", "max_stored_tasks", "created_at")
    search_fields = ("slug", "name")
    fieldsets = (
        (None, {"fields": ("slug", "name", "workflows")}),
        ("Quotas and rate limits", {
            "fields": ("max_running_tasks", "max_stored_tasks", "create_rate_limit", "steer_rate_limit"),
            "description": "Empty: no limit of the tenant's own (docs/quotas.md). A running cap takes effect at the "
                           "next claim; a stored cap at the next create; a rate at the next request. The rates are "
                           "per person (an account: its session and all its tokens together); the tenant as a whole "
                           "is held to the deployment's RATE_LIMIT_TENANT_CREATE / RATE_LIMIT_TENANT_STEER besides."}),
    )
    # The rate fields' help as it is now (the model's still says "per token or user": a help text, not worth a
    # migration of its own).
    RATE_HELP = {"create_rate_limit": "Task creations per person (their session and tokens together), e.g. "
                                      "\"60/minute\"; \"off\" for none; empty: the deployment's RATE_LIMIT_CREATE.",
                 "steer_rate_limit": "Steering commands and cancels per person (their session and tokens together), "
                                     "e.g. \"120/minute\"; \"off\" for none; empty: the deployment's "
                                     "RATE_LIMIT_STEER."}

    def formfield_for_dbfield(self, db_field, request, **kwargs):
        field = super().formfield_for_dbfield(db_field, request, **kwargs)
        if field is not None and db_field.name in self.RATE_HELP:
            field.help_text = self.RATE_HELP[db_field.name]
        return field


@admin.register(TenantMembership)
class TenantMembershipAdmin(AuditedAdmin):
    list_display = ("user", "tenant", "created_at")
    list_filter = ("tenant",)
    search_fields = ("user__username", "tenant__slug")
    raw_id_fields = ("user",)
    # created_at is the database's (db_default): shown, never typed (a required field here made adding impossible).
    fields = ("user", "tenant", "created_at")
    readonly_fields = ("created_at",)
    rule_action = access.Action.MANAGE_MEMBERS


@admin.register(ApiToken)
class ApiTokenAdmin(AuditedAdmin):
    """Tokens are created with `manage.py create_api_token` (the raw value is shown once); here, only revoked.

    Nothing of a token is editable here: a cleared revoked_at would bring a revoked token back. Its hash is not
    shown (nothing needs it, and a hash can be tried against guesses)."""

    list_display = ("prefix", "name", "user", "tenant", "scopes", "created_at", "revoked_at")
    list_filter = ("tenant", "revoked_at")
    search_fields = ("prefix", "name", "user__username")
    fields = ("prefix", "name", "user", "tenant", "scopes", "created_at", "revoked_at")
    readonly_fields = fields
    actions = ["revoke"]
    actions_recorded_by_services = ("revoke",)  # api_token_revoke records each revocation
    rule_action = access.Action.MANAGE_TOKENS  # (revoke needs "change": so the rule too)

    def has_add_permission(self, request):
        return False

    # Without `permissions`, Django offers an action to whoever may view the list: a read-only staff account could
    # revoke every token of the deployment.
    @admin.action(description="Revoke selected tokens", permissions=["change"])
    def revoke(self, request, queryset):
        revoked = 0
        for token in queryset:
            if api_token_revoke(token=token, revoked_by=requested_by_of(request)):
                revoked += 1
                # The admin's own object history (LogEntry); the audit trail's record is the service's.
                LogEntry.objects.log_actions(user_id=request.user.pk, queryset=[token], action_flag=CHANGE,
                                             change_message="Revoked", single_object=True)
        already = queryset.count() - revoked
        self.message_user(request, f"Revoked {revoked} token(s): each is refused from its next request."
                          + (f" {already} had been revoked already." if already else ""),
                          level=messages.SUCCESS if revoked else messages.WARNING)


# Checkpoints (checkpoints_app, below the access rule) are a task's: registered again under the rule, as the task's
# admin is — a tenant's viewer listed every tenant's checkpoints and their task ids.
admin.site.unregister(Checkpoint)
admin.site.register(Checkpoint, type("TenantCheckpointAdmin", (TenantScopedAdmin, CheckpointAdmin),
                                     {"__module__": __name__}))

# Every other admin of the deployment that writes (accounts, groups, the beat schedules) is audited too.
audit_other_admins(admin.site)
