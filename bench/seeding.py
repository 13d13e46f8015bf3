"""Seeding many stored terminal tasks fast, for benchmarks and load tests (``bench/seed_tasks.py``).

The rows are what the engine leaves behind for a ``demo_steps`` task that ran to its end: most completed, a few
failed at a step after their retries, a few cancelled while still queued (by a cancel command, whose
SteeringCommand row is written too). Same columns, same events with a valid hash chain (``verify_events``
passes), optionally the Step rows with their checksummed deltas, and created_at spread over the last days in
creation order, as a live table would be. They are written with PostgreSQL COPY,
one transaction per batch; nothing already stored is read or changed.

Speed: everything that repeats from task to task (event data, inputs, fingerprints, errors, deltas) is rendered
once; per task only the id, the times and the hash chain are computed. An event's hash comes from
``tasks_app.events.event_hash_of_canonical`` given the data's canonical JSON rendered once, because serialising
the same data again for every event was most of the rendering time; the hash rule itself stays in the events
module. The database does most of the work (index inserts, the deferred FK checks at commit), so batches are
written on two connections at once by default. Figures: docs/performance.md ("Seeding stored tasks").

Not seeded, although the engine writes them too: the plan's PlanChunk row and each step's SideEffect row (the
step's progress event names the effect). A task has at most ``checkpoint.every_steps`` steps, so no checkpoint
falls due before its last step and none is missing.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import date, timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import JSONField
from django.db.models.fields import NOT_PROVIDED, AutoFieldMixin

from config.base.canonical import canonical_json, canonical_json_strict
from steering_app.application import applied_event, reason_shown
from steering_app.models import CommandType, SteeringCommand
from tasks_app.engine.restore import delta_sha256
from tasks_app.events import event_hash, event_hash_of_canonical, progress_event, status_event, transition_events
from tasks_app.ids import uuid7
from tasks_app.models import Step, Task, TaskEvent, TaskStatus, Tenant
from tasks_app.registry import registry
from tasks_app.services import task_request_fingerprint

WORKFLOW = "demo_steps"
STEP_NAME = "tick"  # demo_steps plans ["tick"] * steps
EFFECT_NAME = "record"  # …and each tick records one effect
# Every task's events: status queued, status working, per step its progress (naming the step's effects), then
# the terminal status and the `terminal` event streams close on.
EVENTS_FIXED = 4
EVENTS_PER_STEP = 1
DEFAULT_EVENTS_PER_TASK = 6
FAILED_SHARE = 0.03
CANCELLED_SHARE = 0.02
# Who cancelled the cancelled ones (steering_cancel's requested_by).
CANCELLED_BY = "user:seed"
# Milliseconds a step sleeps (the demo's simulated tool latency), one per task: tasks of different lengths.
SLEEP_MS_CHOICES = (0, 50, 100, 250, 500, 1000)
# The newest task is created this long before now, so even the slowest has finished by now.
NEWEST_TASK_AGE_SECONDS = 300.0


class SeedError(ValueError):
    """Options that cannot describe a seedable task; the message says which and what to use instead."""


@dataclass(frozen=True)
class SeedShape:
    steps: int  # plan length of every seeded task
    write_steps: bool  # also write their Step rows

    @property
    def events_per_task(self) -> int:
        """Events of a completed task (a failed one has fewer, a cancelled one four)."""
        return EVENTS_FIXED + EVENTS_PER_STEP * self.steps


def seed_shape(*, events_per_task: int | None, steps_per_task: int) -> SeedShape:
    """The tasks that ``--events-per-task`` / ``--steps-per-task`` describe, or SeedError saying why none.

    A demo_steps task of n steps writes 4 + n events, so the two options name the same number: give one, or both
    agreeing. ``steps_per_task`` 0 writes no Step rows (the events still describe the steps).
    """
    events_of = "(queued, working, a progress event per step, completed, terminal)"
    if steps_per_task < 0:
        raise SeedError(f"--steps-per-task must be 0 (no Step rows) or more, not {steps_per_task}.")
    if steps_per_task:
        steps = steps_per_task
        implied = EVENTS_FIXED + EVENTS_PER_STEP * steps
        if events_per_task is not None and events_per_task != implied:
            raise SeedError(f"a demo_steps task of {steps} steps writes {implied} events {events_of}, not "
                            f"{events_per_task}: leave --events-per-task out, or make it {implied}.")
    else:
        events = DEFAULT_EVENTS_PER_TASK if events_per_task is None else events_per_task
        if events < EVENTS_FIXED + EVENTS_PER_STEP:
            raise SeedError(f"--events-per-task {events} describes no demo_steps task: one of n steps writes 4 + n "
                            f"events {events_of}. Use {EVENTS_FIXED + EVENTS_PER_STEP} or more.")
        steps = (events - EVENTS_FIXED) // EVENTS_PER_STEP
    most = settings.RUNTIME.checkpoint.every_steps
    if steps > most:
        raise SeedError(
            f"tasks of {steps} steps would also have written checkpoints (every {most} steps), which this command "
            f"does not seed: use at most {most} steps ({EVENTS_FIXED + EVENTS_PER_STEP * most} events) per task."
        )
    return SeedShape(steps=steps, write_steps=bool(steps_per_task))


@dataclass
class SeedReport:
    tasks: int = 0
    events: int = 0
    steps: int = 0
    statuses: Counter = field(default_factory=Counter)
    seconds: float = 0.0


@dataclass(frozen=True)
class SeedProgress:
    done: int
    total: int
    seconds: float


def seed_options_check(*, count: int, batch: int, days: float, workers: int) -> None:
    """SeedError naming the first option out of range (before anything, the tenant included, is written)."""
    if count < 1:
        raise SeedError(f"--count must be at least 1, not {count}.")
    if batch < 1:
        raise SeedError(f"--batch must be at least 1, not {batch}.")
    if days <= 0:
        raise SeedError(f"--days must be more than 0, not {days:g}.")
    if workers < 1:
        raise SeedError(f"--workers must be at least 1, not {workers}.")


def tasks_seed(
    *,
    tenant: Tenant,
    count: int,
    shape: SeedShape,
    batch: int = 20_000,
    days: float = 30,
    workers: int = 2,
    seed: int | None = None,
    on_batch: Callable[[SeedProgress], None] | None = None,
) -> SeedReport:
    """Write ``count`` terminal demo_steps tasks of ``tenant`` (with their events, and Step rows if the shape
    says so), created over the last ``days`` in creation order, ``batch`` tasks per transaction on ``workers``
    connections at once; then ANALYZE the tables written. Only inserts: no stored row is read or changed. A
    failed batch rolls back alone and stops the seed; the batches committed before it stay.

    Called inside a transaction (a test, a caller's atomic block), everything is written in it, on this
    connection: another connection could not see its uncommitted rows (the tenant), and the caller expects the
    rows to commit or roll back with its own.
    """
    seed_options_check(count=count, batch=batch, days=days, workers=workers)
    started = time.monotonic()
    with connection.cursor() as cursor:
        cursor.execute("SELECT extract(epoch FROM now())::float8")  # the database's clock, as the engine's times
        now = cursor.fetchone()[0]
    _Rows(tenant_id=tenant.pk, shape=shape, rng=random.Random(seed)).self_check()
    job = _Job(tenant_id=tenant.pk, shape=shape, count=count, batch=batch, seed=seed, on_batch=on_batch,
               started=started, oldest=now - days * 86_400, newest=now - min(NEWEST_TASK_AGE_SECONDS, days * 43_200))
    if workers == 1 or connection.in_atomic_block or count <= batch:
        job.run()
    else:
        # The database does most of the work (index inserts, the deferred FK checks at commit): one backend per
        # worker keeps its cores busy while another worker renders its next batch.
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="seed") as pool:
            try:
                for done in [pool.submit(job.run_on_own_connection) for _ in range(workers)]:
                    done.result()
            except BaseException:  # Ctrl-C, or a worker's error: the others stop after their current batch
                job.failed = True
                raise
    tables = [Task, TaskEvent] + ([Step] if job.report.steps else [])
    with connection.cursor() as cursor:
        # Fresh statistics, or the planner plans the benchmarks' queries for the empty table it last saw.
        cursor.execute("ANALYZE " + ", ".join(connection.ops.quote_name(m._meta.db_table) for m in tables))
    job.report.seconds = time.monotonic() - started
    return job.report


@dataclass
class _Job:
    """The batches of one seed, taken in order by however many workers run them."""

    tenant_id: int
    shape: SeedShape
    count: int
    batch: int
    seed: int | None
    on_batch: Callable[[SeedProgress], None] | None
    started: float
    oldest: float
    newest: float
    report: SeedReport = field(default_factory=SeedReport)
    lock: threading.Lock = field(default_factory=threading.Lock)
    next_first: int = 0
    failed: bool = False

    def run_on_own_connection(self) -> None:
        try:
            self.run()
        finally:
            connection.close()  # this thread's own connection

    def run(self) -> None:
        try:
            while True:
                with self.lock:
                    first = self.next_first
                    if first >= self.count or self.failed:
                        return
                    self.next_first += self.batch
                self._write_batch(first, min(self.batch, self.count - first))
        except BaseException:
            self.failed = True  # the other workers stop after their current batch
            raise

    def _write_batch(self, first: int, size: int) -> None:
        # A batch's own random stream: the same --seed gives the same tasks whichever worker writes them.
        rng = random.Random(f"{self.seed}:{first}") if self.seed is not None else random.Random()
        rows = _Rows(tenant_id=self.tenant_id, shape=self.shape, rng=rng)
        text = _Text()
        statuses = Counter()
        span = (self.newest - self.oldest) / self.count
        for position in range(first, first + size):
            # In creation order across batches, as a live table fills (index correlation, page locality).
            statuses[rows.task(text, self.oldest + (position + rng.random()) * span)] += 1
        connection.ensure_connection()
        raw = connection.connection  # psycopg 3: COPY is not something Django's cursor wraps
        with transaction.atomic(), raw.cursor() as cursor:
            # Tasks before the rows that reference them: right whether or not those have a (deferred) FK.
            _copy(cursor, Task, rows.task_columns, text.tasks)
            _copy(cursor, TaskEvent, rows.event_columns, text.events)
            if text.steps:
                _copy(cursor, Step, rows.step_columns, text.steps)
            if text.commands:
                _copy(cursor, SteeringCommand, rows.command_columns, text.commands)
        with self.lock:
            report = self.report
            report.tasks += size
            report.events += len(text.events)
            report.steps += len(text.steps)
            report.statuses += statuses
            if self.on_batch:
                self.on_batch(SeedProgress(done=report.tasks, total=self.count,
                                           seconds=time.monotonic() - self.started))


# -------------------------------------------------------------------------------------------------------------
# Rendering rows as COPY text
# -------------------------------------------------------------------------------------------------------------
@dataclass
class _Text:
    """One batch's rows, one COPY text line each."""

    tasks: list[str] = field(default_factory=list)
    events: list[str] = field(default_factory=list)
    steps: list[str] = field(default_factory=list)
    commands: list[str] = field(default_factory=list)


def _copy(cursor, model, columns: list[str], lines: list[str]) -> None:
    names = ", ".join(connection.ops.quote_name(c) for c in columns)
    with cursor.copy(f"COPY {connection.ops.quote_name(model._meta.db_table)} ({names}) FROM STDIN") as copy:
        copy.write("".join(lines))


def _field(text: str) -> str:
    """A value as a field of COPY's text format."""
    return text.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n").replace("\r", "\\r")


def _json_field(value: Any) -> str:
    return _field(json.dumps(value, ensure_ascii=False))


def _constant_columns(model, written: tuple[str, ...], fixed: dict[str, Any]) -> tuple[list[str], str]:
    """The columns seeding does not vary per row, and their values as the tail of a COPY line: ``fixed`` ones,
    else the field's default (what a fresh row of the engine holds there). Whatever field the model gains is
    filled this way; one without a default stops the seed, naming it, before anything is written."""
    columns, values = [], []
    for f in model._meta.concrete_fields:
        if f.column in written or isinstance(f, AutoFieldMixin):
            continue
        if f.column in fixed:
            value = fixed[f.column]
        elif f.has_default():
            value = f.get_default()
        elif f.db_default is not NOT_PROVIDED:
            continue  # the database fills it
        elif f.null:
            value = None
        else:
            raise SeedError(f"{model.__name__}.{f.name} has no default, so seeding does not know what a finished "
                            f"task holds there: add it to bench/seeding.py.")
        columns.append(f.column)
        if value is None:
            values.append("\\N")
        elif isinstance(f, JSONField):
            values.append(_json_field(value))
        elif isinstance(value, bool):
            values.append("t" if value else "f")
        else:
            values.append(_field(str(value)))
    return columns, "".join("\t" + v for v in values) + "\n"


@dataclass(frozen=True)
class _Event:
    """An event's type and data, rendered once: the data's canonical JSON (what its hash is taken over) and its
    COPY field."""

    type: str
    canon: str
    copy: str

    @classmethod
    def of(cls, event: tuple[str, dict]) -> _Event:
        type_, data = event
        canon = canonical_json(data)
        return cls(type_, canon, _field(canon))


class _Stamps:
    """Epoch seconds → timestamptz text, without a datetime per value: a task's events fall within a few
    seconds, so the text of the last second is kept, and the date part is cached per day."""

    def __init__(self):
        self.days: dict[int, str] = {}
        self.second, self.second_text = -1, ""

    def __call__(self, t: float) -> str:
        second, micro = divmod(int(t * 1_000_000), 1_000_000)
        if second != self.second:
            day, of_day = divmod(second, 86_400)
            text = self.days.get(day)
            if text is None:
                text = self.days[day] = (date(1970, 1, 1) + timedelta(days=day)).isoformat()
            hour, rest = divmod(of_day, 3600)
            self.second, self.second_text = second, f"{text} {hour:02d}:{rest // 60:02d}:{rest % 60:02d}."
        return f"{self.second_text}{micro:06d}+00"


class _Rows:
    """Builds seeded tasks as COPY text: a task's row, its events with their hash chain, its Step rows."""

    # Per-row columns, in the order the f-strings below write them; every other column is a constant.
    task_written = ("id", "status", "status_message", "progress", "plan_length", "next_step_index", "steps_completed",
                    "lease_epoch", "hint_at", "input", "request_fingerprint", "result", "error", "event_seq",
                    "event_head_hash", "created_at", "updated_at", "completed_at", "state_version", "steering_cursor")
    event_written = ("task_id", "seq", "type", "data", "at", "prev_hash", "hash")
    step_written = ("task_id", "seq", "step_index", "name", "status", "attempt", "lease_epoch", "state_delta",
                    "delta_sha256", "output", "started_at", "finished_at")
    command_written = ("id", "task_id", "type", "payload", "expected_version", "old_version", "new_version",
                       "requested_by", "reason", "created_at")

    def __init__(self, *, tenant_id: int, shape: SeedShape, rng: random.Random):
        self.shape = shape
        self.rng = rng
        self.stamp = _Stamps()
        cfg = settings.RUNTIME
        self.slice_seconds = cfg.slice_seconds
        self.attempts = cfg.step_retry.max_attempts  # demo_steps' tick keeps the default
        self.retry_seconds = sum(min(cfg.step_retry.backoff_max_seconds, cfg.step_retry.backoff_seconds * 2 ** a)
                                 for a in range(self.attempts - 1))
        fixed = {"tenant_id": tenant_id, "workflow_name": WORKFLOW,
                 "workflow_version": registry.get(WORKFLOW).version}
        task_const, self.task_tail = _constant_columns(Task, self.task_written, fixed)
        event_const, self.event_tail = _constant_columns(TaskEvent, self.event_written, {})
        step_const, self.step_tail = _constant_columns(Step, self.step_written, {})
        command_const, self.command_tail = _constant_columns(SteeringCommand, self.command_written, {})
        self.task_columns = [*self.task_written, *task_const]
        self.event_columns = [*self.event_written, *event_const]
        self.step_columns = [*self.step_written, *step_const]
        self.command_columns = [*self.command_written, *command_const]

        # The same events every writer builds (tasks_app.events), rendered once.
        self.queued = _Event.of(status_event(TaskStatus.QUEUED, "Queued: waiting for a worker"))  # task_create
        self.working = _Event.of(*transition_events(TaskStatus.WORKING, "Working"))  # the engine's first claim
        self.completed = [_Event.of(e) for e in transition_events(TaskStatus.COMPLETED, "Completed")]
        # steering_cancel of a queued task, without a reason: applied at its submission (its steering.applied
        # event names the command, so it is rendered per task)
        self.cancelled = [_Event.of(e) for e in
                          transition_events(TaskStatus.CANCELLED, "Cancelled", reason=reason_shown(""))]

        n = shape.steps
        # Per step s (1-based): demo_steps' delta ({"set": {"count": s}} plus its one effect), its checksum, the
        # step's output, and the progress event binding the checksum into the chain and naming the effect.
        self.deltas = [canonical_json_strict({"set": {"count": s}, "effects": 1}) for s in range(1, n + 1)]
        self.delta_shas = [delta_sha256(d) for d in self.deltas]
        self.delta_copies = [_field(d) for d in self.deltas]
        self.outputs = [_field(canonical_json_strict({"count": s})) for s in range(1, n + 1)]
        # One progress event per step, as the engine writes for steps slower than progress_event_seconds.
        self.progress = [_Event.of(progress_event(progress=s / n, phase=None, step=STEP_NAME, steps_completed=s,
                                                  delta_sha256s=[self.delta_shas[s - 1]],
                                                  effects=[f"{s}:{EFFECT_NAME}"]))
                         for s in range(1, n + 1)]
        self.result = _json_field({"steps": n})  # demo_steps' result(): its count
        self.inputs: dict[tuple, tuple[str, str]] = {}
        self.failures: dict[int, tuple] = {}

    # -- per distinct value, once --------------------------------------------------------------------------------
    def _input(self, sleep_ms: int, fail_step: int | None = None) -> tuple[str, str]:
        """An input's COPY field and the fingerprint task_create stores for it."""
        found = self.inputs.get((sleep_ms, fail_step))
        if found is None:
            data = {"steps": self.shape.steps}
            if sleep_ms:
                data["sleep_ms"] = sleep_ms
            if fail_step is not None:
                data["fail_step"] = fail_step
            fingerprint = task_request_fingerprint(workflow=WORKFLOW, input=data)
            found = self.inputs[(sleep_ms, fail_step)] = (_json_field(data), fingerprint)
        return found

    def _failure(self, index: int) -> tuple:
        """What the engine records when step ``index`` raised on every attempt (demo_steps' fail_step)."""
        found = self.failures.get(index)
        if found is None:
            attempts = [{"attempt": a, "type": "RuntimeError", "message": f"demo failure at step {index}, attempt {a}",
                         "duration_ms": 0,
                         "traceback": '  File "tasks_app/examples/demo_steps.py", line 87, in tick\n'
                                      '    raise RuntimeError(f"demo failure at step {ctx.step_index}, attempt '
                                      '{ctx.attempt}")\n'
                                      f"RuntimeError: demo failure at step {index}, attempt {a}\n"}
                        for a in range(1, self.attempts + 1)]
            error = {"type": "RuntimeError", "message": attempts[-1]["message"], "step": STEP_NAME,
                     "stepIndex": index, "attempt": self.attempts, "attempts": attempts}
            public = {k: v for k, v in error.items() if k != "attempts"}
            message = f"Failed: {error['type']}: {error['message']}"[:500]
            events = [_Event.of(e) for e in transition_events(TaskStatus.FAILED, message, error=public)]
            found = self.failures[index] = (_field(message), _json_field(error), _json_field(public), events)
        return found

    # -- one task ------------------------------------------------------------------------------------------------
    def task(self, out: _Text, created: float) -> str:
        """Append one task's rows to ``out``; return its status."""
        roll = self.rng.random()
        if roll < CANCELLED_SHARE:
            return self._cancelled(out, created)
        if roll < CANCELLED_SHARE + FAILED_SHARE:
            return self._ran(out, created, fail_at=self.rng.randrange(self.shape.steps))
        return self._ran(out, created, fail_at=None)

    def _ran(self, out: _Text, created: float, *, fail_at: int | None) -> str:
        """A task a worker ran: completed, or failed at step ``fail_at`` (0-based) after its retries."""
        rng, stamp, n = self.rng, self.stamp, self.shape.steps
        task_id = str(uuid7(unix_ms=int(created * 1000)))  # as task_create's ids, by creation
        sleep_ms = rng.choice(SLEEP_MS_CHOICES)
        created_at = stamp(created)
        chain = _Chain(task_id, out.events)
        chain.add(self.queued, stamp(created + 0.0005 + rng.random() * 0.002))
        t = created + 0.005 + rng.random() ** 2 * 3  # waiting for a worker
        chain.add(self.working, stamp(t))
        epoch, slice_start = 1, t
        ran = n if fail_at is None else fail_at
        for s in range(1, ran + 1):
            begun = t + 0.001 + rng.random() * 0.003
            t = begun + sleep_ms / 1000 + 0.002 + rng.random() * 0.004
            at = stamp(t)
            chain.add(self.progress[s - 1], at)
            if self.shape.write_steps:
                out.steps.append(f"{task_id}\t{s}\t{s - 1}\t{STEP_NAME}\tcommitted\t1\t{epoch}\t"
                                 f"{self.delta_copies[s - 1]}\t{self.delta_shas[s - 1]}\t{self.outputs[s - 1]}\t"
                                 f"{stamp(begun)}\t{at}{self.step_tail}")
            if t - slice_start >= self.slice_seconds and s < n:
                # The slice is over: the lease goes back with the commit, the next claim takes a new epoch.
                t += 0.002 + rng.random() * 0.01
                epoch, slice_start = epoch + 1, t
        if fail_at is None:
            t += 0.001 + rng.random() * 0.003
            ended = stamp(t)
            chain.add(self.completed[0], ended)
            chain.add(self.completed[1], ended)
            input_text, fingerprint = self._input(sleep_ms)
            out.tasks.append(f"{task_id}\tcompleted\tCompleted\t1\t{n}\t{n}\t{n}\t{epoch}\t\\N\t{input_text}\t"
                             f"{fingerprint}\t{self.result}\t\\N\t{chain.seq}\t{chain.head}\t{created_at}\t{ended}\t"
                             f"{ended}\t1\t0{self.task_tail}")
            return TaskStatus.COMPLETED.value
        message, error, public, events = self._failure(fail_at)
        t += 0.003 + sleep_ms / 1000 * self.attempts + self.retry_seconds  # every attempt raised; backoff between
        ended = stamp(t)
        chain.add(events[0], ended)
        chain.add(events[1], ended)
        if self.shape.write_steps:
            out.steps.append(f"{task_id}\t{fail_at + 1}\t{fail_at}\t{STEP_NAME}\tfailed\t{self.attempts}\t{epoch}\t"
                             f"{{}}\t\t{public}\t\\N\t{ended}{self.step_tail}")
        input_text, fingerprint = self._input(sleep_ms, fail_at)
        # The plan is stored with the first commit: a task that failed at its first step has none.
        plan_length = n if fail_at else "\\N"
        progress = repr(fail_at / n) if fail_at else "0"
        out.tasks.append(f"{task_id}\tfailed\t{message}\t{progress}\t{plan_length}\t{fail_at}\t{fail_at}\t{epoch}\t"
                         f"\\N\t{input_text}\t{fingerprint}\t\\N\t{error}\t{chain.seq}\t{chain.head}\t{created_at}\t"
                         f"{ended}\t{ended}\t1\t0{self.task_tail}")
        return TaskStatus.FAILED.value

    def _cancelled(self, out: _Text, created: float) -> str:
        """Cancelled while queued: no worker ever claimed it (lease epoch 0, no plan). steering_cancel applies the
        command at its submission (version 1 → 2, the cursor past it) and clears the pending hint."""
        rng, stamp = self.rng, self.stamp
        task_id = str(uuid7(unix_ms=int(created * 1000)))  # as task_create's ids, by creation
        created_at = stamp(created)
        chain = _Chain(task_id, out.events)
        chain.add(self.queued, stamp(created + 0.0005 + rng.random() * 0.002))
        ended_at = created + 0.5 + rng.random() * 120
        ended = stamp(ended_at)
        command = SteeringCommand(id=uuid7(unix_ms=int(ended_at * 1000)), task_id=task_id, type=CommandType.CANCEL,
                                  payload={}, expected_version=None, old_version=1, new_version=2,
                                  requested_by=CANCELLED_BY, reason="")
        chain.add(_Event.of(applied_event(command)), ended)
        chain.add(self.cancelled[0], ended)
        chain.add(self.cancelled[1], ended)
        out.commands.append(f"{command.id}\t{task_id}\t{command.type}\t{{}}\t\\N\t1\t2\t{_field(CANCELLED_BY)}\t\t"
                            f"{ended}{self.command_tail}")
        input_text, fingerprint = self._input(rng.choice(SLEEP_MS_CHOICES))
        out.tasks.append(f"{task_id}\tcancelled\tCancelled\t0\t\\N\t0\t0\t0\t\\N\t{input_text}\t"
                         f"{fingerprint}\t\\N\t\\N\t{chain.seq}\t{chain.head}\t{created_at}\t{ended}\t"
                         f"{ended}\t2\t2{self.task_tail}")
        return TaskStatus.CANCELLED.value

    # -- the rendering, checked as verify_events would -----------------------------------------------------------
    def self_check(self) -> None:
        """Seed one task of each kind in memory and recompute every event hash with tasks_app.events.event_hash
        from the data as COPY will store it, as verify_events does: if the COPY text no longer decodes to the data
        that was hashed, or a chain link or a task's event_head_hash is wrong, stop before writing."""
        out = _Text()
        self._ran(out, 0.0, fail_at=None)
        self._cancelled(out, 0.0)
        for fail_at in {0, self.shape.steps - 1}:
            self._ran(out, 0.0, fail_at=fail_at)
        heads = {}
        for line in out.events:
            task_id, seq, type_, data, _at, prev, digest = line.rstrip("\n").split("\t")[:7]
            expected = event_hash(prev_hash=prev, seq=int(seq), type=type_, data=json.loads(_unfield(data)))
            if digest != expected or prev != heads.get(task_id, ""):
                raise RuntimeError(f"seeding renders event {seq} ({type_}) with hash {digest}, but "
                                     f"tasks_app.events.event_hash gives {expected}: update bench/seeding.py")
            heads[task_id] = digest
        for line in out.tasks:
            values = dict(zip(self.task_columns, line.rstrip("\n").split("\t")))
            if values["event_head_hash"] != heads[values["id"]]:
                raise RuntimeError(f"a seeded {values['status']} task's event_head_hash is not its last event's")


class _Chain:
    """A task's events with their hash chain, appended as COPY lines."""

    __slots__ = ("task_id", "lines", "seq", "head")

    def __init__(self, task_id: str, lines: list[str]):
        self.task_id, self.lines, self.seq, self.head = task_id, lines, 0, ""

    def add(self, event: _Event, at: str) -> None:
        self.seq += 1
        digest = event_hash_of_canonical(prev_hash=self.head, seq=self.seq, type=event.type, data_json=event.canon)
        self.lines.append(f"{self.task_id}\t{self.seq}\t{event.type}\t{event.copy}\t{at}\t{self.head}\t{digest}\n")
        self.head = digest


def _unfield(text: str) -> str:
    """COPY text field → value (the inverse of _field, for the self-check)."""
    out, i = [], 0
    escapes = {"\\": "\\", "t": "\t", "n": "\n", "r": "\r"}
    while i < len(text):
        if text[i] == "\\":
            out.append(escapes[text[i + 1]])
            i += 2
        else:
            out.append(text[i])
            i += 1
    return "".join(out)
