"""`runtime`: the runtime's REST API from a shell, built on tasks_app.client (installed with the project as
.venv/bin/runtime; `python -m tasks_app.client` runs the same)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from tasks_app.client import errors
from tasks_app.client.config import __doc__ as CONFIG_DOC
from tasks_app.client.errors import RuntimeClientError
from tasks_app.client.models import Event, Task
from tasks_app.client.sync import RuntimeClient

EPILOG = f"""\
Exit codes (for scripts):
  {errors.EXIT_OK}  done (a watched or awaited task completed)
  {errors.EXIT_TASK_UNSUCCESSFUL}  the watched or awaited task ended failed or cancelled
  {errors.EXIT_USAGE}  a bad command line, or a request the server refused as invalid (400, 413, 422)
  {errors.EXIT_NOT_FOUND}  no such task, artifact or path (404)
  {errors.EXIT_CONFLICT}  a conflict: the task changed since the version sent (409; --retry sends again at the
     current version), a finished task, a reused idempotency key, or no open wait to answer
  {errors.EXIT_AUTH}  no token, or the server refused it (401, 403)
  {errors.EXIT_UNAVAILABLE}  the server could not be reached, or failed (5xx)
  {errors.EXIT_TIMEOUT}  --timeout passed before the task ended (it goes on)

Server and token:
{CONFIG_DOC.split(chr(10), 2)[2]}"""


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "handler", None):
        parser.print_help(sys.stderr)
        return errors.EXIT_USAGE
    try:
        with RuntimeClient(args.url, profile=args.profile) as client:
            return args.handler(client, args)
    except RuntimeClientError as error:
        print(f"runtime: {error}", file=sys.stderr)
        if isinstance(error, errors.VersionConflict) and error.snapshot is not None:
            print(f"  the task is now at stateVersion {error.snapshot.state_version} "
                  f"({error.snapshot.internal_status}); nothing was queued. Run again, or add --retry to send it at "
                  f"the current version.", file=sys.stderr)
        return error.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `runtime … | head`: the reader went away
        return 0


# -- the command line --------------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--url", default=argparse.SUPPRESS, help="the server (default: RUNTIME_URL, the config "
                                                                  "file, http://127.0.0.1:8000)")
    common.add_argument("--profile", default=argparse.SUPPRESS, help="a profile (table) of the config file")
    common.add_argument("--output", choices=("text", "json"), default=argparse.SUPPRESS,
                        help="text for people (default), json for scripts")
    parser = argparse.ArgumentParser(
        prog="runtime", parents=[common], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EPILOG,
        description="Create, follow and steer the runtime's tasks through its REST API.")
    parser.set_defaults(url=None, profile=None, output="text", handler=None)
    commands = parser.add_subparsers(title="commands", metavar="COMMAND")

    def command(group, name: str, handler, help_text: str) -> argparse.ArgumentParser:
        sub = group.add_parser(name, parents=[common], help=help_text, description=help_text)
        sub.set_defaults(handler=handler, handler_action=name)
        return sub

    def steering_options(sub: argparse.ArgumentParser, *, reason_required: bool = False) -> None:
        sub.add_argument("--reason", default="", required=reason_required, help="why (kept in the audit trail)")
        sub.add_argument("--expected-version", type=int, metavar="N",
                         help="the stateVersion you decided on (default: the task's current one, read now)")
        sub.add_argument("--retry", action="store_true",
                         help="on 409 (the task changed), send it again at the current version")

    tasks = commands.add_parser("tasks", help="list, get, create and watch tasks").add_subparsers(metavar="ACTION",
                                                                                                  required=True)
    listing = command(tasks, "list", cmd_tasks_list, "your tenant's tasks, newest first")
    listing.add_argument("--status", choices=("working", "input_required", "completed", "failed", "cancelled"))
    listing.add_argument("--internal-status")
    listing.add_argument("--workflow")
    listing.add_argument("--limit", type=int, default=20, help="at most this many (default 20)")
    get = command(tasks, "get", cmd_tasks_get, "a task's snapshot")
    get.add_argument("task")
    create = command(tasks, "create", cmd_tasks_create, "start a task")
    create.add_argument("workflow")
    create.add_argument("--input", type=json_argument, default={}, metavar="JSON",
                        help="the input, as JSON (@file reads a file, - standard input)")
    create.add_argument("--goal", type=loose_json_argument, metavar="JSON|TEXT")
    create.add_argument("--priority", type=int, choices=range(10), metavar="0-9")
    create.add_argument("--approve-before", action="append", metavar="EFFECT",
                        help="wait for an approval before each effect of this name (repeatable)")
    create.add_argument("--idempotency-key", help="the same key and body answer the same task")
    create.add_argument("--wait", action="store_true", help="follow it to its end (exit 1 if it fails or is "
                                                             "cancelled)")
    create.add_argument("--timeout", type=float, metavar="SECONDS", help="with --wait: give up after this long")
    watch = command(tasks, "watch", cmd_tasks_watch, "follow a task live to its end: progress, phase, waits")
    watch.add_argument("task")
    watch.add_argument("--last-event-id", type=int, metavar="SEQ", help="resume after this event")
    watch.add_argument("--timeout", type=float, metavar="SECONDS")
    watch.add_argument("--until", type=lambda text: set(text.split(",")), metavar="STATUS[,STATUS]",
                       help="stop once the task is in one of these statuses (e.g. paused, input_required), exit 0")

    steer = commands.add_parser("steer", help="pause, resume, cancel, kill, reprioritise or adjust a task") \
        .add_subparsers(metavar="ACTION", required=True)
    for name, help_text in (("pause", "pause at the next safe point"), ("resume", "resume a paused task"),
                            ("cancel", "cancel (without --expected-version: no version check)")):
        steering_options(command(steer, name, cmd_steer, help_text))
        steer.choices[name].add_argument("task")
    kill = command(steer, "kill", cmd_steer, "stop at once, without waiting for the running step (operators)")
    kill.add_argument("task")
    steering_options(kill, reason_required=True)
    priority = command(steer, "priority", cmd_steer, "set the priority (0 lowest … 9 most urgent)")
    priority.add_argument("task")
    priority.add_argument("priority", type=int, choices=range(10), metavar="0-9")
    steering_options(priority)
    adjust = command(steer, "adjust", cmd_steer, "adjust the goal or parameters (the workflow re-plans)")
    adjust.add_argument("task")
    adjust.add_argument("--goal", type=loose_json_argument, metavar="JSON|TEXT")
    adjust.add_argument("--parameters", type=json_argument, metavar="JSON")
    steering_options(adjust)

    answer = command(commands, "answer", cmd_answer, "answer the task's open question (an input wait)")
    answer.add_argument("task")
    answer.add_argument("value", type=loose_json_argument, help="the answer, as JSON (else the text itself)")
    for sub in (answer, command(commands, "approve", cmd_answer, "approve the effect the task waits on"),
                command(commands, "reject", cmd_answer, "reject the effect the task waits on")):
        if sub is not answer:
            sub.add_argument("task")
        sub.add_argument("--wait-id", help="the wait to answer (default: the task's open wait)")
        steering_options(sub)

    events = command(commands, "events", cmd_events, "a task's stored events (with TASK), or your tenant's live "
                                                     "status events (without)")
    events.add_argument("task", nargs="?")
    events.add_argument("--after", type=int, default=0, metavar="SEQ", help="only events after this seq")
    events.add_argument("--follow", action="store_true", help="with TASK: go on live until the task ends")
    events.add_argument("--limit", type=int, metavar="N", help="stop after N events")

    artifacts = commands.add_parser("artifacts", help="a task's files").add_subparsers(metavar="ACTION",
                                                                                       required=True)
    command(artifacts, "list", cmd_artifacts_list, "the files a task wrote").add_argument("task")
    artifact_get = command(artifacts, "get", cmd_artifacts_get, "download one")
    artifact_get.add_argument("task")
    artifact_get.add_argument("name")
    artifact_get.add_argument("--to", metavar="PATH", help="where to write it (default: ./NAME; - standard output)")

    fork = command(commands, "fork", cmd_fork, "a new task that starts again at a step of a task (its state there), "
                                               "with a corrected goal or input")
    fork.add_argument("task")
    at = fork.add_mutually_exclusive_group(required=True)
    at.add_argument("--from-step", type=int, metavar="N", help="the step it starts again at (1 = the first)")
    at.add_argument("--from-turn", type=int, metavar="N", help="an agent: the turn it starts again at")
    fork.add_argument("--goal", type=loose_json_argument, metavar="JSON|TEXT")
    fork.add_argument("--input", type=json_argument, metavar="JSON")
    fork.add_argument("--wait", action="store_true")
    fork.add_argument("--timeout", type=float, metavar="SECONDS")

    command(commands, "tool-servers", cmd_tool_servers, "your tenant's downstream MCP tool servers")
    return parser


def json_argument(text: str) -> Any:
    if text == "-":
        text = sys.stdin.read()
    elif text.startswith("@"):
        text = Path(text[1:]).expanduser().read_text()
    try:
        return json.loads(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"not JSON ({error})") from None


def loose_json_argument(text: str) -> Any:
    """JSON if it parses, else the text itself (a goal, an answer in words)."""
    try:
        return json_argument(text)
    except argparse.ArgumentTypeError:
        return text


# -- output ------------------------------------------------------------------------------------------------------
def emit(args, value: Any, text: str) -> None:
    print(json.dumps(value, ensure_ascii=False) if args.output == "json" else text, flush=True)


def task_text(task: Task) -> str:
    lines = [f"{task.task_id}  {task.workflow}  {task.status} ({task.internal_status})",
             f"  {task.status_message}" + (f"  phase: {task.phase}" if task.phase else ""),
             f"  progress {task.progress:.0%}, {task.steps_completed} steps, stateVersion {task.state_version}, "
             f"priority {task.priority}"]
    forked = task.raw.get("forkedFrom")
    if isinstance(forked, dict):
        lines.append(f"  forked from {forked.get('taskId')} at step {forked.get('fromStep')}")
    if task.wait is not None:
        lines.append(f"  waits ({task.wait.kind} {task.wait.wait_id}): {task.wait.prompt}")
        if task.wait.name == "effect_outcome" and isinstance(task.wait.effect, dict):
            lines.extend(f"    {label}: {text}" for label, text in outcome_facts(task.wait.effect))
    if task.status == "completed":
        lines.append(f"  result: {json.dumps(task.result, ensure_ascii=False)}")
    if task.error:
        lines.append(f"  error: {task.error.get('type', '')}: {task.error.get('message', '')}")
    return "\n".join(lines)


# "Did this effect happen?" (issue 38, build 3): the facts a person decides by, one a line, from the wait's `effect`
# as the API gives it (the server's tasks_app.engine.waits.outcome_facts words them alike; this client imports no
# server code). Answer with: answer TASK '{"outcome": "not_applied"}' --reason "…" (applied: with "result", optional).
OUTCOME_HINTS = ("readOnlyHint", "idempotentHint", "destructiveHint")
OUTCOME_UNKNOWN_WHY = {"worker_died": "its worker stopped mid-call", "timed_out": "no answer came within its timeout",
                       "dropped_after_send": "the connection broke after the call was sent",
                       "answer_unusable": "its server's answer could not be used"}


def outcome_facts(effect: dict[str, Any]) -> list[tuple[str, str]]:
    called = (f"{effect['server']} -> {effect['tool']}" if effect.get("server") and effect.get("tool")
              else str(effect.get("name") or ""))
    facts = [("called", called), ("key", str(effect.get("key") or ""))]
    shown = effect.get("arguments")
    if isinstance(shown, dict) and effect.get("server") and set(shown) <= {"server", "tool", "arguments"}:
        shown = shown.get("arguments")
    if shown is not None:
        facts.append(("arguments (redacted)", json.dumps(shown, ensure_ascii=False, sort_keys=True)[:1000]))
    facts.append(("sent at", str(effect.get("sentAt") or "not recorded")))
    why = str(effect.get("unknownWhy") or "")
    facts.append(("outcome unknown because", OUTCOME_UNKNOWN_WHY.get(why, why or "no answer came")
                  + (f" ({why})" if why in OUTCOME_UNKNOWN_WHY else "")))
    annotations = effect.get("annotations")
    facts.append(("annotations", ", ".join(
        f"{hint}={'?' if annotations.get(hint) is None else str(annotations[hint]).lower()}" for hint in OUTCOME_HINTS)
        if isinstance(annotations, dict) else "none known"))
    deadline = effect.get("deadline")
    facts.append(("deadline", f"{deadline} (passed: the call can no longer land)" if deadline and
                  effect.get("deadlinePassed") is not False else str(deadline or "none recorded")))
    return facts


def final_code(task: Task) -> int:
    return errors.EXIT_OK if task.status == "completed" else errors.EXIT_TASK_UNSUCCESSFUL


class Watcher:
    """Shows a task's events as they come: a progress bar redrawn in place with the live phase on a terminal, a line
    per event otherwise, a JSON line per event with --output json."""

    WIDTH = 24

    def __init__(self, args):
        self.json = args.output == "json"
        self.tty = sys.stdout.isatty() and not self.json
        self.bar_shown = False

    def __call__(self, event: Event) -> None:
        if self.json:
            print(json.dumps(event.as_json(), ensure_ascii=False), flush=True)
            return
        if event.type == "progress" and self.tty:
            data = event.payload
            self.draw(float(data.get("progress") or 0), data.get("stepsCompleted"), data.get("phase"))
            return
        line = self.describe(event)
        if line:
            if self.bar_shown:
                sys.stdout.write("\n")
                self.bar_shown = False
            print(line, flush=True)
        if event.opening and self.tty:  # where it stands, drawn at once (joined late or after a gap: no progress
            snapshot = event.snapshot   # event may come before the end)
            self.draw(snapshot.progress, snapshot.steps_completed, snapshot.phase)

    def draw(self, progress: float, steps, phase) -> None:
        filled = int(self.WIDTH * progress)
        bar = "#" * filled + "-" * (self.WIDTH - filled)
        sys.stdout.write(f"\r[{bar}] {progress:4.0%}  {steps} steps  {phase or ''}\033[K")
        sys.stdout.flush()
        self.bar_shown = True

    def reconnecting(self, reason: str, last_seq: int | None) -> None:
        if self.bar_shown:
            sys.stdout.write("\n")
            sys.stdout.flush()
            self.bar_shown = False
        after = f" after event #{last_seq}" if last_seq is not None else ""
        print(f"runtime: the stream dropped ({reason}); reconnecting{after}", file=sys.stderr, flush=True)

    @classmethod
    def describe(cls, event: Event) -> str:
        if event.type == "task":  # the tenant's stream (runtime events without TASK): one task's event, inside
            inner = Event(type=str(event.data.get("type", "")), seq=event.data.get("seq"), data=event.data)
            return f"{event.data.get('taskId', '')}  {cls.describe(inner)}"
        data = event.payload
        seq = f"#{event.seq} " if event.seq is not None else ""
        if event.opening:
            snapshot = event.snapshot
            gap = f" (re-read: events {event.gap[0]}–{event.gap[1]} were missed)" if event.gap else ""
            return f"{seq}{snapshot.internal_status}: {snapshot.status_message}, {snapshot.progress:.0%}{gap}"
        if event.type == "progress":
            return (f"{seq}progress {float(data.get('progress') or 0):.0%}  {data.get('stepsCompleted')} steps"
                    f"  {data.get('phase') or ''}").rstrip()
        if event.type == "status":
            return f"{seq}{data.get('status')}" + (f": {data['message']}" if data.get("message") else "")
        if event.type == "input_required":
            return f"{seq}waits ({data.get('kind')} {data.get('waitId')}): {data.get('prompt')}"
        if event.type == "terminal":
            return f"{seq}ended: {data.get('status', '')}"
        if event.seq is None:
            return ""  # live-only items (an agent's tokens) are not shown line by line
        return f"{seq}{event.type} {json.dumps(data, ensure_ascii=False)}"


def _read_after_the_stream(client: RuntimeClient, task_id: str, seconds: float = 60):
    """The task once its stream ended: read again for a while if the server went away right then (a restart)."""
    give_up_at = time.monotonic() + seconds
    while True:
        try:
            return client.get_task(task_id)
        except errors.ConnectionFailed:
            if time.monotonic() > give_up_at:
                raise
            time.sleep(1)


def follow(client: RuntimeClient, args, task_id: str, *, last_event_id: int | None = None) -> int:
    show = Watcher(args)
    until = getattr(args, "until", None) or set()
    reached = False
    stream = client.watch(task_id, last_event_id=last_event_id, timeout=getattr(args, "timeout", None),
                          on_reconnect=show.reconnecting)
    try:
        for event in stream:
            show(event)
            snapshot = event.snapshot if event.opening else None
            statuses = {snapshot.status, snapshot.internal_status} if snapshot else (
                {event.payload.get("status")} if event.type == "status" else set())
            if until & statuses:
                reached = True
                break
    finally:
        stream.close()
    task = _read_after_the_stream(client, task_id)
    if show.bar_shown:
        sys.stdout.write("\n")
    print(json.dumps(task.raw, ensure_ascii=False) if show.json else task_text(task), flush=True)
    return errors.EXIT_OK if reached else final_code(task)


# -- the commands ------------------------------------------------------------------------------------------------
def cmd_tasks_list(client: RuntimeClient, args) -> int:
    filters = {"status": args.status, "internal_status": args.internal_status, "workflow": args.workflow}
    found = []
    for summary in client.iter_tasks(limit=min(max(args.limit, 1), 200), **filters):
        found.append(summary)
        if len(found) >= args.limit:
            break
    emit(args, [s.raw for s in found], "\n".join(
        f"{s.task_id}  {s.workflow:16} {s.status:15} {s.progress:4.0%}  {s.created_at}" for s in found)
        or "no tasks")
    return 0


def cmd_tasks_get(client: RuntimeClient, args) -> int:
    task = client.get_task(args.task)
    emit(args, task.raw, task_text(task))
    return 0


def cmd_tasks_create(client: RuntimeClient, args) -> int:
    if not isinstance(args.input, dict):
        raise errors.InvalidRequest(400, {"title": "Invalid input", "detail": "--input must be a JSON object."})
    options = {"goal": args.goal, "priority": args.priority}
    if args.approve_before:
        options["approval_policy"] = {"before": args.approve_before}
    task = client.create_task(args.workflow, args.input, idempotency_key=args.idempotency_key, **options)
    if not args.wait:
        emit(args, task.raw, task_text(task))
        return 0
    if args.output == "text":
        print(task.task_id, flush=True)
    return follow(client, args, task.task_id)


def cmd_tasks_watch(client: RuntimeClient, args) -> int:
    return follow(client, args, args.task, last_event_id=args.last_event_id)


def cmd_steer(client: RuntimeClient, args) -> int:
    action = args.handler_action
    versioned = {"expected_version": args.expected_version, "reason": args.reason, "retry_on_conflict": args.retry}
    if action == "cancel" and args.expected_version is None:
        task = client.cancel(args.task, reason=args.reason)
        emit(args, task.raw, f"{task.task_id}: {task.internal_status} ({task.status_message})")
        return 0
    if action == "priority":
        result = client.set_priority(args.task, args.priority, **versioned)
    elif action == "adjust":
        if args.goal is None and args.parameters is None:
            raise errors.InvalidRequest(400, {"title": "Nothing to adjust", "detail": "Give --goal, --parameters or "
                                                                                       "both."})
        result = client.adjust_goal(args.task, goal=args.goal, parameters=args.parameters, **versioned)
    else:
        result = client.steer(args.task, action, **versioned)
    emit(args, result.raw, f"{action}: {result.status} (command {result.command_id}, stateVersion "
                           f"{result.state_version}); applied at the task's next safe point")
    return 0


def cmd_answer(client: RuntimeClient, args) -> int:
    action = args.handler_action
    options = {"wait_id": args.wait_id, "expected_version": args.expected_version, "reason": args.reason,
               "retry_on_conflict": args.retry}
    if action == "answer":
        result = client.answer(args.task, args.value, **options)
    else:
        result = getattr(client, action)(args.task, **options)
    emit(args, result.raw, f"{action}: {result.status} (command {result.command_id}, stateVersion "
                           f"{result.state_version})")
    return 0


def cmd_events(client: RuntimeClient, args) -> int:
    show = Watcher(args)
    shown = 0
    if args.task is None:
        source = client.tenant_events()
    elif args.follow:
        source = client.watch(args.task, last_event_id=args.after)
    else:
        source = iter(client.events(args.task, after=args.after))
    try:
        for event in source:
            show(event)
            shown += 1
            if args.limit and shown >= args.limit:
                break
    finally:
        close = getattr(source, "close", None)
        if close:
            close()
    return 0


def cmd_artifacts_list(client: RuntimeClient, args) -> int:
    found = client.artifacts(args.task)
    emit(args, [a.raw for a in found], "\n".join(f"{a.name:32} {a.bytes:>10}  {a.content_type:24} {a.created_at}"
                                                 for a in found) or "no artifacts")
    return 0


def cmd_artifacts_get(client: RuntimeClient, args) -> int:
    if args.to == "-":
        client.download_artifact(args.task, args.name, sys.stdout.buffer)
        sys.stdout.buffer.flush()
        return 0
    target = Path(args.to or Path(args.name).name)
    written = client.download_artifact(args.task, args.name, target)
    emit(args, {"name": args.name, "path": str(target), "bytes": written}, f"wrote {target} ({written} bytes)")
    return 0


def cmd_fork(client: RuntimeClient, args) -> int:
    task = client.fork(args.task, from_step=args.from_step, from_turn=args.from_turn, goal=args.goal,
                       input=args.input)
    if not args.wait:
        emit(args, task.raw, task_text(task))
        return 0
    if args.output == "text":
        print(task.task_id, flush=True)
    return follow(client, args, task.task_id)


def cmd_tool_servers(client: RuntimeClient, args) -> int:
    servers = client.tool_servers()
    emit(args, [s.raw for s in servers], "\n".join(
        f"{s.name:20} {s.url}  {s.protocol_version or 'not checked'}  {len(s.tools)} tools"
        + (f": {', '.join(s.tools)}" if s.tools else "") for s in servers) or "no tool servers")
    return 0


if __name__ == "__main__":
    sys.exit(main())
