"""REST API for tasks under /runtime/: thin views over services and selectors (one APIView per operation)."""

from __future__ import annotations

import re
import uuid

from django.conf import settings
from django.http import FileResponse
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiParameter,
    OpenApiResponse,
    extend_schema,
    extend_schema_field,
    inline_serializer,
)
from rest_framework import exceptions, serializers, status
from rest_framework.pagination import CursorPagination
from rest_framework.response import Response
from rest_framework.views import APIView

from config.base.negotiation import FallbackContentNegotiation
from config.base.problems import Problem, answers_unknown_paths, path_not_found, problem_response
from config.base.runtime import TOOL_PATTERN
from tasks_app import access, forks, selectors, services
from tasks_app.models import (
    BUDGET_MAX_TOKENS,
    TOOL_POLICY_LISTS,
    TOOL_POLICY_MAX_CALLS,
    TOOL_POLICY_MAX_PATTERNS,
    TaskStatus,
    task_tool_policy_errors,
)
from tasks_app.observability import tracing
from tasks_app.registry import BUDGET_POLICIES
from tasks_app.web.artifacts import ArtifactNotFound, artifact_content_type, artifact_response
from tasks_app.web.authentication import rate_limit_check, requested_by_of
from tasks_app.web.converters import TASK_ID, TASK_ID_EXAMPLE


def _url_for(request):
    return request.build_absolute_uri


def _task_or_404(request, task_id):
    task = getattr(request, "access_task", None)  # (read by the access rule: tasks_app.web.authentication)
    if task is not None and task.id == task_id:
        return task
    task = selectors.task_get(tenant=request.tenant, task_id=task_id)
    if task is None:
        # The same answer whether the id does not exist or belongs to another tenant.
        raise exceptions.NotFound(f"No task {task_id}.")
    return task


class RuntimeApi(APIView):
    """Base of the API's views. A client whose Accept header names no JSON type (a browser asking for
    text/html) gets JSON rather than 406 (config.base.negotiation)."""

    content_negotiation_class = FallbackContentNegotiation


class StrictSerializer(serializers.Serializer):
    """Refuses fields it does not know, so a typo ("inptu") is a 400 rather than silently ignored."""

    def to_internal_value(self, data):
        unknown = {
            name: [f"Unknown field; known fields: {', '.join(self.fields)}."]
            for name in sorted(set(data) - set(self.fields))
        } if isinstance(data, dict) else {}
        try:
            value = super().to_internal_value(data)
        except serializers.ValidationError as error:
            if unknown and isinstance(error.detail, dict):
                raise serializers.ValidationError({**error.detail, **unknown}) from None
            raise
        if unknown:
            raise serializers.ValidationError(unknown)
        return value


class TaskSnapshotSerializer(serializers.Serializer):
    """The authoritative task snapshot (for the OpenAPI schema; the data comes from selectors.task_snapshot)."""

    taskId = serializers.UUIDField()
    workflow = serializers.CharField()
    workflowVersion = serializers.CharField()
    status = serializers.ChoiceField(choices=selectors.EXTERNAL_STATUSES, help_text="MCP-compatible status")
    statusMessage = serializers.CharField()
    internalStatus = serializers.ChoiceField(choices=TaskStatus.choices)
    progress = serializers.FloatField(min_value=0, max_value=1)
    phase = serializers.CharField()
    priority = serializers.IntegerField()
    stateVersion = serializers.IntegerField(help_text="Send as expectedVersion when steering")
    planVersion = serializers.IntegerField()
    stepsCompleted = serializers.IntegerField()
    recoveries = serializers.IntegerField()
    lastCheckpoint = inline_serializer(
        "LastCheckpoint", {"sequence": serializers.IntegerField(), "at": serializers.DateTimeField()}, allow_null=True
    )
    deadline = serializers.DateTimeField(allow_null=True)
    createdAt = serializers.DateTimeField()
    updatedAt = serializers.DateTimeField()
    completedAt = serializers.DateTimeField(allow_null=True)
    statusUrl = serializers.URLField()
    streamUrl = serializers.URLField()
    artifactsUrl = serializers.URLField(help_text="The files the task wrote (GET /runtime/tasks/{id}/artifacts)")
    result = serializers.JSONField(required=False, help_text="Present when completed")
    resultRef = serializers.CharField(required=False, help_text="Storage reference of a large result")
    error = serializers.JSONField(required=False, help_text="Present when failed: {type, message, step, attempt}")
    approvalPolicy = serializers.JSONField(required=False, help_text="As created: {before: [effect names]}")
    checkpointPolicy = serializers.JSONField(required=False, help_text="As created: {everySteps, maxSeconds}")
    toolPolicy = serializers.JSONField(required=False, help_text="As created: {deny, allow, requireApproval, "
                                                                 "maxCalls}")
    wait = serializers.JSONField(required=False, help_text="While input_required (or paused in a wait): {waitId, kind "
                                                           "(input | approval | budget), name, prompt, schema, "
                                                           "effect?, budget?}; answer it with a provide_input / "
                                                           "approve / reject command (a budget wait: set_budget)")
    budget = inline_serializer("TaskBudgetShown", {
        "maxSteps": serializers.IntegerField(allow_null=True), "maxCost": serializers.CharField(allow_null=True),
        "maxTokens": serializers.IntegerField(allow_null=True),
        "onExhausted": serializers.ChoiceField(choices=BUDGET_POLICIES)},
        help_text="The task's budgets (null: no limit; set_budget changes them) and what it does when one is spent")
    forkedFrom = inline_serializer("TaskForkedFrom", {"taskId": serializers.UUIDField(),
                                                       "fromStep": serializers.IntegerField()},
                                   required=False, help_text="Present on a fork: the task it was forked from and the "
                                                             "step it started again at (POST …/fork)")
    costSpent = serializers.CharField(help_text="What the task spent, against budget.maxCost (decimal text)")
    tokensSpent = serializers.IntegerField(help_text="Model tokens (in + out) the task used, against budget.maxTokens")


PROBLEM_RESPONSE = OpenApiResponse(description="Problem details (application/problem+json)")
TASK_ID_PARAMETER = OpenApiParameter("task_id", OpenApiTypes.UUID, OpenApiParameter.PATH,
                                     description="The task's id (`taskId` in its snapshot)")


class ApprovalPolicySerializer(StrictSerializer):
    class Meta:
        ref_name = "ApprovalPolicy"

    before = serializers.ListField(
        child=serializers.RegexField(r"^[A-Za-z][A-Za-z0-9_.-]{0,99}$", error_messages={
            "invalid": "An effect name: letters, digits, '_', '.' or '-', starting with a letter."}),
        max_length=50, help_text="Effect names (as the workflow calls them) that wait for approval in this task, on "
                                 "top of the deployment's require_approval")


class CheckpointPolicySerializer(StrictSerializer):
    class Meta:
        ref_name = "CheckpointPolicy"

    everySteps = serializers.IntegerField(required=False, help_text="Checkpoint after this many steps")
    maxSeconds = serializers.FloatField(required=False, help_text="…or once this many seconds passed since the last")

    def validate_everySteps(self, value):
        policy = settings.RUNTIME.checkpoint
        if not policy.task_min_every_steps <= value <= policy.task_max_every_steps:
            raise serializers.ValidationError(f"Must be from {policy.task_min_every_steps} to "
                                              f"{policy.task_max_every_steps} (this deployment's bounds).")
        return value

    def validate_maxSeconds(self, value):
        policy = settings.RUNTIME.checkpoint
        if not policy.task_min_seconds <= value <= policy.task_max_seconds:
            raise serializers.ValidationError(f"Must be from {policy.task_min_seconds:g} to "
                                              f"{policy.task_max_seconds:g} seconds (this deployment's bounds).")
        return value


@extend_schema_field({
    "type": "object", "additionalProperties": False,
    "properties": {
        **{key: {"type": "array", "maxItems": TOOL_POLICY_MAX_PATTERNS, "nullable": True,
                 "items": {"type": "string", "pattern": TOOL_PATTERN.pattern},
                 "description": description}
           for key, description in zip(TOOL_POLICY_LISTS, (
               "Tools never called in this task, as globs on server.tool (e.g. github.delete_*)",
               "If given, only tools matching one of these may be called (within what the tenant allows)",
               "Tools that wait for a person's approval before each call in this task"))},
        "maxCalls": {"type": "integer", "minimum": 1, "maximum": TOOL_POLICY_MAX_CALLS, "nullable": True,
                     "description": "Tool calls this task may make (the smallest limit of deployment, tenant and "
                                    "task applies)"},
    },
})
class ToolPolicyField(serializers.JSONField):
    """A task's toolPolicy: its shape is checked here (tasks_app.models.task_tool_policy_errors), what it means by
    agents_app.policy, which can only narrow the tenant's policy with it."""

    def to_internal_value(self, data):
        value = super().to_internal_value(data)
        errors = task_tool_policy_errors(value, field="")
        if errors:  # {"deny.0": [...]}: flattened under the field's name, "toolPolicy.deny.0"
            raise serializers.ValidationError({error["field"] or "non_field_errors": [error["message"]]
                                               for error in errors})
        return value


class TaskCreateApi(RuntimeApi):
    class InputSerializer(StrictSerializer):
        class BudgetSerializer(StrictSerializer):
            class Meta:
                ref_name = "TaskBudget"

            maxSteps = serializers.IntegerField(min_value=1, max_value=2_147_483_647, required=False)
            maxCost = serializers.DecimalField(max_digits=12, decimal_places=4, min_value=0, required=False,
                                               coerce_to_string=False)
            maxTokens = serializers.IntegerField(min_value=0, max_value=BUDGET_MAX_TOKENS, required=False,
                                                 help_text="Model tokens (in + out) the task may use in all")
            onExhausted = serializers.ChoiceField(
                choices=BUDGET_POLICIES, required=False,
                help_text="When a budget is spent: fail (BudgetExhausted), or wait in input_required until an operator "
                          "raises it (set_budget). Default: the workflow's (the snapshot's budget.onExhausted)")

        class Meta:
            ref_name = "TaskCreate"

        workflow = serializers.CharField(max_length=100, help_text="A name from GET /runtime/workflows")
        input = serializers.JSONField(help_text="Validated against the workflow's input JSON Schema")
        goal = serializers.JSONField(required=False, allow_null=True, help_text="The goal; steering may adjust it")
        priority = serializers.IntegerField(min_value=0, max_value=9, default=5, help_text="0 lowest … 9 most urgent")
        deadline = serializers.DateTimeField(required=False, allow_null=True)
        budget = BudgetSerializer(required=False)
        approvalPolicy = ApprovalPolicySerializer(required=False, help_text="Effects of this task that wait for a "
                                                                            "person's approval")
        checkpointPolicy = CheckpointPolicySerializer(required=False, help_text="How often this task checkpoints")
        toolPolicy = ToolPolicyField(required=False, help_text="The downstream tools this task may call: it narrows "
                                                               "its tenant's tool policy, never widens it")

        def validate_input(self, value):
            if not isinstance(value, dict):
                raise serializers.ValidationError("Must be a JSON object.")
            return value

        def validate_deadline(self, value):
            if value is not None and value <= timezone.now():
                raise serializers.ValidationError("The deadline must be in the future.")
            return value

    @extend_schema(
        operation_id="tasks_create",
        tags=["Tasks"],
        summary="Start a task",
        description="Creates a task that runs `workflow` on `input` and queues it for a worker. The input is "
                    "checked against the workflow's input JSON Schema (GET /runtime/workflows). Answers 201 with the "
                    "task's snapshot and its URL in Location. With an Idempotency-Key, repeating the same request "
                    "answers 200 with the same task instead of starting another.",
        request=InputSerializer,
        parameters=[OpenApiParameter("Idempotency-Key", str, OpenApiParameter.HEADER, pattern=r"^[!-~]{1,255}$",
                                     description="Retry-safe creation: the same key and body return the same task "
                                                 "(1–255 visible ASCII characters, e.g. a UUID)")],
        responses={201: TaskSnapshotSerializer, 200: TaskSnapshotSerializer, 400: PROBLEM_RESPONSE,
                   409: PROBLEM_RESPONSE, 413: PROBLEM_RESPONSE, 422: PROBLEM_RESPONSE, 429: PROBLEM_RESPONSE},
    )
    def post(self, request):
        rate_limit_check(request, "create")  # first: a refused request does nothing (429, Retry-After)
        # The key is checked before the body so a malformed key never depends on what else is wrong.
        idempotency_key = services.idempotency_key_validate(request.headers.get("Idempotency-Key"))
        serializer = self.InputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        budget = data.get("budget", {})
        outcome = services.task_create(
            tenant=request.tenant, owner=request.user, workflow=data["workflow"], input=data["input"],
            goal=data.get("goal"), priority=data["priority"], deadline_at=data.get("deadline"),
            budget_steps=budget.get("maxSteps"), budget_cost=budget.get("maxCost"),
            budget_tokens=budget.get("maxTokens"), budget_on_exhausted=budget.get("onExhausted"),
            idempotency_key=idempotency_key,
            approval_policy=data.get("approvalPolicy"), checkpoint_policy=data.get("checkpointPolicy"),
            tool_policy=data.get("toolPolicy"), trace_context=tracing.carrier_from_headers(request.headers),
            agent_identity=access.actor_for_request(request).agent_identity,
            created_by_token_id=access.actor_for_request(request).token_id,
        )
        snapshot = selectors.task_snapshot(outcome.task, url_for=_url_for(request))
        return Response(snapshot, status=status.HTTP_201_CREATED if outcome.created else status.HTTP_200_OK,
                        headers={"Location": snapshot["statusUrl"]})


class TaskDetailApi(RuntimeApi):
    @extend_schema(operation_id="tasks_retrieve", tags=["Tasks"], summary="Get a task's snapshot",
                   description="The task's authoritative state: status, progress, phase, last checkpoint; its "
                               "result once completed, its error once failed. Poll it, or follow `streamUrl`. A "
                               "task of another tenant answers 404, as an unknown id does.",
                   parameters=[TASK_ID_PARAMETER], responses={200: TaskSnapshotSerializer, 404: PROBLEM_RESPONSE})
    def get(self, request, task_id):
        task = _task_or_404(request, task_id)
        return Response(selectors.task_snapshot(task, url_for=_url_for(request)))


class TaskForkApi(RuntimeApi):
    access_actions = {"POST": access.Action.FORK}

    class InputSerializer(StrictSerializer):
        class Meta:
            ref_name = "TaskFork"

        fromStep = serializers.IntegerField(min_value=1, max_value=2_147_483_647, required=False,
                                            help_text="The step (its seq, 1 = the first) the fork starts again at: "
                                                      "the steps before it are inherited")
        fromTurn = serializers.IntegerField(min_value=1, max_value=100_000, required=False,
                                            help_text="For a workflow with turns (the agent): the turn the "
                                                      "conversation starts again at, instead of fromStep")
        goal = serializers.JSONField(required=False, allow_null=True,
                                     help_text="The fork's goal (default: the original's current goal)")
        input = serializers.JSONField(required=False, help_text="The fork's input (default: the original's), checked "
                                                                "against the workflow's schema")

        def validate_input(self, value):
            if not isinstance(value, dict):
                raise serializers.ValidationError("Must be a JSON object.")
            return value

    @extend_schema(
        operation_id="tasks_fork", tags=["Tasks"], summary="Fork a task from a step",
        description="Creates a new task that starts again at step `fromStep` (or, for an agent, turn `fromTurn`) of "
                    "this one, with a corrected `goal` or `input` if given: its state is this task's right after the "
                    "step before, rebuilt from its checkpoint and verified deltas. The effects this task made before "
                    "that step are inherited and never repeated; those it made from that step on are listed in the "
                    "fork's `task.forked` event and page, and each runs again only under the fork's own key, after a "
                    "person's approval unless its tool is read-only or idempotent. Works on a running task without "
                    "pausing it. Answers 201 with the fork's snapshot (`forkedFrom` names this task).",
        parameters=[TASK_ID_PARAMETER], request=InputSerializer,
        responses={201: TaskSnapshotSerializer, 400: PROBLEM_RESPONSE, 404: PROBLEM_RESPONSE, 409: PROBLEM_RESPONSE,
                   422: PROBLEM_RESPONSE, 429: PROBLEM_RESPONSE},
    )
    def post(self, request, task_id):
        rate_limit_check(request, "create")  # a fork creates a task
        original = _task_or_404(request, task_id)
        serializer = self.InputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        fork = forks.fork_create(original=original, owner=request.user, actor=requested_by_of(request),
                                 from_step=data.get("fromStep"), from_turn=data.get("fromTurn"),
                                 **({"goal": data["goal"]} if "goal" in data else {}), input=data.get("input"))
        snapshot = selectors.task_snapshot(fork, url_for=_url_for(request))
        return Response(snapshot, status=status.HTTP_201_CREATED, headers={"Location": snapshot["statusUrl"]})


class TaskForksApi(RuntimeApi):
    class ForksSerializer(serializers.Serializer):
        class Meta:
            ref_name = "TaskLineage"

        forkedFrom = serializers.JSONField(allow_null=True, help_text="{taskId, fromStep} or null")
        forks = serializers.JSONField(help_text="[{taskId, fromStep, status, createdAt}], newest first (at most 50)")

    @extend_schema(operation_id="tasks_forks", tags=["Tasks"], summary="A task's lineage",
                   description="The task this one was forked from (if any) and its own forks.",
                   parameters=[TASK_ID_PARAMETER], responses={200: ForksSerializer, 404: PROBLEM_RESPONSE})
    def get(self, request, task_id):
        lineage = forks.fork_lineage(_task_or_404(request, task_id))
        for fork in lineage["forks"]:
            fork["createdAt"] = fork["createdAt"].isoformat()
        return Response(lineage)


class TaskCursorPagination(CursorPagination):
    # The page size comes from TaskListApi's validated `limit`: DRF's own page_size_query_param silently
    # ignores a limit it cannot parse and clamps one over the maximum, so a client never learns it was wrong.
    ordering = ("-created_at", "-id")
    page_size = 50
    max_page_size = 200

    def decode_cursor(self, request):
        try:
            return super().decode_cursor(request)
        except Exception:  # DRF answers a bad cursor with 404; it is the client's malformed parameter
            raise Problem("The cursor is not valid; use the `next` or `previous` link of a page.",
                          errors=[{"field": "cursor", "message": "Invalid cursor."}]) from None


LIMIT_RANGE = f"1 to {TaskCursorPagination.max_page_size}"


class TaskListApi(RuntimeApi):
    access_actions = {"GET": access.Action.LIST_TASKS, "POST": access.Action.CREATE_TASK}
    class FilterSerializer(serializers.Serializer):
        class Meta:
            ref_name = "TaskListFilter"

        limit = serializers.IntegerField(
            min_value=1, max_value=TaskCursorPagination.max_page_size, required=False,
            help_text=f"Page size: {LIMIT_RANGE} (default {TaskCursorPagination.page_size})",
            error_messages=dict.fromkeys(["invalid", "min_value", "max_value", "max_string_length"],
                                         f"Must be an integer from {LIMIT_RANGE}."),
        )
        status = serializers.ChoiceField(choices=selectors.EXTERNAL_STATUSES, required=False)
        internalStatus = serializers.ChoiceField(choices=TaskStatus.choices, required=False)
        workflow = serializers.CharField(max_length=100, required=False)
        createdAfter = serializers.DateTimeField(required=False)
        createdBefore = serializers.DateTimeField(required=False)

    class OutputSerializer(serializers.Serializer):
        """The shape of a list item, for the OpenAPI schema (the data comes from selectors.task_list_item)."""

        class Meta:
            ref_name = "TaskListItem"

        taskId = serializers.UUIDField(source="id")
        workflow = serializers.CharField(source="workflow_name")
        status = serializers.SerializerMethodField()
        internalStatus = serializers.CharField(source="status")
        progress = serializers.FloatField()
        phase = serializers.CharField()
        priority = serializers.IntegerField()
        createdAt = serializers.DateTimeField(source="created_at")
        updatedAt = serializers.DateTimeField(source="updated_at")
        statusUrl = serializers.SerializerMethodField()

        def get_status(self, task) -> str:
            return selectors.EXTERNAL_STATUS[TaskStatus(task.status)]

        def get_statusUrl(self, task) -> str:
            return self.context["request"].build_absolute_uri(f"/runtime/tasks/{task.id}")

    @extend_schema(
        operation_id="tasks_list", tags=["Tasks"], summary="List tasks",
        description="Your tenant's tasks, newest first, one page at a time: follow `next` for older ones. Filter "
                    "by `status`, `internalStatus`, `workflow` and creation time.",
        parameters=[
            FilterSerializer,
            OpenApiParameter("cursor", str, description="Opaque position from a page's `next` or `previous` link"),
        ],
        responses={200: inline_serializer("TaskPage", {
            "next": serializers.URLField(allow_null=True), "previous": serializers.URLField(allow_null=True),
            "results": OutputSerializer(many=True)}), 400: PROBLEM_RESPONSE},
    )
    def get(self, request):
        filters = self.FilterSerializer(data=request.query_params)
        filters.is_valid(raise_exception=True)
        f = filters.validated_data
        tasks = selectors.task_list(
            tenant=request.tenant, status=f.get("status"), internal_status=f.get("internalStatus"),
            workflow=f.get("workflow"), created_after=f.get("createdAfter"), created_before=f.get("createdBefore"),
        )
        paginator = TaskCursorPagination()
        paginator.page_size = f.get("limit", paginator.page_size)
        page = paginator.paginate_queryset(tasks, request, view=self)
        # Built by a plain function, not OutputSerializer (which documents the shape): DRF's field machinery cost
        # more than the rest of the request for a page of 50.
        tasks_url = request.build_absolute_uri("/runtime/tasks/")
        return paginator.get_paginated_response([selectors.task_list_item(row, tasks_url=tasks_url) for row in page])


def _artifact_url(request, task_id, name: str) -> str:
    return request.build_absolute_uri(f"/runtime/tasks/{task_id}/artifacts/{name}")


class TaskArtifactListApi(RuntimeApi):
    access_actions = {"GET": access.Action.DOWNLOAD_ARTIFACT}
    class OutputSerializer(serializers.Serializer):
        """The shape of the list, for the OpenAPI schema (the data comes from selectors.task_artifacts)."""

        class Meta:
            ref_name = "TaskArtifact"

        name = serializers.CharField()
        bytes = serializers.IntegerField()
        contentType = serializers.CharField()
        createdAt = serializers.DateTimeField()
        url = serializers.URLField(help_text="GET it for the file")

    @extend_schema(operation_id="tasks_artifacts_list", tags=["Tasks"], summary="List a task's artifacts",
                   description="The files the task's committed steps wrote (reports, exports), each with its size, "
                               "content type and download URL. A file written by an attempt that did not commit "
                               "is not listed.",
                   parameters=[TASK_ID_PARAMETER],
                   responses={200: inline_serializer("TaskArtifacts", {"artifacts": OutputSerializer(many=True)}),
                              404: PROBLEM_RESPONSE})
    def get(self, request, task_id):
        task = _task_or_404(request, task_id)
        return Response({"artifacts": [
            {"name": a["name"], "bytes": a["bytes"], "contentType": artifact_content_type(a["name"]),
             "createdAt": a["at"], "url": _artifact_url(request, task.id, a["name"])}
            for a in selectors.task_artifacts(task_id=task.id).values()]})


class TaskArtifactApi(RuntimeApi):
    access_actions = {"GET": access.Action.DOWNLOAD_ARTIFACT}
    @extend_schema(operation_id="tasks_artifacts_retrieve", tags=["Tasks"], summary="Download an artifact",
                   description="The file, streamed, with its content type and length. Served as an attachment "
                               "in a sandbox: a file a workflow wrote never runs as a page of this site.",
                   parameters=[TASK_ID_PARAMETER, OpenApiParameter("name", str, OpenApiParameter.PATH)],
                   responses={(200, "application/octet-stream"): OpenApiTypes.BINARY, 404: PROBLEM_RESPONSE})
    def get(self, request, task_id, name):
        task = _task_or_404(request, task_id)
        try:
            return artifact_response(task_id=task.id, name=name)
        except ArtifactNotFound as missing:
            raise exceptions.NotFound(str(missing)) from None

    def finalize_response(self, request, response, *args, **kwargs):
        # A FileResponse is not DRF's to render; errors (Response) are.
        if isinstance(response, FileResponse):
            return response
        return super().finalize_response(request, response, *args, **kwargs)


class WorkflowListApi(RuntimeApi):
    @extend_schema(
        operation_id="workflows_list", tags=["Workflows"], summary="List workflows",
        description="The workflows your tenant's tasks can run: name, description, version and the JSON Schema its "
                    "`input` must match.",
        responses={200: inline_serializer("Workflow", {
            "name": serializers.CharField(), "description": serializers.CharField(),
            "version": serializers.CharField(), "inputSchema": serializers.JSONField()}, many=True)},
    )
    def get(self, request):
        return Response([
            {"name": w.name, "description": w.description, "version": w.version, "inputSchema": w.input_schema}
            for w in selectors.workflows_for(request.tenant)
        ])


class TaskCollectionApi(TaskListApi, TaskCreateApi):
    """/runtime/tasks: GET lists (TaskListApi), POST creates (TaskCreateApi); one URL, two operations."""


@answers_unknown_paths
def task_path_not_found(request, segment: str, rest: str | None = None):
    """/runtime/tasks/<something that is not a task id>[/…]: a 404 that shows what a task id looks like."""
    if TASK_ID.fullmatch(segment):
        return path_not_found(request)  # a real id with an unknown tail (a trailing slash, a typo): "did you mean"
    shown = segment if len(segment) <= 64 else f"{segment[:61]}…"
    if re.fullmatch(r"[0-9a-fA-F]{32}", segment):
        detail = (f"`{shown}` is not a task id: task ids are UUIDs written with dashes; did you mean "
                  f"/runtime/tasks/{uuid.UUID(segment)}{rest or ''}?")
    else:
        detail = f"`{shown}` is not a task id: task ids are UUIDs like {TASK_ID_EXAMPLE}."
    return problem_response(status_code=404, slug="not-found", detail=detail)
