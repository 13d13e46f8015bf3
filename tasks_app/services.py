"""Writes: creating tasks, API tokens and tenants.

Views, admin actions, Celery tasks and MCP methods call these; none of them writes rows itself.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models.functions import Now

from config.base.canonical import canonical_sha256, nul_paths
from config.base.problems import Problem
from tasks_app.db import sql
from tasks_app.db.dispatch import hints_for_tenant_room, task_dispatch
from tasks_app.db.prepared import prepared_fetchone
from tasks_app.errors import (
    IdempotencyKeyReused,
    InputSchemaViolation,
    InvalidIdempotencyKey,
    TaskLimitReached,
    UnknownWorkflowProblem,
)
from tasks_app.events import chain_events, status_event
from tasks_app.models import (
    BUDGET_MAX_TOKENS,
    TOKEN_SCOPES,
    AdminAction,
    ApiToken,
    Task,
    TaskEvent,
    TaskStatus,
    Tenant,
    TenantMembership,
    task_tool_policy_errors,
)
from tasks_app.observability import tracing
from tasks_app.redaction import redact
from tasks_app.registry import BUDGET_POLICIES, UnknownWorkflow, registry
from tasks_app.streaming import events_publish

_EVENT_DATA = TaskEvent._meta.get_field("data")

# Visible ASCII, no spaces, 1–255 characters (a UUID is the usual choice).
IDEMPOTENCY_KEY_RE = re.compile(r"^[\x21-\x7e]{1,255}$")

# ---------------------------------------------------------------------------------------------------------------
# Creating tasks
# ---------------------------------------------------------------------------------------------------------------
def idempotency_key_validate(key: str | None) -> str | None:
    if key is None:
        return None
    if not IDEMPOTENCY_KEY_RE.match(key):
        raise InvalidIdempotencyKey(
            "The Idempotency-Key header must be 1 to 255 visible ASCII characters without spaces.",
            errors=[{"field": "Idempotency-Key", "message": "1–255 visible ASCII characters, no spaces."}],
        )
    return key


def task_request_fingerprint(*, workflow: str, input: Any, goal: Any = None, priority: int = 5,
                             deadline_at: datetime | None = None, budget_steps: int | None = None,
                             budget_cost: Decimal | None = None, budget_tokens: int | None = None,
                             budget_on_exhausted: str | None = None, approval_policy: dict | None = None,
                             checkpoint_policy: dict | None = None, tool_policy: dict | None = None) -> str:
    """What a creating request asked for, hashed: the same Idempotency-Key with another fingerprint is a 409.
    (The policies and the newer budget fields count only when given, so a request without them hashes as it did
    before they existed.)"""
    policies = {key: value for key, value in (("approval_policy", approval_policy),
                                              ("checkpoint_policy", checkpoint_policy),
                                              ("tool_policy", tool_policy), ("budget_tokens", budget_tokens),
                                              ("budget_on_exhausted", budget_on_exhausted))
                if value or (key == "budget_tokens" and value == 0)}
    return canonical_sha256({
        "workflow": workflow, "input": input, "goal": goal, "priority": priority,
        "deadline_at": deadline_at.isoformat() if deadline_at else None,
        "budget_steps": budget_steps, "budget_cost": str(budget_cost) if budget_cost is not None else None,
        **policies,
    })


def task_budget_errors(*, budget_tokens: Any, budget_on_exhausted: Any) -> list[dict]:
    """What is wrong with a task's token budget and budget policy, as [{field, message}] (empty: nothing)."""
    errors = []
    if budget_tokens is not None and (not isinstance(budget_tokens, int) or isinstance(budget_tokens, bool)
                                      or not 0 <= budget_tokens <= BUDGET_MAX_TOKENS):
        errors.append({"field": "budget.maxTokens", "message": f"A whole number from 0 to {BUDGET_MAX_TOKENS}."})
    if budget_on_exhausted is not None and budget_on_exhausted not in BUDGET_POLICIES:
        errors.append({"field": "budget.onExhausted", "message": f"One of {', '.join(BUDGET_POLICIES)}."})
    return errors


@dataclass(frozen=True)
class TaskCreated:
    task: Task
    created: bool  # False: an earlier request with the same Idempotency-Key created it


def task_create(
    *,
    tenant: Tenant,
    owner,
    workflow: str,
    input: dict[str, Any],
    goal: Any = None,
    priority: int = 5,
    deadline_at: datetime | None = None,
    budget_steps: int | None = None,
    budget_cost: Decimal | None = None,
    budget_tokens: int | None = None,
    budget_on_exhausted: str | None = None,
    idempotency_key: str | None = None,
    approval_policy: dict | None = None,
    checkpoint_policy: dict | None = None,
    tool_policy: dict | None = None,
    trace_context: dict | None = None,
    agent_identity: str = "",
    created_by_token_id: int | None = None,
) -> TaskCreated:
    """Validate against the workflow's schema and create a queued task with its first event: one statement
    (sql.TASK_CREATE), then the run_step hint.

    With an idempotency key, the same key and the same request return the task the first request created;
    the same key with a different request raises IdempotencyKeyReused. Two concurrent requests with one key
    create one row: the second INSERT waits on the unique index until the first commits, inserts nothing and
    reads the winner's row.

    ``tool_policy``: the task's narrowing of its tenant's tool policy ({deny, allow, requireApproval, maxCalls});
    a malformed one is refused here, whoever calls (the API's serializer reports it first, with the other fields).
    ``budget_tokens``: model tokens (in + out) the task may use; ``budget_on_exhausted``: "fail" or "wait" when a
    budget is spent (None: the workflow's on_budget_exhausted).
    ``trace_context``: the caller's W3C trace context ({traceparent, tracestate}: the HTTP headers, an MCP request's
    _meta); what the task stores is decided by tracing.task_trace_context (not part of the request's fingerprint).
    ``agent_identity``: the agent the owner acted through ("token:<prefix>"; "" for a person signed in), with the
    token's id (tasks_app.access.Actor); not part of the fingerprint either.
    """
    idempotency_key_validate(idempotency_key)
    budget_errors = task_budget_errors(budget_tokens=budget_tokens, budget_on_exhausted=budget_on_exhausted)
    if budget_errors:
        raise Problem("The budget is not valid.", errors=budget_errors)
    if tool_policy is not None and (tool_policy_errors := task_tool_policy_errors(tool_policy)):
        raise Problem("The toolPolicy is not valid.", errors=tool_policy_errors)
    nul_fields = nul_paths(input, "input") + nul_paths(goal, "goal")
    if nul_fields:
        raise Problem("Text may not contain the NUL character (\\u0000).",
                      errors=[{"field": field, "message": "Contains a NUL character (\\u0000); remove it."}
                              for field in nul_fields])
    try:
        workflow_cls = registry.get(workflow)
        if not tenant.may_run(workflow):  # (answered as an unknown one: what a tenant may not run is not its concern)
            raise UnknownWorkflow(workflow)
    except UnknownWorkflow:
        available = ", ".join(name for name in registry.names() if tenant.may_run(name)) or "none"
        raise UnknownWorkflowProblem(
            f"There is no workflow named {workflow!r}. Available: {available}.",
            errors=[{"field": "workflow", "message": f"Unknown workflow; use one of: {available}."}],
        ) from None
    errors = workflow_cls.input_errors(input) or workflow_cls.tenant_errors(input, tenant=tenant)
    if errors:
        raise InputSchemaViolation(
            f"The input does not match the schema of workflow {workflow!r} (version {workflow_cls.version}).",
            errors=errors,
        )
    fingerprint = task_request_fingerprint(workflow=workflow, input=input, goal=goal, priority=priority,
                                           deadline_at=deadline_at, budget_steps=budget_steps, budget_cost=budget_cost,
                                           budget_tokens=budget_tokens, budget_on_exhausted=budget_on_exhausted,
                                           approval_policy=approval_policy, checkpoint_policy=checkpoint_policy,
                                           tool_policy=tool_policy)
    task = Task(
        tenant=tenant, owner=owner, workflow_name=workflow, workflow_version=workflow_cls.version,
        input=input, goal=goal, priority=priority, deadline_at=deadline_at, budget_steps=budget_steps,
        budget_cost=budget_cost, budget_tokens=budget_tokens, budget_on_exhausted=budget_on_exhausted or "",
        idempotency_key=idempotency_key, request_fingerprint=fingerprint,
        approval_policy=approval_policy or None, checkpoint_policy=checkpoint_policy or None,
        tool_policy=tool_policy or None, trace_context=tracing.task_trace_context(trace_context),
        agent_identity=agent_identity, created_by_token_id=created_by_token_id,
    )
    (first_event,), task.event_seq, task.event_head_hash = chain_events(
        task.id, [status_event(TaskStatus.QUEUED, "Queued: waiting for a worker")], seq=0, head="")
    params = {field.column: field.get_db_prep_save(getattr(task, field.attname), connection)
              for field in Task._meta.concrete_fields if field.column not in sql.TASK_CREATE_BY_DATABASE}
    params.update(first_event_seq=first_event.seq, first_event_type=first_event.type,
                  first_event_data=_EVENT_DATA.get_db_prep_save(first_event.data, connection),
                  first_event_hash=first_event.hash)
    joins_waiting = False
    if tenant.max_stored_tasks is None and tenant.max_running_tasks is None:
        inserted = prepared_fetchone(sql.TASK_CREATE, params)
    else:  # a tenant with quotas: its room checked (under its lock) and the hint decided with the insert
        with transaction.atomic():
            if tenant.max_stored_tasks is not None and not (
                    idempotency_key and Task.objects.filter(tenant=tenant, idempotency_key=idempotency_key).exists()):
                tenant_task_room_check(tenant=tenant)  # (a retried create of a stored task needs no room)
            inserted = prepared_fetchone(sql.TASK_CREATE, params)
            if inserted is not None and tenant.max_running_tasks is not None:
                joins_waiting = task_join_waiting(task_id=task.id, tenant=tenant)
    if inserted is None:  # the Idempotency-Key was used before: that request's task is the answer
        existing = Task.objects.get(tenant=tenant, idempotency_key=idempotency_key)
        if existing.request_fingerprint != fingerprint:
            raise IdempotencyKeyReused(
                "This Idempotency-Key was already used for a different request "
                f"(task {existing.id}). Use a new key, or resend the original body.",
                taskId=str(existing.id),
            )
        return TaskCreated(task=existing, created=False)
    task.hint_at, task.created_at, task.updated_at = inserted
    if joins_waiting:
        task.hint_at = None
    task._state.adding, task._state.db = False, connection.alias
    # Only once the row is committed may a worker look for it (at once outside a transaction; a caller's
    # transaction defers it to its commit). If the send fails, task_dispatch clears hint_at and the reaper
    # hands the task a hint instead.
    if not joins_waiting:
        transaction.on_commit(lambda: task_dispatch(task.id, priority=task.priority))
    else:
        # Race: the tenant's running tasks may all have let go while this create was in flight, their hand-outs
        # reading before its commit. After the commit, a tenant with room hands a slot on itself; a tenant at its cap
        # has a running task whose release comes after this check and so hands on a slot seeing this task.
        transaction.on_commit(lambda: hints_for_tenant_room(tenant_id=tenant.id, cap=tenant.max_running_tasks))
    transaction.on_commit(lambda: events_publish(task_id=task.id, tenant_id=tenant.id, events=[first_event]))
    return TaskCreated(task=task, created=True)


def task_join_waiting(*, task_id, tenant: Tenant) -> bool:
    """A new task of a tenant with max_running_tasks whose tasks already wait for a slot joins them (no hint; True)
    instead of sending a hint of its own (False): its hint could only meet the cap, and a backlog of 10,000 would put
    10,000 hints — each a refused claim — before another tenant's in the broker's queue. The waiting tasks are handed
    slots tenant by tenant, the most urgent first (dispatch.hints_for_waiting), this one among them. One statement
    (sql.TASK_JOIN_WAITING), served by task_waiting_tenant_idx; inside the create's transaction."""
    with connection.cursor() as cursor:
        cursor.execute(sql.TASK_JOIN_WAITING, {"task_id": task_id, "tenant_id": tenant.id})
        return cursor.fetchone() is not None


def tenant_task_room_check(*, tenant: Tenant) -> None:
    """Raise TaskLimitReached when ``tenant`` already stores its max_stored_tasks tasks (nothing to check without a
    limit). Call it inside the transaction that then inserts the task: it takes the tenant's lock
    (sql.TENANT_STORED_TASKS_LOCK) until that transaction ends, so two concurrent creates cannot both see the last
    free place. The count reads at most max_stored_tasks index entries."""
    limit = tenant.max_stored_tasks
    if limit is None:
        return
    with connection.cursor() as cursor:
        cursor.execute(sql.TENANT_STORED_TASKS_LOCK, {"tenant_id": tenant.id})
        cursor.execute(sql.TENANT_STORED_TASKS, {"tenant_id": tenant.id, "limit": limit})
        stored = cursor.fetchone()[0]
    if stored >= limit:
        days = settings.RUNTIME.retention_days
        purge = (f"finished tasks are removed {days} days after they finish, " if days else "")
        raise TaskLimitReached(
            f"Tenant {tenant.slug} stores {limit} tasks, its limit (max_stored_tasks): no task was created. To make "
            f"room, {purge}or an operator removes finished tasks or raises the tenant's limit (admin: Tenants).",
            limit=limit)


# ---------------------------------------------------------------------------------------------------------------
# Tenants and tokens
# ---------------------------------------------------------------------------------------------------------------
TOKEN_PREFIX = "art_"


def token_hash(raw_token: str) -> str:
    return hashlib.sha256(raw_token.encode()).hexdigest()


def tenant_get_or_create(*, slug: str, name: str | None = None) -> Tenant:
    tenant, _ = Tenant.objects.get_or_create(slug=slug, defaults={"name": name or slug})
    return tenant


def tenant_membership_ensure(*, user, tenant: Tenant) -> None:
    """Put ``user`` in ``tenant``; a user of another tenant is refused (one tenant per user)."""
    membership, _ = TenantMembership.objects.get_or_create(user=user, defaults={"tenant": tenant})
    if membership.tenant_id != tenant.id:
        raise ValueError(f"user {user.username!r} belongs to tenant {membership.tenant.slug!r}, not {tenant.slug!r}")


def api_token_create(*, tenant: Tenant, user, name: str = "", scopes=TOKEN_SCOPES,
                     actor: str | None = None) -> tuple[ApiToken, str]:
    """Create a token and return it with its raw value, which exists only here: only the hash is stored.
    ``scopes``: what it may do (models.TOKEN_SCOPES; all by default). ``actor``: who created it (user:<name>,
    cli:<account>), recorded for the audit trail in the same transaction (its prefix and scopes, never its value)."""
    unknown = sorted(set(scopes) - set(TOKEN_SCOPES))
    if unknown or not scopes:
        raise ValueError(f"scopes must be some of {', '.join(TOKEN_SCOPES)}; got {', '.join(scopes) or 'none'}")
    raw = TOKEN_PREFIX + secrets.token_urlsafe(32)
    with transaction.atomic():
        tenant_membership_ensure(user=user, tenant=tenant)
        token = ApiToken.objects.create(tenant=tenant, user=user, name=name, prefix=raw[:12],
                                        token_hash=token_hash(raw),
                                        scopes=[scope for scope in TOKEN_SCOPES if scope in scopes])
        if actor:
            admin_action_record(actor=actor, action="add", obj=token,
                                message=f"Created for {user} with scopes {', '.join(token.scopes)}.")
    return token, raw


def api_token_revoke(*, token: ApiToken, revoked_by: str | None = None) -> bool:
    """Revoke the token; False when it was already revoked (the first revocation's time is kept). A person's
    revocation (``revoked_by``: their actor name) is recorded for the audit trail in the same transaction; only a
    revocation that happened is (a second one changes nothing)."""
    with transaction.atomic():
        revoked = ApiToken.objects.filter(id=token.id, revoked_at__isnull=True).update(revoked_at=Now()) == 1
        if revoked and revoked_by:
            admin_action_record(actor=revoked_by, action="revoke", obj=token,
                                message="Revoked: every request with it is refused from now on.")
    return revoked


# ---------------------------------------------------------------------------------------------------------------
# The audit trail of admin writes
# ---------------------------------------------------------------------------------------------------------------
def admin_action_record(*, actor: str, action: str, obj: Any, message: str = "") -> AdminAction:
    """Record that ``actor`` (user:<name>) did ``action`` (add, change, delete, or a bulk action's name) to ``obj``
    through the admin. Called inside the transaction of the write it records (the admin's own atomic block, or the
    service's), so a write that rolls back leaves no record and a record never lacks its write. Called before a
    delete: the object's id and text are read while it exists.

    What is kept is text, redacted (an object's str() and a message naming fields, never their values): a token's
    value and hash are not in any of it."""
    if not actor:
        raise ValueError("an admin action needs its actor (user:<name>)")
    return AdminAction.objects.create(
        actor=actor, action=action, model=obj._meta.label_lower, object_id=str(obj.pk)[:64],
        object_repr=redact(str(obj))[:200], tenant_id=_tenant_id_of(obj), message=redact(message))


def _tenant_id_of(obj: Any) -> int | None:
    """The tenant an admin write concerns, for the audit's tenant filter: the tenant itself, or the one a row
    belongs to (a membership, a token); None for what belongs to no tenant (a user, a group, a schedule)."""
    if isinstance(obj, Tenant):
        return obj.pk
    return getattr(obj, "tenant_id", None)

