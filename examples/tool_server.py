"""An example downstream MCP tool server: what the runtime's durable tool calls are tested against (docs/tools.md).

    python examples/tool_server.py --port 8765 [--host 127.0.0.1] [--log PATH] [--state PATH] [--token-env NAME]

Built on the official `mcp` SDK's MCPServer, served over Streamable HTTP at /mcp, stateless, with JSON responses; it
answers both protocol eras (2025-11-25 after `initialize`, 2026-07-28 per request after `server/discover`). Five tools
whose annotations say honestly what calling them again does:

    lookup(key)                            readOnlyHint     the stored value of key
    upsert(key, value, delay_ms=0)         idempotentHint   key = value, applied once per idempotency key
    append(text, delay_ms=0)               (neither)        appends text; every call applies
    fail(message)                          readOnlyHint     answers a tool error result (isError)
    report(title, seconds=2, question=…)   (neither)        answers with a task, created once per idempotency key

The idempotency key is read from `params._meta["io.agentruntime/idempotency-key"]` and from the `Idempotency-Key`
header.

`report` is a long-running tool: it runs only as a task. On 2026-07-28 the client declares the tasks extension
(`io.modelcontextprotocol/tasks`) in the request's capabilities, and the call is answered with a task
(`{"resultType": "task", "taskId", "status", "pollIntervalMs", …}`); `tasks/get` then gives a DetailedTask (working;
input_required with its inputRequests; completed with the CallToolResult; cancelled), `tasks/update` takes
inputResponses and `tasks/cancel` cancels. On 2025-11-25 the call carries `params.task` (the tool's listing says
`execution.taskSupport: "required"`) and is answered `{"task": Task}`; then `tasks/get`, `tasks/result` (waits for the
end, then the CallToolResult) and `tasks/cancel`. A call that is neither is refused (-32021, -32601), nothing created.
The task works for `seconds` in the background, then completes with {title, seconds, answer, report}. With `question`
it first asks it — inputRequests {"question": {"method": "elicitation/create", "params": {"mode": "form", "message",
"requestedSchema"}}}, one string field `answer` — and works for `seconds` after the answer
(`{"question": {"action": "accept", "content": {"answer": …}}}`); declined, it completes with a tool error result. Only
a 2026-07-28 client can answer it here: 2025-11-25 asks on the `tasks/result` stream, which a server answering JSON,
stateless, has not got (the task's status message says so). Created once per idempotency key: the same key again is
answered with the same task as it stands now (logged "replayed"); the same key with other arguments is refused; without
a key every call creates a task.

State — the values, the appended list, the idempotency keys applied, the tasks — lives in this process's memory; without
--state a restarted server has forgotten it (and applies a repeated upsert key again), and the call log is what
outlives it. With `--state PATH` every change is also a record of an append-only JSON-lines journal (an upsert with its
idempotency key, arguments and result; an append; a task created, answered, finished), written, flushed and fsynced
before the tool answers, and replayed at start: a restarted server keeps its values, its list, the keys it applied and
its tasks. A task still working at a restart is resumed, on its own clock: it completes when it would have (`seconds`
after its creation, or after its answer; at once if that time has passed), and one that was asking asks again. A last
record torn by a kill mid-write was never answered: it is dropped. The journal is locked while a server uses it: a
second server on it refuses to start.

The call log (--log PATH, else standard output) has one JSON line per tools/call the server receives, written and
flushed before anything is applied, and one more line when it is done: "applied", "replayed" (an upsert or report
answered from its idempotency key), "task_created" (report made a task) or "refused" (no effect: bad arguments, an
unknown tool, a key reused for other arguments, a report not called as a task). Every line has event, call (joins a
call's two lines), tool, arguments, idempotency_key_meta, idempotency_key_header, protocol_version (the era the call
came in) and at — plus traceparent when the call's _meta carried one (a traced caller); the second also has result.
A task's later lines — "task_answered", "task_finished" (result: its CallToolResult), "task_cancelled" — repeat the
fields of the call that created it; all of a task's lines have task_id.
Tests count effects by the "applied" and "task_created" lines.

A received call runs to its end even when its caller goes away mid-call (the handler is shielded from the
cancellation a closed connection causes): the effect lands and only the answer is lost, which is the unknown
outcome the runtime has to decide by the tool's annotations. delay_ms sleeps before applying, to kill a caller then.
"""

from __future__ import annotations

import argparse
import contextlib
import contextvars
import fcntl
import hmac
import json
import os
import sys
import uuid
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, Annotated, Any

import anyio
import uvicorn
from anyio.abc import TaskGroup
from mcp.server.extension import Extension, MethodBinding
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.server import require_client_extension
from mcp.shared.exceptions import MCPError
from mcp.types import INVALID_PARAMS, METHOD_NOT_FOUND, RequestParams, ToolAnnotations, ToolExecution
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import Field

IDEMPOTENCY_META_KEY = "io.agentruntime/idempotency-key"
IDEMPOTENCY_HEADER = "Idempotency-Key"
MCP_PATH = "/mcp"
TASKS_EXTENSION = "io.modelcontextprotocol/tasks"
LEGACY_VERSION = "2025-11-25"
RELATED_TASK_META = "io.modelcontextprotocol/related-task"  # (2025-11-25: tasks/result's _meta names its task)
POLL_INTERVAL_MS = 500
QUESTION_KEY = "question"  # report's one inputRequests key
ANSWER_SCHEMA = {"type": "object", "properties": {"answer": {"type": "string", "title": "Answer"}},
                 "required": ["answer"]}
TERMINAL = ("completed", "failed", "cancelled")
DelayMs = Annotated[int, Field(ge=0, le=60_000, description="Milliseconds to sleep before applying (for tests).")]
Title = Annotated[str, Field(min_length=1, max_length=200, description="What the report is about.")]
Seconds = Annotated[float, Field(ge=0, le=3600, description="How long writing it takes (after the answer, if it "
                                                            "asks).")]
Question = Annotated[str | None, Field(max_length=500, description="A question to ask first (a form with one text "
                                                                   "field, answer); its answer goes in the report.")]


def now() -> str:
    return datetime.now(timezone.utc).isoformat()


class CallLog:
    """The JSON-lines call log. Each line is flushed as it is written: a test reads it while the server runs, and a
    line must be on disk before the effect it announces is applied (a test that kills the caller then reads it)."""

    def __init__(self, stream: IO[str]):
        self._stream = stream
        self._calls = 0

    def received(self, tool: str, arguments: Any, key_meta: Any, key_header: str | None,
                 protocol_version: str | None = None, traceparent: Any = None) -> dict[str, Any]:
        self._calls += 1
        line = {"event": "received", "call": self._calls, "tool": tool, "arguments": arguments,
                "idempotency_key_meta": key_meta, "idempotency_key_header": key_header,
                "protocol_version": protocol_version}
        if traceparent is not None:  # a traced caller's W3C context in _meta (SEP-414): the call is in its trace
            line["traceparent"] = traceparent
        self._write(line)
        return line

    def done(self, received: dict[str, Any], event: str, result: Any, **fields: Any) -> None:
        self._write({**received, "event": event, "result": result, **fields})

    def task(self, task: ReportTask, event: str, result: Any) -> None:
        """A task's line of its own (answered, finished, cancelled): the fields of the call that created it."""
        self._write({**task.received, "event": event, "task_id": task.task_id, "result": result})

    def _write(self, line: dict[str, Any]) -> None:
        line["at"] = now()
        self._stream.write(json.dumps(line, sort_keys=True) + "\n")
        self._stream.flush()


class JournalInUse(Exception):
    pass


class Journal:
    """--state PATH: what the tools applied, as append-only JSON lines, replayed at start (State.apply). Without a
    path it keeps nothing."""

    def __init__(self, path: str | os.PathLike | None):
        self.path = Path(path) if path else None
        self._file: IO[bytes] | None = None

    def open(self) -> list[dict[str, Any]]:
        """The records so far; the journal is then open for appending, and locked: two servers on one journal would
        each append what the other's memory does not know. A last record without its newline was torn by a kill
        mid-write, so its call was never answered: it is cut off (else the next record would be glued to it)."""
        if self.path is None:
            return []
        self.path.parent.mkdir(parents=True, exist_ok=True)
        existed = self.path.exists()
        self._file = open(self.path, "ab")
        try:
            fcntl.flock(self._file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)  # (released by the kernel at any exit)
        except BlockingIOError:
            self._file.close()
            self._file = None
            raise JournalInUse(f"{self.path} is the state journal of another running tool server; give each server "
                               f"its own --state") from None
        if not existed:  # the file's name has to outlive a crash too, not only what it holds
            directory = os.open(self.path.parent, os.O_RDONLY)
            try:
                os.fsync(directory)
            finally:
                os.close(directory)
        data = self.path.read_bytes()
        whole = data[:data.rfind(b"\n") + 1]
        if len(whole) < len(data):
            self._file.truncate(len(whole))
            os.fsync(self._file.fileno())
        return [json.loads(line) for line in whole.splitlines() if line.strip()]

    def write(self, record: dict[str, Any]) -> None:
        """On disk when this returns (written, flushed, fsynced): a caller that got an answer can count on its effect
        after a crash. A blocking fsync, on purpose: State.record changes memory right after it with no await between,
        so no other call sees the change before it is durable (some milliseconds a call, for an example)."""
        if self._file is None:
            return
        self._file.write((json.dumps(record, sort_keys=True) + "\n").encode())
        self._file.flush()
        os.fsync(self._file.fileno())


@dataclass(eq=False)
class ReportTask:
    """One task of report. Its status changes only through State.apply (a journal record), so a replay rebuilds it."""

    task_id: str
    key: str | None
    arguments: dict[str, Any]  # title, seconds, question: what the idempotency key stands for
    received: dict[str, Any]  # the creating call's log line, repeated by the task's own lines
    created_at: str
    status: str = "working"
    updated_at: str = ""
    answer: str | None = None
    answered_at: str | None = None
    result: dict[str, Any] | None = None  # its CallToolResult, once completed
    answered: anyio.Event = field(default_factory=anyio.Event, repr=False)
    finished: anyio.Event = field(default_factory=anyio.Event, repr=False)
    scope: anyio.CancelScope | None = field(default=None, repr=False)  # its background run's, to cancel it

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL


class State:
    """What the tools act on, in this process's memory; each change a journal record first (State.record)."""

    def __init__(self, journal: Journal | None = None) -> None:
        self.journal = journal or Journal(None)
        self.values: dict[str, str] = {}
        self.versions: dict[str, int] = {}
        self.appended: list[str] = []
        # idempotency key → (the arguments it was applied with, the result answered then)
        self.applied_keys: dict[str, tuple[dict[str, str], dict[str, Any]]] = {}
        # idempotency key → set when the call holding it is done (see upsert for the race)
        self.in_flight: dict[str, anyio.Event] = {}
        self.tasks: dict[str, ReportTask] = {}
        self.task_keys: dict[str, str] = {}  # idempotency key → the id of the task it created

    def record(self, record: dict[str, Any]) -> dict[str, Any]:
        """Journal the change, then make it: the one way state changes, live or replayed."""
        record = {**record, "at": now()}
        self.journal.write(record)
        self.apply(record)
        return record

    def apply(self, record: dict[str, Any]) -> None:
        op = record["op"]
        if op == "upsert":
            arguments, result = record["arguments"], record["result"]
            self.values[arguments["key"]] = arguments["value"]
            self.versions[arguments["key"]] = result["version"]
            if record.get("idempotency_key") is not None:
                self.applied_keys[record["idempotency_key"]] = (arguments, result)
        elif op == "append":
            self.appended.append(record["text"])
        elif op == "task_created":
            task = ReportTask(task_id=record["task_id"], key=record.get("idempotency_key"),
                              arguments=record["arguments"], received=record["received"], created_at=record["at"],
                              updated_at=record["at"],
                              status="input_required" if record["arguments"].get("question") else "working")
            self.tasks[task.task_id] = task
            if task.key is not None:
                self.task_keys[task.key] = task.task_id
        elif op == "task_answered":
            task = self.tasks[record["task_id"]]
            task.answer, task.answered_at, task.status, task.updated_at = (record["answer"], record["at"], "working",
                                                                           record["at"])
            task.answered.set()
        elif op == "task_finished":
            task = self.tasks[record["task_id"]]
            task.status, task.result, task.updated_at = record["status"], record.get("result"), record["at"]
            task.answered.set()  # (a run waiting for an answer that will not come now ends)
            task.finished.set()
        else:
            raise ValueError(f"the state journal has a record this server does not know: {op!r}")


class Tasks:
    """report's tasks: made once per idempotency key, run in the background (in the task group of `running`), answered,
    cancelled, finished — each step a journal record — and shown in either era's shape."""

    def __init__(self, state: State, log: CallLog):
        self.state, self.log = state, log
        self._group: TaskGroup | None = None

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """The tasks' runs, for as long as the server serves; the ones the journal left unfinished are resumed. When
        it stops, their runs are cancelled unfinished: the journal still has them working, and the next start resumes
        them."""
        async with anyio.create_task_group() as group:
            self._group = group
            for task in self.state.tasks.values():
                if not task.terminal:
                    group.start_soon(self._run, task)
            try:
                yield
            finally:
                self._group = None
                group.cancel_scope.cancel()

    def create(self, key: str | None, arguments: dict[str, Any], received: dict[str, Any]) -> tuple[ReportTask, bool]:
        """(the task, whether it is new). No await from the key's lookup to its record: two calls with one key cannot
        both find it free."""
        if key is not None and key in self.state.task_keys:
            task = self.state.tasks[self.state.task_keys[key]]
            if task.arguments != arguments:
                raise ToolError(f"idempotency key {key!r} created a task for other arguments ({task.arguments}); a "
                                f"new call needs a new key")
            return task, False
        if self._group is None:
            raise RuntimeError("the tasks are not running: serve the server with serve(), inside Tasks.running()")
        record = self.state.record({"op": "task_created", "task_id": str(uuid.uuid4()), "idempotency_key": key,
                                    "arguments": arguments, "received": received})
        task = self.state.tasks[record["task_id"]]
        self._group.start_soon(self._run, task)
        return task, True

    async def _run(self, task: ReportTask) -> None:
        with anyio.CancelScope() as scope:
            task.scope = scope
            if task.terminal:
                return  # (cancelled before its run began)
            if task.arguments.get("question") and task.answer is None:
                await task.answered.wait()
                if task.terminal:
                    return  # declined or cancelled while it asked
            began = datetime.fromisoformat(task.answered_at or task.created_at)
            spent = (datetime.now(timezone.utc) - began).total_seconds()
            await anyio.sleep(max(0.0, task.arguments["seconds"] - spent))  # (resumed: on its own clock)
            self.finish(task, "completed", self._report(task))

    def answer(self, task: ReportTask, responses: dict[str, Any]) -> None:
        """tasks/update. A response to nothing the task asks now (another key, an answer already taken) is ignored:
        the extension lets updates repeat."""
        response = responses.get(QUESTION_KEY)
        if task.status != "input_required" or response is None:
            return
        action = response.get("action") if isinstance(response, Mapping) else None
        content = response.get("content") if isinstance(response, Mapping) else None
        if action == "accept" and isinstance(content, Mapping) and isinstance(content.get("answer"), str):
            self.state.record({"op": "task_answered", "task_id": task.task_id, "answer": content["answer"]})
            self.log.task(task, "task_answered", {"answer": content["answer"]})
        elif action in ("decline", "cancel"):
            self.finish(task, "completed", {"content": [{"type": "text", "text": f"The question was answered "
                                                                                 f"{action!r}: no report."}],
                                            "isError": True})
        else:
            raise MCPError(INVALID_PARAMS, f'inputResponses["{QUESTION_KEY}"] must be {{"action": "accept", '
                                           f'"content": {{"answer": "<text>"}}}} or {{"action": "decline"}}; the '
                                           f'task still asks', {"taskId": task.task_id})

    def cancel(self, task: ReportTask) -> bool:
        """Whether it was cancelled now (False: it had finished already)."""
        if not self.finish(task, "cancelled", None):
            return False
        if task.scope is not None:
            task.scope.cancel()
        return True

    def finish(self, task: ReportTask, status: str, result: dict[str, Any] | None) -> bool:
        if task.terminal:
            return False  # (the race of a run completing and a tasks/cancel: whichever is recorded first wins)
        self.state.record({"op": "task_finished", "task_id": task.task_id, "status": status, "result": result})
        self.log.task(task, "task_finished" if status == "completed" else f"task_{status}",
                      result or {"status": status})
        return True

    @staticmethod
    def _report(task: ReportTask) -> dict[str, Any]:
        title, seconds = task.arguments["title"], task.arguments["seconds"]
        text = f"Report {title!r}, written in {seconds:g} s" + (f"; the answer: {task.answer!r}" if task.answer else "")
        structured = {"title": title, "seconds": seconds, "answer": task.answer, "report": text}
        return {"content": [{"type": "text", "text": json.dumps(structured)}], "structuredContent": structured,
                "isError": False}

    # -- the task as each era shows it ---------------------------------------------------------------------------
    @staticmethod
    def _message(task: ReportTask, *, legacy: bool = False) -> str:
        if task.status == "input_required":
            asks = f"Asks: {task.arguments['question']}"
            return asks + (" (answer it with tasks/update over 2026-07-28: a 2025-11-25 client is asked on the "
                           "tasks/result stream, which this server, answering JSON, stateless, has not got)"
                           if legacy else "")
        if task.status == "working":
            return f"Writing the report {task.arguments['title']!r} ({task.arguments['seconds']:g} s)"
        if task.status == "completed":
            return "The question was declined" if (task.result or {}).get("isError") else "The report is ready"
        return "Cancelled (tasks/cancel)"

    def fields(self, task: ReportTask) -> dict[str, Any]:
        """The 2026-07-28 Task: what the task-creating answer and every DetailedTask carry."""
        return {"taskId": task.task_id, "status": task.status, "statusMessage": self._message(task),
                "createdAt": task.created_at, "lastUpdatedAt": task.updated_at, "ttlMs": None,
                "pollIntervalMs": POLL_INTERVAL_MS}

    def detailed(self, task: ReportTask) -> dict[str, Any]:
        """tasks/get (2026-07-28): the Task and what its status carries."""
        detailed = self.fields(task)
        if task.status == "input_required":
            detailed["inputRequests"] = {QUESTION_KEY: {"method": "elicitation/create", "params": {
                "mode": "form", "message": task.arguments["question"], "requestedSchema": ANSWER_SCHEMA}}}
        elif task.status == "completed":
            detailed["result"] = task.result
        return detailed

    def legacy(self, task: ReportTask) -> dict[str, Any]:
        """The 2025-11-25 Task (ttl, pollInterval; a tool error result is "failed" in that era)."""
        failed = task.status == "completed" and (task.result or {}).get("isError")
        return {"taskId": task.task_id, "status": "failed" if failed else task.status,
                "statusMessage": self._message(task, legacy=True), "createdAt": task.created_at,
                "lastUpdatedAt": task.updated_at, "ttl": None, "pollInterval": POLL_INTERVAL_MS}


class TaskIdParams(RequestParams):
    task_id: str = Field(alias="taskId")


class TaskUpdateParams(TaskIdParams):
    input_responses: dict[str, Any] = Field(alias="inputResponses")


def modern(ctx) -> bool:
    return ctx.protocol_version in MODERN_PROTOCOL_VERSIONS


# The task a tools/call made (report puts it here), in a slot TasksExtension.middleware opens for each call.
_made_task: contextvars.ContextVar[list[ReportTask]] = contextvars.ContextVar("made_task")


class TasksExtension(Extension):
    """The tasks extension on the SDK's extension interface: tasks/get, tasks/update, tasks/cancel (and 2025-11-25's
    tasks/result) as method bindings, and a 2026-07-28 call that made a task answered with it by the tools/call
    interceptor. The 2025-11-25 answer is `middleware`'s: on a connection of that era the SDK checks whatever the
    tools/call handler returns — an interceptor's too — as a CallToolResult (a CreateTaskResult is not one: the
    client would get an internal error), while a middleware's own answer goes out as it is."""

    identifier = TASKS_EXTENSION

    def __init__(self, tasks: Tasks):
        self.tasks = tasks

    def methods(self) -> list[MethodBinding]:
        return [MethodBinding("tasks/get", TaskIdParams, self.get),
                MethodBinding("tasks/update", TaskUpdateParams, self.update,
                              protocol_versions=frozenset(MODERN_PROTOCOL_VERSIONS)),
                MethodBinding("tasks/cancel", TaskIdParams, self.cancel),
                MethodBinding("tasks/result", TaskIdParams, self.result, protocol_versions=frozenset({LEGACY_VERSION}))]

    async def intercept_tool_call(self, params, ctx, call_next):
        result = await call_next(ctx)
        made = _made_task.get(None)
        if made and modern(ctx):
            return {"resultType": "task", **self.tasks.fields(made[0])}
        return result

    async def middleware(self, ctx, call_next):
        """Server middleware: opens each tools/call's slot for the task it makes, and answers a 2025-11-25 call that
        made one {"task": Task}. And 2025-11-25's `initialize` says the server takes task-augmented tools/call and
        tasks/cancel (the `tasks` capability, which MCPServer does not derive)."""
        if ctx.method == "tools/call":
            made: list[ReportTask] = []
            token = _made_task.set(made)
            try:
                result = await call_next(ctx)
            finally:
                _made_task.reset(token)
            return {"task": self.tasks.legacy(made[0])} if made and not modern(ctx) else result
        result = await call_next(ctx)
        if ctx.method == "initialize" and isinstance(result, dict):
            result.setdefault("capabilities", {})["tasks"] = {"cancel": {}, "requests": {"tools": {"call": {}}}}
        return result

    def _task(self, params: TaskIdParams) -> ReportTask:
        task = self.tasks.state.tasks.get(params.task_id)
        if task is None:
            raise MCPError(INVALID_PARAMS, f"no task {params.task_id!r} on this server", {"taskId": params.task_id})
        return task

    async def get(self, ctx, params: TaskIdParams) -> dict[str, Any]:
        if not modern(ctx):
            return self.tasks.legacy(self._task(params))
        require_client_extension(ctx, TASKS_EXTENSION)
        return self.tasks.detailed(self._task(params))

    async def update(self, ctx, params: TaskUpdateParams) -> dict[str, Any]:
        require_client_extension(ctx, TASKS_EXTENSION)
        self.tasks.answer(self._task(params), params.input_responses)
        return {}

    async def cancel(self, ctx, params: TaskIdParams) -> dict[str, Any]:
        if modern(ctx):  # an acknowledgement: cancelling a finished task changes nothing
            require_client_extension(ctx, TASKS_EXTENSION)
            self.tasks.cancel(self._task(params))
            return {}
        task = self._task(params)
        if not self.tasks.cancel(task):  # (2025-11-25: a finished task's cancel is refused)
            raise MCPError(INVALID_PARAMS, f"task {task.task_id} is {task.status} already: it cannot be cancelled")
        return self.tasks.legacy(task)

    async def result(self, ctx, params: TaskIdParams) -> dict[str, Any]:
        """2025-11-25: waits for the task's end, then its CallToolResult."""
        task = self._task(params)
        await task.finished.wait()
        if task.status != "completed":
            raise MCPError(INVALID_PARAMS, f"task {task.task_id} was {task.status}: it has no result")
        return {**task.result, "_meta": {RELATED_TASK_META: {"taskId": task.task_id}}}


class ExampleServer(MCPServer):
    """MCPServer, with the listing of each tool that runs only as a task saying so: 2025-11-25's
    `execution.taskSupport` (the tool decorator has no parameter for it). 2026-07-28 has no such field (the SDK drops
    it from that era's listing): there the server decides per call, for a client that declared the extension."""

    task_tools = frozenset({"report"})

    async def list_tools(self):
        return [tool.model_copy(update={"execution": ToolExecution(task_support="required")})
                if tool.name in self.task_tools else tool for tool in await super().list_tools()]


# The call's "received" line, set by the middleware for the tool function to complete (same task, so a contextvar).
_received: contextvars.ContextVar[dict[str, Any]] = contextvars.ContextVar("received")
# Whether the tool function wrote the call's second line itself; if not, the middleware writes "refused".
_finished: contextvars.ContextVar[list[bool]] = contextvars.ContextVar("finished")


def build_server(log: CallLog, state: State | None = None) -> ExampleServer:
    """The server, on `state` (a fresh one in memory by default); serve it with serve(), whose Tasks.running() runs
    report's tasks (server.tasks)."""
    state = state if state is not None else State()
    tasks = Tasks(state, log)
    extension = TasksExtension(tasks)

    async def log_every_tool_call(ctx, call_next):
        """Log each tools/call as it arrives, before the arguments are validated or the tool looked up: a call the
        runtime should never have made (a denied, invented or malformed one) shows in the log as received."""
        if ctx.method != "tools/call":
            return await call_next(ctx)
        params = ctx.params if isinstance(ctx.params, Mapping) else {}
        meta = params.get("_meta") if isinstance(params.get("_meta"), Mapping) else {}
        headers = getattr(ctx.request, "headers", None)
        received = log.received(params.get("name"), params.get("arguments"), meta.get(IDEMPOTENCY_META_KEY),
                                headers.get(IDEMPOTENCY_HEADER) if headers is not None else None,
                                getattr(ctx, "protocol_version", None), meta.get("traceparent"))
        finished = [False]
        _received.set(received)
        _finished.set(finished)
        # Shielded: a caller killed mid-call closes its connection, and whether that cancels the handler is up to the
        # SDK and the era (2026-07-28 defines cancellation as closing the response stream; mcp 2.3.0's JSON responses
        # did not cancel when tried). A real downstream system finishes the work either way, and the runtime's
        # recovery is about exactly that case: the effect landed, the answer was lost.
        with anyio.CancelScope(shield=True):
            try:
                result = await call_next(ctx)
            except BaseException as error:
                if not finished[0]:
                    log.done(received, "refused", {"error": str(error)})
                raise
            if not finished[0]:
                log.done(received, "refused", result)
            return result

    server = ExampleServer("agent-runtime-example-tools", version="1", extensions=[extension],
                           middleware=[log_every_tool_call, extension.middleware], log_level="WARNING",
                           instructions="Example tools for the Agent Runtime's durable tool calls (docs/tools.md).")
    server.tasks = tasks

    def done(event: str, result: dict[str, Any], **fields: Any) -> dict[str, Any]:
        log.done(_received.get(), event, result, **fields)
        _finished.get()[0] = True
        return result

    def idempotency_key(ctx: Context) -> str | None:
        meta = ctx.request_context.meta or {}
        from_meta = meta.get(IDEMPOTENCY_META_KEY)
        from_header = ctx.headers.get(IDEMPOTENCY_HEADER) if ctx.headers is not None else None
        if from_meta is not None and not isinstance(from_meta, str):
            raise ToolError(f"_meta[{IDEMPOTENCY_META_KEY!r}] must be a string")
        if from_meta and from_header and from_meta != from_header:
            raise ToolError(f"the idempotency key in _meta ({from_meta!r}) and the {IDEMPOTENCY_HEADER} header "
                            f"({from_header!r}) differ; send the same key in both, or one of them")
        return from_meta or from_header or None

    @server.tool(annotations=ToolAnnotations(title="Look up a key", read_only_hint=True, open_world_hint=False))
    async def lookup(key: str) -> dict[str, Any]:
        """The value stored for key by upsert, and how many upserts have set it."""
        return done("applied", {"key": key, "found": key in state.values, "value": state.values.get(key),
                                "version": state.versions.get(key, 0)})

    @server.tool(annotations=ToolAnnotations(title="Set a key", read_only_hint=False, destructive_hint=True,
                                             idempotent_hint=True, open_world_hint=False))
    async def upsert(key: str, value: str, ctx: Context, delay_ms: DelayMs = 0) -> dict[str, Any]:
        """Set key = value. A call carrying an idempotency key that was applied before is not applied again: it is
        answered with the first call's result. Without a key every call applies."""
        idempotency = idempotency_key(ctx)
        arguments = {"key": key, "value": value}  # delay_ms is a test knob, not part of what the key stands for
        if idempotency is not None:
            # The race: the caller gives up on a slow call (delay_ms) and retries with the same key while the first
            # is still sleeping; both would find the key unapplied. The second waits for the first to finish.
            while idempotency in state.in_flight:
                await state.in_flight[idempotency].wait()
            if idempotency in state.applied_keys:
                first_arguments, first_result = state.applied_keys[idempotency]
                if first_arguments != arguments:
                    raise ToolError(f"idempotency key {idempotency!r} was applied to other arguments "
                                    f"({first_arguments}); a new call needs a new key")
                return done("replayed", first_result)
            state.in_flight[idempotency] = anyio.Event()
        try:
            await anyio.sleep(delay_ms / 1000)
            result = {"key": key, "value": value, "previous": state.values.get(key),
                      "version": state.versions.get(key, 0) + 1}
            state.record({"op": "upsert", "idempotency_key": idempotency, "arguments": arguments, "result": result})
            return done("applied", result)
        finally:
            if idempotency is not None:
                state.in_flight.pop(idempotency).set()

    @server.tool(annotations=ToolAnnotations(title="Append a text", read_only_hint=False, destructive_hint=False,
                                             idempotent_hint=False, open_world_hint=False))
    async def append(text: str, delay_ms: DelayMs = 0) -> dict[str, Any]:
        """Append text to the list. Every call applies, with or without an idempotency key: calling it again after
        an unknown outcome may append twice."""
        await anyio.sleep(delay_ms / 1000)
        result = {"index": len(state.appended), "count": len(state.appended) + 1}
        state.record({"op": "append", "text": text, "result": result})
        return done("applied", result)

    @server.tool(annotations=ToolAnnotations(title="Fail", read_only_hint=True, open_world_hint=False))
    async def fail(message: str) -> str:
        """Answer a tool error result (isError: true) with message as its text; nothing else happens."""
        done("applied", {"isError": True, "message": message})
        raise ToolError(message)

    # No outputSchema (structured_output=False): the SDK's client checks the result a task-answering call resolves to
    # against it, and a client that hands the task back to wait on it elsewhere resolves it to no structured content.
    @server.tool(annotations=ToolAnnotations(title="Write a report (a task)", read_only_hint=False,
                                             destructive_hint=False, idempotent_hint=False, open_world_hint=False),
                 structured_output=False)
    async def report(title: Title, ctx: Context, seconds: Seconds = 2, question: Question = None) -> dict[str, Any]:
        """Write a report, as a task (only): answered at once with the task, which works for `seconds` and then
        completes with {title, seconds, answer, report}. With `question` it first asks it (input_required) and puts
        the answer in the report. One task per idempotency key: the same key again gets the same task."""
        request = ctx.request_context
        if modern(request):
            require_client_extension(request, TASKS_EXTENSION)  # (-32021: nothing created)
        elif (request.params or {}).get("task") is None:
            raise MCPError(METHOD_NOT_FOUND, "report runs only as a task: call it with params.task")
        arguments = {"title": title, "seconds": seconds, "question": question}
        task, created = tasks.create(idempotency_key(ctx), arguments, _received.get())
        _made_task.get().append(task)
        return done("task_created" if created else "replayed", tasks.fields(task), task_id=task.task_id)

    return server


class RequireBearer:
    """ASGI wrapper: every HTTP request must carry `Authorization: Bearer <token>`, else 401 with a problem-details
    body. The token is compared in constant time and never logged."""

    def __init__(self, app, token: str):
        self.app = app
        self.expected = f"Bearer {token}".encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(given, self.expected):
                body = json.dumps({"type": "about:blank", "title": "Unauthorized", "status": 401,
                                   "detail": "Send the header Authorization: Bearer <token>, the token being the "
                                             "value of the environment variable named by the server's --token-env."})
                await send({"type": "http.response.start", "status": 401, "headers": [
                    (b"content-type", b"application/problem+json"), (b"www-authenticate", b'Bearer realm="mcp"'),
                    (b"content-length", str(len(body)).encode())]})
                await send({"type": "http.response.body", "body": body.encode()})
                return
        await self.app(scope, receive, send)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], prog="examples/tool_server.py")
    parser.add_argument("--port", type=int, required=True, help="the port to listen on")
    parser.add_argument("--host", default="127.0.0.1", help="the address to listen on (default: loopback only)")
    parser.add_argument("--log", help="append the call log (JSON lines) to this file (default: standard output)")
    parser.add_argument("--state", metavar="PATH",
                        help="keep the tools' state in this append-only journal (JSON lines, fsynced before each "
                             "answer, replayed at start); default: in memory only, forgotten at exit")
    parser.add_argument("--token-env", metavar="NAME",
                        help="require Authorization: Bearer <the value of environment variable NAME>")
    return parser.parse_args(argv)


async def serve(args: argparse.Namespace, token: str | None, stream: IO[str], journal: Journal,
                records: list[dict[str, Any]]) -> None:
    state = State(journal)
    for record in records:  # (in the event loop: a task's events belong to it)
        state.apply(record)
    server = build_server(CallLog(stream), state)
    app = server.streamable_http_app(streamable_http_path=MCP_PATH, stateless_http=True, json_response=True,
                                     host=args.host)
    if token is not None:
        app = RequireBearer(app, token)
    if args.state:
        unfinished = sum(not task.terminal for task in state.tasks.values())
        print(f"tool_server: state {args.state}: {len(state.values)} keys, {len(state.appended)} appended, "
              f"{len(state.applied_keys)} idempotency keys applied, {len(state.tasks)} tasks ({unfinished} resumed)",
              file=sys.stderr, flush=True)
    print(f"tool_server: serving MCP on http://{args.host}:{args.port}{MCP_PATH}", file=sys.stderr, flush=True)
    # A short graceful shutdown: a call sleeping in delay_ms (or a tasks/result waiting) must not hold a SIGTERM long.
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level="warning", timeout_graceful_shutdown=2)
    async with server.tasks.running():
        await uvicorn.Server(config).serve()


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    token = None
    if args.token_env:
        token = os.environ.get(args.token_env)
        if not token:
            print(f"tool_server: --token-env names {args.token_env!r}, which is not set or empty in the "
                  f"environment; set it to the bearer token callers must send", file=sys.stderr)
            return 2
    if token is None and args.host not in ("127.0.0.1", "localhost", "::1"):
        print(f"tool_server: warning: listening on {args.host} without --token-env: anyone who can reach it can "
              "call its tools", file=sys.stderr)
    journal = Journal(args.state)
    try:
        records = journal.open()
    except (JournalInUse, OSError, ValueError) as error:  # (ValueError: a record that is not JSON)
        print(f"tool_server: cannot use the state journal: {error}", file=sys.stderr)
        return 2
    stream = open(args.log, "a", encoding="utf-8") if args.log else sys.stdout
    anyio.run(serve, args, token, stream, journal, records)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
