"""Reads for the audit views (steering_app.audit): TaskEvents and steering commands across every tenant, filtered,
newest first, one keyset page at a time; and each task's chain verification, on demand.

Every query is bounded by a task or a time range (AuditFilter.bounded) and pages by keyset — never OFFSET, which
reads and throws away every row before the page. Which index serves which query (TaskEvent has no index on `at`,
and none is added here: each TaskEvent insert is on the engine's hot path, see tasks_app.models):

- events of one task:       WHERE task_id = $1 [AND at/type/actor] AND seq < $cursor ORDER BY seq DESC LIMIT n
                            — the primary key (task_id, seq), read backwards from the cursor; a steering type or an
                            actor narrows it to taskevent_steering_idx, type `artifact` to taskevent_artifact_idx.
- events of a tenant:       JOIN tasks_app_task WHERE tenant_id = $1 AND created_at < $until — a tenant index of the
                            task table (task_tenant_created_idx, or the tenant foreign key's) finds the tenant's tasks
                            that existed before the window closed (a task's events are all at or after its
                            created_at, both the database's clock), then the primary key per task (a nested loop:
                            each of those tasks' events is read, the window filters them).
- events of every tenant:   with a steering type, the partial taskevent_steering_idx (small: steering outcomes
                            only); with an actor, that one and taskevent_decision_idx (the status events of a
                            person's dead-letter retries and abandons), OR-ed in one bitmap scan; with `artifact`,
                            taskevent_artifact_idx. Otherwise NO index serves a time
                            range over every task: PostgreSQL scans tasks_app_taskevent sequentially with a top-n sort
                            (LIMIT bounds the memory, not the I/O). Hence MAX_WINDOW, and the page's hint to narrow by
                            tenant, task or type. (A BRIN index on `at` would serve it at almost no write cost — an
                            insert into a not yet summarized block range writes nothing to a BRIN index — but its
                            ranges blur once the retention purge's freed space is reused by new events; not added.)
- commands of one task:     WHERE task_id = $1 AND new_version < $cursor ORDER BY new_version DESC — the unique
                            (task_id, new_version) index, steering_version_unique_per_task.
- commands of a tenant:     a tenant index of the task table for its tasks, then SteeringCommand's task_id index.
- commands of every tenant: a sequential scan of steering_app_steeringcommand (no index on created_at) — one row per
                            command a person or client sent, orders of magnitude fewer than events.
- their outcomes:           one query per page: WHERE task_id IN (<the page's tasks>) AND type IN ('steering.applied',
                            'steering.rejected') AND data->>'commandId' IN (<the page's commands>) —
                            taskevent_steering_idx.
- admin actions:            WHERE at >= $1 AND at < $2 [AND actor | tenant_id | action] ORDER BY at DESC, id DESC
                            — adminaction_at_idx read backwards (one row per write a person made in the admin).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from itertools import islice
from typing import Any

from django.db.models import Q

from steering_app.models import SteeringCommand
from tasks_app.models import DECIDED_BY, STEERING_OUTCOME_EVENTS, AdminAction, SealedHead, Task, TaskEvent, Tenant
from tasks_app.selectors import task_events_verify

PAGE_ROWS = 50
# The widest time window a query without a task may ask for: without one, events are read by a sequential scan
# (see above); an export of a longer period is several exports, or one per task.
MAX_WINDOW = timedelta(days=31)
# The most rows one CSV export streams; a longer one ends with a row saying it was cut, and where to go on from.
EXPORT_MAX_ROWS = 200_000
EXPORT_CHUNK_ROWS = 2_000
# task_events_verify reads a task's whole chain (every event, and each progress event's step delta): at most this
# many tasks per request.
MAX_VERIFY_TASKS = 25

EVENT_COLUMNS = ("at", "task_id", "seq", "type", "data", "hash")
COMMAND_COLUMNS = ("created_at", "id", "task_id", "new_version", "old_version", "expected_version", "type", "payload",
                   "requested_by", "reason")
ADMIN_ACTION_COLUMNS = ("at", "id", "actor", "action", "model", "object_id", "object_repr", "tenant_id", "message")


@dataclass(frozen=True)
class AuditFilter:
    task_id: uuid.UUID | None = None
    tenant_id: int | None = None
    type: str = ""
    actor: str = ""  # events: data.requestedBy (steering outcomes, dead-letter decisions); commands: requested_by;
    #                  admin actions: actor
    since: datetime | None = None  # inclusive
    until: datetime | None = None  # exclusive

    @property
    def bounded(self) -> bool:
        """A task, or a closed time window of at most MAX_WINDOW: the only queries these views run."""
        if self.task_id is not None:
            return True
        return self.since is not None and self.until is not None and self.until - self.since <= MAX_WINDOW


@dataclass(frozen=True)
class Cursor:
    """Where the next page starts (exclusive): the last row's sort key. Without a task the order is (at, task, seq)
    for events and (created_at, id) for commands; within one task, seq or new_version alone."""

    at: datetime
    id: uuid.UUID  # the task's id (events) or the command's (commands)
    seq: int  # the event's seq or the command's new_version

    def encode(self) -> str:
        return f"{self.at.isoformat()}_{self.id}_{self.seq}"

    @classmethod
    def decode(cls, text: str) -> Cursor:
        """Raises ValueError for a cursor this module did not write."""
        at, id_, seq = text.split("_")
        at = datetime.fromisoformat(at)
        if at.tzinfo is None:
            raise ValueError("A cursor's time has its offset.")
        return cls(at=at, id=uuid.UUID(id_), seq=int(seq))


def _require_bounded(filters: AuditFilter) -> None:
    if not filters.bounded:
        raise ValueError(f"An audit query needs a task, or a time window of at most {MAX_WINDOW.days} days.")


def _events(filters: AuditFilter):
    _require_bounded(filters)
    events = TaskEvent.objects.all()
    if filters.task_id is not None:
        events = events.filter(task_id=filters.task_id)
    if filters.tenant_id is not None:
        events = events.filter(task__tenant_id=filters.tenant_id)
        if filters.until is not None:  # lets task_tenant_created_idx bound the tenant's tasks (see above)
            events = events.filter(task__created_at__lt=filters.until)
    if filters.type:
        events = events.filter(type=filters.type)
    if filters.actor:
        # Only steering outcomes and the status events of a person's dead-letter decisions carry requestedBy; saying
        # so lets their two partial indexes (taskevent_steering_idx, taskevent_decision_idx) serve the query.
        events = events.filter(Q(type__in=STEERING_OUTCOME_EVENTS) | Q(type="status", data__has_key=DECIDED_BY),
                               data__requestedBy=filters.actor)
    if filters.since is not None:
        events = events.filter(at__gte=filters.since)
    if filters.until is not None:
        events = events.filter(at__lt=filters.until)
    return events


def _events_ordered(filters: AuditFilter, after: Cursor | None):
    events = _events(filters)
    if filters.task_id is not None:
        # One task: its chain's order, newest first (the primary key backwards).
        if after is not None:
            events = events.filter(seq__lt=after.seq)
        return events.order_by("-seq")
    if after is not None:
        events = events.filter(Q(at__lt=after.at) | Q(at=after.at, task_id__lt=after.id)
                               | Q(at=after.at, task_id=after.id, seq__lt=after.seq))
    return events.order_by("-at", "-task_id", "-seq")


def _event_row(values: tuple, tenant: str) -> dict[str, Any]:
    at, task_id, seq, type_, data, hash_ = values
    return {"at": at, "task_id": task_id, "tenant": tenant, "seq": seq, "type": type_, "data": data,
            "actor": data.get("requestedBy", "") if isinstance(data, dict) else "", "hash": hash_,
            "cursor": Cursor(at=at, id=task_id, seq=seq)}


def _tenant_slugs(task_ids: Iterable[uuid.UUID]) -> dict[uuid.UUID, str]:
    """The tenant of each task on a page: one query on the task primary key (not a join in the page's query,
    which the planner might then run before the LIMIT)."""
    return dict(Task.objects.filter(id__in=set(task_ids)).values_list("id", "tenant__slug"))


def audit_events_page(*, filters: AuditFilter, after: Cursor | None = None,
                      limit: int = PAGE_ROWS) -> tuple[list[dict], Cursor | None]:
    """A page of events, newest first, and the cursor of the next page (None on the last)."""
    rows = list(_events_ordered(filters, after).values_list(*EVENT_COLUMNS)[:limit + 1])
    more = len(rows) > limit
    rows = rows[:limit]
    tenants = _tenant_slugs(row[1] for row in rows)
    page = [_event_row(row, tenants.get(row[1], "")) for row in rows]
    return page, (page[-1]["cursor"] if more and page else None)


def audit_events_export(*, filters: AuditFilter, after: Cursor | None = None,
                        max_rows: int = EXPORT_MAX_ROWS) -> Iterator[dict]:
    """Every event the filter selects, newest first, up to ``max_rows`` (then a last item {"truncated": cursor}).

    One query (its tenant joined in), read in chunks through a server-side cursor: no keyset re-query per chunk,
    which without a task would scan the table again each time."""
    events = _events_ordered(filters, after).values_list(*EVENT_COLUMNS, "task__tenant__slug")[:max_rows + 1]
    last = None
    for count, values in enumerate(events.iterator(chunk_size=EXPORT_CHUNK_ROWS)):
        if count == max_rows:
            yield {"truncated": last["cursor"]}
            return
        last = _event_row(values[:-1], values[-1])
        yield last


def _commands(filters: AuditFilter):
    _require_bounded(filters)
    commands = SteeringCommand.objects.all()
    if filters.task_id is not None:
        commands = commands.filter(task_id=filters.task_id)
    if filters.tenant_id is not None:
        commands = commands.filter(task__tenant_id=filters.tenant_id)
        if filters.until is not None:
            commands = commands.filter(task__created_at__lt=filters.until)
    if filters.type:
        commands = commands.filter(type=filters.type)
    if filters.actor:
        commands = commands.filter(requested_by=filters.actor)
    if filters.since is not None:
        commands = commands.filter(created_at__gte=filters.since)
    if filters.until is not None:
        commands = commands.filter(created_at__lt=filters.until)
    return commands


def _commands_ordered(filters: AuditFilter, after: Cursor | None):
    commands = _commands(filters)
    if filters.task_id is not None:
        # One task: its queue's order, newest first (steering_version_unique_per_task backwards).
        if after is not None:
            commands = commands.filter(new_version__lt=after.seq)
        return commands.order_by("-new_version")
    if after is not None:
        commands = commands.filter(Q(created_at__lt=after.at) | Q(created_at=after.at, id__lt=after.id))
    return commands.order_by("-created_at", "-id")


def command_outcomes(commands: list[dict]) -> dict[str, tuple[str, datetime, str | None]]:
    """What became of each command, by its id: (applied | rejected, when, why rejected). One query for a page of
    commands, on taskevent_steering_idx; a command with no outcome event yet is pending (as in steering_history)."""
    if not commands:
        return {}
    outcomes = TaskEvent.objects.filter(
        task_id__in={c["task_id"] for c in commands}, type__in=STEERING_OUTCOME_EVENTS,
        data__commandId__in=[str(c["id"]) for c in commands]).values_list("type", "at", "data")
    return {data["commandId"]: (type_.removeprefix("steering."), at, data.get("why") if type_ == "steering.rejected"
                                else None) for type_, at, data in outcomes}


def _command_row(values: tuple, tenant: str) -> dict[str, Any]:
    row = dict(zip(COMMAND_COLUMNS, values, strict=True))
    row.update(tenant=tenant, status="pending", decided_at=None, rejection=None,
               cursor=Cursor(at=row["created_at"], id=row["id"], seq=row["new_version"]))
    return row


def _with_outcomes(rows: list[dict]) -> list[dict]:
    outcomes = command_outcomes(rows)
    for row in rows:
        outcome = outcomes.get(str(row["id"]))
        if outcome is not None:
            row["status"], row["decided_at"], row["rejection"] = outcome
    return rows


def audit_commands_page(*, filters: AuditFilter, after: Cursor | None = None,
                        limit: int = PAGE_ROWS) -> tuple[list[dict], Cursor | None]:
    """A page of steering commands, newest first, each with its status (pending / applied / rejected), and the
    cursor of the next page. Three queries: the page, its tasks' tenants, the outcome events of its commands."""
    rows = list(_commands_ordered(filters, after).values_list(*COMMAND_COLUMNS)[:limit + 1])
    more = len(rows) > limit
    rows = rows[:limit]
    tenants = _tenant_slugs(row[2] for row in rows)
    page = _with_outcomes([_command_row(row, tenants.get(row[2], "")) for row in rows])
    return page, (page[-1]["cursor"] if more and page else None)


def audit_commands_export(*, filters: AuditFilter, after: Cursor | None = None,
                          max_rows: int = EXPORT_MAX_ROWS) -> Iterator[dict]:
    """Every command the filter selects with its status, newest first, up to ``max_rows`` (then a last item
    {"truncated": cursor}). One query for the commands; one outcome query per chunk of them."""
    commands = _commands_ordered(filters, after).values_list(*COMMAND_COLUMNS, "task__tenant__slug")[:max_rows + 1]
    count = 0
    last = None
    rows = commands.iterator(chunk_size=EXPORT_CHUNK_ROWS)
    while chunk := list(islice(rows, 500)):
        for row in _with_outcomes([_command_row(values[:-1], values[-1]) for values in chunk]):
            if count == max_rows:
                yield {"truncated": last["cursor"]}
                return
            count += 1
            last = row
            yield row


@dataclass(frozen=True)
class ChainState:
    task_id: uuid.UUID
    tenant: str
    first_bad_seq: int | None  # None: the chain verifies
    events: int  # the task row's head: how many events the chain should have
    # Its newest sealed head (tasks_app.audit.anchors, from the seals' index) and whether the event at that seq still
    # has the sealed hash (False: the chain was rewritten after the seal); None: not sealed yet.
    sealed_seq: int | None = None
    seal_sequence: int | None = None
    seal_holds: bool | None = None

    @property
    def verified(self) -> bool:
        return self.first_bad_seq is None


def audit_chains_verify(*, task_ids: Iterable[uuid.UUID]) -> list[ChainState]:
    """Each task's chain verification (tasks_app.selectors.task_events_verify), for at most MAX_VERIFY_TASKS tasks:
    it reads every event of each task, and recomputes each progress event's step-delta hash — a whole task's history
    per task, so never for a whole listing. Unknown task ids are left out."""
    task_ids = list(dict.fromkeys(task_ids))
    if len(task_ids) > MAX_VERIFY_TASKS:
        raise ValueError(f"At most {MAX_VERIFY_TASKS} tasks per verification: each reads its whole event chain.")
    tasks = {row[0]: row for row in Task.objects.filter(id__in=task_ids).values_list("id", "tenant__slug",
                                                                                       "event_seq")}
    sealed = {task_id: (seq, head, sequence) for task_id, seq, head, sequence in SealedHead.objects.filter(
        task_id__in=list(tasks)).values_list("task_id", "seq", "hash", "seal_sequence")}
    hashes = {(task_id, seq): digest for task_id, seq, digest in TaskEvent.objects.filter(
        task_id__in=list(sealed), seq__in=[seq for seq, _, _ in sealed.values()]).values_list("task_id", "seq", "hash")}
    states = []
    for task_id in task_ids:
        if task_id not in tasks:
            continue
        seq, head, sequence = sealed.get(task_id, (None, None, None))
        states.append(ChainState(task_id=task_id, tenant=tasks[task_id][1], events=tasks[task_id][2],
                                 first_bad_seq=task_events_verify(task_id=task_id), sealed_seq=seq,
                                 seal_sequence=sequence,
                                 seal_holds=None if seq is None else hashes.get((task_id, seq)) == head))
    return states


def _admin_actions(filters: AuditFilter):
    _require_bounded(filters)
    if filters.task_id is not None:
        return AdminAction.objects.none()  # an admin write concerns no task
    actions = AdminAction.objects.all()
    if filters.tenant_id is not None:
        actions = actions.filter(tenant_id=filters.tenant_id)
    if filters.type:
        actions = actions.filter(action=filters.type)
    if filters.actor:
        actions = actions.filter(actor=filters.actor)
    if filters.since is not None:
        actions = actions.filter(at__gte=filters.since)
    if filters.until is not None:
        actions = actions.filter(at__lt=filters.until)
    return actions


def _admin_actions_ordered(filters: AuditFilter, after: Cursor | None):
    actions = _admin_actions(filters)
    if after is not None:
        actions = actions.filter(Q(at__lt=after.at) | Q(at=after.at, id__lt=after.id))
    return actions.order_by("-at", "-id")


def _admin_action_row(values: tuple, tenants: dict[int, str]) -> dict[str, Any]:
    row = dict(zip(ADMIN_ACTION_COLUMNS, values, strict=True))
    tenant_id = row["tenant_id"]
    row.update(tenant=tenants.get(tenant_id, "" if tenant_id is None else f"(deleted tenant {tenant_id})"),
               cursor=Cursor(at=row["at"], id=row["id"], seq=0))
    return row


def _tenant_slugs_by_id(tenant_ids: Iterable[int | None]) -> dict[int, str]:
    return dict(Tenant.objects.filter(id__in={t for t in tenant_ids if t is not None}).values_list("id", "slug"))


def audit_admin_actions_page(*, filters: AuditFilter, after: Cursor | None = None,
                             limit: int = PAGE_ROWS) -> tuple[list[dict], Cursor | None]:
    """A page of admin actions (AdminAction: the writes people made through the admin), newest first, and the
    cursor of the next page. Two queries: the page, its tenants' slugs."""
    rows = list(_admin_actions_ordered(filters, after).values_list(*ADMIN_ACTION_COLUMNS)[:limit + 1])
    more = len(rows) > limit
    rows = rows[:limit]
    tenants = _tenant_slugs_by_id(row[ADMIN_ACTION_COLUMNS.index("tenant_id")] for row in rows)
    page = [_admin_action_row(row, tenants) for row in rows]
    return page, (page[-1]["cursor"] if more and page else None)


def audit_admin_actions_export(*, filters: AuditFilter, after: Cursor | None = None,
                               max_rows: int = EXPORT_MAX_ROWS) -> Iterator[dict]:
    """Every admin action the filter selects, newest first, up to ``max_rows`` (then {"truncated": cursor})."""
    actions = _admin_actions_ordered(filters, after).values_list(*ADMIN_ACTION_COLUMNS)[:max_rows + 1]
    last = None
    rows = actions.iterator(chunk_size=EXPORT_CHUNK_ROWS)
    count = 0
    while chunk := list(islice(rows, 500)):
        tenants = _tenant_slugs_by_id(values[ADMIN_ACTION_COLUMNS.index("tenant_id")] for values in chunk)
        for values in chunk:
            if count == max_rows:
                yield {"truncated": last["cursor"]}
                return
            count += 1
            last = _admin_action_row(values, tenants)
            yield last
