"""Reads of the agent layer: the tool policy a call is decided by, and an agent task's conversation as people read
it (the console's task page, GET /runtime/tasks/{id}/transcript)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from django.db import connection

from agents_app.models import TenantToolPolicy, ToolServer, TranscriptMessage
from checkpoints_app.models import SideEffect
from config.base.json_input import dumps_bounded
from config.base.problems import Problem
from tasks_app.engine.decisions import DeadLetter
from tasks_app.engine.restore import state_read
from tasks_app.models import TERMINAL_STATUSES, TOOL_EVENT_TYPES, Step, Task, TaskEvent
from tasks_app.redaction import redact, redact_json
from tasks_app.registry import UnknownWorkflow, registry


def task_seconds_since_last_event(*, task_id) -> float:
    """How long ago, on the database's clock, the task's newest event was appended (0.0 without one): since its last
    step committed, or whatever else happened to it last (a resume, a recovery)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT extract(epoch FROM now() - at) FROM tasks_app_taskevent WHERE task_id = %s "
                       "ORDER BY seq DESC LIMIT 1", [task_id])
        row = cursor.fetchone()
    return max(float(row[0]), 0.0) if row else 0.0


def tenant_tool_policy_get(*, tenant_id) -> TenantToolPolicy | None:
    """The tenant's tool policy as it is now, with its tenant (so a decision's rule can name it). Read for every
    call, never kept: an edit in admin applies to the next call of every running task."""
    return TenantToolPolicy.objects.select_related("tenant").filter(tenant_id=tenant_id).first()


def task_tool_server_exists(*, task_id, name: str) -> bool:
    """Whether the task's tenant has a downstream tool server called ``name`` (one query, the task's row joined)."""
    return ToolServer.objects.filter(name=name, tenant__tasks__id=task_id).exists()


def tool_servers_of(*, tenant) -> list[dict[str, Any]]:
    """The tenant's downstream tool servers as GET /runtime/tool-servers shows them: name, URL, the protocol and
    tools its last check found (never the credential's value; not even its variable's name, an operator's concern)."""
    rows = ToolServer.objects.filter(tenant=tenant).order_by("name").values(
        "name", "url", "protocol_version", "tools", "tools_read_at", "enabled_tools")
    return [{"name": row["name"], "url": row["url"], "protocolVersion": row["protocol_version"] or None,
             "tools": [tool.get("name") for tool in row["tools"] or [] if isinstance(tool, dict)],
             "toolsReadAt": row["tools_read_at"], "enabledTools": row["enabled_tools"]} for row in rows]


# -- an agent task's conversation (the console's task page, GET /runtime/tasks/{id}/transcript) -----------------------
# What one message may show: a tool result goes back to the model at up to agent.TOOL_RESULT_MAX_CHARS, instructions
# at up to 50,000; a page shows the start and says how much was left out.
CONTENT_MAX_CHARS = 8_000
ARGUMENTS_MAX_CHARS = 2_000
# The events the conversation is joined with: the model's answers (they mark where each turn begins in the chain),
# the gateway's, and the people's (questions, approvals and their answers).
CONVERSATION_EVENT_TYPES = ("llm.message", *TOOL_EVENT_TYPES, "input_required", "steering.applied")
_RESTORE_TRIES = 3


class NotAnAgentTask(Problem):
    """The task runs a workflow without a model conversation (409: the task's kind, not the request, is the
    conflict; another tenant's task, or none, is a 404 before this is asked)."""

    status_code = 409
    slug = "not-an-agent-task"


@dataclass
class Conversation:
    """An agent task's messages in order (the window asked for), as a person may read them."""

    goal: str
    messages: list[dict[str, Any]] = field(default_factory=list)
    omitted: int = 0  # messages of the window's turns before its first message, left out (`last`)
    turns: int = 0  # model calls committed so far
    next_after_turn: int | None = None  # more turns after the window: ask again with afterTurn=this
    tokens_in: int = 0
    tokens_out: int = 0
    cost: Decimal = Decimal(0)
    model: str = ""
    unreadable: str = ""  # why the task's state could not be rebuilt (its next worker dead-letters it for that)


def is_agent_task(task: Task) -> bool:
    """Whether the task runs the agent loop (the `agent` workflow, or one built on it)."""
    from agents_app.agent import Agent  # (the workflow module imports the gateway, which imports this one)

    try:
        return issubclass(registry.get(task.workflow_name), Agent)
    except UnknownWorkflow:
        return False


def agent_state_read(*, task: Task) -> tuple[Task, dict[str, Any]]:
    """The task's durable state as of its last committed step, rebuilt the one way the engine rebuilds it
    (tasks_app.engine.restore.state_read: the latest good checkpoint and the verified step deltas after it), with
    the task row it was rebuilt for. Read only: no lease is taken, nothing is written.

    The race: the task row is read, then the checkpoint and the deltas, each at READ COMMITTED — a step that commits
    in between makes the history one step longer than the row says, which restore refuses as inconsistent. The row
    is read again and the state rebuilt again; a history that still does not add up raises DeadLetter (the worker
    that claims the task next dead-letters it for the same reason)."""
    for attempt in range(1, _RESTORE_TRIES + 1):
        try:
            return task, state_read(task).variables
        except DeadLetter:
            fresh = Task.objects.get(id=task.id)
            if attempt == _RESTORE_TRIES or fresh.steps_completed == task.steps_completed:
                raise
            task = fresh
    raise AssertionError("unreachable")


def task_conversation(*, task: Task, after_turn: int = 0, max_turns: int | None = None,
                      last: int | None = None) -> Conversation:
    """An agent task's conversation with its model: its messages in order (the digests its state keeps, turn by
    turn, joined with their transcript rows), each tool call with its outcome (the gateway's events and the ledger:
    made, denied, flagged, waiting for or refused an approval; a question to a person and who answered), and the
    running counters. What people see is redacted (tasks_app.redaction) and bounded (CONTENT_MAX_CHARS,
    ARGUMENTS_MAX_CHARS).

    The window: the turns after ``after_turn``, at most ``max_turns`` of them (``next_after_turn`` says where the
    next page starts), then at most the ``last`` messages of those (``omitted`` counts the ones before). Costs: the
    state's rebuild (a checkpoint and the deltas after it), one read of the window's transcript rows, one of the
    task's conversation events from the window's first turn on, one of the window's ledger rows and act steps.
    NotAnAgentTask for a task of another workflow."""
    if not is_agent_task(task):
        raise NotAnAgentTask(f"The task runs the workflow {task.workflow_name!r}, which has no conversation with a "
                             f"model; only an agent task (the `agent` workflow or one built on it) has a transcript.")
    from agents_app.agent import goal_text

    try:
        task, state = agent_state_read(task=task)
    except DeadLetter as corrupt:
        return Conversation(goal=redact(goal_text(task.goal, task.input)), cost=task.cost_spent,
                            unreadable=redact(f"{corrupt.reason}: {corrupt.message}"))
    turns = int(state.get("turns") or 0)
    conversation = Conversation(goal=redact(goal_text(task.goal, task.input)), turns=turns, cost=task.cost_spent,
                                tokens_in=int(state.get("tokens_in") or 0),
                                tokens_out=int(state.get("tokens_out") or 0))
    # Every message's place in the whole conversation (1, 2, …), then the window asked for.
    everything = [(turn, position, digest) for turn in range(1, turns + 1)
                  for position, digest in enumerate(state.get(f"m{turn:04d}") or [])]
    window = [(index, *ref) for index, ref in enumerate(everything, start=1) if ref[0] > after_turn]
    shown_turns = sorted({turn for _, turn, _, _ in window})
    if max_turns is not None and len(shown_turns) > max_turns:
        conversation.next_after_turn = shown_turns[max_turns - 1]
        window = [ref for ref in window if ref[1] <= conversation.next_after_turn]
    if last is not None and len(window) > last:
        conversation.omitted, window = len(window) - last, window[len(window) - last:]
    if not window:
        return conversation
    # (not transcript.messages_load: its cache is the workers'; a person paging through conversations would fill it)
    rows = dict(TranscriptMessage.objects.filter(task_id=task.id, digest__in={ref[3] for ref in window})
                .values_list("digest", "message"))
    events = _turn_events(task.id, first_turn=window[0][1])
    conversation.model = next((row["data"].get("model", "") for bucket in reversed(events.values()) for row in bucket
                               if row["type"] == "llm.message"), "")
    calls: dict[str, dict] = {}  # tool_call_id → the call's item, for the results that answer it
    people: dict[str, dict] = {}
    for rows_of_turn in events.values():
        people.update(_answers(rows_of_turn))
    conversation.messages = [_message_item(turn, position, index, digest, rows.get(digest), calls)
                             for index, turn, position, digest in window]
    _join_outcomes(task, conversation.messages, events, people)
    return conversation


def _text(value: Any, limit: int) -> tuple[str | None, int]:
    """Text for people: redacted, then cut at ``limit`` characters; (text, characters left out)."""
    if value is None:
        return None, 0
    text = redact(value if isinstance(value, str) else dumps_bounded(value, ensure_ascii=False))
    return (text, 0) if len(text) <= limit else (text[:limit], len(text) - limit)


def _arguments(text: str | None) -> tuple[str, int]:
    """A tool call's arguments as the model wrote them (JSON text), redacted — by key too (redaction.keys) when they
    parse — and bounded."""
    try:
        value = json.loads(text or "{}")
    except (ValueError, RecursionError):  # (a model's arguments nested past json.loads' reach: shown as text)
        return _text(text or "", ARGUMENTS_MAX_CHARS)
    shown = json.dumps(redact_json(value), ensure_ascii=False)
    return (shown, 0) if len(shown) <= ARGUMENTS_MAX_CHARS else (shown[:ARGUMENTS_MAX_CHARS],
                                                                 len(shown) - ARGUMENTS_MAX_CHARS)


def _message_item(turn: int, position: int, index: int, digest: str, message: dict | None,
                  calls: dict[str, dict]) -> dict[str, Any]:
    if message is None:  # (never, while the engine's invariant holds: a step's rows are written before it commits)
        return {"turn": turn, "index": index, "role": "", "kind": "missing", "digest": digest,
                "content": "[this message's transcript row is missing]", "contentCut": 0}
    role = str(message.get("role", ""))
    content, cut = _text(message.get("content"), CONTENT_MAX_CHARS)
    item: dict[str, Any] = {"turn": turn, "index": index, "role": role, "kind": role, "digest": digest,
                            "content": content, "contentCut": cut}
    if role == "system":
        item["kind"] = "instructions"
    elif role == "user":
        item["kind"] = "goal" if turn == 1 and position == 1 else "note"  # (a goal changed, a loop let go on)
    elif role == "assistant":
        item["kind"] = "answer"
        item["toolCalls"] = []
        for call in message.get("tool_calls") or []:
            function = call.get("function") or {}
            arguments, arguments_cut = _arguments(function.get("arguments"))
            call_item = {"id": call.get("id", ""), "name": function.get("name", ""), "arguments": arguments,
                         "argumentsCut": arguments_cut, "tool": None, "outcome": {"status": "pending", "detail": ""},
                         "resultIndex": None}
            item["toolCalls"].append(call_item)
            calls[call_item["id"]] = call_item
    elif role == "tool":
        item["kind"] = "tool_result"
        item["toolCallId"] = message.get("tool_call_id")
        call = calls.get(item["toolCallId"])
        if call is not None:
            call["resultIndex"] = index
            if call["name"] == "ask_human":
                item["kind"] = "human_answer"
    return item


def _turn_events(task_id, *, first_turn: int) -> dict[int, list[dict]]:
    """The task's conversation events by turn, from the model answer of ``first_turn`` on: each turn's llm.message
    and what followed it in the chain until the next one (its tool calls, their approvals, the questions asked)."""
    start = (TaskEvent.objects.filter(task_id=task_id, type="llm.message", data__turn=first_turn)
             .order_by("seq").values_list("seq", flat=True).first())
    if start is None:
        return {}
    buckets: dict[int, list[dict]] = {}
    turn = None
    for row in (TaskEvent.objects.filter(task_id=task_id, seq__gte=start, type__in=CONVERSATION_EVENT_TYPES)
                .order_by("seq").values("seq", "type", "data", "at")):
        row["data"] = row["data"] or {}
        if row["type"] == "llm.message":
            turn = row["data"].get("turn")
        if turn is not None:
            buckets.setdefault(turn, []).append(row)
    return buckets


def _answers(rows: list[dict]) -> dict[str, dict]:
    """Who answered each wait of a turn (steering.applied provide_input / approve / reject), by wait id."""
    return {row["data"]["waitId"]: {"by": row["data"].get("requestedBy") or "", "type": row["data"].get("type"),
                                    "decision": row["data"].get("decision"), "reason": row["data"].get("reason") or "",
                                    "at": row["at"]}
            for row in rows if row["type"] == "steering.applied" and row["data"].get("waitId")}


def _tool_of_effect(effect_name: str) -> str:
    """'shop.upsert:2' (the gateway's effect name: the tool and its call number in the step) → 'shop.upsert'."""
    return effect_name.rsplit(":", 1)[0] if ":" in effect_name else effect_name


def _names_match(tool: str, function: str) -> bool:
    """Whether a gateway's tool name (server.tool) or the agent's (the function name it refused) is the function the
    model called."""
    from agents_app.agent import function_name

    if tool == function:
        return True
    server, _, name = tool.partition(".")
    return bool(name) and function_name(server, name) == function


def _join_outcomes(task: Task, messages: list[dict], events: dict[int, list[dict]], people: dict[str, dict]) -> None:
    """Give each tool call of the window its outcome: the gateway's record of it, matched in order by name within
    its turn (the act step calls them in the order the model gave them, and the chain records them in that order),
    the ledger's row by its key, and the people who approved or answered it."""
    results = {item["index"]: item for item in messages if item["role"] == "tool"}
    by_turn: dict[int, list[dict]] = {}
    for item in messages:
        if item["role"] == "assistant":
            by_turn.setdefault(item["turn"], []).extend(item["toolCalls"])
            _usage(item, events.get(item["turn"], []))
    units_by_turn = {turn: _units(rows) for turn, rows in events.items() if turn in by_turn}
    _ledger_units(task, units_by_turn, turns=list(by_turn))
    keys = [unit["key"] for units in units_by_turn.values() for unit in units if unit["key"]]
    ledger = {row["key"]: row for row in SideEffect.objects.filter(task_id=task.id, key__in=keys)
              .values("key", "status", "attempts")}
    for turn, calls in by_turn.items():
        units = units_by_turn.get(turn, [])
        questions = [row for row in events.get(turn, []) if row["type"] == "input_required"
                     and not (row["data"].get("effect") or {}).get("key")]
        for call in calls:
            result = results.get(call["resultIndex"]) if call["resultIndex"] else None
            call["outcome"] = _outcome(call, units, questions, people, ledger, result)
            if call["outcome"]["status"] == "pending" and task.status in TERMINAL_STATUSES:
                call["outcome"]["status"] = "not called"  # (the task ended before its act step)
        assistant = next(item for item in messages if item["role"] == "assistant" and item["turn"] == turn)
        # Questions no call asked (the loop check's "go on or stop?"): shown with the turn.
        assistant["questions"] = [
            {"name": row["data"].get("name", ""), "prompt": redact(str(row["data"].get("prompt", ""))),
             "at": row["at"], "answeredBy": (people.get(row["data"].get("waitId")) or {}).get("by", ""),
             "answeredAt": (people.get(row["data"].get("waitId")) or {}).get("at")}
            for row in questions if not row.get("claimed")]


def _usage(item: dict, rows: list[dict]) -> None:
    """The model answer's usage, from its llm.message event (the one whose ref is this message, else the turn's)."""
    answers = [row for row in rows if row["type"] == "llm.message"]
    row = next((row for row in answers if row["data"].get("ref") == item["digest"]), answers[0] if answers else None)
    if row is not None:
        data = row["data"]
        item["at"] = row["at"]
        item["usage"] = {"model": data.get("model", ""), "finish": data.get("finish", ""),
                         "tokensIn": data.get("tokensIn"), "tokensOut": data.get("tokensOut"),
                         "cost": data.get("cost")}


def _units(rows: list[dict]) -> list[dict]:
    """A turn's gateway record as one unit per call, in the order the chain has them: keyed ones (asked for approval,
    made, its result, flagged; by the call's ledger key) and refusals (tool.denied: no key, nothing was made)."""
    units: list[dict] = []
    keyed: dict[str, dict] = {}

    def unit_for(key: str, tool: str) -> dict:
        if key not in keyed:
            keyed[key] = {"key": key, "tool": tool, "used": False}
            units.append(keyed[key])
        return keyed[key]

    for row in rows:
        data, kind = row["data"], row["type"]
        if kind == "tool.denied":
            units.append({"key": "", "tool": str(data.get("tool", "")), "used": False,
                          "denied": redact(str(data.get("rule", "")))})
        elif kind in ("tool.call", "tool.result", "tool.flagged") and data.get("key"):
            unit = unit_for(data["key"], str(data.get("tool", "")))
            if kind == "tool.call":
                unit["at"] = row["at"]
            elif kind == "tool.result":
                unit["result"], unit["ms"] = data.get("outcome", ""), data.get("ms")
            else:
                unit["flagged"] = f"flagged ({', '.join(map(str, data.get('rules') or []))}): {data.get('action', '')}"
        elif kind == "input_required" and (data.get("effect") or {}).get("key"):
            effect = data["effect"]
            unit = unit_for(effect["key"], _tool_of_effect(str(effect.get("name", ""))))
            unit.setdefault("waits", []).append({"waitId": data.get("waitId"), "kind": data.get("kind"),
                                                 "name": data.get("name"), "at": row["at"]})
    return units


def _ledger_units(task: Task, units_by_turn: dict[int, list[dict]], *, turns: list[int]) -> None:
    """Calls the ledger has and the chain does not (a step re-run after a crash took the ledger's recorded result:
    no new tool.call event), found through the turn's act step, placed by their call number among the turn's
    calls of the same tool."""
    steps = dict(Step.objects.filter(task_id=task.id, name="act", status="committed",
                                     output__turn__in=turns).values_list("seq", "output__turn"))
    if not steps:
        return
    for row in (SideEffect.objects.filter(task_id=task.id, step_seq__in=list(steps))
                .order_by("step_seq", "started_at", "key").values("key", "name", "step_seq")):
        units = units_by_turn.setdefault(steps[row["step_seq"]], [])
        if any(unit["key"] == row["key"] for unit in units):
            continue
        tool = _tool_of_effect(row["name"])
        number = _call_number(row["name"])
        later = next((i for i, unit in enumerate(units) if unit["key"] and unit["tool"] == tool
                      and _call_number(unit["key"]) > number), len(units))
        units.insert(later, {"key": row["key"], "tool": tool, "used": False})


def _call_number(name_or_key: str) -> int:
    tail = name_or_key.rsplit(":", 1)[-1]
    return int(tail) if tail.isdigit() else 0


def _outcome(call: dict, units: list[dict], questions: list[dict], people: dict[str, dict], ledger: dict,
             result: dict | None) -> dict[str, Any]:
    """One tool call's outcome for people: {status, detail, key, ms, ledger, attempts, approval, answeredBy}."""
    outcome: dict[str, Any] = {"status": "pending", "detail": "", "key": "", "ms": None, "ledger": "",
                               "attempts": None, "approval": None, "answeredBy": ""}
    answered = result is not None
    if call["name"] == "finish":
        outcome["status"] = "finished"
        return outcome
    if call["name"] == "ask_human":
        asked = next((row for row in questions if str(row["data"].get("name", "")).startswith("ask_human")
                      and not row.get("claimed")), None)
        if asked is not None:
            asked["claimed"] = True
            who = people.get(asked["data"].get("waitId")) or {}
            outcome["answeredBy"] = who.get("by", "")
            outcome["detail"] = redact(str(asked["data"].get("prompt", "")))
        outcome["status"] = "answered" if answered else "waiting for an answer" if asked is not None else "pending"
        return outcome
    unit = next((unit for unit in units if not unit["used"] and _names_match(unit["tool"], call["name"])), None)
    if unit is None:
        # Refused by the agent before the gateway (not offered, arguments not JSON, a repeated call): its result
        # says why, and the model read that.
        outcome["status"] = "not called" if answered else "pending"
        return outcome
    unit["used"] = True
    call["tool"] = unit["tool"] if "." in unit["tool"] else None
    outcome.update(key=unit["key"], ms=unit.get("ms"))
    if unit["key"] in ledger:
        outcome["ledger"], outcome["attempts"] = ledger[unit["key"]]["status"], ledger[unit["key"]]["attempts"]
    for wait in unit.get("waits", []):
        who = people.get(wait["waitId"])
        if wait["kind"] == "approval":
            outcome["approval"] = {"decision": (who or {}).get("decision") or "asked", "by": (who or {}).get("by", ""),
                                   "reason": (who or {}).get("reason", ""), "at": (who or {}).get("at")}
        elif who is not None:
            outcome["answeredBy"] = who["by"]  # (whether it happened, said by a person)
    approval = outcome["approval"]
    if unit.get("denied"):
        outcome["status"], outcome["detail"] = "denied", unit["denied"]
    elif approval and approval["decision"] == "rejected":
        outcome["status"] = "rejected"
        outcome["detail"] = f"by {approval['by']}" + (f": {approval['reason']}" if approval["reason"] else "")
    elif unit.get("result"):
        outcome["status"], outcome["detail"] = unit["result"], unit.get("flagged", "")
    elif approval and approval["decision"] == "asked":
        outcome["status"] = "waiting for approval"
    elif outcome["ledger"]:
        outcome["status"] = {"succeeded": "ok", "started": "calling"}.get(outcome["ledger"], outcome["ledger"])
    else:
        outcome["status"] = "answered" if answered else "pending"
    return outcome
