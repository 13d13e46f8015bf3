"""What the sync and the async client share: paths, bodies, answers read into results or errors, the SSE decoder
and the bookkeeping of a watch (seqs seen, gaps). No I/O here: each client does its own."""

from __future__ import annotations

import json
from typing import Any, Callable

import httpx2

from tasks_app.client.errors import error_for
from tasks_app.client.models import Event, Task, parse_data

API = "/runtime"
USER_AGENT = "agent-runtime-client/1"
KEEP_ALIVE_SECONDS = 15.0  # the server's keep-alive comment interval on a stream (tasks_app/web/stream_views.py)
REQUEST_TIMEOUT = httpx2.Timeout(30.0, connect=5.0)
RECONNECT_DELAYS = (0.2, 0.5, 1.0, 2.0)  # between a watch's reconnection attempts (the last one repeats)

# retry_on_conflict: False (raise VersionConflict), True (send again at the current version), or a callable given
# the task as it is now that says whether to.
ConflictPolicy = bool | Callable[[Task], bool]


def stream_timeout(remaining: float | None) -> httpx2.Timeout:
    """A stream's read timeout: three keep-alives without a byte means the connection is gone (or the caller's time
    is up)."""
    read = KEEP_ALIVE_SECONDS * 3
    if remaining is not None:
        read = max(0.1, min(read, remaining))
    return httpx2.Timeout(read, connect=5.0)


def headers(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}", "Accept": "application/json", "User-Agent": USER_AGENT}


def task_path(task_id: str, tail: str = "") -> str:
    return f"{API}/tasks/{task_id}{tail}"


def create_body(workflow: str, input: dict[str, Any], *, goal: Any = None, priority: int | None = None,
                deadline: str | None = None, budget: dict | None = None, approval_policy: dict | None = None,
                checkpoint_policy: dict | None = None, tool_policy: dict | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"workflow": workflow, "input": input}
    for key, value in (("goal", goal), ("priority", priority), ("deadline", deadline), ("budget", budget),
                       ("approvalPolicy", approval_policy), ("checkpointPolicy", checkpoint_policy),
                       ("toolPolicy", tool_policy)):
        if value is not None:
            body[key] = value
    return body


def list_params(*, status: str | None, internal_status: str | None, workflow: str | None, limit: int | None,
                created_after: str | None, created_before: str | None) -> dict[str, Any]:
    params = {"status": status, "internalStatus": internal_status, "workflow": workflow, "limit": limit,
              "createdAfter": created_after, "createdBefore": created_before}
    return {key: value for key, value in params.items() if value is not None}


def steering_body(command_type: str, payload: dict | None, expected_version: int, reason: str,
                  command_id: str | None) -> dict[str, Any]:
    body = {"type": command_type, "payload": payload or {}, "expectedVersion": expected_version, "reason": reason}
    if command_id:
        body["commandId"] = command_id
    return body


def fork_body(from_step: int | None, from_turn: int | None, goal: Any, input: dict | None) -> dict[str, Any]:
    body: dict[str, Any] = {}
    if from_step is not None:
        body["fromStep"] = from_step
    if from_turn is not None:
        body["fromTurn"] = from_turn
    if goal is not None:
        body["goal"] = goal
    if input is not None:
        body["input"] = input
    return body


def wants_retry(policy: ConflictPolicy, current: Task | None) -> bool:
    if current is None or current.finished:
        return False
    return policy(current) if callable(policy) else bool(policy)


def json_or_error(response: httpx2.Response) -> Any:
    """The answer's JSON, or the error its status and problem details say (ApiError and subclasses)."""
    if response.status_code >= 400:
        raise error_for(response.status_code, _body(response), url=str(response.request.url))
    return _body(response)


def raise_for_error(response: httpx2.Response) -> None:
    """For a streamed answer whose body was read: raise if it is an error."""
    if response.status_code >= 400:
        raise error_for(response.status_code, _body(response), url=str(response.request.url))


def _body(response: httpx2.Response) -> Any:
    if not response.content:
        return None
    try:
        return response.json()
    except ValueError:
        return {"detail": response.text[:500]}


def wait_of(task: Task, wait_id: str | None) -> tuple[str, int]:
    """(the wait id to answer, the version to answer at): the caller's wait id, else the task's open wait."""
    from tasks_app.client.errors import NoOpenWait

    if wait_id:
        return wait_id, task.state_version
    if task.wait is None:
        raise NoOpenWait(f"Task {task.task_id} waits for nothing (status {task.internal_status}); there is no wait "
                         f"to answer.")
    return task.wait.wait_id, task.state_version


class SseDecoder:
    """text/event-stream lines → Events (the WHATWG rules the server's stream uses: id, event, data; comments)."""

    def __init__(self):
        self._id: str | None = None
        self._type = ""
        self._data: list[str] = []

    def feed(self, line: str) -> Event | None:
        if line == "":
            if not self._data and not self._type:
                return None
            event_id, self._id = self._id, None
            event = Event(type=self._type or "message", seq=int(event_id) if event_id and event_id.isdigit() else None,
                          data=parse_data("\n".join(self._data)))
            self._type, self._data = "", []
            return event
        if line.startswith(":"):
            return None  # a comment: the keep-alive
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "id":
            self._id = value
        elif name == "event":
            self._type = value
        elif name == "data":
            self._data.append(value)
        return None


class WatchState:
    """A watch's bookkeeping across connections: the last seq seen (sent as Last-Event-ID when reconnecting),
    duplicates dropped, gaps noticed, the end."""

    SKIP, PASS, GAP = "skip", "pass", "gap"

    def __init__(self, last_event_id: int | None):
        self.last = last_event_id
        self.done = False
        self.reconnects = 0
        self.missing: tuple[int, int] | None = None

    def request_headers(self) -> dict[str, str]:
        shown = {"Accept": "text/event-stream", "Cache-Control": "no-cache"}
        if self.last is not None:
            shown["Last-Event-ID"] = str(self.last)
        return shown

    def classify(self, event: Event) -> str:
        if event.seq is None:
            return self.PASS  # a live-only item (an agent's tokens): not part of the history, never a gap
        if event.type == "task.snapshot" and "snapshot" in event.data:  # the stream's opening snapshot (the stored
            # task.snapshot events, written at checkpoints, carry no `snapshot`): the seq it reflects
            self.last = event.seq
            snapshot = event.snapshot
            self.done = snapshot is not None and snapshot.finished
            return self.PASS
        if self.last is not None and event.seq <= self.last:
            return self.SKIP  # already seen (a replay overlapping what came before)
        verdict = self.PASS
        if self.last is not None and event.seq > self.last + 1:
            verdict, self.missing = self.GAP, (self.last + 1, event.seq - 1)
        self.last = event.seq
        self.done = event.type == "terminal"
        return verdict

    def gap_event(self, snapshot: Task) -> Event:
        """The snapshot re-read after a gap, as an event: where the missing events left the task."""
        return Event(type="task.snapshot", seq=None, data={"taskId": snapshot.task_id, "snapshot": snapshot.raw},
                     gap=self.missing)


def dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)
