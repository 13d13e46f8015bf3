"""Tenants, API tokens, tasks, steps and the per-task event log.

Rows are written only through services (tasks_app/services.py): no logic in save(), no signals. Every status
change is one guarded UPDATE whose row count is checked (ARCHITECTURE §3).
"""

from __future__ import annotations

from django.conf import settings
from django.core.validators import MinValueValidator
from django.db import models
from django.db.models import Q
from django.db.models.functions import Now

from config.base.json_input import StoredJSONField  # (reads back a value of any depth)
from config.base.rate_limits import rate_limit_validator
from config.base.runtime import TOOL_PATTERN, TOOL_PATTERN_HELP
from tasks_app.ids import uuid7
from tasks_app.registry import BUDGET_POLICIES


class Tenant(models.Model):
    """An isolated customer space: every task, token and query is scoped to exactly one tenant."""

    slug = models.SlugField(max_length=64, unique=True)
    name = models.CharField(max_length=200)
    created_at = models.DateTimeField(db_default=Now())
    # The workflows this tenant may run (through the API and as MCP tools); null: every registered one. Another is
    # answered as an unknown workflow.
    workflows = StoredJSONField(null=True, blank=True, help_text="Workflow names this tenant may run, as a JSON "
                                 "list; empty (null) for every registered workflow.")
    # Quotas (docs/quotas.md). Running: tasks holding a worker at once (a lease); the rest wait queued, and the
    # claim (runtime_lease_claim) refuses one beyond it, so free slots go to the other tenants first. Stored: task
    # rows of the tenant, finished ones included; a create beyond it is refused (409 tenant-task-limit). Null: no
    # limit.
    max_running_tasks = models.PositiveIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1)],
        help_text="At most this many of the tenant's tasks run at once (hold a worker); the rest wait queued. Empty: "
                  "no limit of its own (the fleet's max_concurrent_tasks still holds).")
    max_stored_tasks = models.PositiveIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1)],
        help_text="At most this many tasks stored, finished ones included: creating another is refused until tasks "
                  "are purged (retention) or the limit is raised. Empty: no limit.")
    # Rate limits per token (or signed-in user) of this tenant, "N/second|minute|hour|day" (config.base.rate_limits);
    # empty: the deployment's RATE_LIMIT_CREATE / RATE_LIMIT_STEER.
    create_rate_limit = models.CharField(
        max_length=32, blank=True, default="", validators=[rate_limit_validator],
        help_text='Task creations per token or user, e.g. "60/minute"; "off" for none; empty: the deployment\'s '
                  "RATE_LIMIT_CREATE.")
    steer_rate_limit = models.CharField(
        max_length=32, blank=True, default="", validators=[rate_limit_validator],
        help_text='Steering commands and cancels per token or user, e.g. "120/minute"; "off" for none; empty: the '
                  "deployment's RATE_LIMIT_STEER.")

    def __str__(self) -> str:
        return self.slug

    def may_run(self, workflow: str) -> bool:
        return self.workflows is None or workflow in self.workflows


class TenantMembership(models.Model):
    """A user belongs to exactly one tenant; the API acts within it."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="tenant_membership")
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="memberships")
    created_at = models.DateTimeField(db_default=Now())

    def __str__(self) -> str:
        return f"{self.user} @ {self.tenant}"


# What a bearer token may do (ApiToken.scopes): read tasks, create and cancel them, steer them. A person signed in
# to the admin may do what their permissions allow; scopes only narrow tokens.
TOKEN_SCOPES = ("tasks:read", "tasks:write", "steer")


def all_token_scopes() -> list[str]:
    return list(TOKEN_SCOPES)


class ApiToken(models.Model):
    """A bearer token for the API and the MCP endpoint. Only its sha256 is stored; it is shown once."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="api_tokens")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=100, blank=True)
    # The first characters, to tell tokens apart in admin without revealing them.
    prefix = models.CharField(max_length=16)
    token_hash = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(db_default=Now())
    revoked_at = models.DateTimeField(null=True, blank=True)
    scopes = StoredJSONField(default=all_token_scopes)  # a subset of TOKEN_SCOPES

    class Meta:
        constraints = [
            models.CheckConstraint(condition=Q(scopes__contained_by=list(TOKEN_SCOPES)), name="apitoken_scopes_known"),
        ]

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.user}, {self.tenant})"


class AdminAction(models.Model):
    """A write a person made through the admin — an add, a change, a delete, or a bulk action such as revoking a
    token — for the audit trail (steering_app.audit), under the actor naming every other decision uses
    (`user:<name>`, tasks_app.web.authentication.requested_by_of). Steering commands and dead-letter decisions are
    not here: they have their own records (SteeringCommand; the task's status event, with requestedBy).

    Written by tasks_app.services.admin_action_record in the same transaction as the write it records. Append-only
    (migration 0022: UPDATE is refused by a trigger; 0029: DELETE too, outside the retention purge). The actor, the
    object and the tenant are kept as text and ids, never as foreign keys that would take the record with them:
    Django's own LogEntry is deleted with its user, so a removed account would erase what it did. Never a value:
    what changed is said by field names only (a token's value or hash never reaches this table)."""

    id = models.UUIDField(primary_key=True, default=uuid7, editable=False)  # time-ordered: the pages' keyset
    at = models.DateTimeField(db_default=Now())  # the database's clock, as every other audit time
    actor = models.CharField(max_length=200)
    # add | change | delete, or the name of the bulk action (revoke, enable_tasks, …)
    action = models.CharField(max_length=64)
    model = models.CharField(max_length=100)  # app_label.model_name of what was written
    object_id = models.CharField(max_length=64)
    object_repr = models.CharField(max_length=200)
    # The tenant the object belongs to (a tenant, a membership, a token), for the tenant filter; no constraint:
    # the record outlives the tenant.
    tenant = models.ForeignKey(Tenant, null=True, blank=True, on_delete=models.DO_NOTHING, db_constraint=False,
                               related_name="+")
    message = models.TextField(blank=True)  # what changed, for people: field names, never values

    class Meta:
        indexes = [
            # The audit page's window queries, newest first by keyset: WHERE at >= $1 AND at < $2
            #   [AND actor = $3 | AND tenant_id = $3] ORDER BY at DESC, id DESC LIMIT n.
            models.Index(fields=["at", "id"], name="adminaction_at_idx"),
        ]
        constraints = [
            models.CheckConstraint(condition=~Q(actor=""), name="adminaction_actor_named"),
        ]

    def __str__(self) -> str:
        return f"{self.actor} {self.action} {self.model} {self.object_repr}"


class TaskStatus(models.TextChoices):
    QUEUED = "queued"
    WORKING = "working"
    INPUT_REQUIRED = "input_required"
    PAUSING = "pausing"
    PAUSED = "paused"
    CANCELLING = "cancelling"
    RECOVERING = "recovering"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    DEAD_LETTERED = "dead_lettered"


# A killed task's status message starts so ("Killed by user:alice: runaway costs"): steering_app writes it, the
# safe point's stop keeps it (db/sql.py STOP_AT_SAFE_POINT matches the same text), the console labels it "killed".
KILLED_PREFIX = "Killed by "
TERMINAL_STATUSES = frozenset({TaskStatus.COMPLETED, TaskStatus.FAILED, TaskStatus.CANCELLED})
# Statuses a worker may claim a lease in (it then executes, or applies the pending pause/cancel at a safe point).
RUNNABLE_STATUSES = frozenset(
    {TaskStatus.QUEUED, TaskStatus.WORKING, TaskStatus.PAUSING, TaskStatus.CANCELLING, TaskStatus.RECOVERING}
)

# The allowed transitions, written once (ARCHITECTURE §3). Services guard every UPDATE with the sources here.
TRANSITIONS: dict[TaskStatus, frozenset[TaskStatus]] = {
    # (queued → recovering: a worker claimed it and died before its first step)
    TaskStatus.QUEUED: frozenset({TaskStatus.WORKING, TaskStatus.CANCELLED, TaskStatus.DEAD_LETTERED,
                                  TaskStatus.FAILED, TaskStatus.RECOVERING}),
    # (working → paused/cancelled: a command applied by its worker at a safe point, without the -ing stop)
    TaskStatus.WORKING: frozenset({TaskStatus.WORKING, TaskStatus.INPUT_REQUIRED, TaskStatus.PAUSING,
                                   TaskStatus.PAUSED, TaskStatus.CANCELLING, TaskStatus.CANCELLED,
                                   TaskStatus.RECOVERING, TaskStatus.COMPLETED, TaskStatus.FAILED,
                                   TaskStatus.DEAD_LETTERED}),
    TaskStatus.INPUT_REQUIRED: frozenset({TaskStatus.WORKING, TaskStatus.CANCELLED, TaskStatus.PAUSED,
                                          TaskStatus.DEAD_LETTERED, TaskStatus.FAILED}),
    # pausing/cancelling → themselves: the worker died; the request must survive its recovery
    TaskStatus.PAUSING: frozenset({TaskStatus.PAUSING, TaskStatus.PAUSED, TaskStatus.CANCELLING,
                                   TaskStatus.RECOVERING, TaskStatus.DEAD_LETTERED, TaskStatus.FAILED,
                                   TaskStatus.COMPLETED}),
    # (paused → input_required: resumed while a wait it was paused in is still open)
    TaskStatus.PAUSED: frozenset({TaskStatus.WORKING, TaskStatus.INPUT_REQUIRED, TaskStatus.CANCELLED,
                                  TaskStatus.DEAD_LETTERED, TaskStatus.FAILED}),
    TaskStatus.CANCELLING: frozenset({TaskStatus.CANCELLING, TaskStatus.CANCELLED, TaskStatus.RECOVERING,
                                      TaskStatus.DEAD_LETTERED, TaskStatus.FAILED, TaskStatus.COMPLETED}),
    TaskStatus.RECOVERING: frozenset({TaskStatus.RECOVERING, TaskStatus.WORKING, TaskStatus.DEAD_LETTERED,
                                      TaskStatus.CANCELLING, TaskStatus.CANCELLED, TaskStatus.FAILED}),
    TaskStatus.DEAD_LETTERED: frozenset({TaskStatus.RECOVERING, TaskStatus.FAILED}),
    TaskStatus.COMPLETED: frozenset(),
    TaskStatus.FAILED: frozenset(),
    TaskStatus.CANCELLED: frozenset(),
}


def sources_of(target: TaskStatus) -> list[str]:
    """The statuses from which ``target`` may be entered: the WHERE status IN (…) guard of a transition."""
    return sorted(source.value for source, targets in TRANSITIONS.items() if target in targets)


# The largest maxTokens a budget may name (the column is a bigint). What a task does when a budget is spent is one of
# BUDGET_POLICIES (tasks_app.registry, beside Workflow.on_budget_exhausted: a workflow's default, which a task may
# override at create with budget.onExhausted).
BUDGET_MAX_TOKENS = 2**63 - 1


# A task's toolPolicy (POST /runtime/tasks): its narrowing of its tenant's tool policy. Only its shape is known here
# (tasks_app is below agents_app); what it means, and that it can only narrow, is agents_app.policy.tool_decision.
TOOL_POLICY_LISTS = ("deny", "allow", "requireApproval")
TOOL_POLICY_MAX_PATTERNS = 100
TOOL_POLICY_MAX_CALLS = 1_000_000


def task_tool_policy_errors(value, *, field: str = "toolPolicy") -> list[dict]:
    """What is wrong with a task's toolPolicy, as [{field, message}] (empty: nothing). The shape: an object with any
    of deny, allow, requireApproval (lists of at most TOOL_POLICY_MAX_PATTERNS tool patterns, globs on server.tool)
    and maxCalls (an integer from 1 to TOOL_POLICY_MAX_CALLS); a key set to null counts as absent. ``field``: the
    name the errors start with ("" for names relative to the policy)."""

    def at(*parts) -> str:
        return ".".join(str(part) for part in (field, *parts) if part != "")

    if not isinstance(value, dict):
        return [{"field": at(), "message": "Must be a JSON object with any of deny, allow, requireApproval (lists of "
                                          "tool patterns) and maxCalls."}]
    known = (*TOOL_POLICY_LISTS, "maxCalls")
    errors = [{"field": at(key), "message": f"Unknown key; known keys: {', '.join(known)}."}
              for key in sorted(set(value) - set(known), key=str)]
    for key in TOOL_POLICY_LISTS:
        patterns = value.get(key)
        if patterns is None:
            continue
        if not isinstance(patterns, list) or len(patterns) > TOOL_POLICY_MAX_PATTERNS:
            errors.append({"field": at(key), "message": f"Must be a list of at most {TOOL_POLICY_MAX_PATTERNS} tool "
                                                        f"patterns."})
            continue
        errors += [{"field": at(key, index), "message": f"Must be {TOOL_PATTERN_HELP}."}
                   for index, pattern in enumerate(patterns)
                   if not isinstance(pattern, str) or not TOOL_PATTERN.match(pattern)]
    max_calls = value.get("maxCalls")
    if max_calls is not None and (not isinstance(max_calls, int) or isinstance(max_calls, bool)
                                  or not 1 <= max_calls <= TOOL_POLICY_MAX_CALLS):
        errors.append({"field": at("maxCalls"), "message": f"Must be an integer from 1 to {TOOL_POLICY_MAX_CALLS}."})
    return errors


class Task(models.Model):
    """One unit of long-running agent work. The row is the authoritative snapshot every replica answers from."""

    id = models.UUIDField(primary_key=True, default=uuid7, editable=False)  # time-ordered: see tasks_app.ids
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="tasks")
    # Who started it (ARCHITECTURE §12): the initiating person (owner), and the agent identity they acted through —
    # "token:<prefix>" for a bearer token (the token's row too, while it exists), "" for a person signed in;
    # an OAuth client will be "oauth:<client id>". Kept as text: the record outlives a deleted token.
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                              related_name="tasks")
    agent_identity = models.CharField(max_length=200, blank=True, default="")
    created_by_token = models.ForeignKey("ApiToken", null=True, blank=True, on_delete=models.SET_NULL,
                                         related_name="+", db_index=False, db_constraint=False)
    workflow_name = models.CharField(max_length=100)
    workflow_version = models.CharField(max_length=32)
    input = StoredJSONField()
    goal = StoredJSONField(null=True, blank=True)  # the current goal; adjust_goal replaces it and re-plans

    status = models.CharField(max_length=20, choices=TaskStatus.choices, default=TaskStatus.QUEUED)
    status_message = models.CharField(max_length=500, blank=True, default="")
    progress = models.FloatField(default=0.0)
    phase = models.CharField(max_length=200, blank=True, default="")
    priority = models.SmallIntegerField(default=5)  # 0 (lowest) … 9 (most urgent)

    state_version = models.BigIntegerField(default=1)  # bumped by every steering change (expectedVersion)
    # Steering commands up to this one were applied at a safe point (kept in the checkpoint too).
    steering_cursor = models.BigIntegerField(default=0)
    plan_version = models.IntegerField(default=1)
    # The current plan's step names live in PlanChunk rows; the task keeps only its length and the cursor, so a
    # step costs the same at index 10 and 100,000 (no walk over, or load of, the whole plan).
    plan_length = models.IntegerField(null=True, blank=True)  # NULL until the first commit stores the plan
    next_step_index = models.IntegerField(default=0)
    steps_completed = models.IntegerField(default=0)

    lease_owner = models.CharField(max_length=200, null=True, blank=True)
    lease_epoch = models.BigIntegerField(default=0)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    # When a run_step hint was sent and not yet consumed by a claim; NULL while none is pending. A runnable,
    # unleased task with none pending is waiting for a free slot (max_concurrent_tasks) and is handed one
    # when a lease is released or by the reaper — never by a message that re-sends itself.
    hint_at = models.DateTimeField(null=True, blank=True)
    recoveries = models.SmallIntegerField(default=0)  # lease expiries over the task's life
    # Lease expiries since the last committed step: max_recoveries bounds this one, so a long task that keeps
    # progressing between crashes (pre-empted machines, OOM kills) is never dead-lettered for it.
    recoveries_since_progress = models.SmallIntegerField(default=0)

    idempotency_key = models.CharField(max_length=255, null=True, blank=True)
    # sha256 of the canonical JSON of the creating request: the same key with another body is a 409.
    request_fingerprint = models.CharField(max_length=64, null=True, blank=True)

    result = StoredJSONField(null=True, blank=True)
    result_ref = models.CharField(max_length=500, blank=True, default="")  # storage path of a large result
    error = StoredJSONField(null=True, blank=True)  # {type, message, step, attempt}

    deadline_at = models.DateTimeField(null=True, blank=True)
    budget_steps = models.IntegerField(null=True, blank=True)
    budget_cost = models.DecimalField(max_digits=12, decimal_places=4, null=True, blank=True)
    cost_spent = models.DecimalField(max_digits=20, decimal_places=4, default=0)  # room for any sum of spend()s
    # Model tokens (in + out) counted with each step like cost (ctx.spend(amount, tokens=n)), against budget_tokens.
    budget_tokens = models.BigIntegerField(null=True, blank=True)
    tokens_spent = models.BigIntegerField(default=0)
    # What happens when a budget is spent (BUDGET_POLICIES): "" is the workflow's choice (on_budget_exhausted).
    budget_on_exhausted = models.CharField(max_length=4, blank=True, default="")

    # Denormalised from the latest Checkpoint so the snapshot is one row read.
    checkpoint_sequence = models.IntegerField(null=True, blank=True)
    checkpoint_at = models.DateTimeField(null=True, blank=True)

    # Head of the TaskEvent chain: the last seq and its hash, advanced under the task row lock.
    event_seq = models.BigIntegerField(default=0)
    event_head_hash = models.CharField(max_length=64, blank=True, default="")

    created_at = models.DateTimeField(db_default=Now())
    updated_at = models.DateTimeField(db_default=Now())
    completed_at = models.DateTimeField(null=True, blank=True)

    # Steering (ARCHITECTURE §6). NULL for most tasks, so they cost no bytes in the row a step rewrites.
    # The open wait while input_required: {waitId, kind, name, prompt, schema, effect?, step, planVersion}.
    wait = StoredJSONField(null=True, blank=True)
    # Resolved waits by wait id: {kind, name, value?, files?, credentials?, decision?, by, commandId} — or
    # {superseded: …} when adjust_goal re-planned past it. Steps read them as ctx.answers; only the web side
    # writes it, while no worker holds the task.
    answers = StoredJSONField(null=True, blank=True)
    approval_policy = StoredJSONField(null=True, blank=True)  # {"before": [effect names]} on top of the config
    checkpoint_policy = StoredJSONField(null=True, blank=True)  # {"everySteps": n, "maxSeconds": s}, bounded
    # {"deny": [...], "allow": [...], "requireApproval": [...], "maxCalls": n} (task_tool_policy_errors): it narrows
    # the tenant's tool policy, never widens it (agents_app.policy).
    tool_policy = StoredJSONField(null=True, blank=True)
    # Lineage (tasks_app.forks): the task this one was forked from, and the step (seq) it starts again at — steps
    # before it, and their effects, are the original's, inherited; NULL for a task that was not forked. The
    # original's forks are found by this column (its partial index below), so the original's row is never written
    # for a fork: forking a running task takes nothing from the worker that holds it.
    forked_from = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL, related_name="forks",
                                    db_index=False)
    forked_from_step = models.IntegerField(null=True, blank=True)
    # The W3C trace context the task's spans continue ({"traceparent", "tracestate"?}), from the request that
    # created it (tasks_app.observability.tracing): every slice, on any worker, after any recovery, is in that
    # trace. NULL when the request carried none and tracing was off. Read once per slice, and only when tracing is on.
    trace_context = StoredJSONField(null=True, blank=True)

    class Meta:
        # The auditor's right to export a task with its audit chain (tasks_app.access.Action.EXPORT).
        permissions = [("export_task", "Can export tasks with their audit chain")]
        constraints = [
            models.CheckConstraint(condition=Q(status__in=TaskStatus.values), name="task_status_valid"),
            models.CheckConstraint(condition=Q(progress__gte=0) & Q(progress__lte=1), name="task_progress_0_1"),
            models.CheckConstraint(condition=Q(priority__gte=0) & Q(priority__lte=9), name="task_priority_0_9"),
            models.CheckConstraint(condition=Q(budget_on_exhausted__in=("", *BUDGET_POLICIES)),
                                   name="task_budget_policy_valid"),
            # Prevents two tasks from one retried request: the same key creates one task per tenant.
            models.UniqueConstraint(fields=["tenant", "idempotency_key"], condition=Q(idempotency_key__isnull=False),
                                    name="task_idempotency_key_per_tenant"),
        ]
        indexes = [
            # Serves the reaper's re-send of runnable tasks whose message was lost, most urgent first:
            #   SELECT id FROM tasks_app_task WHERE status IN (<runnable>) AND lease_owner IS NULL
            #   ORDER BY priority DESC, created_at
            models.Index(fields=["-priority", "created_at"], name="task_runnable_idx",
                         condition=Q(status__in=sorted(RUNNABLE_STATUSES))),
            # Serves the reaper's expired-lease scan:
            #   SELECT id FROM tasks_app_task WHERE lease_expires_at < now() (only leased rows are indexed)
            models.Index(fields=["lease_expires_at"], name="task_lease_expiry_idx",
                         condition=Q(lease_expires_at__isnull=False)),
            # Serves the reaper's deadline sweep: SELECT id FROM tasks_app_task WHERE deadline_at < now()
            # AND status NOT IN (<terminal>) — only unfinished tasks with a deadline are indexed.
            models.Index(fields=["deadline_at"], name="task_deadline_idx",
                         condition=Q(deadline_at__isnull=False) & ~Q(status__in=sorted(TERMINAL_STATUSES))),
            # Serves GET /runtime/tasks: one tenant's tasks, newest first, cursor-paginated.
            models.Index(fields=["tenant", "-created_at", "-id"], name="task_tenant_created_idx"),
            # Serves the retention purge, in batches: SELECT id FROM tasks_app_task WHERE status IN (<terminal>)
            #   AND completed_at < now() - retention ORDER BY completed_at LIMIT n (never a whole-table scan).
            models.Index(fields=["completed_at"], name="task_retention_idx",
                         condition=Q(status__in=sorted(TERMINAL_STATUSES))),
            # Serves handing free slots to tasks waiting for one, tenant by tenant (sql.HINT_WAITING: each tenant's
            # most urgent first, WHERE tenant_id = :t AND status IN (<runnable>) AND lease_owner IS NULL AND hint_at
            # IS NULL ORDER BY priority DESC, created_at LIMIT n), and the letting-go writes' "is anyone waiting?"
            # probe (any entry). Per tenant, so one tenant's thousands of waiting tasks are never walked to reach
            # another's.
            models.Index(fields=["tenant", "-priority", "created_at"], name="task_waiting_tenant_idx",
                         condition=Q(status__in=sorted(RUNNABLE_STATUSES), lease_owner__isnull=True,
                                     hint_at__isnull=True)),
            # Serves a task's forks (its page's lineage): only forked tasks are indexed.
            models.Index(fields=["forked_from"], name="task_forked_from_idx", condition=Q(forked_from__isnull=False)),
            # Serves /metrics and the console's overview (tasks_app.web.console.task_counts_unfinished, waits_open):
            #   SELECT status, count(*) FROM tasks_app_task WHERE status IN (<unfinished>) GROUP BY status
            # an index-only scan of the unfinished tasks, never the finished ones. A step commit changes no status,
            # so it stays an in-place (HOT) update; only a status change writes an entry here.
            models.Index(fields=["status"], name="task_unfinished_status_idx",
                         condition=Q(status__in=sorted(set(TaskStatus.values) - TERMINAL_STATUSES))),
        ]

    def __str__(self) -> str:
        return f"{self.workflow_name} {self.id} ({self.status})"


# The rows the engine writes per step (Step, TaskEvent, PlanChunk here; Checkpoint and SideEffect in
# checkpoints_app) reference their task without a database foreign key (db_constraint=False). A foreign key would
# make PostgreSQL run a `SELECT 1 … FOR KEY SHARE` on the task row for every row inserted (4.4 per step, each
# locking the row and writing WAL for the lock). Integrity is held where the rows are written instead: every
# insert is part of a fenced statement whose task-row UPDATE must match (tasks_app.db.sql), so a row is written only
# while its task exists and is leased by the writer, and deleting a task (the retention purge, through the ORM)
# deletes its rows in the same transaction (Django's CASCADE). tests/test_storage_integrity.py checks both.
# No separate index on task_id either: each table's key (task, seq…) serves "rows of a task". Step, TaskEvent and
# SideEffect have it as their primary key, with no surrogate id: one index entry per row, not two.
# The events that record a steering command's outcome (steering_app writes them through the safe-point hook).
STEERING_OUTCOME_EVENTS = ["steering.applied", "steering.rejected"]
# A downstream tool call's events (agents_app.gateway writes them; tasks_app.events lists them among its types).
TOOL_EVENT_TYPES = ["tool.call", "tool.result", "tool.denied", "tool.flagged"]
# Who made a decision an event records: a steering outcome's, or a status event's that a person caused (a dead
# letter retried or abandoned). Its value is an actor name: user:<name>, token:<prefix>.
DECIDED_BY = "requestedBy"

TASK_CHILD = {"on_delete": models.CASCADE, "db_constraint": False, "db_index": False}


class Step(models.Model):
    """One committed (or failed) execution of a workflow step, with the state delta recovery replays."""

    class Status(models.TextChoices):
        COMMITTED = "committed"
        FAILED = "failed"

    # The natural key is the primary key: a surrogate id would cost an index entry (and its WAL) on every step.
    pk = models.CompositePrimaryKey("task", "seq")
    task = models.ForeignKey(Task, related_name="steps", **TASK_CHILD)
    seq = models.IntegerField()  # 1, 2, … in commit order within the task
    plan_version = models.IntegerField(default=1)
    step_index = models.IntegerField()  # position in the plan it ran under
    name = models.CharField(max_length=200)
    status = models.CharField(max_length=20, choices=Status.choices)
    attempt = models.SmallIntegerField(default=1)
    lease_epoch = models.BigIntegerField()
    # Canonical JSON text, stored as text (like checkpoints) so the bytes verified are the bytes checksummed;
    # recovery replays it, so an edited delta must be caught: delta_sha256 is checked on every load and is also
    # bound into the event hash chain (the step's progress event carries it).
    state_delta = models.TextField(default="{}")
    delta_sha256 = models.CharField(max_length=64, blank=True, default="")
    output = StoredJSONField(null=True, blank=True)  # a small summary; large outputs go to storage
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(db_default=Now())

    class Meta:
        constraints = [
            models.CheckConstraint(condition=Q(status__in=["committed", "failed"]), name="step_status_valid"),
        ]

    def __str__(self) -> str:
        return f"{self.task_id} #{self.seq} {self.name}"


class PlanChunk(models.Model):
    """PLAN_CHUNK_STEPS consecutive step names of one plan version, run-length encoded ([["tick", 1024]]).

    A slice loads only the chunk holding its cursor, and the next one when it crosses a boundary.
    """

    task = models.ForeignKey(Task, related_name="plan_chunks", **TASK_CHILD)
    plan_version = models.IntegerField()
    chunk = models.IntegerField()  # covers step indexes [chunk * PLAN_CHUNK_STEPS, (chunk + 1) * PLAN_CHUNK_STEPS)
    steps = StoredJSONField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["task", "plan_version", "chunk"], name="planchunk_unique")]


class TaskEvent(models.Model):
    """Append-only per-task log: the audit chain and the source of the stream (ARCHITECTURE §8).

    ``hash`` = sha256(prev_hash, seq, type, data) in canonical JSON, so a changed or removed event breaks the
    chain. A database trigger (migration 0002) refuses UPDATE on this table.
    """

    pk = models.CompositePrimaryKey("task", "seq")  # the natural key: no surrogate id to index on every append
    task = models.ForeignKey(Task, related_name="events", **TASK_CHILD)
    seq = models.BigIntegerField()
    type = models.CharField(max_length=40)
    data = StoredJSONField(default=dict)
    at = models.DateTimeField(db_default=Now())
    prev_hash = models.CharField(max_length=64, blank=True, default="")
    hash = models.CharField(max_length=64)

    class Meta:
        indexes = [
            # selectors.task_artifacts: WHERE task_id = $1 AND type = 'artifact' ORDER BY seq — a task's files
            # without reading its (possibly 100,000) other events. Partial: no entry, no WAL, for other events.
            models.Index(fields=["task", "seq"], condition=Q(type="artifact"), name="taskevent_artifact_idx"),
            # steering_app's steering_history and safe point: what became of each of a task's commands (WHERE
            # task_id = $1 AND type IN (…)), without reading its other events. Partial: no entry for per-step events.
            models.Index(fields=["task", "seq"], condition=Q(type__in=STEERING_OUTCOME_EVENTS),
                         name="taskevent_steering_idx"),
            # The console's "in this state for 12 min" (tasks_app.web.console.status_since): the task's newest status
            # event, one index entry read backwards, instead of a walk back over every progress event since.
            # Partial: status events are a handful per task, per-step events get no entry.
            models.Index(fields=["task", "seq"], condition=Q(type="status"), name="taskevent_status_idx"),
            # The task page's tool calls (tasks_app.web.console.task_tool_calls): a task's tool.* events without
            # reading its other events. Partial: no entry for per-step events.
            models.Index(fields=["task", "seq"], condition=Q(type__in=TOOL_EVENT_TYPES), name="taskevent_tool_idx"),
            # The audit's actor filter over every task: a person's dead-letter retry or abandon is a status event
            # carrying requestedBy (tasks_app.engine.dead_letters); WHERE type = 'status' AND data ? 'requestedBy' AND
            # data->>'requestedBy' = $1, beside the steering outcomes above. Partial: no entry for other status events.
            models.Index(fields=["task", "seq"], condition=Q(type="status") & Q(data__has_key=DECIDED_BY),
                         name="taskevent_decision_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.task_id} #{self.seq} {self.type}"


class AnchorSeal(models.Model):
    """The index of one seal of the event chains' heads (tasks_app.audit.anchors): the seal itself is a signed file in
    blob storage (``file``, under anchors/), the proof; this row only says where it is and what its hash is, so the
    next seal can chain to it without reading storage. Append-only: UPDATE and DELETE are refused by a trigger
    (migration 0029). The verifier (verify_events --anchors) trusts the files and their signatures, never these rows
    alone."""

    sequence = models.BigIntegerField(primary_key=True)  # 1, 2, … each seal chains to the one before
    sealed_at = models.DateTimeField()  # the database's now() when the seal was made
    hash = models.CharField(max_length=64)  # sha256 of the seal's canonical JSON (what the next seal names)
    file = models.CharField(max_length=300)
    heads = models.IntegerField()  # how many chain heads it seals

    def __str__(self) -> str:
        return f"seal {self.sequence} ({self.heads} heads)"


class SealedHead(models.Model):
    """The newest sealed head of each task's chain (its seq and hash, and the seal holding them): how the next seal
    finds the chains that changed since (event_seq beyond the sealed seq), and what the task page shows ("sealed up
    to seq M"). An index, rewritten by each seal: no foreign key, the purge deletes a purged task's row."""

    task_id = models.UUIDField(primary_key=True)
    seq = models.BigIntegerField()
    hash = models.CharField(max_length=64)
    seal_sequence = models.BigIntegerField()


class StorageHold(models.Model):
    """A storage folder of a purged task that a live fork still refers to (a fork inherits its original's state, and
    with it references to the original's artifacts and input files: tasks_app.forks). The retention purge deletes a
    task's rows but keeps its folder while a hold names it, handing the holds a purged fork had on to its own live
    forks; the folder goes when the last hold does (tasks_app.audit.retention)."""

    pk = models.CompositePrimaryKey("folder", "task_id")
    folder = models.CharField(max_length=200)  # tasks/<purged task id>
    task_id = models.UUIDField()  # the live fork that holds it


class ThroughputSample(models.Model):
    """The step table's insert counter (pg_stat_user_tables.n_tup_ins), sampled by the reaper's sweep: the console's
    steps-per-minute chart reads these, at no cost to any step. No index on Step.finished_at serves it instead: a
    B-tree entry per step costs WAL on every step, and so does a BRIN summary, rewritten by every insert into a
    summarised range once the retention purge frees space in old ranges (figures: docs/performance.md).

    An hour of samples at most (the sweep deletes older ones): a few hundred rows, read whole, no index."""

    at = models.DateTimeField(db_default=Now())
    steps_inserted = models.BigIntegerField()  # cumulative since the statistics were last reset
