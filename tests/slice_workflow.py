"""A test-only workflow whose steps do whatever a generated *script* says (tests/test_slice_properties.py).

The task input is ``{"script": [step, ...], "result": mode, "ballast": n}``; the plan has one step per script entry
(``act``, or ``act_costly`` — a @step(costly=True) that forces a checkpoint — when the entry says so). Each step
entry is ``{"costly": bool, "ops": [op, ...], "output": kind}``; ops run in order:

    ["set", key, kind]            ctx.state[key] = value(kind)          (through the state's own JSON check;
                                  key "step" stands for the step's own key, s<seq>)
    ["mutate", key, kind]         append value(kind) to the list/dict in state[key], in place (no check)
    ["del", key]                  del ctx.state[key]                    (KeyError when absent)
    ["effect", name, options]     ctx.effect(name, fn, reconcile=?, timeout=?); options: reconcile (bool),
                                  raises (fn raises on its first N calls: 0, 1 or 99 = always), result (kind),
                                  timeout (null: none; "in_time": timeout=5 and fn answers at once; "late":
                                  timeout=0.05 and fn lands the effect, then answers after 0.15 s)
    ["artifact", name, content]   ctx.artifact(name, content); content: str, bytes, empty, big
    ["spend", amount]             ctx.spend(amount)                     (amount is a string, e.g. "1e9", "NaN")
    ["progress", x, phase]        ctx.progress(x, phase)                (x may be outside 0…1, "nan", "inf")
    ["log", message]              ctx.log(message)
    ["checkpoint"]                ctx.checkpoint()
    ["raise", type, message, n]   raise type(message) on the step's first n attempts (n = 99: always)

The step returns value(output). With ``"ballast": n`` in the input, every step first keeps n bytes of state under
a key of its own, so state grows step by step towards the checkpoint cap. ``result`` selects what
Workflow.result(state) does: "default" (the base class: state["result"]), "raise", or a value kind.

Value kinds are names, so the input stays JSON: the odd Python values (Decimal, datetime, UUID, set, NaN, …) are
made inside the step. Everything a step and an effect does is appended to a per-task file outside PostgreSQL
(``<EXTERNAL_ROOT>/prop_slice/<task id>.log``), one line per event:

    start <seq> <attempt>      a step attempt began
    ok <seq> <attempt>         the step function returned normally (the engine may still refuse the attempt)
    call <key>                 an effect function was entered
    done <key>                 ... and returned (the effect happened)
    raise <key>                ... and raised (the effect did not happen)
"""

from __future__ import annotations

import math
import time
import uuid
from datetime import datetime
from decimal import Decimal
from pathlib import Path

from django.conf import settings

from checkpoints_app.ledger import EffectOutcome
from tasks_app.registry import Workflow, register, step

NAME = "prop_slice"

NORMAL_KINDS = ["none", "int", "str", "bool", "float", "list", "dict", "unicode", "bigint", "intkeys", "tuple",
                "medium"]
ODD_KINDS = ["decimal", "datetime", "uuid", "set", "nan", "inf", "bytes", "object", "deep", "large", "oversize",
             "nul", "surrogate"]
VALUE_KINDS = NORMAL_KINDS + ODD_KINDS

EXCEPTIONS = {"RuntimeError": RuntimeError, "ValueError": ValueError, "KeyError": KeyError, "TypeError": TypeError}
MESSAGES = ["plain", "empty", "nul", "long", "secret"]


class Opaque:
    """Not JSON; str() works, so a `default=str` encoder lets it through."""

    def __str__(self) -> str:
        return "<opaque>"


def make_value(kind: str):
    if kind == "none":
        return None
    if kind == "int":
        return 7
    if kind == "str":
        return "text"
    if kind == "bool":
        return True
    if kind == "float":
        return 1.5
    if kind == "list":
        return [1, "a", None]
    if kind == "dict":
        return {"k": [1, 2], "n": None}
    if kind == "unicode":
        return "ünï ✓ \U0001F600"
    if kind == "bigint":
        return 10**30
    if kind == "intkeys":
        return {1: "a", 2: "b"}
    if kind == "tuple":
        return (1, "a")
    if kind == "medium":
        return "m" * 2200  # under the 4 KiB cap alone; two of them make the whole state (a checkpoint) too big
    if kind == "decimal":
        return Decimal("1.5")
    if kind == "datetime":
        return datetime.now()
    if kind == "uuid":
        return uuid.uuid4()
    if kind == "set":
        return {1, 2}
    if kind == "nan":
        return math.nan
    if kind == "inf":
        return math.inf
    if kind == "bytes":
        return b"\x00\xffbytes"
    if kind == "object":
        return Opaque()
    if kind == "deep":
        value: list = []
        for _ in range(1500):  # deeper than Python's recursion limit
            value = [value]
        return value
    if kind == "large":
        return list(range(6000))
    if kind == "oversize":
        return "x" * (settings.RUNTIME.checkpoint.max_bytes + 100)
    if kind == "nul":
        return "a\x00b"
    if kind == "surrogate":
        return "lone \ud800 surrogate"
    raise AssertionError(f"unknown value kind {kind!r}")


def make_message(kind: str, where: str) -> str:
    if kind == "plain":
        return f"scripted failure {where}"
    if kind == "empty":
        return ""
    if kind == "nul":
        return f"scripted failure with a NUL \x00 {where}"
    if kind == "long":
        return "L" * 20_000
    if kind == "secret":
        return f"calling with Bearer abcdefghijklmnopqrstuvwxyz failed {where}"
    raise AssertionError(f"unknown message kind {kind!r}")


# -- the record outside the database -------------------------------------------------------------------------------
def log_path(task_id) -> Path:
    return Path(settings.EXTERNAL_ROOT) / NAME / f"{task_id}.log"


def log_append(task_id, line: str) -> None:
    path = log_path(task_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:  # one write of a whole line
        handle.write(line + "\n")


def log_lines(task_id) -> list[list[str]]:
    path = log_path(task_id)
    return [line.split() for line in path.read_text().splitlines()] if path.exists() else []


def _effect_done(task_id, key: str) -> bool:
    return ["done", key] in log_lines(task_id)


def _effect_calls(task_id, key: str) -> int:
    return sum(1 for line in log_lines(task_id) if line == ["call", key])


# -- the workflow ----------------------------------------------------------------------------------------------------
class PropSlice(Workflow):
    name = NAME
    description = "Test only: each step does what its generated script entry says (tests/test_slice_properties.py)."
    version = "1"
    input_schema = {
        "type": "object",
        "properties": {"script": {"type": "array", "items": {"type": "object"}}, "result": {"type": "string"},
                       "ballast": {"type": "integer", "minimum": 0}},
        "required": ["script"],
    }

    def plan(self, goal, input, state):
        self._result_mode = input.get("result", "default")
        return ["act_costly" if entry.get("costly") else "act" for entry in input["script"]]

    @step
    def act(self, ctx):
        return self._perform(ctx)

    @step(costly=True)
    def act_costly(self, ctx):
        return self._perform(ctx)

    def result(self, state):
        mode = getattr(self, "_result_mode", "default")
        if mode == "default":
            return super().result(state)
        if mode == "raise":
            raise RuntimeError("scripted failure in Workflow.result()")
        return make_value(mode)

    # -- what one step does ------------------------------------------------------------------------------------------
    def _perform(self, ctx):
        self._result_mode = ctx.input.get("result", "default")  # result(state) sees no input: remember it here
        entry = ctx.input["script"][ctx.step_index]
        where = f"(step {ctx.step_seq}, attempt {ctx.attempt})"
        log_append(ctx.task_id, f"start {ctx.step_seq} {ctx.attempt}")
        if ctx.input.get("ballast"):
            ctx.state[f"ballast{ctx.step_seq}"] = "b" * ctx.input["ballast"]
        for op in entry.get("ops", []):
            kind = op[0]
            if kind in ("set", "mutate", "del") and op[1] == "step":
                op = [kind, f"s{ctx.step_seq}", *op[2:]]
            if kind == "set":
                ctx.state[op[1]] = make_value(op[2])
            elif kind == "mutate":
                current = ctx.state.get(op[1])
                if not isinstance(current, (list, dict)):
                    ctx.state[op[1]] = []
                    current = ctx.state[op[1]]
                if isinstance(current, list):
                    current.append(make_value(op[2]))
                else:
                    current["m"] = make_value(op[2])
            elif kind == "del":
                del ctx.state[op[1]]
            elif kind == "effect":
                self._effect(ctx, op[1], op[2])
            elif kind == "artifact":
                content = {"str": "report text", "bytes": b"\x00\x01binary", "empty": "", "big": "B" * 100_000}[op[2]]
                ctx.artifact(op[1], content)
            elif kind == "spend":
                ctx.spend(op[1])
            elif kind == "progress":
                fraction = float(op[1]) if isinstance(op[1], str) else op[1]
                phase = {None: None, "phase": "phase", "nul": "ph\x00ase", "long": "P" * 1000}[op[2]]
                ctx.progress(fraction, phase)
            elif kind == "log":
                message = {"plain": "a log line", "nul": "log \x00 line", "secret": "Bearer abcdefghijklmnop",
                           "long": "G" * 10_000, "object": Opaque()}[op[1]]
                ctx.log(message)
            elif kind == "checkpoint":
                ctx.checkpoint()
            elif kind == "raise":
                if ctx.attempt <= op[3]:
                    raise EXCEPTIONS[op[1]](make_message(op[2], where))
            else:
                raise AssertionError(f"unknown op {op!r}")
        output = make_value(entry.get("output", "none"))
        log_append(ctx.task_id, f"ok {ctx.step_seq} {ctx.attempt}")
        return output

    @staticmethod
    def _effect(ctx, name: str, options: dict) -> None:
        task_id = ctx.task_id

        def call(key: str):
            earlier_calls = _effect_calls(task_id, key)
            log_append(task_id, f"call {key}")
            if earlier_calls < options["raises"]:
                log_append(task_id, f"raise {key}")
                raise RuntimeError(f"scripted effect failure of {name} (call {earlier_calls + 1})")
            value = make_value(options["result"])
            log_append(task_id, f"done {key}")  # the effect has happened ...
            if options["timeout"] == "late":
                time.sleep(0.15)  # ... but the answer comes back after the caller gave up waiting
            return value

        ctx.effect(name, call, reconcile=reconciled if options["reconcile"] else None,
                   timeout={None: None, "in_time": 5.0, "late": 0.05}[options["timeout"]])


def reconciled(key: str) -> EffectOutcome:
    """Asks "the remote side": our log says whether the call went through. (Module-level: a per-call hook is recorded
    by name on its effect's ledger row.)"""
    task_id = key.split(":", 1)[0]
    if _effect_done(task_id, key):
        return EffectOutcome.was_applied({"reconciled": key})
    return EffectOutcome.not_applied()


def workflow_register() -> type[Workflow]:
    return register(PropSlice)
