"""Steering in the operators' console: the task page gains its steering history, its open wait and forms to steer it.

tasks_app's admin does not know steering (dependencies point down), so this module re-registers the task's admin
with these additions. On the task page (the console panel) it adds the steering part: the open wait, pause / resume
/ cancel buttons that post to steer/ with a reason, links to the other steering pages and the history.

Every command goes through steering_app.services, as from the API; a stale version or a command that does not
apply is shown as a message on the page, never as a server error.

Pages (under admin/tasks_app/task/<id>/):
- steer/       pause, resume, cancel, set_priority, kill (the generic commands, which need no form of their own);
- steer/goal/  adjust_goal: a new goal and the workflow's goal parameters, a form built from their JSON Schema;
- steer/wait/  the open wait: provide_input (a form built from the wait's JSON Schema) or approve / reject (a budget
               wait: the budget page);
- steer/budget/ set_budget: the task's budgets beside what it used, and a form to raise (or lower, or remove) them.

The forms built from a JSON Schema check types (a number must be a number) and the bounds Django can state
(min/max length and value), so most typos are answered at once; the schema itself is checked by the service, the
one authority, whose 422 errors are put back on the fields they name.
"""

from __future__ import annotations

import base64
import json
import re
from typing import Any
from urllib.parse import urlencode

from django import forms
from django.conf import settings
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.shortcuts import redirect
from django.template.response import TemplateResponse
from django.urls import path, reverse

from config.base.json_input import MALFORMED, JsonInputError, bounded_copy, loads
from config.base.problems import Problem
from steering_app import selectors, services, validation
from steering_app.errors import VersionConflict
from steering_app.models import CommandType
from steering_app.schema_forms import attach_problem_errors, choice_key, schema_form, schema_form_value
from tasks_app import access
from tasks_app.admin import TaskAdmin
from tasks_app.audit.actors import actor_shown
from tasks_app.engine import waits
from tasks_app.errors import RateLimited
from tasks_app.models import BUDGET_MAX_TOKENS, TERMINAL_STATUSES, Task, TaskStatus
from tasks_app.redaction import redact
from tasks_app.registry import UnknownWorkflow, budget_policy, goal_parameters, registry
from tasks_app.selectors import task_artifacts
from tasks_app.templatetags.console_time import time_text
from tasks_app.web.admin_limits import admin_rate_refusal
from tasks_app.web.outcome_form import OutcomeForm, is_outcome_question
from tasks_app.web.authentication import rate_limit_check, requested_by_of
from tasks_app.web.console import task_budget_rows

STEER_PERMISSION = access.STEER_PERMISSION  # (what the steer action needs: tasks_app.access.RULES)
NOT_ALLOWED = "Your account may read tasks but not steer them."
# The commands of the generic form: the others carry a payload with a form of its own (adjust_goal, the answers).
GENERIC_COMMANDS = (CommandType.PAUSE, CommandType.RESUME, CommandType.CANCEL, CommandType.SET_PRIORITY,
                    CommandType.KILL)
# The task page's buttons, each offered in the statuses steering accepts it in (validation.refuse_for_status).
# The service stays the authority: a button a page shows out of date gets the service's refusal as a message.
QUICK_COMMANDS = (
    (CommandType.PAUSE, "Pause", (TaskStatus.QUEUED, TaskStatus.WORKING, TaskStatus.RECOVERING,
                                  TaskStatus.INPUT_REQUIRED)),
    (CommandType.RESUME, "Resume", (TaskStatus.PAUSED,)),
    (CommandType.CANCEL, "Cancel", (TaskStatus.QUEUED, TaskStatus.WORKING, TaskStatus.RECOVERING,
                                    TaskStatus.INPUT_REQUIRED, TaskStatus.PAUSING, TaskStatus.PAUSED)),
)
# The statuses a task takes commands in (validation.refuse_for_status refuses every command in the others).
STEERABLE_STATUSES = tuple(status for status in TaskStatus.values
                           if status not in TERMINAL_STATUSES and status != TaskStatus.DEAD_LETTERED)
# How many commands the task page lists (the steer page lists them all).
HISTORY_ON_TASK_PAGE = 10
# A file name the service accepts (steering_app.validation._FILE_NAME); an upload's name is made to fit.
_FILE_NAME_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


class ReasonForm(forms.Form):
    reason = forms.CharField(max_length=500, help_text="Kept with each command and in each task's audit trail")


class SteerForm(forms.Form):
    type = forms.ChoiceField(choices=[(t.value, t.label) for t in GENERIC_COMMANDS])
    priority = forms.IntegerField(min_value=0, max_value=9, required=False, help_text="For set_priority: 0–9")
    reason = forms.CharField(max_length=500, help_text="Kept with the command and in the task's audit trail")
    expected_version = forms.IntegerField(widget=forms.HiddenInput)

    def clean(self):
        data = super().clean()
        if data.get("type") == CommandType.SET_PRIORITY and data.get("priority") is None:
            self.add_error("priority", "set_priority needs a priority.")
        return data


class AdjustGoalForm(forms.Form):
    goal = forms.CharField(
        required=False, widget=forms.Textarea(attrs={"rows": 4}),
        help_text="Replaces the goal (leave empty to keep it). A JSON object or array is sent as JSON, anything else "
                  "as text. A new goal keeps only the parameters shown below.")
    reason = forms.CharField(max_length=500, help_text="Kept with the command and in the task's audit trail")
    expected_version = forms.IntegerField(widget=forms.HiddenInput)

    def clean_goal(self):
        _new_goal(self.cleaned_data["goal"])  # (a JSON goal past the nesting cap: this form error, not a 500)
        return self.cleaned_data["goal"]


class AnswerForm(forms.Form):
    """What every answer to a wait carries besides its value: which wait, at which version, and why."""

    wait_id = forms.CharField(widget=forms.HiddenInput)
    expected_version = forms.IntegerField(widget=forms.HiddenInput)
    reason = forms.CharField(max_length=500, required=False,
                             help_text="Kept with the answer and in the task's audit trail")


class BudgetForm(forms.Form):
    """set_budget: each budget as it stands; only the ones changed are sent (emptied: no limit)."""

    max_steps = forms.IntegerField(label="Steps", min_value=1, max_value=2_147_483_647, required=False,
                                   help_text="Steps the task may commit in all; empty: no limit")
    max_cost = forms.DecimalField(label="Cost", min_value=0, max_digits=12, decimal_places=4, required=False,
                                  help_text="What the task may spend in all, in the deployment's cost unit; empty: no "
                                            "limit")
    max_tokens = forms.IntegerField(label="Tokens", min_value=0, max_value=BUDGET_MAX_TOKENS, required=False,
                                    help_text="Model tokens (in + out) the task may use in all; empty: no limit")
    reason = forms.CharField(max_length=500, help_text="Kept with the command and in the task's audit trail")
    expected_version = forms.IntegerField(widget=forms.HiddenInput)

    FIELDS = {"max_steps": "maxSteps", "max_cost": "maxCost", "max_tokens": "maxTokens"}

    def payload(self) -> dict:
        sent = {}
        for field, name in self.FIELDS.items():
            if field in self.changed_data:
                value = self.cleaned_data[field]
                sent[name] = str(value) if field == "max_cost" and value is not None else value
        return sent


class InputFileForm(forms.Form):
    file = forms.FileField(required=False, help_text="Optional: becomes one of the task's artifacts")


def _goal_parameters_schema(task: Task) -> dict:
    try:
        return registry.get(task.workflow_name).goal_parameters_schema
    except UnknownWorkflow:
        return {"type": "object", "additionalProperties": False}


def _goal_text(goal: Any) -> str:
    if goal is None:
        return ""
    # (bounded: a goal stored nested deeper than json.dumps can walk is shown cut, with a marker, not a 500)
    return goal if isinstance(goal, str) else json.dumps(bounded_copy(goal), indent=2, sort_keys=True)


def _new_goal(text: str) -> Any:
    """The goal a textarea states: a JSON object or array as such, anything else as the text itself. A JSON text
    config.base.json_input refuses (nested past RUNTIME_MAX_JSON_DEPTH, a lone surrogate) is a ValidationError."""
    if not text.lstrip().startswith(("{", "[")):
        return text  # (only an object or array is read as JSON)
    try:
        parsed = loads(text)
    except JsonInputError as error:
        if error.kind != MALFORMED:
            raise forms.ValidationError(str(error)) from None
        return text
    return parsed if isinstance(parsed, dict | list) else text


def _initial_parameters(task: Task, form: forms.Form) -> dict:
    """The task's current goal parameters, as its form shows them (enum values as the text a <select> posts)."""
    if form.whole_value:
        return {"value": goal_parameters(task.goal) or None}
    initial = {}
    for name, value in goal_parameters(task.goal).items():
        field = form.fields.get(name)
        if isinstance(field, forms.TypedMultipleChoiceField) and isinstance(value, list):
            initial[name] = [choice_key(v) for v in value]
        elif isinstance(field, forms.TypedChoiceField):
            initial[name] = choice_key(value)
        else:
            initial[name] = value
    return initial


def _file_payload(upload) -> list[dict]:
    if upload is None:
        return []
    name = _FILE_NAME_UNSAFE.sub("_", upload.name).lstrip("._-")[:81] or "upload"
    item = {"name": name, "contentBase64": base64.b64encode(upload.read()).decode("ascii")}
    if upload.content_type:
        item["contentType"] = upload.content_type
    return [item]


def _pretty_json(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)


def closed_because(task: Task) -> str:
    """Why nothing steers this task any more, for people ("" while commands still apply): the steering pages show
    this instead of their forms (the service refuses every command in these statuses anyway)."""
    if task.status in TERMINAL_STATUSES:
        return f"The task is {task.status}: a finished task takes no more commands."
    if task.status == TaskStatus.DEAD_LETTERED:
        return ("The task is dead-lettered: it takes no commands until it is retried from its page (or abandoned, "
                "which finishes it).")
    return ""


def _strings_in(value: Any):
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings_in(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings_in(item)


def artifacts_named(artifacts: dict[str, dict], arguments: Any) -> list[str]:
    """The task's artifacts an effect's arguments name: a string among them (at any depth) that is an artifact's
    name or its storage reference (what ctx.artifact() returned to the step)."""
    strings = set(_strings_in(arguments))
    return [name for name, artifact in artifacts.items() if name in strings or artifact["ref"] in strings]


class SteeringTaskAdmin(TaskAdmin):
    actions = [*TaskAdmin.actions, "pause_tasks", "resume_tasks", "cancel_tasks"]

    # Offered only to an account that may steer (an auditor's list offers none of them); one posted anyway is
    # refused: "Your account may read tasks but not steer them" (config.base.admin_base.ExplainedRefusalsAdmin).
    def has_steer_permission(self, request) -> bool:
        return access.allows(access.actor_for_request(request), access.Action.STEER)

    @admin.action(description="Pause the selected tasks (at their next safe point)", permissions=["steer"])
    def pause_tasks(self, request, queryset):
        return self._steer_many(request, queryset, CommandType.PAUSE, "pause_tasks")

    @admin.action(description="Resume the selected paused tasks", permissions=["steer"])
    def resume_tasks(self, request, queryset):
        return self._steer_many(request, queryset, CommandType.RESUME, "resume_tasks")

    @admin.action(description="Cancel the selected tasks (at their next safe point)", permissions=["steer"])
    def cancel_tasks(self, request, queryset):
        return self._steer_many(request, queryset, CommandType.CANCEL, "cancel_tasks")

    def _steer_many(self, request, queryset, command_type: str, action: str):
        """Ask for a reason first (an intermediate page that says which tasks the command does not apply to, and
        why), then send one command per task it applies to, at its current version; a task that moved on meanwhile
        is reported for that task, the others go ahead. When it applies to none, say so and ask nothing."""
        self._require_steering(request)
        applies, skipped = [], []
        for task in queryset:
            try:
                validation.refuse_for_status(command_type, TaskStatus(task.status))
                applies.append(task)
            except Problem as refused:
                skipped.append({"task": task, "why": refused.detail})
        label = CommandType(command_type).label.lower()
        if not applies:
            self.message_user(request, f"Nothing to {label}: " + " ".join(
                f"{item['task'].id}: {item['why']}" for item in skipped[:10])
                + (f" (and {len(skipped) - 10} more)" if len(skipped) > 10 else ""), level=messages.WARNING)
            return None
        form = ReasonForm(request.POST if "reason" in request.POST else None)
        if not form.is_valid():
            return TemplateResponse(request, "admin/steering_app/steer_many.html", {
                **self.admin_site.each_context(request), "title": f"{label.capitalize()}: why?", "tasks": applies,
                "skipped": skipped, "form": form, "action": action, "command": label, "opts": self.model._meta,
                "action_checkbox_name": admin.helpers.ACTION_CHECKBOX_NAME})
        # One command per task, each counted as the REST command is (in each task's tenant): over a limit, none is
        # sent and the 429 page says whose limit it is.
        for tenant_id in {task.tenant_id for task in applies}:
            in_tenant = [task for task in applies if task.tenant_id == tenant_id]
            refused = admin_rate_refusal(request, "steer", tenant=in_tenant[0].tenant, cost=len(in_tenant))
            if refused is not None:
                return refused
        for item in skipped:
            self.message_user(request, f"{item['task'].id}: not sent: {item['why']}", level=messages.WARNING)
        sent = 0
        for task in applies:
            try:
                services.steering_submit(task=task, command_type=command_type, expected_version=task.state_version,
                                         reason=form.cleaned_data["reason"],
                                         requested_by=requested_by_of(request))
                sent += 1
            except Problem as refused:
                self.message_user(request, f"{task.id}: {refused.detail}", level=messages.WARNING)
        if sent:
            self.message_user(request, f"{command_type} sent to {sent} task(s).", level=messages.SUCCESS)
        return None

    def has_operate_permission(self, request) -> bool:
        """Retrying and abandoning dead letters is operators' work: the steering permission (the `operators`
        group has it, `auditors` do not) — or tasks_app's own rule, the change permission."""
        return self.has_steer_permission(request) or super().has_operate_permission(request)

    def console_context(self, request, task):
        """The task page's steering part (templates/console/steering.html): what the task waits for, the buttons
        that apply to it now (for an account that may steer), links to the other steering pages, the history."""
        context = super().console_context(request, task)
        history = [{**command, "reason": redact(command["reason"] or ""),
                    "requestedBy": actor_shown(command["requestedBy"]),  # (as the audit pages name it)
                    "rejection": redact(command["rejection"]) if command["rejection"] else None}
                   for command in selectors.steering_history(task=task)[:HISTORY_ON_TASK_PAGE]]
        context["steering"] = {
            "may_steer": self.has_steer_permission(request),
            # A finished task offers no steering: no buttons, no links (the page says why); a page loaded before it
            # finished hides them when task.js sees the new status (data-when: the statuses they apply in).
            "closed": closed_because(task),
            "steerable_when": " ".join(STEERABLE_STATUSES),
            "version": task.state_version,
            "steer_url": reverse("admin:steering_app_task_steer", args=[task.id]),
            "goal_url": reverse("admin:steering_app_task_adjust_goal", args=[task.id]),
            "wait_url": reverse("admin:steering_app_task_wait", args=[task.id]),
            "budget_url": reverse("admin:steering_app_task_budget", args=[task.id]),
            "wait_answer": {waits.INPUT: "Answer it", waits.APPROVAL: "Approve or reject it",
                            waits.BUDGET: "Raise the budget"}.get((task.wait or {}).get("kind"), "Answer it"),
                        "commands": [{"type": command, "label": label, "when": " ".join(statuses),
                          "offered": task.status in statuses} for command, label, statuses in QUICK_COMMANDS],
            "any_offered": any(task.status in statuses for _, _, statuses in QUICK_COMMANDS),
            "history": history,
        }
        return context

    def get_urls(self):
        return [path("<uuid:task_id>/steer/", self.admin_site.admin_view(self.steer_view),
                     name="steering_app_task_steer"),
                path("<uuid:task_id>/steer/goal/", self.admin_site.admin_view(self.adjust_goal_view),
                     name="steering_app_task_adjust_goal"),
                path("<uuid:task_id>/steer/wait/", self.admin_site.admin_view(self.wait_view),
                     name="steering_app_task_wait"),
                path("<uuid:task_id>/steer/budget/", self.admin_site.admin_view(self.budget_view),
                     name="steering_app_task_budget"),
                *super().get_urls()]

    # --- shared by the steering pages ---

    @staticmethod
    def _require_steering(request) -> None:
        """403 for an account that may read tasks but not steer them (an auditor): every steering page and action."""
        if not access.allows(access.actor_for_request(request), access.Action.STEER):
            raise PermissionDenied(NOT_ALLOWED)

    def _submit(self, request, task, *, command_type: str, payload: Any, expected_version: int, reason: str,
                may_kill: bool = False) -> tuple[services.Submitted | None, Problem | None]:
        """Send through the service. A refusal — 409 (the task moved on), 422 (does not apply, or the payload does
        not fit), 403 (kill), 429 (over the person's or the tenant's steering rate: counted as the REST command is,
        tasks_app.web.authentication.rate_limit_check; the page then answers 429) — is said on the page and returned,
        for the form to show its field errors."""
        try:
            rate_limit_check(request, "steer", tenant=task.tenant)
        except RateLimited as limited:
            self.message_user(request, str(limited.detail), level=messages.WARNING)
            request.rate_limited = limited
            return None, limited
        try:
            submitted = services.steering_submit(
                task=task, command_type=command_type, payload=payload, expected_version=expected_version,
                reason=reason, requested_by=requested_by_of(request), may_kill=may_kill)
        except Problem as refused:
            detail = str(refused.detail)
            if isinstance(refused, VersionConflict):
                detail = self._changed_since(task, seen=expected_version, command_type=command_type)
            self.message_user(request, detail, level=messages.WARNING)
            return None, refused
        if command_type == CommandType.KILL:
            said = ("the running step is cut off now (its worker is fenced out) and the task ends as cancelled as soon "
                    "as a worker takes it up; an effect that step had started is reconciled, never assumed")
        else:
            said = "applied at once when no worker holds the task, else at its next safe point (see Steering)"
        self.message_user(request, f"Command {command_type} accepted at version {submitted.state_version}: {said}.",
                          level=messages.SUCCESS)
        return submitted, None

    @staticmethod
    def _changed_since(task, *, seen: int, command_type: str) -> str:
        """A refused stale form, said for a person: what changed since the version they saw, by whom and when, where
        the task is now, and whether their action still applies (the page they land on offers it again)."""
        task.refresh_from_db(fields=["status", "state_version"])
        changes = "; ".join(
            f"{CommandType(change['type']).label.lower()} by {change['requestedBy'] or 'an unnamed caller'} at "
            f"{time_text(change['createdAt'])}"
            for change in selectors.steering_changes_since(task=task, version=seen))
        action = CommandType(command_type).label.lower()
        try:
            validation.refuse_for_status(command_type, TaskStatus(task.status))
            offer = f"If you still want to {action} it, check the page and send it again."
        except Problem:
            offer = f"{action.capitalize()} no longer applies to a task that is {task.status}."
        return (f"Not done: the task changed since you looked at it (version {seen}, now {task.state_version}): "
                f"{changes or 'its state moved on'}. It is {task.status} now. {offer}")

    def _render(self, request, task, template: str, title: str, **context):
        """A steering page: its form only while commands still apply to the task (``closed``: why not); a 429 with
        Retry-After when the form was over a rate limit (_submit), the form kept as it was sent."""
        response = TemplateResponse(request, f"admin/steering_app/{template}", {
            **self.admin_site.each_context(request), "title": title, "task": task, "opts": self.model._meta,
            "history": selectors.steering_history(task=task), "closed": closed_because(task), **context})
        limited = getattr(request, "rate_limited", None)
        if limited is not None:
            response.status_code = 429
            response["Retry-After"] = str(limited.wait)
        return response

    # --- pages ---

    def steer_view(self, request, task_id):
        task = self.task_or_404(request, task_id)
        self._require_steering(request)
        may_kill = access.allows(access.actor_for_request(request), access.Action.KILL)
        # A refused stale form lands here with its command and reason filled in again, at the current version.
        offered = {key: request.GET[key] for key in ("type", "reason") if key in request.GET}
        form = SteerForm(request.POST or None, initial={"expected_version": task.state_version, **offered})
        if not may_kill:
            form.fields["type"].choices = [c for c in form.fields["type"].choices if c[0] != CommandType.KILL]
        if request.method == "POST" and form.is_valid():
            data = form.cleaned_data
            submitted, refused = self._submit(
                request, task, command_type=data["type"], expected_version=data["expected_version"],
                payload={"priority": data["priority"]} if data["type"] == CommandType.SET_PRIORITY else {},
                reason=data["reason"], may_kill=may_kill)
            if submitted is not None:
                return redirect("admin:tasks_app_task_change", task.id)
            if isinstance(refused, VersionConflict):
                again = urlencode({"type": data["type"], "reason": data["reason"]})
                return redirect(f"{reverse('admin:steering_app_task_steer', args=[task.id])}?{again}")
        return self._render(request, task, "steer.html", f"Steer {task}", form=form)

    def adjust_goal_view(self, request, task_id):
        task = self.task_or_404(request, task_id)
        self._require_steering(request)
        schema = _goal_parameters_schema(task)
        data = request.POST if request.method == "POST" else None
        form = AdjustGoalForm(data, initial={"expected_version": task.state_version})
        parameters = schema_form(schema, prefix="parameters", data=data)
        parameters.initial = _initial_parameters(task, parameters)  # read when rendering and for changed_data
        # `&`, not `and`: both forms are validated, so each shows its errors.
        if data is not None and form.is_valid() & parameters.is_valid():
            payload = self._adjust_goal_payload(form, parameters)
            if payload is None:
                form.add_error(None, "Nothing to send: write a new goal or change a parameter.")
            else:
                submitted, refused = self._submit(request, task, command_type=CommandType.ADJUST_GOAL,
                                                  payload=payload, reason=form.cleaned_data["reason"],
                                                  expected_version=form.cleaned_data["expected_version"])
                if submitted is not None:
                    return redirect("admin:tasks_app_task_change", task.id)
                if isinstance(refused, VersionConflict):
                    return redirect("admin:steering_app_task_adjust_goal", task.id)
                attach_problem_errors(refused, forms_by_path={"payload.parameters": parameters, "payload": form})
        return self._render(request, task, "adjust_goal.html", f"Adjust the goal of {task}", form=form,
                            parameters=parameters, current_goal=_goal_text(task.goal),
                            parameters_schema=_pretty_json(schema))

    @staticmethod
    def _adjust_goal_payload(form: AdjustGoalForm, parameters: forms.Form) -> dict | None:
        """{"goal"?, "parameters"?}. The service merges parameters over the goal's (a new goal has none of the old
        one's), so: with a new goal every parameter the form shows is sent; without, only the ones changed."""
        payload = {}
        if form.cleaned_data["goal"].strip():
            payload["goal"] = _new_goal(form.cleaned_data["goal"])
        if parameters.whole_value:
            if parameters.cleaned_data["value"] is not None and (
                    "goal" in payload or parameters.has_changed()):
                payload["parameters"] = parameters.cleaned_data["value"]
        else:
            changed = None if "goal" in payload else set(parameters.changed_data)
            sent = schema_form_value(parameters, only=changed)
            if sent:
                payload["parameters"] = sent
        return payload or None

    def wait_view(self, request, task_id):
        task = self.task_or_404(request, task_id)
        self._require_steering(request)
        wait = task.wait
        if not wait:
            self.message_user(request, f"The task is {task.status} and waits for nothing.", level=messages.INFO)
            return redirect("admin:tasks_app_task_change", task.id)
        if wait["kind"] == waits.BUDGET:  # raised, not answered: the budget page
            return redirect("admin:steering_app_task_budget", task.id)
        data = request.POST if request.method == "POST" else None
        answer = AnswerForm(data, initial={"wait_id": wait["waitId"], "expected_version": task.state_version})
        if data is not None and data.get("wait_id") != wait["waitId"]:
            # The page answered a wait that has since been answered or replaced: sending its fields against the
            # new wait's schema would be a guess. (state_version moves with commands only, not when a step waits.)
            self.message_user(request, "The wait this page answered was answered or replaced; this is the task's "
                                       "open wait now.", level=messages.WARNING)
            return redirect("admin:steering_app_task_wait", task.id)
        if wait["kind"] == waits.APPROVAL:
            return self._approval(request, task, wait, answer)
        return self._provide_input(request, task, wait, answer)

    def _approval(self, request, task, wait, answer: AnswerForm):
        decision = request.POST.get("decision")
        if request.method == "POST" and answer.is_valid():
            if decision not in (CommandType.APPROVE, CommandType.REJECT):
                answer.add_error(None, "Choose Approve or Reject.")
            else:
                submitted, refused = self._submit(request, task, command_type=decision,
                                                  payload={"waitId": answer.cleaned_data["wait_id"]},
                                                  expected_version=answer.cleaned_data["expected_version"],
                                                  reason=answer.cleaned_data["reason"])
                if submitted is not None:
                    return redirect("admin:tasks_app_task_change", task.id)
                if isinstance(refused, VersionConflict):
                    return redirect("admin:steering_app_task_wait", task.id)
                attach_problem_errors(refused, forms_by_path={"payload": answer})
        effect = wait.get("effect") or {}
        # What the approval is about: approvals carry no artifact of their own, so the page links every artifact
        # the effect's arguments name (by name or storage reference), and the task's whole artifact list.
        artifacts = task_artifacts(task_id=task.id)
        named = [{**artifacts[name], "url": reverse("admin:tasks_app_task_artifact", args=[task.id, name])}
                 for name in artifacts_named(artifacts, effect.get("arguments"))]
        return self._render(request, task, "approval.html", f"Approve or reject: {wait['name']}", wait=wait,
                            form=answer, effect=effect, arguments=_pretty_json(effect.get("arguments")),
                            named_artifacts=named, artifact_count=len(artifacts),
                            artifacts_url=reverse("admin:tasks_app_task_artifacts", args=[task.id]))

    def _provide_input(self, request, task, wait, answer: AnswerForm):
        data = request.POST if request.method == "POST" else None
        # "Did this happen?" has its own form, the dead letters' too (outcome_form): facts shown, no answer chosen.
        value_form = (OutcomeForm(data, prefix="value", effect=wait.get("effect") or {}) if is_outcome_question(wait)
                      else schema_form(wait.get("schema") or {}, prefix="value", data=data))
        files_allowed = settings.RUNTIME.input_files.max_files > 0
        file_form = InputFileForm(data, request.FILES if data is not None else None) if files_allowed else None
        if data is not None and answer.is_valid() & value_form.is_valid() & (file_form is None
                                                                             or file_form.is_valid()):
            payload = {"waitId": answer.cleaned_data["wait_id"],
                       "value": value_form.value() if isinstance(value_form, OutcomeForm)
                       else schema_form_value(value_form)}
            files = _file_payload(file_form.cleaned_data.get("file")) if file_form is not None else []
            if files:
                payload["files"] = files
            submitted, refused = self._submit(request, task, command_type=CommandType.PROVIDE_INPUT, payload=payload,
                                              expected_version=answer.cleaned_data["expected_version"],
                                              reason=answer.cleaned_data["reason"])
            if submitted is not None:
                return redirect("admin:tasks_app_task_change", task.id)
            if isinstance(refused, VersionConflict):
                return redirect("admin:steering_app_task_wait", task.id)
            attach_problem_errors(refused, forms_by_path={
                "payload.value": value_form, "payload.files": file_form or answer, "payload": answer})
        return self._render(request, task, "provide_input.html", f"Answer: {wait['name']}", wait=wait, form=answer,
                            value_form=value_form, file_form=file_form, schema=_pretty_json(wait.get("schema")))


    def budget_view(self, request, task_id):
        """set_budget: the task's budgets beside what it used (and its budget wait, if it waits in one), and a form
        that sends the budgets changed. A waiting task goes on at once when its budgets allow it."""
        task = self.task_or_404(request, task_id)
        self._require_steering(request)
        data = request.POST if request.method == "POST" else None
        form = BudgetForm(data, initial={"expected_version": task.state_version, "max_steps": task.budget_steps,
                                         "max_cost": task.budget_cost, "max_tokens": task.budget_tokens})
        if data is not None and form.is_valid():
            payload = form.payload()
            if not payload:
                form.add_error(None, "Nothing to send: change a budget (empty it to remove the limit).")
            else:
                submitted, refused = self._submit(request, task, command_type=CommandType.SET_BUDGET, payload=payload,
                                                  expected_version=form.cleaned_data["expected_version"],
                                                  reason=form.cleaned_data["reason"])
                if submitted is not None:
                    return redirect("admin:tasks_app_task_change", task.id)
                if isinstance(refused, VersionConflict):
                    return redirect("admin:steering_app_task_budget", task.id)
                attach_problem_errors(refused, forms_by_path={"payload": form})
        wait = task.wait if (task.wait or {}).get("kind") == waits.BUDGET else None
        return self._render(request, task, "budget.html", f"Budget of {task}", form=form, wait=wait,
                            rows=task_budget_rows(task),
                            policy=budget_policy(_workflow_or_none(task), task.budget_on_exhausted))


def _workflow_or_none(task: Task):
    try:
        return registry.get(task.workflow_name)
    except UnknownWorkflow:
        return None


admin.site.unregister(Task)
admin.site.register(Task, SteeringTaskAdmin)
