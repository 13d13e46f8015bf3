"""REST API for tasks under /runtime/: thin views over services and selectors (one APIView per operation)."""

from __future__ import annotations

from django.http import Http404
from django.utils import timezone
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema, inline_serializer
from rest_framework import serializers, status
from rest_framework.pagination import CursorPagination
from rest_framework.response import Response
from rest_framework.views import APIView

from config.problems import Problem
from tasks_app import selectors, services
from tasks_app.models import TaskStatus
from tasks_app.registry import registry


def _url_for(request):
    return request.build_absolute_uri


def _task_or_404(request, task_id):
    task = selectors.task_get(tenant=request.tenant, task_id=task_id)
    if task is None:
        # The same answer whether the id does not exist or belongs to another tenant.
        raise Http404
    return task


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
    result = serializers.JSONField(required=False, help_text="Present when completed")
    resultRef = serializers.CharField(required=False, help_text="Storage reference of a large result")
    error = serializers.JSONField(required=False, help_text="Present when failed: {type, message, step, attempt}")


PROBLEM_RESPONSE = OpenApiResponse(description="Problem details (application/problem+json)")


class TaskCreateApi(APIView):
    class InputSerializer(StrictSerializer):
        class BudgetSerializer(StrictSerializer):
            class Meta:
                ref_name = "TaskBudget"

            maxSteps = serializers.IntegerField(min_value=1, max_value=2_147_483_647, required=False)
            maxCost = serializers.DecimalField(max_digits=12, decimal_places=4, min_value=0, required=False,
                                               coerce_to_string=False)

        class Meta:
            ref_name = "TaskCreate"

        workflow = serializers.CharField(max_length=100, help_text="A name from GET /runtime/workflows")
        input = serializers.JSONField(help_text="Validated against the workflow's input JSON Schema")
        goal = serializers.JSONField(required=False, allow_null=True, help_text="The goal; steering may adjust it")
        priority = serializers.IntegerField(min_value=0, max_value=9, default=5, help_text="0 lowest … 9 most urgent")
        deadline = serializers.DateTimeField(required=False, allow_null=True)
        budget = BudgetSerializer(required=False)

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
        request=InputSerializer,
        parameters=[OpenApiParameter("Idempotency-Key", str, OpenApiParameter.HEADER, pattern=r"^[!-~]{1,255}$",
                                     description="Retry-safe creation: the same key and body return the same task "
                                                 "(1–255 visible ASCII characters, e.g. a UUID)")],
        responses={201: TaskSnapshotSerializer, 200: TaskSnapshotSerializer, 400: PROBLEM_RESPONSE,
                   409: PROBLEM_RESPONSE, 413: PROBLEM_RESPONSE, 422: PROBLEM_RESPONSE},
    )
    def post(self, request):
        # The key is checked before the body so a malformed key never depends on what else is wrong.
        idempotency_key = services.idempotency_key_validate(request.headers.get("Idempotency-Key"))
        serializer = self.InputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        budget = data.get("budget", {})
        outcome = services.task_create(
            tenant=request.tenant, owner=request.user, workflow=data["workflow"], input=data["input"],
            goal=data.get("goal"), priority=data["priority"], deadline_at=data.get("deadline"),
            budget_steps=budget.get("maxSteps"), budget_cost=budget.get("maxCost"), idempotency_key=idempotency_key,
        )
        snapshot = selectors.task_snapshot(outcome.task, url_for=_url_for(request))
        return Response(snapshot, status=status.HTTP_201_CREATED if outcome.created else status.HTTP_200_OK,
                        headers={"Location": snapshot["statusUrl"]})


class TaskDetailApi(APIView):
    @extend_schema(operation_id="tasks_retrieve", responses={200: TaskSnapshotSerializer, 404: PROBLEM_RESPONSE})
    def get(self, request, task_id):
        task = _task_or_404(request, task_id)
        return Response(selectors.task_snapshot(task, url_for=_url_for(request)))


class TaskCursorPagination(CursorPagination):
    ordering = ("-created_at", "-id")
    page_size = 50
    page_size_query_param = "limit"
    max_page_size = 200

    def decode_cursor(self, request):
        try:
            return super().decode_cursor(request)
        except Exception:  # DRF answers a bad cursor with 404; it is the client's malformed parameter
            raise Problem("The cursor is not valid; use the `next` or `previous` link of a page.",
                          errors=[{"field": "cursor", "message": "Invalid cursor."}]) from None


class TaskListApi(APIView):
    class FilterSerializer(serializers.Serializer):
        class Meta:
            ref_name = "TaskListFilter"

        status = serializers.ChoiceField(choices=selectors.EXTERNAL_STATUSES, required=False)
        internalStatus = serializers.ChoiceField(choices=TaskStatus.choices, required=False)
        workflow = serializers.CharField(max_length=100, required=False)
        createdAfter = serializers.DateTimeField(required=False)
        createdBefore = serializers.DateTimeField(required=False)

    class OutputSerializer(serializers.Serializer):
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

    @extend_schema(operation_id="tasks_list", parameters=[
        FilterSerializer,
        OpenApiParameter("cursor", str, description="Opaque position from a page's `next` or `previous` link"),
        OpenApiParameter("limit", int, description="Page size (default 50, at most 200)"),
    ], responses={200: inline_serializer("TaskPage", {
        "next": serializers.URLField(allow_null=True), "previous": serializers.URLField(allow_null=True),
        "results": OutputSerializer(many=True)}), 400: PROBLEM_RESPONSE})
    def get(self, request):
        filters = self.FilterSerializer(data=request.query_params)
        filters.is_valid(raise_exception=True)
        f = filters.validated_data
        tasks = selectors.task_list(
            tenant=request.tenant, status=f.get("status"), internal_status=f.get("internalStatus"),
            workflow=f.get("workflow"), created_after=f.get("createdAfter"), created_before=f.get("createdBefore"),
        )
        paginator = TaskCursorPagination()
        page = paginator.paginate_queryset(tasks, request, view=self)
        data = self.OutputSerializer(page, many=True, context={"request": request}).data
        return paginator.get_paginated_response(data)


class TaskCancelApi(APIView):
    class InputSerializer(StrictSerializer):
        class Meta:
            ref_name = "TaskCancel"

        reason = serializers.CharField(max_length=500, required=False, allow_blank=True, default="")

    @extend_schema(operation_id="tasks_cancel", request=InputSerializer,
                   responses={202: TaskSnapshotSerializer, 400: PROBLEM_RESPONSE, 404: PROBLEM_RESPONSE,
                              409: PROBLEM_RESPONSE})
    def post(self, request, task_id):
        task = _task_or_404(request, task_id)
        serializer = self.InputSerializer(data=request.data or {})
        serializer.is_valid(raise_exception=True)
        task = services.task_cancel(task=task, reason=serializer.validated_data["reason"], requested_by=request.user)
        return Response(selectors.task_snapshot(task, url_for=_url_for(request)), status=status.HTTP_202_ACCEPTED)


class WorkflowListApi(APIView):
    @extend_schema(operation_id="workflows_list", responses={200: inline_serializer("Workflow", {
        "name": serializers.CharField(), "description": serializers.CharField(),
        "version": serializers.CharField(), "inputSchema": serializers.JSONField()}, many=True)})
    def get(self, request):
        return Response([
            {"name": w.name, "description": w.description, "version": w.version, "inputSchema": w.input_schema}
            for w in registry.all()
        ])


class TaskCollectionApi(TaskListApi, TaskCreateApi):
    """/runtime/tasks: GET lists (TaskListApi), POST creates (TaskCreateApi); one URL, two operations."""
