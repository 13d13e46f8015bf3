"""The per-task event log's hash chain, and the one place each kind of event is built (ARCHITECTURE §8).

Every writer — the engine's fenced writes, services' transitions, the reaper — builds its events here and
chains them with ``chain_events`` under the task row's lock, in the same transaction as the change they record.
An event is a ``(type, data)`` pair until it is chained.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from django.db import transaction

from config.base.canonical import canonical_json
from tasks_app.models import STEERING_OUTCOME_EVENTS, TERMINAL_STATUSES, TOOL_EVENT_TYPES, TaskEvent
from tasks_app.streaming import events_publish

Event = tuple[str, dict[str, Any]]

# The kinds of event built below (the console filters on them).
# A downstream tool call (agents_app.gateway): made, its outcome, refused by the policy, its result flagged.
TOOL_EVENTS = tuple(TOOL_EVENT_TYPES)
# A model's answer, committed with the agent's think step (agents_app.agent builds it; the text as it streams is
# live only: tasks_app.streaming.LIVE_ONLY_TYPES).
LLM_EVENTS = ("llm.message",)
EVENT_TYPES = ("status", "progress", "checkpoint", "task.snapshot", "effect", "log", "artifact", "terminal",
               "input_required", "plan.adjusted", "task.forked",  # (tasks_app.forks writes it, in a fork)
               *STEERING_OUTCOME_EVENTS,  # (steering_app builds those two)
               *TOOL_EVENTS,  # (agents_app.gateway builds these)
               *LLM_EVENTS)
# A chain link's prev hash and type as canonical_json writes them (ensure_ascii off; a str takes the encoder's
# C fast path, where canonical_json's json.dumps builds a new encoder per call).
_json_text = json.JSONEncoder(ensure_ascii=False).encode
# How much of a plan an event shows (runs of step names): a re-plan of a 100,000-step task stays a small event.
PLAN_EVENT_MAX_RUNS = 50


def event_hash(*, prev_hash: str, seq: int, type: str, data: dict) -> str:
    """An event's link in its task's chain: the sha256 of canonical JSON of ``{"prev", "seq", "type", "data"}``."""
    return event_hash_of_canonical(prev_hash=prev_hash, seq=seq, type=type, data_json=canonical_json(data))


def event_hash_of_canonical(*, prev_hash: str, seq: int, type: str, data_json: str) -> str:
    """event_hash for data already rendered as ``canonical_json(data)``: the one place the hashed text is written.

    A caller that hashes the same data many times (bench/seeding.py) renders it once and passes the text. The
    text is what ``canonical_json({"prev": …, "seq": …, "type": …, "data": …})`` writes (sorted keys, no spaces;
    json nests a value's text unchanged), built around ``data_json`` so the data is not serialised again per
    event; tests/test_canonical.py checks the two agree.
    """
    return hashlib.sha256(
        f'{{"data":{data_json},"prev":{_json_text(prev_hash)},"seq":{seq:d},"type":{_json_text(type)}}}'.encode()
    ).hexdigest()


def chain_events(task_id, events: list[Event], *, seq: int, head: str) -> tuple[list[TaskEvent], int, str]:
    """Number and hash-chain new events after (seq, head). The caller holds the task row lock."""
    rows = []
    for type_, data in events:
        seq += 1
        digest = event_hash(prev_hash=head, seq=seq, type=type_, data=data)
        rows.append(TaskEvent(task_id=task_id, seq=seq, type=type_, data=data, prev_hash=head, hash=digest))
        head = digest
    return rows, seq, head


def events_insert(rows: list[TaskEvent], *, tenant_id) -> None:
    """Insert chained events in the caller's transaction; live subscribers hear of them once it commits."""
    if not rows:
        return
    TaskEvent.objects.bulk_create(rows)
    task_id = rows[0].task_id
    transaction.on_commit(lambda: events_publish(task_id=task_id, tenant_id=tenant_id, events=rows))


def status_event(task_status: str, message: str = "", **extra) -> Event:
    return "status", {"status": str(task_status), "message": message, **extra}


def transition_events(task_status: str, message: str = "", **extra) -> list[Event]:
    """A status change; entering a terminal status adds the ``terminal`` event streams close on."""
    events = [status_event(task_status, message, **extra)]
    if task_status in TERMINAL_STATUSES:
        events.append(("terminal", {"status": str(task_status)}))
    return events


def progress_event(*, progress: float, phase: str | None, step: str, steps_completed: int,
                   delta_sha256s: list[str], effects: list[str] = ()) -> Event:
    """Steps committed: the last is ``steps_completed`` (named ``step``), the first ``steps_completed -
    len(delta_sha256s) + 1`` (see progress_event_seconds). Each step's state delta is bound into the hash chain,
    so an edited delta no longer matches the event that recorded it (recovery also checks it against the step
    row): one step's as deltaSha256; several as deltasSha256, the sha256 of their sha256s (hex) in step order,
    with firstStep. ``effects`` lists the effects that succeeded in these steps as "<step>:<name>" (the key is
    "<taskId>:<step>:<name>"): no event per effect as well, which cost WAL on every step (figures:
    docs/performance.md)."""
    data = {"progress": progress, "phase": phase, "step": step, "stepsCompleted": steps_completed}
    if len(delta_sha256s) == 1:
        data["deltaSha256"] = delta_sha256s[0]
    else:
        data["firstStep"] = steps_completed - len(delta_sha256s) + 1
        data["deltasSha256"] = deltas_sha256(delta_sha256s)
    if effects:
        data["effects"] = list(effects)
    return "progress", data


def deltas_sha256(delta_sha256s: list[str]) -> str:
    return hashlib.sha256("".join(delta_sha256s).encode()).hexdigest()


def checkpoint_event(*, sequence: int, size: int) -> Event:
    return "checkpoint", {"sequence": sequence, "bytes": size}


def snapshot_event(*, steps_completed: int, next_step: int, plan_length: int | None, checkpoint: int | None) -> Event:
    return "task.snapshot", {"stepsCompleted": steps_completed, "nextStep": next_step, "planLength": plan_length,
                             "checkpoint": checkpoint}


def effect_event(*, name: str, key: str, status: str) -> Event:
    return "effect", {"name": name, "key": key, "status": status}


def log_event(*, step: str, message: str) -> Event:
    return "log", {"step": step, "message": message}


def artifact_event(*, name: str, ref: str, size: int) -> Event:
    return "artifact", {"name": name, "ref": ref, "bytes": size}


def input_required_event(wait: dict) -> Event:
    """The task waits for a person: the wait as the snapshot shows it (its prompt and arguments are redacted)."""
    return "input_required", {key: wait[key] for key in ("waitId", "kind", "name", "prompt", "schema", "effect",
                                                         "step", "budget") if key in wait}


def plan_adjusted_event(*, old_version: int, new_version: int, from_step: int, old_plan: list[list],
                        new_plan: list[list], command_id: str) -> Event:
    """adjust_goal re-planned the task from ``from_step``: the remaining steps before and after (run-length
    encoded, as PlanChunk stores them)."""
    return "plan.adjusted", {"oldPlanVersion": old_version, "newPlanVersion": new_version, "fromStep": from_step,
                             "oldPlan": old_plan[:PLAN_EVENT_MAX_RUNS], "newPlan": new_plan[:PLAN_EVENT_MAX_RUNS],
                             "commandId": command_id}
