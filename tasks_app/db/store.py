"""The store between the slice loop and PostgreSQL (procrastinate's worker/manager split): the engine decides, this
module runs its statements (tasks_app.db.sql) and hands back what they returned.

One named, documented function per statement. The fenced writes take a frozen dataclass per kind (StepCommit,
TaskFailure, …) whose fields ARE the statement's parameters: ``params()`` is what the statement is executed with,
and when this module is imported every dataclass is checked against its statement's ``%(…)s`` placeholders
(together with the few the executor supplies itself: the fence and the event chain). So a misspelt or missing
argument is a TypeError where the value is built, and a statement and its dataclass that disagree stop the process
at start-up — never a KeyError from psycopg in the middle of a slice.

This module grew out of db/writes.py instead of sitting beside it: the fenced writer's retry (re-read the task's
head, chain our events after a newcomer's, run the statement again) is itself one of these statements (HEAD), and
the writer is the only way a fenced statement is run; two modules would have split one protocol.

What is prepared (tasks_app.db.prepared) is what was before: the per-step statements, that is the fenced writes and
an effect's ``started`` row. The others run once per slice or rarely and go through Django's cursor.
"""

from __future__ import annotations

import contextlib
import json
import re
import typing
from dataclasses import dataclass, fields, is_dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any, ClassVar

from django.db import IntegrityError, connection, transaction

from checkpoints_app.fencing import Fence, LeaseLost
from checkpoints_app.ledger import EffectBegin
from tasks_app.db import sql
from tasks_app.db.prepared import json_value, prepared_fetchone
from tasks_app.events import Event, chain_events
from tasks_app.models import RUNNABLE_STATUSES, TaskStatus, sources_of
from tasks_app.streaming import events_publish

# -- typed parameters ---------------------------------------------------------------------------------------------
_PLACEHOLDER = re.compile(r"%\((\w+)\)s")
_FENCE_PARAMETERS = frozenset({"task_id", "owner", "epoch"})
# What FencedWriter adds to every fenced write: the fence, the source statuses it is guarded on, the event chain.
_WRITER_PARAMETERS = _FENCE_PARAMETERS | {"sources", "expected_seq", "new_seq", "new_head", "events"}


class Parameters:
    """A statement's parameters as a frozen dataclass. A field whose type is itself a Parameters dataclass (the
    checkpoint a write carries, say) contributes its own fields, flat, as the statement names them."""

    statement: ClassVar[str]
    _flat: ClassVar[tuple[tuple[str, bool], ...]]  # (field, nested?) in declaration order

    def params(self) -> dict[str, Any]:
        values: dict[str, Any] = {}
        for name, nested in self._flat:
            value = getattr(self, name)
            if nested:
                values.update(value.params())
            else:
                values[name] = value
        return values


def _binds(statement: str, *, supplied: frozenset[str] = frozenset()):
    """Class decorator: the dataclass carries ``statement``'s parameters, all of them and no others, besides those
    ``supplied`` by the function that runs it. Checked once, at import."""

    def bind(cls):
        hints = typing.get_type_hints(cls)
        flat, names = [], set()
        for field in fields(cls):
            nested = is_dataclass(hints[field.name]) and issubclass(hints[field.name], Parameters)
            flat.append((field.name, nested))
            names |= {f.name for f in fields(hints[field.name])} if nested else {field.name}
        expected = set(_PLACEHOLDER.findall(statement)) - supplied
        if names != expected:
            raise TypeError(f"{cls.__name__} does not match its statement: missing {sorted(expected - names)}, "
                            f"not in the statement {sorted(names - expected)}")
        cls.statement, cls._flat = statement, tuple(flat)
        return cls

    return bind


def _check_nested(cls):
    cls._flat = tuple((field.name, False) for field in fields(cls))
    return cls


@_check_nested
@dataclass(frozen=True)
class CheckpointRow(Parameters):
    """The full checkpoint a fenced write may insert in the same statement (sql._CHECKPOINT); NO_CHECKPOINT: none."""

    cp_sequence: int | None
    cp_schema: int | None
    cp_payload: str | None
    cp_checksum: str | None
    cp_size: int | None


NO_CHECKPOINT = CheckpointRow(cp_sequence=None, cp_schema=None, cp_payload=None, cp_checksum=None, cp_size=None)


@_check_nested
@dataclass(frozen=True)
class FailedStepRow(Parameters):
    """The failed step's row a task failure inserts with it (sql.FAIL); NO_FAILED_STEP when no step failed (a
    budget, a deadline, an invalid plan or result)."""

    step_seq: int | None
    step_index: int | None
    step_name: str | None
    attempt: int | None
    output: str | None  # the public error, JSON


NO_FAILED_STEP = FailedStepRow(step_seq=None, step_index=None, step_name=None, attempt=None, output=None)

# A worker executes and commits steps in these statuses (a pause or cancel request is applied at the next safe
# point, after the step in flight commits).
STEPPING = [TaskStatus.WORKING.value, TaskStatus.PAUSING.value, TaskStatus.CANCELLING.value]
_RUNNABLE_SOURCES = sorted(RUNNABLE_STATUSES)


# -- the fenced writes: one dataclass per kind, each naming its statement and the statuses it is guarded on --------
@_binds(sql.COMMIT_STEP, supplied=_WRITER_PARAMETERS)
@dataclass(frozen=True)
class StepCommit(Parameters):
    """One step committed (sql.COMMIT_STEP): its row and delta, the cursor and progress, effect outcomes, the plan on
    the first commit, a checkpoint when due, and the lease released at the end of a slice."""

    sources: ClassVar[list[str]] = STEPPING

    progress: float
    phase: str | None
    next_index: int
    step_seq: int
    cost: Decimal
    tokens: int
    plan_length: int | None  # the plan's length with its first commit; None afterwards
    plan_chunks: str  # JSON list of the plan's chunks, stored with the first commit ("[]" afterwards)
    release: bool
    plan_version: int
    step_index: int
    step_name: str
    attempt: int
    delta: str
    delta_sha256: str
    output: str
    started_at: datetime
    effect_keys: list[str]
    effect_results: str  # JSON object: key → result
    prune_through: int | None  # checkpoints up to this sequence are deleted (quarantined ones never)
    checkpoint: CheckpointRow


@_binds(sql.START_WORKING, supplied=_WRITER_PARAMETERS)
@dataclass(frozen=True)
class WorkingStart(Parameters):
    """queued/recovering → working at the start of a slice (sql.START_WORKING): nothing but the fence and events."""

    sources: ClassVar[list[str]] = sources_of(TaskStatus.WORKING)


@_binds(sql.COMPLETE, supplied=_WRITER_PARAMETERS)
@dataclass(frozen=True)
class TaskCompletion(Parameters):
    """The task completed (sql.COMPLETE): its result inline (JSON) or by reference, the lease let go."""

    sources: ClassVar[list[str]] = sources_of(TaskStatus.COMPLETED)

    result: str
    result_ref: str
    plan_length: int | None  # an empty plan made in this slice is stored with the completion


@_binds(sql.FAIL, supplied=_WRITER_PARAMETERS)
@dataclass(frozen=True)
class TaskFailure(Parameters):
    """The task failed (sql.FAIL): its error, what failed attempts spent, and the failed step's row if one failed."""

    sources: ClassVar[list[str]] = sources_of(TaskStatus.FAILED)

    message: str
    error: str  # JSON
    cost: Decimal
    tokens: int
    plan_version: int
    failed_step: FailedStepRow


@_binds(sql.DEAD_LETTER, supplied=_WRITER_PARAMETERS)
@dataclass(frozen=True)
class TaskDeadLetter(Parameters):
    """The task is parked for an operator (sql.DEAD_LETTER) with its reason in ``error``."""

    sources: ClassVar[list[str]] = sources_of(TaskStatus.DEAD_LETTERED)

    message: str
    error: str  # JSON: {"type": "DeadLettered", "reason", "message", "openEffects"}
    cost: Decimal
    tokens: int


@_binds(sql.STOP_AT_SAFE_POINT, supplied=_WRITER_PARAMETERS)
@dataclass(frozen=True)
class SafePointStop(Parameters):
    """Pause or cancel at a safe point (sql.STOP_AT_SAFE_POINT): a checkpoint, the transition, the cursor of the
    command that asked for it, the lease let go."""

    status: str  # paused or cancelled
    message: str
    steering_cursor: int | None
    cost: Decimal
    tokens: int
    checkpoint: CheckpointRow

    @property
    def sources(self) -> list[str]:
        return sources_of(TaskStatus(self.status))


@_binds(sql.APPLY_SAFE_POINT, supplied=_WRITER_PARAMETERS)
@dataclass(frozen=True)
class SafePointApply(Parameters):
    """A safe-point decision that does not stop the task (sql.APPLY_SAFE_POINT): its events, the steering cursor
    past it, a new priority, goal or budgets."""

    sources: ClassVar[list[str]] = _RUNNABLE_SOURCES

    steering_cursor: int | None
    priority: int | None
    set_goal: bool
    goal: str | None  # JSON, when set_goal
    status_message: str | None
    set_budget: bool  # the three budgets below are written (each None: no limit)
    budget_steps: int | None
    budget_cost: Decimal | None
    budget_tokens: int | None


@_binds(sql.ENTER_WAIT, supplied=_WRITER_PARAMETERS)
@dataclass(frozen=True)
class WaitEntry(Parameters):
    """The task waits for a person (sql.ENTER_WAIT): the wait record, a checkpoint, the lease let go with no hint."""

    sources: ClassVar[list[str]] = sources_of(TaskStatus.INPUT_REQUIRED)

    message: str
    wait: str  # JSON
    cost: Decimal
    tokens: int
    # A budget wait: the steering version its worker decided up to; a submission since fails the write with
    # SteeringArrived (sql.ENTER_WAIT says why). None: not guarded (input and approval waits).
    state_version: int | None
    checkpoint: CheckpointRow


@_binds(sql.ADJUST_PLAN, supplied=_WRITER_PARAMETERS)
@dataclass(frozen=True)
class PlanAdjustment(Parameters):
    """adjust_goal applied (sql.ADJUST_PLAN): the new goal, the next plan version from the chunk holding the cursor
    on, the steering cursor past the command."""

    sources: ClassVar[list[str]] = _RUNNABLE_SOURCES

    goal: str  # JSON
    plan_version: int
    plan_length: int
    steering_cursor: int | None
    priority: int | None
    plan_chunks: str  # JSON list of chunks
    message: str


FencedWrite = (StepCommit | WorkingStart | TaskCompletion | TaskFailure | TaskDeadLetter | SafePointStop
               | SafePointApply | WaitEntry | PlanAdjustment)


class StatusMoved(Exception):
    """A status-guarded write found the task in another status (e.g. cancelled from the web meanwhile)."""

    def __init__(self, status: str | None):
        super().__init__(status)
        self.status = status


class SteeringArrived(Exception):
    """A write guarded on the steering version (a budget wait's entry) found a command submitted since: nothing was
    written; apply the commands up to ``state_version`` at a safe point and decide again."""

    def __init__(self, state_version: int):
        super().__init__(state_version)
        self.state_version = state_version


@dataclass(frozen=True)
class Written:
    status: str
    state_version: int
    waiting: bool  # tasks wait for a slot: the releasing worker hands one on
    deadline_passed: bool  # seen at every commit, so a deadline stops the task at its next safe point


class FencedWriter:
    """Runs one slice's fenced writes with the task's event chain.

    The worker keeps the head of the event chain it last wrote; a web replica (cancel, steering) may append events
    meanwhile, which makes the fence's ``event_seq`` guard miss. Then the head is re-read (HEAD) and, if the lease is
    still ours and the status still allows the write, the events are chained after the newcomers and the statement
    runs again. So for every write below, 0 rows means LeaseLost (the lease moved on, or the row is gone) or
    StatusMoved (the status no longer allows it) — never a silent no-op.
    """

    def __init__(self, fence: Fence, *, event_seq: int, event_head: str, status: str, tenant_id: int | None = None):
        self.fence = fence
        self.tenant_id = tenant_id
        self.event_seq = event_seq
        self.event_head = event_head
        self.status = status

    def step_commit(self, commit: StepCommit, *, events: list[Event]) -> Written:
        """Commit one step (sql.COMMIT_STEP), guarded on the statuses a step runs in (STEPPING)."""
        return self._write(commit, events)

    def working_start(self, *, events: list[Event]) -> Written:
        """Move queued/recovering → working (sql.START_WORKING)."""
        return self._write(_WORKING_START, events)

    def task_complete(self, completion: TaskCompletion, *, events: list[Event]) -> Written:
        """Complete the task and let the lease go (sql.COMPLETE)."""
        return self._write(completion, events)

    def task_fail(self, failure: TaskFailure, *, events: list[Event]) -> Written:
        """Fail the task and let the lease go (sql.FAIL)."""
        return self._write(failure, events)

    def task_dead_letter(self, dead: TaskDeadLetter, *, events: list[Event]) -> Written:
        """Dead-letter the task and let the lease go (sql.DEAD_LETTER)."""
        return self._write(dead, events)

    def safe_point_stop(self, stop: SafePointStop, *, events: list[Event]) -> Written:
        """Pause or cancel at a safe point and let the lease go (sql.STOP_AT_SAFE_POINT)."""
        return self._write(stop, events)

    def safe_point_apply(self, apply: SafePointApply, *, events: list[Event]) -> Written:
        """Write a safe-point decision that does not stop the task (sql.APPLY_SAFE_POINT); the lease is kept."""
        return self._write(apply, events)

    def wait_enter(self, entry: WaitEntry, *, events: list[Event]) -> Written:
        """Enter input_required and let the lease go with no hint (sql.ENTER_WAIT)."""
        return self._write(entry, events)

    def plan_adjust(self, adjustment: PlanAdjustment, *, events: list[Event]) -> Written:
        """Store the re-planned rest of the plan as the next plan version (sql.ADJUST_PLAN); the lease is kept."""
        return self._write(adjustment, events)

    def _write(self, value: FencedWrite, events: list[Event]) -> Written:
        """Run one fenced statement; LeaseLost if the lease is not ours, StatusMoved if the status forbids it,
        SteeringArrived if it is guarded on a steering version that moved."""
        statement, sources, params = value.statement, value.sources, value.params()
        for _ in range(10):
            rows, new_seq, new_head = chain_events(self.fence.task_id, events, seq=self.event_seq,
                                                   head=self.event_head)
            values = {
                **self.fence.params(), **params, "sources": sources,
                "expected_seq": self.event_seq, "new_seq": new_seq, "new_head": new_head,
                "events": json.dumps([{"seq": r.seq, "type": r.type, "data": r.data, "prev_hash": r.prev_hash,
                                       "hash": r.hash} for r in rows]),
            }
            row = prepared_fetchone(statement, values)
            if row is not None:
                self.event_seq, self.event_head, self.status = new_seq, new_head, row[0]
                if rows:  # live subscribers hear of them once committed (at once, outside a transaction)
                    transaction.on_commit(lambda rows=rows: events_publish(
                        task_id=self.fence.task_id, tenant_id=self.tenant_id, events=rows))
                return Written(status=row[0], state_version=row[1], waiting=row[2], deadline_passed=row[3])
            head = task_head(self.fence.task_id)
            if head is None:  # the row is gone (purged or deleted by an operator): nothing of ours can be written
                raise LeaseLost(f"task {self.fence.task_id} no longer exists")
            owner, epoch, event_seq, event_head, status, state_version = head
            if owner != self.fence.owner or epoch != self.fence.epoch:
                raise LeaseLost(f"task {self.fence.task_id}: lease now {owner}/{epoch}")
            if status not in sources:
                raise StatusMoved(status)
            guarded = params.get("state_version") if isinstance(value, WaitEntry) else None
            if guarded is not None and state_version != guarded:
                raise SteeringArrived(state_version)
            # Someone (steering, cancel) appended events: chain ours after theirs and try again.
            self.event_seq, self.event_head, self.status = event_seq, event_head, status
        raise LeaseLost(f"task {self.fence.task_id}: could not commit after 10 attempts")


_WORKING_START = WorkingStart()


def task_head(task_id) -> tuple[str | None, int, int, str, str, int] | None:
    """(lease_owner, lease_epoch, event_seq, event_head_hash, status, state_version) of the task (sql.HEAD), read
    after a fenced write matched nothing to tell a lost lease from a newcomer's events (or, for a write guarded on
    it, from a steering command submitted since). None: the row is gone."""
    with connection.cursor() as cursor:
        cursor.execute(sql.HEAD, {"task_id": task_id})
        return cursor.fetchone()


# -- the lease ----------------------------------------------------------------------------------------------------
def claim(*, task_id, owner: str, ttl: float, max_concurrent: int, chunk_steps: int,
          share: float | None = None) -> tuple | None:
    """Take the task's lease through runtime_lease_claim (sql.CLAIM; its text is db/lease_claim.sql) and return its
    row, columns as sql.CLAIM lists them. None: not runnable, someone holds a live lease, or the fleet or the task's
    tenant is full (its max_running_tasks, or ``share`` of the live fleet without one; the hint is consumed either
    way; claim_probe tells which)."""
    with connection.cursor() as cursor:
        cursor.execute(sql.CLAIM, {"task_id": task_id, "owner": owner, "ttl": ttl, "max_concurrent": max_concurrent,
                                   "runnable": sql.RUNNABLE, "chunk_steps": chunk_steps, "share": share})
        return cursor.fetchone()


def claim_probe(task_id) -> int | None:
    """Why a claim (or a release) found the task not ours (sql.CLAIM_PROBE): its priority when it is runnable and
    nobody holds a live lease — the fleet was full, or our lease was released under us, and the task waits for a
    hint — else None (someone holds it, it is not runnable, or it is gone)."""
    with connection.cursor() as cursor:
        cursor.execute(sql.CLAIM_PROBE, {"task_id": task_id, "runnable": sql.RUNNABLE})
        row = cursor.fetchone()
    return row[1] if row and row[0] else None


def lease_renew(fence: Fence, *, ttl: float) -> tuple[str, bool, int] | None:
    """Extend our lease by ``ttl`` seconds from the database's now (sql.RENEW): (status, deadline passed,
    state_version). None (0 rows): the lease is not ours any more."""
    with connection.cursor() as cursor:
        cursor.execute(sql.RENEW, {**fence.params(), "ttl": ttl})
        return cursor.fetchone()


def lease_release(fence: Fence, *, cost: Decimal | int = 0, tokens: int = 0) -> tuple[str, int] | None:
    """Give the lease back without a status change, marking a hint pending (sql.RELEASE): (status, priority). None
    (0 rows): it was not ours any more. The caller sends the hint when the task is still runnable. ``cost`` and
    ``tokens``: what an attempt that committed nothing spent (a step stopped at an approval gate), kept with the
    release."""
    with connection.cursor() as cursor:
        cursor.execute(sql.RELEASE, {**fence.params(), "cost": cost, "tokens": tokens})
        return cursor.fetchone()


def lease_park(fence: Fence, *, seconds: float, message: str, cost: Decimal | int = 0,
               tokens: int = 0) -> tuple[str, int] | None:
    """Give the lease back until ``seconds`` from now (sql.PARK): (status, priority). None (0 rows): it was not ours
    any more. The caller sends the hint, delayed by as much."""
    with connection.cursor() as cursor:
        cursor.execute(sql.PARK, {**fence.params(), "seconds": seconds, "message": message[:500], "cost": cost,
                                  "tokens": tokens})
        return cursor.fetchone()


# -- restoring state and reading the plan --------------------------------------------------------------------------
def checkpoint_latest(task_id) -> tuple[int, int, Any, str] | None:
    """(sequence, schema_version, payload, checksum) of the task's newest checkpoint that is not quarantined
    (sql.LATEST_CHECKPOINT). None: it has none."""
    with connection.cursor() as cursor:
        cursor.execute(sql.LATEST_CHECKPOINT, {"task_id": task_id})
        return cursor.fetchone()


def step_deltas_after(task_id, *, after: int) -> list[tuple[int, int, int, str, str, str]]:
    """(seq, plan_version, step_index, name, state_delta, delta_sha256) of the committed steps after ``after``, in
    order (sql.DELTAS_AFTER). Empty: none committed since."""
    with connection.cursor() as cursor:
        cursor.execute(sql.DELTAS_AFTER, {"task_id": task_id, "after": after})
        return cursor.fetchall()


def plan_chunk(task_id, *, plan_version: int, chunk: int) -> list | None:
    """The steps of one stored chunk of the plan (sql.PLAN_CHUNK). None: no such chunk is stored."""
    with connection.cursor() as cursor:
        cursor.execute(sql.PLAN_CHUNK, {"task_id": task_id, "plan_version": plan_version, "chunk": chunk})
        row = cursor.fetchone()
    return json_value(row[0]) if row else None


def plan_chunks_from(task_id, *, plan_version: int, chunk: int) -> list[tuple[int, list]]:
    """(chunk, steps) of the plan's stored chunks from ``chunk`` on, in order (sql.PLAN_CHUNKS_FROM). Empty: none."""
    with connection.cursor() as cursor:
        cursor.execute(sql.PLAN_CHUNKS_FROM, {"task_id": task_id, "plan_version": plan_version, "chunk": chunk})
        return [(number, json_value(steps)) for number, steps in cursor.fetchall()]


# -- the ledger's storage, fenced (its rules are checkpoints_app.ledger's) ----------------------------------------
@_binds(sql.EFFECT_BEGIN, supplied=_FENCE_PARAMETERS)
@dataclass(frozen=True)
class EffectStart(Parameters):
    """An effect about to be called: its ``started`` row (sql.EFFECT_BEGIN / EFFECT_BEGIN_AGAIN)."""

    key: str
    step_seq: int
    name: str
    lands_within: float | None = None  # seconds after its start the call can no longer land (None: no bound)
    recovery: str | None = None  # how an unknown outcome is decided (checkpoints_app.models.Recovery)
    asks: bool | None = None  # a person is asked on the task (True) or through the dead letters
    about: str | None = None  # JSON: what a person deciding is shown (redacted arguments, server, tool, annotations)


@_binds(sql.EFFECT_MARK, supplied=_FENCE_PARAMETERS)
@dataclass(frozen=True)
class EffectMark(Parameters):
    """An effect's outcome recorded outside a step commit (sql.EFFECT_MARK)."""

    key: str
    step_seq: int
    status: str
    restart: int  # 1: started again under this lease (attempts + 1, a fresh started_at and deadline)
    result: str | None  # JSON
    error: str | None  # JSON
    lands_within: float | None = None  # with restart: the seconds the call may take again (its new deadline)
    why: str | None = None  # with status unknown: why (checkpoints_app.models.UnknownWhy); None: derived


def effect_begin(fence: Fence, start: EffectStart) -> EffectBegin | None:
    """Insert the effect's ``started`` row, committed before the call (sql.EFFECT_BEGIN), fenced on the lease. When
    the key exists (a retried or recovered step) its primary key rejects the insert and effect_begin_again returns
    the existing row. None (0 rows): the lease is not ours."""
    try:
        # Inside a transaction (tests, an operator's tool) the failed INSERT must not abort the caller's work.
        with transaction.atomic() if connection.in_atomic_block else contextlib.nullcontext():
            row = prepared_fetchone(sql.EFFECT_BEGIN, {**fence.params(), **start.params()})
    except IntegrityError:  # the key exists
        return effect_begin_again(fence, start)
    return _effect_begin(row)


def effect_begin_again(fence: Fence, start: EffectStart) -> EffectBegin | None:
    """The effect's key exists: its row, locked, so a concurrent outcome is seen whole — or a fresh ``started`` row
    if the one in the way is gone (sql.EFFECT_BEGIN_AGAIN). None (0 rows): the lease is not ours."""
    return _effect_begin(prepared_fetchone(sql.EFFECT_BEGIN_AGAIN, {**fence.params(), **start.params()}))


def _effect_begin(row: tuple | None) -> EffectBegin | None:
    if row is None:
        return None
    inserted, status, result = row
    return EffectBegin(inserted=inserted, status=status, result=json_value(result))


def effect_mark(fence: Fence, mark: EffectMark) -> bool:
    """Record an effect's outcome (sql.EFFECT_MARK), fenced on the lease. False (0 rows): the lease is not ours (or
    the effect has no row under this task and step)."""
    with connection.cursor() as cursor:
        cursor.execute(sql.EFFECT_MARK, {**fence.params(), **mark.params()})
        return cursor.fetchone() is not None


def effect_unknown_facts(task_id, *, step_seq: int, key: str) -> dict | None:
    """An open effect's {"sent_at", "deadline", "why", "status", "seconds_left", "name", "recovery", "asks", "about"}
    (sql.EFFECT_UNKNOWN_FACTS; times as the database keeps them, seconds_left on its clock, None without a deadline).
    None: no such row."""
    with connection.cursor() as cursor:
        cursor.execute(sql.EFFECT_UNKNOWN_FACTS, {"task_id": task_id, "step_seq": step_seq, "key": key})
        row = cursor.fetchone()
    if row is None:
        return None
    facts = dict(zip(("sent_at", "deadline", "why", "status", "seconds_left", "name", "recovery", "asks", "about"), row))
    facts["about"] = json_value(facts["about"])
    return facts


def effects_open(task_id) -> list[dict]:
    """The task's effects without an outcome, {"key", "name", "step_seq", "status"} in step and key order, as the
    claim returns them (sql.OPEN_EFFECTS). Empty: every effect has its outcome."""
    with connection.cursor() as cursor:
        cursor.execute(sql.OPEN_EFFECTS, {"task_id": task_id})
        return [{"key": key, "name": name, "step_seq": step_seq, "status": status}
                for key, name, step_seq, status in cursor.fetchall()]


# -- the reaper's statements ---------------------------------------------------------------------------------------
def sweep_due(*, retention_days: int) -> dict[str, bool]:
    """Which of the sweep's parts have anything to look at ({"leased", "runnable", "overdue", "purgeable"}), with the
    console's throughput sampled on the way (sql.SWEEP_DUE)."""
    with connection.cursor() as cursor:
        cursor.execute(sql.SWEEP_DUE, {"retention_days": retention_days})
        return dict(zip(("leased", "runnable", "overdue", "purgeable"), cursor.fetchone()))


def slots_free(*, max_concurrent: int) -> int:
    """How many more leases the fleet may hold right now (sql.FREE_SLOTS); negative when over the limit."""
    with connection.cursor() as cursor:
        cursor.execute(sql.FREE_SLOTS, {"max_concurrent": max_concurrent})
        return cursor.fetchone()[0]
