"""Reads: the task snapshot, task lists, the event chain check. Always tenant-scoped, always from PostgreSQL."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import datetime
from decimal import Decimal
from typing import Any

from django.db import connection
from django.db.models import QuerySet

from tasks_app.events import event_hash
from tasks_app.models import SealedHead, Task, TaskEvent, TaskStatus, Tenant
from tasks_app.registry import UnknownWorkflow, Workflow, budget_policy, registry

# Internal status -> external (REST `status` and MCP): MCP knows working, input_required, completed, failed,
# cancelled; the others are shown as `working` with a statusMessage saying which (ARCHITECTURE §3).
EXTERNAL_STATUS = {
    TaskStatus.QUEUED: "working",
    TaskStatus.WORKING: "working",
    TaskStatus.PAUSING: "working",
    TaskStatus.PAUSED: "working",
    TaskStatus.CANCELLING: "working",
    TaskStatus.RECOVERING: "working",
    TaskStatus.INPUT_REQUIRED: "input_required",
    TaskStatus.COMPLETED: "completed",
    TaskStatus.FAILED: "failed",
    TaskStatus.DEAD_LETTERED: "failed",
    TaskStatus.CANCELLED: "cancelled",
}
EXTERNAL_STATUSES = sorted(set(EXTERNAL_STATUS.values()))

DEFAULT_STATUS_MESSAGE = {
    TaskStatus.QUEUED: "Queued: waiting for a worker",
    TaskStatus.WORKING: "Working",
    TaskStatus.PAUSING: "Pausing at the next safe point",
    TaskStatus.PAUSED: "Paused",
    TaskStatus.CANCELLING: "Cancelling at the next safe point",
    TaskStatus.RECOVERING: "Recovering: resuming from the last checkpoint after a worker was lost",
    TaskStatus.INPUT_REQUIRED: "Waiting for input",
    TaskStatus.COMPLETED: "Completed",
    TaskStatus.FAILED: "Failed",
    TaskStatus.DEAD_LETTERED: "Dead-lettered: needs an operator to retry or abandon it",
    TaskStatus.CANCELLED: "Cancelled",
}


def workflows_for(tenant: Tenant) -> list[type[Workflow]]:
    """The registered workflows ``tenant`` may run (Tenant.workflows), by name."""
    return [workflow for workflow in registry.all() if tenant.may_run(workflow.name)]


def internal_statuses_for(external: str) -> list[str]:
    return sorted(internal for internal, ext in EXTERNAL_STATUS.items() if ext == external)


def task_id_prefix_bounds(text: str) -> tuple[uuid.UUID, uuid.UUID] | None:
    """The range of task ids that start with `text` (hex digits, dashes ignored: "3f2a9c1e", "3f2a9c1e-41"), for a
    search by what a person copied from a log line; None for anything else, or fewer than 4 digits (a prefix that
    short matches a sixteenth of every task)."""
    digits = text.replace("-", "").lower()
    if not 4 <= len(digits) <= 32 or any(char not in "0123456789abcdef" for char in digits):
        return None
    return uuid.UUID(digits.ljust(32, "0")), uuid.UUID(digits.ljust(32, "f"))


def task_get(*, tenant: Tenant, task_id) -> Task | None:
    """One row read. A task of another tenant is simply not found (the API answers 404, never 403)."""
    return Task.objects.filter(tenant=tenant, id=task_id).first()


def task_snapshot(task: Task, *, url_for: Callable[[str], str]) -> dict[str, Any]:
    """The authoritative snapshot, built from the task row alone (no joins, no per-step reads)."""
    status = TaskStatus(task.status)
    snapshot: dict[str, Any] = {
        "taskId": str(task.id),
        "workflow": task.workflow_name,
        "workflowVersion": task.workflow_version,
        "status": EXTERNAL_STATUS[status],
        "statusMessage": task.status_message or DEFAULT_STATUS_MESSAGE[status],
        "internalStatus": status.value,
        "progress": task.progress,
        "phase": task.phase,
        "priority": task.priority,
        "stateVersion": task.state_version,
        "planVersion": task.plan_version,
        "stepsCompleted": task.steps_completed,
        "recoveries": task.recoveries,
        "lastCheckpoint": (
            {"sequence": task.checkpoint_sequence, "at": task.checkpoint_at}
            if task.checkpoint_sequence is not None else None
        ),
        "deadline": task.deadline_at,
        "createdAt": task.created_at,
        "updatedAt": task.updated_at,
        "completedAt": task.completed_at,
        "statusUrl": url_for(f"/runtime/tasks/{task.id}"),
        "streamUrl": url_for(f"/runtime/tasks/{task.id}/events"),
        "artifactsUrl": url_for(f"/runtime/tasks/{task.id}/artifacts"),
    }
    try:
        workflow = registry.get(task.workflow_name)
    except UnknownWorkflow:
        workflow = None
    # Cost as exact decimal text (the columns are decimals; a JSON number would round them).
    snapshot["budget"] = {"maxSteps": task.budget_steps, "maxCost": _decimal_text(task.budget_cost),
                          "maxTokens": task.budget_tokens,
                          "onExhausted": budget_policy(workflow, task.budget_on_exhausted)}
    snapshot["costSpent"] = _decimal_text(task.cost_spent)
    snapshot["tokensSpent"] = task.tokens_spent
    if task.approval_policy:
        snapshot["approvalPolicy"] = task.approval_policy
    if task.checkpoint_policy:
        snapshot["checkpointPolicy"] = task.checkpoint_policy
    if task.tool_policy:
        snapshot["toolPolicy"] = task.tool_policy
    if task.forked_from_id:  # (its forks are on its page and GET …/forks: this stays one row read)
        snapshot["forkedFrom"] = {"taskId": str(task.forked_from_id), "fromStep": task.forked_from_step}
    if task.wait and status in (TaskStatus.INPUT_REQUIRED, TaskStatus.PAUSED):  # (a deadline may end a wait)
        # answer it: POST …/steering {type: provide_input | approve | reject, waitId}; a budget wait: set_budget
        snapshot["wait"] = task.wait
    if status == TaskStatus.COMPLETED:
        snapshot["result"] = task.result
        if task.result_ref:
            snapshot["resultRef"] = task.result_ref
    if status in (TaskStatus.FAILED, TaskStatus.DEAD_LETTERED) or task.error:
        snapshot["error"] = task.error
    return snapshot


def _decimal_text(value) -> str | None:
    """A cost as the columns keep it: 4 places, whether the value was read back or is the one just created."""
    return None if value is None else f"{Decimal(value):.4f}"


def task_artifacts(*, task_id) -> dict[str, dict[str, Any]]:
    """A task's committed artifacts by name, in the order they were written (a name written again: the newest).

    Read from the task's `artifact` events, which only a step's fenced commit writes: a file that a failed attempt,
    a crashed step or a zombie wrote is stored but never listed (context.artifact)."""
    rows = TaskEvent.objects.filter(task_id=task_id, type="artifact").order_by("seq").values_list("seq", "data", "at")
    return artifacts_from_events(rows)


def artifacts_from_events(rows) -> dict[str, dict[str, Any]]:
    """(seq, data, at) rows of a task's artifact events, in seq order → its artifacts by name (a name written again:
    the newest, listed last)."""
    artifacts: dict[str, dict[str, Any]] = {}
    for seq, data, at in rows:
        artifacts.pop(data["name"], None)
        artifacts[data["name"]] = {"name": data["name"], "ref": data["ref"], "bytes": data["bytes"], "seq": seq,
                                   "at": at}
    return artifacts


# The columns a list item shows: not the input, goal, result or error a task row may carry in kilobytes.
TASK_LIST_FIELDS = ("id", "workflow_name", "status", "progress", "phase", "priority", "created_at", "updated_at")


def task_list(
    *,
    tenant: Tenant,
    status: str | None = None,
    internal_status: str | None = None,
    workflow: str | None = None,
    created_after: datetime | None = None,
    created_before: datetime | None = None,
) -> QuerySet:
    """A tenant's tasks, filtered, as rows of TASK_LIST_FIELDS (dicts: no model instance per row); the caller
    orders and pages them (task_tenant_created_idx serves newest-first)."""
    tasks = Task.objects.filter(tenant=tenant)
    if status:
        tasks = tasks.filter(status__in=internal_statuses_for(status))
    if internal_status:
        tasks = tasks.filter(status=internal_status)
    if workflow:
        tasks = tasks.filter(workflow_name=workflow)
    if created_after:
        tasks = tasks.filter(created_at__gte=created_after)
    if created_before:
        tasks = tasks.filter(created_at__lt=created_before)
    return tasks.values(*TASK_LIST_FIELDS)


def task_list_item(row: dict[str, Any], *, tasks_url: str) -> dict[str, Any]:
    """One task in a list page (a row of task_list); ``tasks_url`` is the absolute URL of /runtime/tasks/."""
    return {
        "taskId": str(row["id"]),
        "workflow": row["workflow_name"],
        "status": EXTERNAL_STATUS[TaskStatus(row["status"])],
        "internalStatus": row["status"],
        "progress": row["progress"],
        "phase": row["phase"],
        "priority": row["priority"],
        "createdAt": row["created_at"],
        "updatedAt": row["updated_at"],
        "statusUrl": f"{tasks_url}{row['id']}",
    }


# A progress event binds the state deltas of the steps it covers: one step's sha256 as deltaSha256, several as
# deltasSha256 (the sha256 of their sha256s, hex, in step order, from firstStep to stepsCompleted). A delta edited
# since (recovery would replay it) no longer matches the event that recorded it.
_DELTA_MISMATCH = """
SELECT min(e.seq) FROM tasks_app_taskevent e
 WHERE e.task_id = %(task_id)s AND e.type = 'progress'
   AND CASE WHEN e.data ? 'deltaSha256' THEN
            e.data ->> 'deltaSha256' IS DISTINCT FROM (
                SELECT encode(sha256(convert_to(s.state_delta, 'UTF8')), 'hex') FROM tasks_app_step s
                 WHERE s.task_id = e.task_id AND s.status = 'committed'
                   AND s.seq = (e.data ->> 'stepsCompleted')::int)
            WHEN e.data ? 'deltasSha256' THEN
            e.data ->> 'deltasSha256' IS DISTINCT FROM (
                SELECT encode(sha256(convert_to(string_agg(encode(sha256(convert_to(s.state_delta, 'UTF8')), 'hex'),
                                                           '' ORDER BY s.seq), 'UTF8')), 'hex')
                  FROM tasks_app_step s
                 WHERE s.task_id = e.task_id AND s.status = 'committed'
                   AND s.seq BETWEEN (e.data ->> 'firstStep')::int AND (e.data ->> 'stepsCompleted')::int)
            ELSE false END
"""


def task_events_verify(*, task_id) -> int | None:
    """Walk a task's event chain; return the seq of the first event whose hash or link is wrong — or whose
    step's state delta no longer matches what the event recorded — or None when all is intact."""
    task_head = Task.objects.values("event_seq", "event_head_hash").get(id=task_id)
    head = ""
    expected_seq = 0
    for event in TaskEvent.objects.filter(task_id=task_id).order_by("seq").iterator():
        expected_seq += 1
        recomputed = event_hash(prev_hash=head, seq=event.seq, type=event.type, data=event.data)
        if event.seq != expected_seq or event.prev_hash != head or event.hash != recomputed:
            return expected_seq
        head = event.hash
    # A removed tail leaves an intact but short chain: the task row remembers where the head must be.
    if expected_seq != task_head["event_seq"] or head != task_head["event_head_hash"]:
        return expected_seq + 1
    with connection.cursor() as cursor:
        cursor.execute(_DELTA_MISMATCH, {"task_id": task_id})
        return cursor.fetchone()[0]


def task_verification(task: Task) -> dict:
    """A task's verification state for its page: {"brokenAt": first bad seq or None, "sealedSeq", "sealSequence",
    "sealHolds": whether the event at the sealed seq still has the sealed hash}, from the seals' index rows
    (tasks_app.audit.anchors; the proof against the signed files is verify_events --anchors). Walks the chain: callers
    limit it to chains of a size a page can afford."""
    sealed = SealedHead.objects.filter(task_id=task.id).values_list("seq", "hash", "seal_sequence").first()
    state = {"brokenAt": task_events_verify(task_id=task.id), "sealedSeq": None, "sealSequence": None,
             "sealHolds": None}
    if sealed is not None:
        seq, head, sequence = sealed
        current = task.events.filter(seq=seq).values_list("hash", flat=True).first()
        state.update(sealedSeq=seq, sealSequence=sequence, sealHolds=current == head)
    return state
