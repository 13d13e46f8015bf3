"""RuntimeClient: the runtime's REST API from Python, blocking (httpx2). The async twin is AsyncRuntimeClient."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

import httpx2

from tasks_app.client import _core
from tasks_app.client.config import resolve
from tasks_app.client.errors import ConnectionFailed, ServerError, VersionConflict, WaitTimeout
from tasks_app.client.models import (
    Artifact,
    Event,
    SteeringResult,
    Task,
    TaskPage,
    TaskSummary,
    ToolServer,
)


class RuntimeClient:
    """A client of one runtime server, as one token (tenant). Without url/token the environment and the config
    file say (tasks_app.client.config). Use as a context manager, or call close()."""

    def __init__(self, url: str | None = None, token: str | None = None, *, profile: str | None = None,
                 transport: httpx2.BaseTransport | None = None):
        self.settings = resolve(url=url, token=token, profile=profile)
        self.url = self.settings.url
        self._http = httpx2.Client(base_url=self.url, headers=_core.headers(self.settings.token),
                                   timeout=_core.REQUEST_TIMEOUT, transport=transport)

    def __enter__(self) -> RuntimeClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _call(self, method: str, path: str, **kwargs) -> Any:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx2.TransportError as error:
            raise ConnectionFailed(f"Cannot reach {self.url}: {error or type(error).__name__}") from None
        return _core.json_or_error(response)

    # -- tasks ----------------------------------------------------------------------------------------------------
    def create_task(self, workflow: str, input: dict[str, Any], *, idempotency_key: str | None = None,
                    **options) -> Task:
        """Start a task (goal, priority, deadline, budget, approval_policy, checkpoint_policy, tool_policy as the
        API takes them). With an idempotency_key, the same call again answers the same task."""
        extra = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        body = _core.create_body(workflow, input, **options)
        return Task.from_api(self._call("POST", f"{_core.API}/tasks", json=body, headers=extra))

    def get_task(self, task_id: str) -> Task:
        return Task.from_api(self._call("GET", _core.task_path(task_id)))

    def list_tasks(self, *, status: str | None = None, internal_status: str | None = None,
                   workflow: str | None = None, limit: int | None = None, created_after: str | None = None,
                   created_before: str | None = None, cursor_url: str | None = None) -> TaskPage:
        """One page, newest first; pass the page's next_cursor_url for the next."""
        if cursor_url:
            data = self._call("GET", cursor_url)
        else:
            data = self._call("GET", f"{_core.API}/tasks", params=_core.list_params(
                status=status, internal_status=internal_status, workflow=workflow, limit=limit,
                created_after=created_after, created_before=created_before))
        return TaskPage(tasks=[TaskSummary.from_api(row) for row in data["results"]], next_cursor_url=data.get("next"),
                        raw=data)

    def iter_tasks(self, **filters) -> Iterator[TaskSummary]:
        """Every task matching the filters, page after page."""
        page = self.list_tasks(**filters)
        while True:
            yield from page.tasks
            if not page.next_cursor_url:
                return
            page = self.list_tasks(cursor_url=page.next_cursor_url)

    def workflows(self) -> list[dict[str, Any]]:
        return self._call("GET", f"{_core.API}/workflows")

    def create_and_wait(self, workflow: str, input: dict[str, Any], *, timeout: float | None = None,
                        on_event: Callable[[Event], None] | None = None, **options) -> Task:
        """Start a task and follow its stream to its end; the final snapshot (completed, failed or cancelled: check
        `status`). WaitTimeout after `timeout` seconds (the task goes on)."""
        task = self.create_task(workflow, input, **options)
        return self.wait(task.task_id, timeout=timeout, on_event=on_event)

    def wait(self, task_id: str, *, timeout: float | None = None,
             on_event: Callable[[Event], None] | None = None) -> Task:
        """Follow a task to its end (or for `timeout` seconds: WaitTimeout) and return its final snapshot."""
        for event in self.watch(task_id, timeout=timeout):
            if on_event is not None:
                on_event(event)
        return self.get_task(task_id)

    # -- live events ----------------------------------------------------------------------------------------------
    def watch(self, task_id: str, *, last_event_id: int | None = None, timeout: float | None = None,
              reconnect_for: float = 120.0,
              on_reconnect: Callable[[str, int | None], None] | None = None) -> Iterator[Event]:
        """The task's events until its end: first a `task.snapshot` (unless last_event_id resumes after a seq), then
        each event in seq order. A dropped connection (a web process restarting) is reconnected with Last-Event-ID,
        so nothing is missed or repeated; if the seqs still skip, the snapshot is re-read and yielded as a
        `task.snapshot` event with `gap` set. ConnectionFailed once the server stays unreachable for reconnect_for
        seconds; WaitTimeout after `timeout` seconds. on_reconnect(reason, last seq) is called before each
        reconnection."""
        state = _core.WatchState(last_event_id)
        deadline = None if timeout is None else time.monotonic() + timeout
        failing_since: float | None = None
        while True:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise WaitTimeout(f"Task {task_id} did not end within {timeout:g} s.")
            try:
                with self._http.stream("GET", _core.task_path(task_id, "/events"), headers=state.request_headers(),
                                       timeout=_core.stream_timeout(remaining)) as response:
                    if response.status_code == 204:
                        return  # a finished task with nothing after Last-Event-ID
                    if response.status_code >= 400:
                        response.read()
                        _core.raise_for_error(response)
                    failing_since = None
                    decoder = _core.SseDecoder()
                    for line in response.iter_lines():
                        event = decoder.feed(line)
                        if event is None:
                            continue
                        verdict = state.classify(event)
                        if verdict == state.SKIP:
                            continue
                        if verdict == state.GAP:
                            yield state.gap_event(self.get_task(task_id))
                        yield event
                        if state.done:
                            return
            except (httpx2.TransportError, ServerError, ConnectionFailed) as error:  # (the gap's re-read too)
                if isinstance(error, httpx2.TimeoutException) and deadline is not None \
                        and time.monotonic() >= deadline:
                    raise WaitTimeout(f"Task {task_id} did not end within {timeout:g} s.") from None
                reason = str(error) or type(error).__name__
            else:
                reason = "the stream ended before the task did"
            # The connection ended or failed before the task did: connect again, resuming after the last seq.
            if on_reconnect is not None:
                on_reconnect(reason, state.last)
            now = time.monotonic()
            failing_since = failing_since or now
            if now - failing_since > reconnect_for:
                raise ConnectionFailed(f"Lost the stream of task {task_id} and could not reconnect to {self.url} "
                                       f"for {reconnect_for:g} s ({reason}).")
            time.sleep(_core.RECONNECT_DELAYS[min(state.reconnects, len(_core.RECONNECT_DELAYS) - 1)])
            state.reconnects += 1

    def events(self, task_id: str, *, after: int = 0) -> list[Event]:
        """The task's stored events after seq `after`, up to now (watch() follows them live)."""
        stream = self.watch(task_id)
        try:
            now = next(stream, None)  # the stream's first event: the snapshot and the seq it reflects
        finally:
            stream.close()
        if now is None or now.seq is None or now.seq <= after:
            return []
        found = []
        for event in self.watch(task_id, last_event_id=after):
            if event.seq is not None:
                found.append(event)
            if event.seq is not None and event.seq >= now.seq:
                break
        return found

    def tenant_events(self) -> Iterator[Event]:
        """Status, progress and terminal events of the tenant's tasks, live (no replay), until closed."""
        try:
            with self._http.stream("GET", f"{_core.API}/events", headers={"Accept": "text/event-stream"},
                                   timeout=_core.stream_timeout(None)) as response:
                if response.status_code >= 400:
                    response.read()
                    _core.raise_for_error(response)
                decoder = _core.SseDecoder()
                for line in response.iter_lines():
                    event = decoder.feed(line)
                    if event is not None:
                        yield event
        except httpx2.TransportError as error:
            raise ConnectionFailed(f"Lost the event stream of {self.url}: {error or type(error).__name__}") from None

    # -- steering -------------------------------------------------------------------------------------------------
    def steer(self, task_id: str, command_type: str, payload: dict[str, Any] | None = None, *,
              expected_version: int | None = None, reason: str = "", command_id: str | None = None,
              retry_on_conflict: _core.ConflictPolicy = False, max_attempts: int = 3) -> SteeringResult:
        """Queue a steering command. expected_version: the stateVersion you decided on (None: read the task now and
        use its version). A 409 raises VersionConflict with the current snapshot, unless retry_on_conflict (True,
        or a callable given the current Task) says to send it again at the current version."""
        if expected_version is None:
            expected_version = self.get_task(task_id).state_version
        for attempt in range(1, max_attempts + 1):
            try:
                return SteeringResult.from_api(self._call("POST", _core.task_path(task_id, "/steering"), json=(
                    _core.steering_body(command_type, payload, expected_version, reason, command_id))))
            except VersionConflict as conflict:
                if attempt == max_attempts or not _core.wants_retry(retry_on_conflict, conflict.snapshot):
                    raise
                expected_version = conflict.snapshot.state_version
        raise AssertionError("unreachable")

    def pause(self, task_id: str, **kwargs) -> SteeringResult:
        return self.steer(task_id, "pause", **kwargs)

    def resume(self, task_id: str, **kwargs) -> SteeringResult:
        return self.steer(task_id, "resume", **kwargs)

    def cancel(self, task_id: str, *, reason: str = "") -> Task:
        """Cancel without a version check (POST …/cancel): at once if no worker runs it, else at its next safe
        point. For a version-checked cancel: steer(task_id, "cancel", expected_version=…)."""
        return Task.from_api(self._call("POST", _core.task_path(task_id, "/cancel"), json={"reason": reason}))

    def kill(self, task_id: str, *, reason: str, **kwargs) -> SteeringResult:
        return self.steer(task_id, "kill", reason=reason, **kwargs)

    def set_priority(self, task_id: str, priority: int, **kwargs) -> SteeringResult:
        return self.steer(task_id, "set_priority", {"priority": priority}, **kwargs)

    def adjust_goal(self, task_id: str, *, goal: Any = None, parameters: dict[str, Any] | None = None,
                    **kwargs) -> SteeringResult:
        payload = {key: value for key, value in (("goal", goal), ("parameters", parameters)) if value is not None}
        return self.steer(task_id, "adjust_goal", payload, **kwargs)

    def set_budget(self, task_id: str, budget: dict[str, Any], **kwargs) -> SteeringResult:
        return self.steer(task_id, "set_budget", budget, **kwargs)

    def answer(self, task_id: str, value: Any, *, wait_id: str | None = None, **kwargs) -> SteeringResult:
        """Answer the task's open input wait (or the wait `wait_id`) with `value`."""
        return self._answer(task_id, "provide_input", {"value": value}, wait_id, **kwargs)

    def approve(self, task_id: str, *, wait_id: str | None = None, **kwargs) -> SteeringResult:
        return self._answer(task_id, "approve", {}, wait_id, **kwargs)

    def reject(self, task_id: str, *, wait_id: str | None = None, **kwargs) -> SteeringResult:
        return self._answer(task_id, "reject", {}, wait_id, **kwargs)

    def _answer(self, task_id, command_type, payload, wait_id, *, expected_version=None, **kwargs):
        if wait_id is None or expected_version is None:
            wait_id, version = _core.wait_of(self.get_task(task_id), wait_id)
            expected_version = version if expected_version is None else expected_version
        return self.steer(task_id, command_type, {**payload, "waitId": wait_id}, expected_version=expected_version,
                          **kwargs)

    def steering_history(self, task_id: str) -> list[dict[str, Any]]:
        return self._call("GET", _core.task_path(task_id, "/steering"))["commands"]

    # -- fork, artifacts, tool servers ----------------------------------------------------------------------------
    def fork(self, task_id: str, *, from_step: int | None = None, from_turn: int | None = None, goal: Any = None,
             input: dict[str, Any] | None = None) -> Task:
        """A new task that starts again at step `from_step` (1 = the first; an agent: turn `from_turn`) of this one,
        with its state there and, if given, a corrected goal or input; the original is untouched. The effects the
        original made from that step on run again only under the fork's keys (after approval unless read-only or
        idempotent)."""
        return Task.from_api(self._call("POST", _core.task_path(task_id, "/fork"),
                                        json=_core.fork_body(from_step, from_turn, goal, input)))

    def lineage(self, task_id: str) -> dict[str, Any]:
        """{forkedFrom: {taskId, fromStep} | None, forks: [{taskId, fromStep, status, createdAt}]}"""
        return self._call("GET", _core.task_path(task_id, "/forks"))

    def artifacts(self, task_id: str) -> list[Artifact]:
        data = self._call("GET", _core.task_path(task_id, "/artifacts"))
        return [Artifact.from_api(row) for row in data["artifacts"]]

    def download_artifact(self, task_id: str, name: str, destination: str | Path | BinaryIO) -> int:
        """Stream the artifact into a file (path or binary file object); the number of bytes written."""
        try:
            with self._http.stream("GET", _core.task_path(task_id, f"/artifacts/{name}"),
                                   headers={"Accept": "*/*"}) as response:
                if response.status_code >= 400:
                    response.read()
                    _core.raise_for_error(response)
                if isinstance(destination, (str, Path)):
                    with open(destination, "wb") as handle:
                        return _copy(response.iter_bytes(), handle)
                return _copy(response.iter_bytes(), destination)
        except httpx2.TransportError as error:
            raise ConnectionFailed(f"Cannot reach {self.url}: {error or type(error).__name__}") from None

    def tool_servers(self) -> list[ToolServer]:
        return [ToolServer.from_api(row) for row in self._call("GET", f"{_core.API}/tool-servers")["toolServers"]]


def _copy(chunks, handle) -> int:
    written = 0
    for chunk in chunks:
        handle.write(chunk)
        written += len(chunk)
    return written
