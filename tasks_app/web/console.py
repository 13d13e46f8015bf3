"""Reads for the operators' console (the admin's task page, overview and dead-letter pages): plain ORM queries,
each saying which part of a page it serves and what it costs. No writes: the pages act through the services
(tasks_app.engine.reaper, steering_app.services).

What people see passes through tasks_app.redaction here, once, so no template has to remember it: JSON through
redact_json, text through redact.

Every read that lists or counts tasks takes the actor it is for (``actor``, tasks_app.access.Actor) and reads only
what the one access rule lets it see (access.visible): a tenant's members their tenant's tasks, staff of no tenant
every tenant's. None of them has a default: the overview, the dead letters and the recent recoveries once read every
tenant's tasks for a tenant's viewer (issue 37). /metrics, the deployment's own, asks as access.SYSTEM.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import connection
from django.db.models import Count, OuterRef, QuerySet, Subquery
from django.db.models.fields.json import KT
from django.db.models.functions import Now

from checkpoints_app.models import Checkpoint, SideEffect
from tasks_app import access
from tasks_app.audit.actors import actor_shown
from tasks_app.db.dispatch import hint_queue_depth
from tasks_app.engine import dead_letters
from tasks_app.engine.checks import REAPER_NAME
from tasks_app.models import (
    KILLED_PREFIX,
    TERMINAL_STATUSES,
    TOOL_EVENT_TYPES,
    Step,
    Task,
    TaskEvent,
    TaskStatus,
    ThroughputSample,
)
from tasks_app.observability import metrics
from tasks_app.redaction import redact, redact_json

# How much of a task's history its page shows; the history pages (admin …/history/<kind>/) page through the rest.
TAIL_EVENTS = 30
TAIL_STEPS = 20
TAIL_CHECKPOINTS = 10
TAIL_EFFECTS = 20
# The overview's chart: steps per second in one-minute buckets over this many minutes.
THROUGHPUT_MINUTES = 15
RECENT_RECOVERIES = 20


# -- a task's status, as the console writes it -----------------------------------------------------------------------
def status_shown(*, status: str, message: str = "", wait: dict | None = None) -> dict[str, str]:
    """The status with what kind of it a person needs to tell apart: a cancel that was a kill (who and why are in
    the message), an input wait from an approval wait. `css` colours the badge (static/console/console.css)."""
    detail = ""
    if status == TaskStatus.CANCELLED and (message or "").startswith(KILLED_PREFIX):
        detail = "killed"
    elif status in (TaskStatus.INPUT_REQUIRED, TaskStatus.PAUSED) and wait and wait.get("kind"):
        detail = wait["kind"] if wait["kind"] in ("approval", "budget") else "input"
        if status == TaskStatus.PAUSED:
            detail = f"in its {detail} wait"
    label = f"{status} ({detail})" if detail else str(status)
    return {"status": str(status), "detail": detail, "label": label, "css": f"console-status-{status}",
            "finished": status in TERMINAL_STATUSES}


def with_status_since(tasks: QuerySet) -> QuerySet:
    """Each task with `status_since`: when it entered its status, from its newest status event (the partial index
    taskevent_status_idx, read backwards: one entry a task). None for a task with none (never, in practice: a task
    is created with its `queued` event)."""
    newest = TaskEvent.objects.filter(task_id=OuterRef("pk"), type="status").order_by("-seq").values("at")[:1]
    # read_at: the database's now, as the ages are measured (one clock: a web host's may be off).
    return tasks.annotate(status_since=Subquery(newest), read_at=Now())


# -- the task page ------------------------------------------------------------------------------------------------
def task_event_tail(*, task: Task, limit: int = TAIL_EVENTS) -> list[dict[str, Any]]:
    """Serves the task page's event tail: its newest events, newest first, with their data redacted.

    A range on the primary key (task, seq) from the task's head (event_seq), so a task with 100,000 events
    reads `limit` rows."""
    rows = (TaskEvent.objects.filter(task_id=task.id, seq__gt=task.event_seq - limit)
            .order_by("-seq").values("seq", "type", "data", "at"))
    return [{**row, "summary": event_summary(row["type"], row["data"]), "data": redact_json(row["data"])}
            for row in rows]


def event_summary(event_type: str, data: dict) -> str:
    """One line per event for people: what happened, with who did it where a person did (the page's JS writes the
    same line for events that arrive live: static/console/task.js summary(); tests/test_console.py holds both to
    the same wording)."""
    data = data or {}
    if event_type == "status":
        text = f"{data.get('status', '')}: {data.get('message', '')}"
    elif event_type == "progress":
        text = f"{percent_text(data.get('progress'))} — step {data.get('stepsCompleted', '')} " \
               f"{data.get('step', '')}" + (f" ({data['phase']})" if data.get("phase") else "")
        if data.get("effects"):
            text += "; effects " + ", ".join(str(effect) for effect in data["effects"])
    elif event_type == "log":
        text = f"step {data.get('step', '')}: {data.get('message', '')}"
    elif event_type == "artifact":
        text = f"{data.get('name', '')} ({data.get('bytes', '')} bytes)"
    elif event_type == "checkpoint":
        text = f"checkpoint {data.get('sequence', '')} ({data.get('bytes', '')} bytes)"
    elif event_type == "effect":
        text = f"effect {data.get('name', '')}: {data.get('status', '')} (key {data.get('key', '')})"
    elif event_type in ("steering.applied", "steering.rejected"):
        # The actor as every page names it (tasks_app.audit.actors.actor_shown: "token:art_1a2b3c4d", not the
        # redaction's "token=[redacted]"); the reason is a person's text and is redacted.
        verb = "applied" if event_type == "steering.applied" else "rejected"
        who = actor_shown(data["requestedBy"]) if data.get("requestedBy") else "an unnamed caller"
        text = f"{data.get('type', '')} by {who} {verb}"
        if data.get("version") is not None and event_type == "steering.applied":
            text += f" (version {data['version']})"
        why = data.get("why") or data.get("reason")
        return f"{text}: {redact(str(why))}" if why else text
    elif event_type == "plan.adjusted":
        text = f"plan {data.get('oldPlanVersion', '')} → {data.get('newPlanVersion', '')} from step " \
               f"{data.get('fromStep', '')}: was {plan_text(data.get('oldPlan'))}; now {plan_text(data.get('newPlan'))}"
    elif event_type == "task.forked":
        text = f"forked from {data.get('from', '')} at step {data.get('fromStep', '')}: " \
               f"{(data.get('inherited') or {}).get('steps', '')} steps inherited, " \
               f"{data.get('repeatsCount', '')} effects may run again after approval"
    elif event_type == "task.snapshot":
        text = f"recovered: resumes after step {data.get('stepsCompleted', '')}" + \
               (f", from checkpoint {data['checkpoint']}" if data.get("checkpoint") is not None else "")
    elif event_type == "tool.call":
        text = f"call {data.get('tool', '')} (key {data.get('key', '')})"
    elif event_type == "tool.result":
        text = f"{data.get('tool', '')}: {data.get('outcome', '')}" + \
               (f" in {data['ms']} ms" if data.get("ms") is not None else "")
    elif event_type == "tool.denied":
        text = f"{data.get('tool', '')} denied by {data.get('rule', '')}"
    elif event_type == "tool.flagged":
        text = f"{data.get('tool', '')} result flagged ({', '.join(map(str, data.get('rules') or []))}): " \
               f"{data.get('action', '')}"
    elif event_type == "llm.message":
        calls = data.get("toolCalls") or []
        text = f"turn {data.get('turn', '')} ({data.get('model', '')}): " + \
               (f"calls {', '.join(map(str, calls))}" if calls else "answered") + \
               f" — {data.get('tokensIn', '')} tokens in, {data.get('tokensOut', '')} out, cost {data.get('cost', '')}"
    elif event_type == "terminal":
        text = str(data.get("status", ""))
    elif event_type == "input_required":
        text = f"{data.get('kind', '')} {data.get('name', '')}: {data.get('prompt', '')}"
    else:
        text = ""
    return redact(text)


def percent_of(progress) -> int:
    """0.625 → 63: halves round up, as JavaScript's Math.round does (Python's round() would say 62, and a live line
    would then differ from the same line rendered at load)."""
    return math.floor(100 * float(progress or 0) + 0.5)


def percent_text(progress) -> str:
    try:
        return f"{percent_of(progress)}%"
    except (TypeError, ValueError):
        return ""


def plan_text(runs) -> str:
    """A run-length plan ([[name, count], …], as plan.adjusted carries it) for people: 'fetch ×3, summarise'."""
    if not runs:
        return "nothing"
    parts = []
    for run in runs:
        name, count = (run[0], run[1]) if isinstance(run, (list, tuple)) and len(run) == 2 else (run, 1)
        parts.append(f"{name} ×{count}" if count != 1 else str(name))
    return ", ".join(parts)


def task_recent_steps(*, task: Task, limit: int = TAIL_STEPS) -> list[dict[str, Any]]:
    """Serves the task page's steps table: the newest steps (a backward scan of the primary key (task, seq)), each
    with how long it took."""
    rows = list(Step.objects.filter(task_id=task.id).order_by("-seq")
                .values("seq", "name", "status", "attempt", "plan_version", "started_at", "finished_at")[:limit])
    for row in rows:
        started, finished = row["started_at"], row["finished_at"]
        row["seconds"] = (finished - started).total_seconds() if started and finished else None
        row["duration"] = duration_text(row["seconds"])
    return rows


def duration_text(seconds: float | None) -> str:
    """A step's duration for people: '0.004 s', '1.25 s', '3 min 4 s'."""
    if seconds is None:
        return ""
    if seconds < 1:
        return f"{seconds:.3f} s"
    if seconds < 60:
        return f"{seconds:.2f} s"
    minutes, rest = divmod(int(seconds), 60)
    return f"{minutes} min {rest} s" if minutes < 60 else f"{minutes // 60} h {minutes % 60} min"


TIMELINE_WIDTH = 100.0  # percent of the row


def step_timeline(steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The task page's timeline of its newest steps, oldest first: each step a bar placed at its start and as long
    as it took, on one time axis from the first start to the last finish (CSS percentages; no script, no library).
    A step too short to see still gets a sliver, so a thousand quick steps do not vanish."""
    timed = [step for step in reversed(steps) if step["started_at"] and step["finished_at"]]
    if not timed:
        return []
    first = min(step["started_at"] for step in timed)
    span = max((max(step["finished_at"] for step in timed) - first).total_seconds(), 1e-6)
    bars = []
    for step in timed:
        left = TIMELINE_WIDTH * (step["started_at"] - first).total_seconds() / span
        width = max(TIMELINE_WIDTH * step["seconds"] / span, 0.4)
        bars.append({"seq": step["seq"], "name": step["name"], "status": step["status"],
                     "duration": step["duration"], "left": round(min(left, TIMELINE_WIDTH - 0.4), 2),
                     "width": round(min(width, TIMELINE_WIDTH - min(left, TIMELINE_WIDTH - 0.4)), 2)})
    return bars


TAIL_TOOL_CALLS = 20


def task_tool_calls(*, task: Task, limit: int = TAIL_TOOL_CALLS) -> list[dict[str, Any]]:
    """Serves the task page's tool calls: the newest downstream calls (tool.call / tool.result / tool.denied /
    tool.flagged events, through the partial index taskevent_tool_idx), each with its server and tool, arguments
    (redacted), outcome, duration, and the ledger row's status and attempts (one query on the ledger's keys)."""
    rows = list(TaskEvent.objects.filter(task_id=task.id, type__in=TOOL_EVENT_TYPES).order_by("-seq")
                .values("seq", "type", "data", "at")[:limit * 3])
    calls: dict[str, dict[str, Any]] = {}
    denied = []
    for row in reversed(rows):
        data = row["data"] or {}
        if row["type"] == "tool.denied":
            denied.append({"tool": data.get("tool", ""), "key": "", "arguments": "", "outcome": "denied",
                           "detail": redact(str(data.get("rule", ""))), "ms": None, "at": row["at"],
                           "status": "", "attempts": ""})
            continue
        call = calls.setdefault(data.get("key", f"seq-{row['seq']}"), {
            "tool": data.get("tool", ""), "key": data.get("key", ""), "arguments": "", "outcome": "", "detail": "",
            "ms": None, "at": row["at"], "status": "", "attempts": ""})
        if row["type"] == "tool.call":
            call["arguments"] = pretty_json(data.get("arguments"))
        elif row["type"] == "tool.result":
            call["outcome"], call["ms"] = data.get("outcome", ""), data.get("ms")
        elif row["type"] == "tool.flagged":
            call["detail"] = f"flagged ({', '.join(map(str, data.get('rules') or []))}): {data.get('action', '')}"
    ledger = {row["key"]: row for row in SideEffect.objects.filter(task_id=task.id, key__in=list(calls))
              .values("key", "status", "attempts")}
    for key, call in calls.items():
        if key in ledger:
            call["status"], call["attempts"] = ledger[key]["status"], ledger[key]["attempts"]
    return sorted([*calls.values(), *denied], key=lambda call: call["at"], reverse=True)[:limit]


def task_recent_checkpoints(*, task: Task, limit: int = TAIL_CHECKPOINTS) -> list[dict[str, Any]]:
    """Serves the task page's checkpoints table: the newest ones, by the unique (task, sequence) index. Never the
    payload: it is the task's whole business state."""
    return list(Checkpoint.objects.filter(task_id=task.id).order_by("-sequence")
                .values("id", "sequence", "size_bytes", "quarantined", "created_at")[:limit])


def task_recent_effects(*, task: Task, limit: int = TAIL_EFFECTS) -> list[dict[str, Any]]:
    """Serves the task page's ledger: the newest effects with their results and errors redacted (a result is
    what a remote system answered, and may hold anything)."""
    rows = (SideEffect.objects.filter(task_id=task.id).order_by("-step_seq", "key")
            .values("step_seq", "name", "key", "status", "attempts", "result", "error", "started_at",
                    "finished_at")[:limit])
    return [{**row, "result": redact_json(row["result"]), "error": redact_json(row["error"]),
             "shown": pretty_json(row["error"] if row["error"] is not None else row["result"]),
             "preview": json_summary(row["error"] if row["error"] is not None else row["result"])} for row in rows]


def json_summary(value: Any, *, limit: int = 80) -> str:
    """A folded JSON value's one-line preview (redacted): the start of its compact text."""
    text = json.dumps(redact_json(value), sort_keys=True, ensure_ascii=False, default=str)
    return text if len(text) <= limit else text[:limit - 1] + "…"


def pretty_json(value: Any) -> str:
    """A JSON value for people: redacted, then indented (the template escapes it like any text). "" for None."""
    if value is None:
        return ""
    return json.dumps(redact_json(value), indent=2, sort_keys=True, ensure_ascii=False, default=str)


def task_budget_rows(task: Task) -> list[dict[str, Any]]:
    """What the task used against each of its budgets, for the task page's budget wait and the budget page."""
    def row(name: str, used, limit, shown) -> dict[str, Any]:
        return {"name": name, "used": shown(used), "limit": None if limit is None else shown(limit),
                "spent": limit is not None and used >= limit}

    return [row("steps", task.steps_completed, task.budget_steps, "{:,}".format),
            row("cost", task.cost_spent, task.budget_cost, "{:,.4f}".format),
            row("tokens", task.tokens_spent, task.budget_tokens, "{:,}".format)]


def task_open_wait(*, task: Task) -> dict[str, Any] | None:
    """Serves the task page's open wait: what the task waits for, as the snapshot shows it (only while it waits,
    or is paused in it), with the prompt and an approval's arguments redacted."""
    if not task.wait or task.status not in (TaskStatus.INPUT_REQUIRED, TaskStatus.PAUSED):
        return None
    wait = task.wait
    effect = wait.get("effect") or {}
    return {"kind": wait.get("kind", ""), "name": wait.get("name", ""), "step": wait.get("step"),
            "prompt": redact(str(wait.get("prompt", ""))),
            # A budget wait: what the task used against each budget, from the row (a raise that was not enough
            # updates them there as well as in the wait).
            "budget": task_budget_rows(task) if wait.get("kind") == "budget" else None,
            "effect": {"name": effect.get("name", ""), "key": effect.get("key", ""),
                       "arguments": pretty_json(effect.get("arguments"))} if effect else None}


# -- the overview (and /metrics: the same numbers, from these functions) -------------------------------------------
UNFINISHED_STATUSES = sorted(set(TaskStatus.values) - set(TERMINAL_STATUSES))


def task_counts_unfinished(*, actor: access.Actor) -> dict[str, int]:
    """Serves the overview's unfinished rows of "tasks per status" and /metrics' agent_runtime_tasks: each status a
    task can still leave, zero included.

    One GROUP BY over the partial index task_unfinished_status_idx (an index-only scan of the unfinished tasks; its
    condition is this filter, word for word): the finished ones, however many, are never read. Cheap enough to
    scrape every few seconds. For a tenant's actor the same scan with the tenant's rows only (a filter on each
    entry's row)."""
    counts = dict(access.visible(actor, Task.objects.filter(status__in=UNFINISHED_STATUSES)).order_by()
                  .values_list("status").annotate(n=Count("*")))
    return {status: counts.get(status, 0) for status in TaskStatus.values if status in UNFINISHED_STATUSES}


def task_counts_by_status(*, actor: access.Actor) -> dict[str, int]:
    """Serves the overview's "tasks per status": every status, zero included, in the state machine's order.

    The unfinished ones from task_counts_unfinished; the finished ones by one GROUP BY over the task table's
    finished rows (a scan of them all). Fine for a page an operator opens; not something to poll."""
    finished = dict(access.visible(actor, Task.objects.filter(status__in=sorted(TERMINAL_STATUSES))).order_by()
                    .values_list("status").annotate(n=Count("*")))
    counts = {**finished, **task_counts_unfinished(actor=actor)}
    return {status: counts.get(status, 0) for status in TaskStatus.values}


@dataclass(frozen=True)
class OpenWaits:
    by_kind: dict[str, int]  # input, approval, budget
    oldest_seconds: float | None  # how long the longest-waiting task has waited (None: none waits)

    @property
    def total(self) -> int:
        return sum(self.by_kind.values())


def waits_open(*, actor: access.Actor) -> OpenWaits:
    """Serves the overview's "waiting for a person" and /metrics' agent_runtime_waits_open and
    agent_runtime_wait_oldest_age_seconds: the input_required tasks (through task_unfinished_status_idx), each
    with when it entered that status (with_status_since: one entry of taskevent_status_idx a task), measured by the
    database's clock."""
    rows = with_status_since(access.visible(actor, Task.objects.filter(status=TaskStatus.INPUT_REQUIRED))).annotate(
        kind=KT("wait__kind")).values_list("kind", "status_since", "read_at")
    by_kind: dict[str, int] = {"input": 0, "approval": 0, "budget": 0}
    oldest = None
    for kind, since, read_at in rows:
        by_kind[kind or "input"] = by_kind.get(kind or "input", 0) + 1
        if since is not None:
            waited = (read_at - since).total_seconds()
            oldest = waited if oldest is None else max(oldest, waited)
    return OpenWaits(by_kind=by_kind, oldest_seconds=oldest)


def runtime_state() -> metrics.RuntimeState:
    """What /metrics reads on each scrape (tasks_app.observability.metrics.StateCollector), from the functions the
    overview shows: three index-backed statements and one Redis pipeline; nothing on the step path. The
    deployment's own figures: every tenant's (access.SYSTEM)."""
    waits = waits_open(actor=access.SYSTEM)
    return metrics.RuntimeState(tasks_by_status=task_counts_unfinished(actor=access.SYSTEM),
                                waits_open=waits.by_kind,
                                oldest_wait_seconds=waits.oldest_seconds, hint_queue_depth=hint_queue_depth())


@dataclass(frozen=True)
class Throughput:
    minutes: list[datetime]  # the start of each one-minute bucket, oldest first (the database's clock)
    steps: list[int]  # steps committed (or failed) in that minute

    @property
    def per_second(self) -> list[float]:
        return [count / 60 for count in self.steps]


def steps_throughput(*, minutes: int = THROUGHPUT_MINUTES) -> Throughput:
    """Serves the overview's chart: steps finished per minute over the last ``minutes``, the current (partial)
    minute last, from the reaper's samples of the step table's insert counter (ThroughputSample; one per sweep).
    The steps between two samples count in the minute of the later one; a counter that went back (statistics
    reset) counts nothing. No sweep, no samples: zeros, and the page says the reaper is not running."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT date_trunc('minute', now())")  # the database's clock, as the samples were written
        this_minute = cursor.fetchone()[0]
    first = this_minute - timedelta(minutes=minutes - 1)
    samples = list(ThroughputSample.objects.filter(at__gte=first - timedelta(minutes=1)).order_by("at", "id")
                   .values_list("at", "steps_inserted"))
    counted: dict[datetime, int] = {}
    for (_, before), (at, after) in zip(samples, samples[1:], strict=False):
        minute = at.replace(second=0, microsecond=0)
        counted[minute] = counted.get(minute, 0) + max(after - before, 0)
    buckets = [first + timedelta(minutes=n) for n in range(minutes)]
    return Throughput(minutes=buckets, steps=[counted.get(bucket, 0) for bucket in buckets])


def recent_recoveries(*, actor: access.Actor, limit: int = RECENT_RECOVERIES) -> list[dict[str, Any]]:
    """Serves the overview's "recent recoveries": tasks that lost a worker at least once, most recently changed
    first, with how often (a scan of the task table with a top-N sort)."""
    return [{**row, "status_message": redact(row["status_message"]),
             "shown": status_shown(status=row["status"], message=row["status_message"], wait=row.pop("wait"))}
            for row in access.visible(actor, Task.objects.filter(recoveries__gt=0)).order_by("-updated_at")
            .values("id", "workflow_name", "status", "status_message", "recoveries", "updated_at", "wait")[:limit]]


def reaper_schedule():
    """Serves the console's link to the lease reaper's django-celery-beat PeriodicTask (None when deleted)."""
    from django_celery_beat.models import PeriodicTask

    return PeriodicTask.objects.select_related("interval").filter(name=REAPER_NAME).first()


# -- dead letters -----------------------------------------------------------------------------------------------------
def dead_letter_reason(task: Task) -> str:
    """Why a task was dead-lettered, for people: the error's reason and message, else its status message."""
    error = task.error or {}
    parts = [str(error.get(name)) for name in ("reason", "message") if error.get(name)]
    return redact(": ".join(parts) if parts else task.status_message)


def dead_letter_rows(tasks) -> list[dict[str, Any]]:
    """Serves the dead-letter page: each task with its reason and the effects whose outcome nobody knows (one
    query per task on the ledger's primary key, through the service that retry checks them with)."""
    rows = []
    for task in tasks:
        effects = [{"name": effect.name, "key": effect.key, "step_seq": effect.step_seq, "status": effect.status,
                    "attempts": effect.attempts, "started_at": effect.started_at}
                   for effect in dead_letters.dead_letter_open_effects(task_id=task.id)]
        rows.append({"task": task, "reason": dead_letter_reason(task), "open_effects": effects})
    return rows


def dead_letter_count(*, actor: access.Actor) -> int:
    """Serves the console's "dead letters (n)" links (a scan of the task table for one status), of the tasks the
    actor sees."""
    return dead_letters.dead_letters(actor=actor).order_by().count()

