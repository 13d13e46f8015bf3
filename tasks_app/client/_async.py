"""AsyncRuntimeClient: RuntimeClient's calls as coroutines (httpx2's AsyncClient), for asyncio code. Same arguments,
results and errors; watch(), events of a tenant are async iterators."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, BinaryIO

import httpx2

from tasks_app.client import _core
from tasks_app.client.config import resolve
from tasks_app.client.errors import ConnectionFailed, ServerError, VersionConflict, WaitTimeout
from tasks_app.client.models import Artifact, Event, SteeringResult, Task, TaskPage, TaskSummary, ToolServer


class AsyncRuntimeClient:
    """The async twin of RuntimeClient (see its docstrings). `async with AsyncRuntimeClient() as client: …`"""

    def __init__(self, url: str | None = None, token: str | None = None, *, profile: str | None = None,
                 transport: httpx2.AsyncBaseTransport | None = None):
        self.settings = resolve(url=url, token=token, profile=profile)
        self.url = self.settings.url
        self._http = httpx2.AsyncClient(base_url=self.url, headers=_core.headers(self.settings.token),
                                        timeout=_core.REQUEST_TIMEOUT, transport=transport)

    async def __aenter__(self) -> AsyncRuntimeClient:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _call(self, method: str, path: str, **kwargs) -> Any:
        try:
            response = await self._http.request(method, path, **kwargs)
        except httpx2.TransportError as error:
            raise ConnectionFailed(f"Cannot reach {self.url}: {error or type(error).__name__}") from None
        return _core.json_or_error(response)

    # -- tasks ----------------------------------------------------------------------------------------------------
    async def create_task(self, workflow: str, input: dict[str, Any], *, idempotency_key: str | None = None,
                          **options) -> Task:
        extra = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        return Task.from_api(await self._call("POST", f"{_core.API}/tasks",
                                              json=_core.create_body(workflow, input, **options), headers=extra))

    async def get_task(self, task_id: str) -> Task:
        return Task.from_api(await self._call("GET", _core.task_path(task_id)))

    async def list_tasks(self, *, status: str | None = None, internal_status: str | None = None,
                         workflow: str | None = None, limit: int | None = None, created_after: str | None = None,
                         created_before: str | None = None, cursor_url: str | None = None) -> TaskPage:
        if cursor_url:
            data = await self._call("GET", cursor_url)
        else:
            data = await self._call("GET", f"{_core.API}/tasks", params=_core.list_params(
                status=status, internal_status=internal_status, workflow=workflow, limit=limit,
                created_after=created_after, created_before=created_before))
        return TaskPage(tasks=[TaskSummary.from_api(row) for row in data["results"]], next_cursor_url=data.get("next"),
                        raw=data)

    async def workflows(self) -> list[dict[str, Any]]:
        return await self._call("GET", f"{_core.API}/workflows")

    async def create_and_wait(self, workflow: str, input: dict[str, Any], *, timeout: float | None = None,
                              on_event: Callable[[Event], Awaitable[None] | None] | None = None, **options) -> Task:
        task = await self.create_task(workflow, input, **options)
        return await self.wait(task.task_id, timeout=timeout, on_event=on_event)

    async def wait(self, task_id: str, *, timeout: float | None = None,
                   on_event: Callable[[Event], Awaitable[None] | None] | None = None) -> Task:
        async for event in self.watch(task_id, timeout=timeout):
            if on_event is not None:
                outcome = on_event(event)
                if asyncio.iscoroutine(outcome):
                    await outcome
        return await self.get_task(task_id)

    # -- live events ----------------------------------------------------------------------------------------------
    async def watch(self, task_id: str, *, last_event_id: int | None = None, timeout: float | None = None,
                    reconnect_for: float = 120.0,
                    on_reconnect: Callable[[str, int | None], None] | None = None) -> AsyncIterator[Event]:
        state = _core.WatchState(last_event_id)
        deadline = None if timeout is None else time.monotonic() + timeout
        failing_since: float | None = None
        while True:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise WaitTimeout(f"Task {task_id} did not end within {timeout:g} s.")
            try:
                async with self._http.stream("GET", _core.task_path(task_id, "/events"),
                                             headers=state.request_headers(),
                                             timeout=_core.stream_timeout(remaining)) as response:
                    if response.status_code == 204:
                        return
                    if response.status_code >= 400:
                        await response.aread()
                        _core.raise_for_error(response)
                    failing_since = None
                    decoder = _core.SseDecoder()
                    async for line in response.aiter_lines():
                        event = decoder.feed(line)
                        if event is None:
                            continue
                        verdict = state.classify(event)
                        if verdict == state.SKIP:
                            continue
                        if verdict == state.GAP:
                            yield state.gap_event(await self.get_task(task_id))
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
            if on_reconnect is not None:
                on_reconnect(reason, state.last)
            now = time.monotonic()
            failing_since = failing_since or now
            if now - failing_since > reconnect_for:
                raise ConnectionFailed(f"Lost the stream of task {task_id} and could not reconnect to {self.url} "
                                       f"for {reconnect_for:g} s ({reason}).")
            await asyncio.sleep(_core.RECONNECT_DELAYS[min(state.reconnects, len(_core.RECONNECT_DELAYS) - 1)])
            state.reconnects += 1

    async def events(self, task_id: str, *, after: int = 0) -> list[Event]:
        stream = self.watch(task_id)
        try:
            now = await anext(stream, None)
        finally:
            await stream.aclose()
        if now is None or now.seq is None or now.seq <= after:
            return []
        found = []
        stream = self.watch(task_id, last_event_id=after)
        try:
            async for event in stream:
                if event.seq is not None:
                    found.append(event)
                if event.seq is not None and event.seq >= now.seq:
                    break
        finally:
            await stream.aclose()
        return found

    async def tenant_events(self) -> AsyncIterator[Event]:
        try:
            async with self._http.stream("GET", f"{_core.API}/events", headers={"Accept": "text/event-stream"},
                                         timeout=_core.stream_timeout(None)) as response:
                if response.status_code >= 400:
                    await response.aread()
                    _core.raise_for_error(response)
                decoder = _core.SseDecoder()
                async for line in response.aiter_lines():
                    event = decoder.feed(line)
                    if event is not None:
                        yield event
        except httpx2.TransportError as error:
            raise ConnectionFailed(f"Lost the event stream of {self.url}: {error or type(error).__name__}") from None

    # -- steering -------------------------------------------------------------------------------------------------
    async def steer(self, task_id: str, command_type: str, payload: dict[str, Any] | None = None, *,
                    expected_version: int | None = None, reason: str = "", command_id: str | None = None,
                    retry_on_conflict: _core.ConflictPolicy = False, max_attempts: int = 3) -> SteeringResult:
        if expected_version is None:
            expected_version = (await self.get_task(task_id)).state_version
        for attempt in range(1, max_attempts + 1):
            try:
                return SteeringResult.from_api(await self._call("POST", _core.task_path(task_id, "/steering"), json=(
                    _core.steering_body(command_type, payload, expected_version, reason, command_id))))
            except VersionConflict as conflict:
                if attempt == max_attempts or not _core.wants_retry(retry_on_conflict, conflict.snapshot):
                    raise
                expected_version = conflict.snapshot.state_version
        raise AssertionError("unreachable")

    async def pause(self, task_id: str, **kwargs) -> SteeringResult:
        return await self.steer(task_id, "pause", **kwargs)

    async def resume(self, task_id: str, **kwargs) -> SteeringResult:
        return await self.steer(task_id, "resume", **kwargs)

    async def cancel(self, task_id: str, *, reason: str = "") -> Task:
        return Task.from_api(await self._call("POST", _core.task_path(task_id, "/cancel"), json={"reason": reason}))

    async def kill(self, task_id: str, *, reason: str, **kwargs) -> SteeringResult:
        return await self.steer(task_id, "kill", reason=reason, **kwargs)

    async def set_priority(self, task_id: str, priority: int, **kwargs) -> SteeringResult:
        return await self.steer(task_id, "set_priority", {"priority": priority}, **kwargs)

    async def adjust_goal(self, task_id: str, *, goal: Any = None, parameters: dict[str, Any] | None = None,
                          **kwargs) -> SteeringResult:
        payload = {key: value for key, value in (("goal", goal), ("parameters", parameters)) if value is not None}
        return await self.steer(task_id, "adjust_goal", payload, **kwargs)

    async def set_budget(self, task_id: str, budget: dict[str, Any], **kwargs) -> SteeringResult:
        return await self.steer(task_id, "set_budget", budget, **kwargs)

    async def answer(self, task_id: str, value: Any, *, wait_id: str | None = None, **kwargs) -> SteeringResult:
        return await self._answer(task_id, "provide_input", {"value": value}, wait_id, **kwargs)

    async def approve(self, task_id: str, *, wait_id: str | None = None, **kwargs) -> SteeringResult:
        return await self._answer(task_id, "approve", {}, wait_id, **kwargs)

    async def reject(self, task_id: str, *, wait_id: str | None = None, **kwargs) -> SteeringResult:
        return await self._answer(task_id, "reject", {}, wait_id, **kwargs)

    async def _answer(self, task_id, command_type, payload, wait_id, *, expected_version=None, **kwargs):
        if wait_id is None or expected_version is None:
            wait_id, version = _core.wait_of(await self.get_task(task_id), wait_id)
            expected_version = version if expected_version is None else expected_version
        return await self.steer(task_id, command_type, {**payload, "waitId": wait_id},
                                expected_version=expected_version, **kwargs)

    async def steering_history(self, task_id: str) -> list[dict[str, Any]]:
        return (await self._call("GET", _core.task_path(task_id, "/steering")))["commands"]

    # -- fork, artifacts, tool servers ----------------------------------------------------------------------------
    async def fork(self, task_id: str, *, from_step: int | None = None, from_turn: int | None = None,
                   goal: Any = None, input: dict[str, Any] | None = None) -> Task:
        return Task.from_api(await self._call("POST", _core.task_path(task_id, "/fork"),
                                              json=_core.fork_body(from_step, from_turn, goal, input)))

    async def lineage(self, task_id: str) -> dict[str, Any]:
        return await self._call("GET", _core.task_path(task_id, "/forks"))

    async def artifacts(self, task_id: str) -> list[Artifact]:
        data = await self._call("GET", _core.task_path(task_id, "/artifacts"))
        return [Artifact.from_api(row) for row in data["artifacts"]]

    async def download_artifact(self, task_id: str, name: str, destination: str | Path | BinaryIO) -> int:
        try:
            async with self._http.stream("GET", _core.task_path(task_id, f"/artifacts/{name}"),
                                         headers={"Accept": "*/*"}) as response:
                if response.status_code >= 400:
                    await response.aread()
                    _core.raise_for_error(response)
                handle = open(destination, "wb") if isinstance(destination, (str, Path)) else destination
                try:
                    written = 0
                    async for chunk in response.aiter_bytes():
                        handle.write(chunk)
                        written += len(chunk)
                    return written
                finally:
                    if handle is not destination:
                        handle.close()
        except httpx2.TransportError as error:
            raise ConnectionFailed(f"Cannot reach {self.url}: {error or type(error).__name__}") from None

    async def tool_servers(self) -> list[ToolServer]:
        data = await self._call("GET", f"{_core.API}/tool-servers")
        return [ToolServer.from_api(row) for row in data["toolServers"]]
