"""Typed results: the API's JSON as dataclasses with the fields a caller uses named, and the whole answer in `raw`
(fields the server adds later are there before this client names them)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

FINISHED_STATUSES = frozenset({"completed", "failed", "cancelled"})  # a snapshot's (external) `status`


@dataclass(frozen=True)
class Wait:
    """What a task in input_required (or paused in a wait) waits for: answer it with answer / approve / reject."""

    wait_id: str
    kind: str  # input | approval | budget
    name: str
    prompt: str
    schema: dict[str, Any] | None
    effect: dict[str, Any] | None
    raw: dict[str, Any] = field(repr=False)

    @classmethod
    def from_api(cls, data: dict[str, Any]) -> Wait:
        return cls(wait_id=str(data.get("waitId", "")), kind=str(data.get("kind", "")),
                   name=str(data.get("name") or ""), prompt=str(data.get("prompt") or ""),
                   schema=data.get("schema"), effect=data.get("effect"), raw=data)


@dataclass(frozen=True)
class Task:
    """A task's snapshot (GET /runtime/tasks/{id})."""

    task_id: str
    workflow: str
    status: str  # working | input_required | completed | failed | cancelled
    internal_status: str
    status_message: str
    progress: float
    phase: str
    priority: int
    state_version: int  # send as expected_version when steering
    steps_completed: int
    created_at: str
    updated_at: str
    completed_at: str | None
    result: Any
    error: dict[str, Any] | None
    wait: Wait | None
    raw: dict[str, Any] = field(repr=False)

    @classmethod
    def from_api(cls, data: dict[str, Any]) -> Task:
        wait = data.get("wait")
        return cls(
            task_id=str(data["taskId"]), workflow=str(data.get("workflow", "")), status=str(data.get("status", "")),
            internal_status=str(data.get("internalStatus", "")), status_message=str(data.get("statusMessage") or ""),
            progress=float(data.get("progress") or 0), phase=str(data.get("phase") or ""),
            priority=int(data.get("priority") or 0), state_version=int(data.get("stateVersion") or 0),
            steps_completed=int(data.get("stepsCompleted") or 0), created_at=str(data.get("createdAt", "")),
            updated_at=str(data.get("updatedAt", "")), completed_at=data.get("completedAt"),
            result=data.get("result"), error=data.get("error"),
            wait=Wait.from_api(wait) if isinstance(wait, dict) else None, raw=data)

    @property
    def finished(self) -> bool:
        return self.status in FINISHED_STATUSES


@dataclass(frozen=True)
class TaskSummary:
    """A task as a list shows it (GET /runtime/tasks)."""

    task_id: str
    workflow: str
    status: str
    internal_status: str
    progress: float
    phase: str
    priority: int
    created_at: str
    raw: dict[str, Any] = field(repr=False)

    @classmethod
    def from_api(cls, data: dict[str, Any]) -> TaskSummary:
        return cls(task_id=str(data["taskId"]), workflow=str(data.get("workflow", "")),
                   status=str(data.get("status", "")), internal_status=str(data.get("internalStatus", "")),
                   progress=float(data.get("progress") or 0), phase=str(data.get("phase") or ""),
                   priority=int(data.get("priority") or 0), created_at=str(data.get("createdAt", "")), raw=data)


@dataclass(frozen=True)
class TaskPage:
    tasks: list[TaskSummary]
    next_cursor_url: str | None
    raw: dict[str, Any] = field(repr=False)


@dataclass(frozen=True)
class SteeringResult:
    """A steering command the server took (202): queued, applied at the task's next safe point."""

    command_id: str
    state_version: int
    status: str  # accepted | replayed (the same commandId sent again)
    raw: dict[str, Any] = field(repr=False)

    @classmethod
    def from_api(cls, data: dict[str, Any]) -> SteeringResult:
        return cls(command_id=str(data.get("commandId", "")), state_version=int(data.get("stateVersion") or 0),
                   status=str(data.get("status", "")), raw=data)


@dataclass(frozen=True)
class Artifact:
    name: str
    bytes: int
    content_type: str
    created_at: str
    url: str
    raw: dict[str, Any] = field(repr=False)

    @classmethod
    def from_api(cls, data: dict[str, Any]) -> Artifact:
        return cls(name=str(data["name"]), bytes=int(data.get("bytes") or 0),
                   content_type=str(data.get("contentType", "")), created_at=str(data.get("createdAt", "")),
                   url=str(data.get("url", "")), raw=data)


@dataclass(frozen=True)
class ToolServer:
    name: str
    url: str
    protocol_version: str
    tools: list[str]
    raw: dict[str, Any] = field(repr=False)

    @classmethod
    def from_api(cls, data: dict[str, Any]) -> ToolServer:
        return cls(name=str(data["name"]), url=str(data.get("url", "")),
                   protocol_version=str(data.get("protocolVersion") or ""),
                   tools=[str(t) for t in data.get("tools") or []], raw=data)


@dataclass(frozen=True)
class Event:
    """One event of a task's stream. `seq` is its place in the task's history (None for live-only items such as an
    agent's tokens, which are not stored). A `task.snapshot` event carries the snapshot (`snapshot`); one the client
    made itself after a gap in the seqs has `gap` = (first missing seq, last missing seq)."""

    type: str
    seq: int | None
    data: dict[str, Any]
    gap: tuple[int, int] | None = None

    @property
    def opening(self) -> bool:
        """The stream's snapshot (first on a connection, or re-read after a gap), not an event of the history."""
        return self.type == "task.snapshot" and isinstance(self.data.get("snapshot"), dict)

    @property
    def snapshot(self) -> Task | None:
        raw = self.data.get("snapshot")
        return Task.from_api(raw) if isinstance(raw, dict) else None

    @property
    def payload(self) -> dict[str, Any]:
        """The event's own data (progress: {progress, phase, step, stepsCompleted}; status: {status, …})."""
        inner = self.data.get("data")
        return inner if isinstance(inner, dict) else {}

    def as_json(self) -> dict[str, Any]:
        shown: dict[str, Any] = {"seq": self.seq, "type": self.type, "data": self.data}
        if self.gap:
            shown["gap"] = list(self.gap)
        return shown


def parse_data(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text) if text else {}
    except ValueError:
        return {"text": text}
    return value if isinstance(value, dict) else {"value": value}
