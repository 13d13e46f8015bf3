"""REST for steering: submit a command, list a task's commands, the cancel shorthand (thin views over
steering_app.services and steering_app.selectors)."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers, status
from rest_framework.response import Response

from steering_app import selectors as steering_selectors
from steering_app import services
from steering_app.errors import VersionConflict
from steering_app.models import CommandType
from tasks_app import access, selectors
from tasks_app.web.api import (
    PROBLEM_RESPONSE,
    TASK_ID_PARAMETER,
    RuntimeApi,
    StrictSerializer,
    TaskSnapshotSerializer,
    _task_or_404,
    _url_for,
)
from tasks_app.web.authentication import rate_limit_check, requested_by_of


class HistoryItemSerializer(serializers.Serializer):
    """One command in a task's steering history (for the OpenAPI schema; the data is
    steering_app.selectors.steering_history)."""

    class Meta:
        ref_name = "SteeringHistoryItem"

    commandId = serializers.UUIDField()
    type = serializers.ChoiceField(choices=CommandType.choices)
    payload = serializers.JSONField()
    status = serializers.ChoiceField(choices=["pending", "applied", "rejected"])
    requestedBy = serializers.CharField(help_text="user:<name>, token:<prefix> for an API token, "
                                        "oauth:<client> for an OAuth access token")
    reason = serializers.CharField()
    expectedVersion = serializers.IntegerField(allow_null=True, help_text="null: sent without a version check")
    oldVersion = serializers.IntegerField()
    newVersion = serializers.IntegerField()
    createdAt = serializers.DateTimeField()
    appliedAt = serializers.DateTimeField(allow_null=True)
    rejection = serializers.CharField(allow_null=True, help_text="Why it was rejected")


class TaskSteeringApi(RuntimeApi):
    access_actions = {"POST": access.Action.STEER}  # (a kill is checked again by the service: may_kill)

    class InputSerializer(StrictSerializer):
        class Meta:
            ref_name = "SteeringCommandSubmit"

        type = serializers.ChoiceField(choices=CommandType.choices)
        payload = serializers.JSONField(required=False, default=dict)
        expectedVersion = serializers.IntegerField(min_value=0, help_text="The snapshot's stateVersion you decided on")
        reason = serializers.CharField(max_length=500, required=False, allow_blank=True, default="")
        commandId = serializers.UUIDField(required=False, help_text="Retry-safe: the same id answers the first "
                                                                    "submission again")

    @extend_schema(
        operation_id="tasks_steering_submit", tags=["Steering"], summary="Steer a task",
        description="Queue a command for the task: pause, resume, cancel, set_priority `{priority}`, adjust_goal "
                    "`{goal?, parameters?}` (the workflow re-plans from the cursor), provide_input `{waitId, value, "
                    "files?, credentials?}`, approve / reject `{waitId}` (answer the snapshot's `wait`; a value "
                    "that fails the wait's schema is a 422 and the task still waits), set_budget `{maxSteps?, "
                    "maxCost?, maxTokens?}` (each a number, or null to remove that budget; a task waiting in its "
                    "budget wait goes on once its budgets allow it). A command is applied at the task's next safe "
                    "point, between steps (resume, answers and a waiting task's set_budget at once). `kill` "
                    "(operators with the kill permission, a reason required) stops the task without waiting for its "
                    "running step: the step's effect is reconciled, never assumed. `expectedVersion` must be the "
                    "snapshot's `stateVersion`: if the task changed since, 409 with the current snapshot. A command "
                    "that makes no sense in the task's status, or a bad payload, is a 422 saying why.",
        parameters=[TASK_ID_PARAMETER], request=InputSerializer,
        responses={202: inline_serializer("SteeringAccepted", {
            "commandId": serializers.UUIDField(), "stateVersion": serializers.IntegerField(),
            "status": serializers.CharField()}),
            400: PROBLEM_RESPONSE, 403: PROBLEM_RESPONSE, 404: PROBLEM_RESPONSE, 409: PROBLEM_RESPONSE,
            422: PROBLEM_RESPONSE, 429: PROBLEM_RESPONSE},
    )
    def post(self, request, task_id):
        rate_limit_check(request, "steer")  # first: a refused request does nothing (429, Retry-After)
        task = _task_or_404(request, task_id)
        serializer = self.InputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        try:
            submitted = services.steering_submit(
                task=task, command_type=data["type"], payload=data["payload"],
                expected_version=data["expectedVersion"], reason=data["reason"],
                requested_by=requested_by_of(request), command_id=data.get("commandId"),
                may_kill=access.allows(access.actor_for_request(request), access.Action.KILL))
        except VersionConflict as conflict:
            task.refresh_from_db()
            conflict.extra["snapshot"] = selectors.task_snapshot(task, url_for=_url_for(request))
            raise
        return Response({"commandId": str(submitted.command.id), "stateVersion": submitted.state_version,
                         "status": "replayed" if submitted.replayed else "accepted"},
                        status=status.HTTP_202_ACCEPTED)

    @extend_schema(
        operation_id="tasks_steering_list", tags=["Steering"], summary="A task's steering history",
        description="Every command submitted for the task, newest first: pending, applied (when) or rejected "
                    "(why), who asked and why, and the versions it moved the task between.",
        parameters=[TASK_ID_PARAMETER],
        responses={200: inline_serializer("SteeringHistory", {"commands": HistoryItemSerializer(many=True)}),
                   404: PROBLEM_RESPONSE},
    )
    def get(self, request, task_id):
        task = _task_or_404(request, task_id)
        return Response({"commands": steering_selectors.steering_history(task=task)})


class TaskCancelApi(RuntimeApi):
    access_actions = {"POST": access.Action.CANCEL}

    class InputSerializer(StrictSerializer):
        class Meta:
            ref_name = "TaskCancel"

        reason = serializers.CharField(max_length=500, required=False, allow_blank=True, default="")

    @extend_schema(operation_id="tasks_cancel", tags=["Tasks"], summary="Cancel a task",
                   description="Shorthand for a `cancel` steering command (POST /runtime/tasks/{id}/steering) "
                               "without a version check. A task no worker is running (queued, paused, waiting for "
                               "input) is cancelled at once; a running one becomes `cancelling` and its worker "
                               "stops it at the next safe point. Asking again while it is cancelling or once it is "
                               "cancelled changes nothing and answers 202 with the snapshot. A finished task "
                               "(completed, failed, dead-lettered) cannot be cancelled: 409.",
                   parameters=[TASK_ID_PARAMETER], request=InputSerializer,
                   responses={202: TaskSnapshotSerializer, 400: PROBLEM_RESPONSE, 404: PROBLEM_RESPONSE,
                              409: PROBLEM_RESPONSE, 429: PROBLEM_RESPONSE})
    def post(self, request, task_id):
        rate_limit_check(request, "steer")
        task = _task_or_404(request, task_id)
        serializer = self.InputSerializer(data=request.data or {})
        serializer.is_valid(raise_exception=True)
        task = services.steering_cancel(task=task, reason=serializer.validated_data["reason"],
                                        requested_by=requested_by_of(request))
        return Response(selectors.task_snapshot(task, url_for=_url_for(request)), status=status.HTTP_202_ACCEPTED)
