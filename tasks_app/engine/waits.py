"""Waits: a step asks a person for input, or an effect waits for approval (ARCHITECTURE §3, §5, §6).

Pure functions shared by the engine (which enters waits) and steering (which resolves them). A wait's id is
derived from where it was asked, never random, so the same wait entered again after a crash (or re-asked by the
re-run of a suspended step) keeps the id a client may already be answering:

- an input wait: the step that asked (its seq) and the name;
- an approval: the plan version and the effect's idempotency key. After adjust_goal (plan_version + 1) the same
  effect asks again: an approval given for the old plan does not carry over to the new one;
- a budget wait: the number of steps committed when it was entered (the safe point before the next step).

A task's answers (Task.answers) map wait ids to what resolved them. Only the web side writes them, while no worker
holds the task, and a slice reads them once, at its claim.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterable
from decimal import Decimal
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from config.base import json_input
from config.base.canonical import storable
from tasks_app.redaction import redact, redact_json

INPUT = "input"
APPROVAL = "approval"
BUDGET = "budget"  # a budget is spent and the task's policy is "wait": answered by set_budget, not by an answer
PROMPT_MAX_CHARS = 2000
WAIT_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]{0,63}$")
# What an approval asks for: nothing but the decision (approve / reject are their own commands).
APPROVAL_SCHEMA = {"type": "object", "properties": {}, "additionalProperties": False}


class ApprovalRequired(BaseException):
    """Raised by ctx.effect() before an effect that needs approval and has none yet: the attempt stops before the
    call, and the task waits. A BaseException, so step code that catches Exception cannot swallow it and run on."""

    def __init__(self, wait: dict):
        super().__init__(wait["prompt"])
        self.wait = wait


class QuestionRequired(ApprovalRequired):
    """Raised by a step mid-way to ask a person something it cannot go on without (a downstream task's question,
    relayed by the tool gateway): like an approval, the attempt stops, what it called is recorded, and the step runs
    again from its start once the wait is answered (its answer: ctx.answer_for(wait_id))."""


def downstream_question_wait(*, task_id, step_seq: int, plan_version: int, tool: str, downstream_task: str,
                             request_key: str, message: str, schema: dict) -> dict:
    """A downstream task's input request, as our task's input wait: answered by provide_input like any other, and
    sent on to the downstream task (tasks/update) by the step's re-run. Its id is derived from the downstream task
    and its request key, so the same question asked again is the same wait."""
    return {"waitId": _wait_id(task_id, f"downstream:{downstream_task}:{request_key}"), "kind": INPUT,
            "name": "downstream_input", "prompt": _prompt(f"{tool} asks: {message}"),
            "schema": schema if isinstance(schema, dict) else {"type": "object"}, "step": step_seq,
            "planVersion": plan_version,
            "downstream": {"tool": tool, "taskId": downstream_task, "requestKey": request_key}}


REVIEW_SCHEMA = {
    "type": "object", "required": ["decision"], "additionalProperties": False,
    "properties": {"decision": {"enum": ["pass", "redact", "reject"],
                                "description": "pass: the step gets the result as it is; redact: with the flagged "
                                               "parts removed; reject: the step fails (tool_result_rejected)."}},
}


def tool_result_review_wait(*, task_id, step_seq: int, plan_version: int, tool: str, effect_key: str,
                            findings: list[dict]) -> dict:
    """A tool result the injection screen flagged, held for a person (tools.screening: hold): what was found is
    shown (rules, where, redacted excerpts — never the result itself)."""
    found = "; ".join(f"{f.get('rule')} at {f.get('where')}: {f.get('excerpt')}" for f in findings[:5])
    return {"waitId": _wait_id(task_id, f"review:{effect_key}"), "kind": INPUT, "name": "tool_result_review",
            "prompt": _prompt(f"The result of {tool} looks like it carries instructions for the model ({found}). "
                              f"Pass it, pass it redacted, or reject it?"),
            "schema": REVIEW_SCHEMA, "step": step_seq, "planVersion": plan_version,
            "effect": {"name": tool, "key": effect_key, "arguments": {"findings": redacted(findings[:20])}}}


class ExternalWait(BaseException):
    """Raised by a step (through ctx.tool, when a downstream server answered with a task still running) to wait for
    something outside without holding a worker: what the attempt called is recorded (never called again), its state
    changes are dropped, and the step runs again from its start after ``seconds`` — on whichever worker takes the
    task then. A BaseException, so step code that catches Exception cannot swallow it and run on."""

    MIN_SECONDS = 0.5
    MAX_SECONDS = 300.0

    def __init__(self, seconds: float, message: str):
        super().__init__(message)
        self.seconds = min(max(float(seconds), self.MIN_SECONDS), self.MAX_SECONDS)
        self.message = message


class EffectRejected(Exception):
    """Raised by ctx.effect() when a person rejected the effect: it was not called and will not be. A step may catch
    it and go on without the effect; uncaught, it fails the task at once (retrying would be refused again)."""

    def __init__(self, name: str, reason: str):
        super().__init__(f"effect {name!r} was rejected" + (f": {reason}" if reason else ""))
        self.name = name
        self.reason = reason


def _wait_id(task_id, where: str) -> str:
    return str(uuid.uuid5(uuid.UUID(str(task_id)), where))


def input_wait(*, task_id, step_seq: int, plan_version: int, name: str, schema: dict, prompt: str) -> dict:
    """The record of an input wait, as the step's delta keeps it (and the task row shows it while it waits)."""
    if not isinstance(name, str) or not WAIT_NAME.match(name):
        raise ValueError("a wait's name is 1–64 letters, digits, '_', '.' or '-', starting with a letter")
    if not isinstance(schema, dict):
        raise TypeError("a wait's schema is a JSON Schema object")
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as error:
        raise ValueError(f"wait {name!r} has an invalid JSON Schema: {error.message}") from None
    return {"waitId": _wait_id(task_id, f"{INPUT}:{step_seq}:{name}"), "kind": INPUT, "name": name,
            "prompt": _prompt(prompt), "schema": schema, "step": step_seq, "planVersion": plan_version}


def parts_wait(*, task_id, step_seq: int, plan_version: int, name: str, prompt: str, parts: dict) -> dict:
    """An input wait with several questions, answerable one at a time (provide_input with ``part``) or together:
    ``parts`` = {part: {"schema": JSON Schema, "prompt": text}}. The task waits until every part is answered."""
    if not isinstance(parts, dict) or not parts:
        raise ValueError("a wait's parts are a non-empty {part: {'schema': …, 'prompt': …}} mapping")
    shown = {}
    for part, spec in parts.items():
        if not isinstance(part, str) or not WAIT_NAME.match(part):
            raise ValueError(f"part name {part!r}: 1–64 letters, digits, '_', '.' or '-', starting with a letter")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
            raise TypeError(f"part {part!r} needs a JSON Schema under 'schema'")
        shown[part] = {"schema": input_wait(task_id=task_id, step_seq=step_seq, plan_version=plan_version, name=part,
                                            schema=spec["schema"], prompt=spec.get("prompt", ""))["schema"],
                       "prompt": _prompt(spec.get("prompt", ""))}
    wait = input_wait(task_id=task_id, step_seq=step_seq, plan_version=plan_version, name=name, prompt=prompt,
                      schema={"type": "object", "properties": {part: spec["schema"] for part, spec in shown.items()},
                              "required": list(shown), "additionalProperties": False})
    return {**wait, "parts": shown}


def approval_wait(*, task_id, step_seq: int, plan_version: int, effect_name: str, effect_key: str,
                  arguments: Any, repeat: bool = False) -> dict:
    asked = (f"This task is a fork: its original already made the effect {effect_name!r} at this step. Make it again "
             f"(under this task's own key)?" if repeat else f"Approve the effect {effect_name!r}?")
    return {"waitId": approval_wait_id(task_id, plan_version=plan_version, effect_key=effect_key),
            "kind": APPROVAL, "name": effect_name, "prompt": _prompt(asked), "schema": APPROVAL_SCHEMA,
            "effect": {"name": effect_name, "key": effect_key, "arguments": redacted(arguments)},
            "step": step_seq, "planVersion": plan_version}


# "Did this happen?": asked about an effect whose outcome nobody can tell (the worker died mid-call, no answer came)
# when its caller chose to ask a person rather than dead-letter the task (ctx.effect(ask=True): every tool call).
# An input wait like any other — answered by provide_input from the console, REST or MCP — whose answer the step's
# re-run reads when the ledger asks who knows the outcome.
OUTCOME_SCHEMA = {
    "type": "object",
    "required": ["outcome"],
    "additionalProperties": False,
    "properties": {
        "outcome": {"enum": ["applied", "not_applied", "abandon"],
                    "description": "applied: it happened (give its result if the task needs it); not_applied: it "
                                   "did not happen, call it again with the same key; abandon: fail the task."},
        "result": {"description": "What it returned, as the step should receive it (only with applied)."},
    },
}


class EffectAbandoned(Exception):
    """A person answered "abandon" to whether an effect happened: the task fails at once with that reason."""

    retryable = False
    reason = "effect_abandoned"

    def __init__(self, name: str, key: str):
        super().__init__(f"a person abandoned the task rather than say whether {name!r} (key {key}) happened")
        self.effect_key = key  # left unknown in the ledger: that is the truth of it


def effect_outcome_wait_id(task_id, *, effect_key: str) -> str:
    return _wait_id(task_id, f"outcome:{effect_key}")  # a fact about a call: the same whatever the plan version


# Why an effect's outcome is unknown (checkpoints_app.models.UnknownWhy), as the question says it.
UNKNOWN_WHY_TEXT = {
    "worker_died": "its worker stopped mid-call",
    "timed_out": "no answer came within its timeout",
    "dropped_after_send": "the connection broke after the call was sent",
    "answer_unusable": "its server's answer could not be used",
}


# The MCP tool annotations a person deciding "did this happen?" is shown (as the tool declared them; None: not declared).
ANNOTATION_HINTS = ("readOnlyHint", "idempotentHint", "destructiveHint")


def effect_outcome_wait(*, task_id, step_seq: int, plan_version: int, effect_name: str, effect_key: str,
                        arguments: Any, facts: dict | None = None, about: dict | None = None) -> dict:
    """``facts``: {"sentAt", "deadline", "why"} from the effect's ledger row (tasks_app.engine.effects), asked only
    once the deadline has passed — said so, for the person checks the remote system knowing it can no longer land.
    ``about``: what the step knows of the call besides its arguments — {"server", "tool", "annotations"} for a tool
    call (the gateway, from the tool list it called with: never re-read here). Everything shown is in the payload's
    ``effect`` (the console, REST, the CLI and MCP show the same facts) and, in words, in its prompt."""
    facts, about = facts or {}, about or {}
    annotations = about.get("annotations")
    effect = {"name": effect_name, "key": effect_key, "arguments": redacted(arguments),
              "server": about.get("server"), "tool": about.get("tool"),
              "annotations": ({hint: annotations.get(hint) for hint in ANNOTATION_HINTS}
                              if isinstance(annotations, dict) else None),
              "sentAt": facts.get("sentAt"), "deadline": facts.get("deadline"), "unknownWhy": facts.get("why"),
              # Asked only past the deadline (effects.decide): True with one.
              "deadlinePassed": True if facts.get("deadline") else None}
    facts_text = " ".join(f"{label}: {text}." for label, text in outcome_facts(effect))
    return {"waitId": effect_outcome_wait_id(task_id, effect_key=effect_key), "kind": INPUT,
            "name": "effect_outcome",
            "prompt": _prompt(f"Did {effect_name} happen? {facts_text} Check the remote system, then answer applied "
                              f"(with its result, if the task needs it), not_applied (it is called again with the same "
                              f"key) or abandon."),
            "schema": OUTCOME_SCHEMA, "step": step_seq, "planVersion": plan_version, "effect": effect}


def outcome_facts(effect: dict) -> list[tuple[str, str]]:
    """The facts of a "did this happen?" question as (label, words) — what was called, when, why nobody knows, the
    tool's annotations, the deadline — from a wait's ``effect`` (or a dead letter's open effect in the same shape):
    the one wording the console, the CLI and MCP show."""
    called = (f"{effect['server']} → {effect['tool']}" if effect.get("server") and effect.get("tool")
              else str(effect.get("name") or ""))
    shown = effect.get("arguments")
    if isinstance(shown, dict) and effect.get("server") and set(shown) <= {"server", "tool", "arguments"}:
        shown = shown.get("arguments")  # (the gateway's record of a call: server and tool are said above)
    facts = [("Called", called), ("Key", str(effect.get("key") or ""))]
    if shown is not None:
        facts.append(("Arguments (redacted)", json_input.dumps_bounded(shown, sort_keys=True)[:1000]))
    facts.append(("Sent at", effect.get("sentAt") or "not recorded"))
    why = effect.get("unknownWhy")
    facts.append(("Why the outcome is unknown", UNKNOWN_WHY_TEXT.get(why or "", "no answer came")
                  + (f" ({why})" if why else "")))
    annotations = effect.get("annotations")
    if isinstance(annotations, dict):
        facts.append(("Tool annotations", ", ".join(
            f"{hint} {'not declared' if annotations.get(hint) is None else str(annotations[hint]).lower()}"
            for hint in ANNOTATION_HINTS)))
    else:
        facts.append(("Tool annotations", "none known (not a tool call)"))
    if not effect.get("deadline"):
        facts.append(("Deadline", "none recorded (the call had no bound)"))
    elif effect.get("deadlinePassed") is False:
        facts.append(("Deadline", f"{effect['deadline']} — NOT passed yet: the call may still land; check after it"))
    else:
        facts.append(("Deadline", f"{effect['deadline']} (the timeout it was sent with, plus a margin) has passed, "
                                  f"so it can no longer land"))
    return facts


def effect_outcome_answer(answers: dict, *, task_id, effect_key: str) -> dict | None:
    """A person's answer to "did this happen?" for this key ({"outcome", "result"?}), or None."""
    answer = answers.get(effect_outcome_wait_id(task_id, effect_key=effect_key))
    value = (answer or {}).get("value")
    return value if isinstance(value, dict) and value.get("outcome") in ("applied", "not_applied", "abandon") else None


def approval_wait_id(task_id, *, plan_version: int, effect_key: str) -> str:
    return _wait_id(task_id, f"{APPROVAL}:{plan_version}:{effect_key}")


def is_fork_repeat(policy: dict | None, *, step_seq: int, name: str) -> bool:
    """Whether the effect ``name`` of step ``step_seq`` is one a fork's original already made (the fork's
    approvalPolicy.repeats, "seq:name", tasks_app.forks): running it again waits for a person."""
    repeats = (policy or {}).get("repeats")
    return bool(repeats) and f"{step_seq}:{name}" in repeats


def needs_approval(name: str, *, configured: Iterable[str], policy: dict | None, flag: bool) -> bool:
    """The per-call flag can add an approval, never remove one the deployment or the task requires."""
    return flag or name in configured or name in ((policy or {}).get("before") or ())


# -- budgets ----------------------------------------------------------------------------------------------------------
# What set_budget takes (steering_app.validation checks it; the budget wait shows it as its schema): each budget a
# number, or null to remove it. maxCost is a decimal with at most 4 places, as budget.maxCost at create.
SET_BUDGET_SCHEMA = {
    "type": "object", "additionalProperties": False, "minProperties": 1,
    "properties": {
        "maxSteps": {"type": ["integer", "null"], "minimum": 1, "maximum": 2_147_483_647,
                     "description": "Steps the task may commit in all (null: no limit)."},
        "maxCost": {"type": ["number", "string", "null"],
                    "description": "What the task may spend in all, in the deployment's cost unit (null: no limit)."},
        "maxTokens": {"type": ["integer", "null"], "minimum": 0,
                      "description": "Model tokens (in + out) the task may use in all (null: no limit)."},
    },
}
BUDGET_NAMES = {"steps": "maxSteps", "cost": "maxCost", "tokens": "maxTokens"}


def budgets_spent(*, steps: int, cost: Decimal, tokens: int, max_steps: int | None, max_cost: Decimal | None,
                  max_tokens: int | None) -> list[str]:
    """Which of a task's budgets are spent ("steps", "cost", "tokens"), given what it used: the one rule the engine
    (before each step) and set_budget (does a waiting task go on?) decide by."""
    spent = []
    if max_steps is not None and steps >= max_steps:
        spent.append("steps")
    if max_cost is not None and Decimal(cost) >= Decimal(max_cost):
        spent.append("cost")
    if max_tokens is not None and tokens >= max_tokens:
        spent.append("tokens")
    return spent


def budget_figures(*, steps: int, cost: Decimal, tokens: int, max_steps: int | None, max_cost: Decimal | None,
                   max_tokens: int | None) -> dict:
    """What a task used and its budgets, as the budget wait and the snapshot show them (cost as exact text)."""
    return {"spent": {"steps": steps, "cost": f"{Decimal(cost):.4f}", "tokens": tokens},
            "limits": {"maxSteps": max_steps, "maxCost": None if max_cost is None else f"{Decimal(max_cost):.4f}",
                       "maxTokens": max_tokens}}


def budget_exhausted_message(spent: list[str], figures: dict) -> str:
    """Which budgets are spent, in words: "the task used 4 of its 4 steps; spent 1.5000 of its cost budget 1.5000"."""
    used, limits = figures["spent"], figures["limits"]
    said = {"steps": lambda: f"the task used {used['steps']:,} of its {limits['maxSteps']:,} steps",
            "cost": lambda: f"the task spent {used['cost']} of its cost budget {limits['maxCost']}",
            "tokens": lambda: f"the task used {used['tokens']:,} of its {limits['maxTokens']:,} tokens"}
    return "; ".join(said[name]() for name in spent)


def budget_wait(*, task_id, steps_completed: int, plan_version: int, spent: list[str], figures: dict) -> dict:
    """The budget wait: the task stopped before its next step because ``spent`` budgets are used up. set_budget
    answers it (a raise that lets the task go on clears it); its id stays the same while no further step commits, so
    the wait entered again after a crash, or after a raise that was not enough, is the same wait."""
    raise_with = " and ".join(BUDGET_NAMES[name] for name in spent)
    return {"waitId": _wait_id(task_id, f"{BUDGET}:{steps_completed}"), "kind": BUDGET, "name": "budget",
            "prompt": _prompt(f"Budget spent: {budget_exhausted_message(spent, figures)}. Raise {raise_with} with a "
                              f"set_budget command (or remove the limit with null) to let it go on, or cancel it."),
            "schema": SET_BUDGET_SCHEMA, "step": steps_completed, "planVersion": plan_version,
            "budget": {**figures, "exhausted": spent}}


def is_waiting(open_wait: dict | None, answers: dict) -> bool:
    """An open wait without a complete answer (a wait with parts is answered once every part is)."""
    return bool(open_wait) and not answers.get(open_wait["waitId"], {}).get("complete", open_wait["waitId"] in answers)


def answers_by_name(answers: dict) -> dict[str, dict]:
    """Input answers by wait name, the latest per name (a name asked again is answered again)."""
    by_name: dict[str, dict] = {}
    for answer in sorted((a for a in answers.values() if a.get("kind") == INPUT and "superseded" not in a
                          and a.get("complete", True)), key=lambda a: a.get("step", 0)):
        by_name[answer["name"]] = answer
    return by_name


def redacted(value: Any) -> Any:
    """A JSON value fit for events and pages: values under secret keys masked, every string redacted and storable."""
    value = redact_json(value)
    if isinstance(value, str):
        return storable(value)
    if isinstance(value, dict):
        return {str(k): redacted(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [redacted(v) for v in value]
    return value


def _prompt(text: str) -> str:
    return storable(redact(str(text)))[:PROMPT_MAX_CHARS]
