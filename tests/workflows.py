"""Workflows for in-process engine tests, registered on import: each step acts out a script the test sets.

``scripted``: step ``act`` at plan index i performs ``SCRIPTS[input["script"]][i]`` (a list of actions), read at
execution time, so a test can change what a step does between one run and its re-run (an LLM choosing another
tool). Effects append their key to ``scripted_effects.log`` outside the database, so tests count real calls.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from decimal import Decimal

from checkpoints_app.ledger import EffectOutcome
from tasks_app.examples import external
from tasks_app.models import Task
from tasks_app.registry import Workflow, register, step

EFFECTS_LOG = "scripted_effects.log"
SCRIPTS: dict[str, dict[int, list[dict]]] = {}
GATES: dict[str, threading.Event] = {}
REACHED: dict[str, threading.Event] = {}

ODD_VALUES = {"decimal": lambda: Decimal("1.5"), "set": lambda: {1, 2}, "nan": lambda: float("nan"),
              "tuple": lambda: (1, 2), "int_key": lambda: {1: "a"}}


def effect_calls(task_id) -> Counter:
    return Counter(key for key in external.lines(EFFECTS_LOG) if key.startswith(str(task_id)))


def landed(key: str) -> EffectOutcome:
    return EffectOutcome.was_applied({"sent": key}) if key in external.lines(EFFECTS_LOG) else \
        EffectOutcome.not_applied()


def send(key: str, *, answer_after: float = 0, fail: bool = False) -> dict:
    if fail:
        raise ConnectionError("the remote side refused")
    external.append_line(EFFECTS_LOG, key)
    if answer_after:
        time.sleep(answer_after)
    return {"sent": key}


@register
class Scripted(Workflow):
    name = "scripted"
    description = "Test workflow: each step acts out a script set by the test."
    input_schema = {"type": "object", "properties": {"script": {"type": "string"}, "steps": {"type": "integer"},
                                                     "workflow_reconcile": {"type": "boolean"},
                                                     "result": {"type": "string"}},
                    "required": ["script", "steps"]}

    def plan(self, goal, input, state):
        return ["act"] * input["steps"]

    @step(max_attempts=2)
    def act(self, ctx):
        for action in SCRIPTS[ctx.input["script"]].get(ctx.step_index, []):
            if action.get("attempts") and ctx.attempt not in action["attempts"]:
                continue
            kind = action["do"]
            if kind == "effect":
                hook = landed if action.get("reconcile") else None
                ctx.effect(action["name"], lambda key, act=action: send(key, answer_after=act.get("answer_after", 0),
                                                                        fail=act.get("fail", False)),
                           reconcile=hook, timeout=action.get("timeout"))
            elif kind == "raise":
                raise RuntimeError(action.get("message", "scripted failure"))
            elif kind == "artifact":
                ctx.state[f"artifact:{action['name']}"] = ctx.artifact(action["name"], action["content"])
            elif kind == "read_artifact":  # a committed artifact's file, read back (a fork's inherited one too)
                from django.core.files.storage import default_storage

                with default_storage.open(ctx.artifacts[action["name"]]) as stored:
                    ctx.state[f"read:{action['name']}"] = stored.read().decode()
            elif kind == "set":
                ctx.state[action["key"]] = action["value"]
            elif kind == "set_odd":
                ctx.state[action["key"]] = ODD_VALUES[action["value"]]()
            elif kind == "mutate_odd":  # in place, after reading: only the delta check can catch it
                ctx.state.setdefault(action["key"], [])
                ctx.state[action["key"]].append(ODD_VALUES[action["value"]]())
            elif kind == "return_odd":
                return {"value": ODD_VALUES[action["value"]]()}
            elif kind == "spend":
                ctx.spend(action["amount"])
            elif kind == "sleep":
                time.sleep(action["seconds"])
            elif kind == "block":  # signal that the step is here, then wait until the test opens the gate
                REACHED[action["gate"]].set()
                GATES[action["gate"]].wait(30)
            elif kind == "leak":  # a careless step: a secret in a log line, an effect's arguments and its result
                secret = action["secret"]
                ctx.log(f"calling the CRM with token={secret}")
                ctx.state["crm"] = ctx.effect(
                    "crm.update", lambda key, secret=secret: {"sent": key, "session": {"token": secret},
                                                              "echo": f"Bearer {secret}"},
                    approval=True, arguments={"api_key": secret, "note": f"auth with Bearer {secret}"})
            elif kind == "pause_self":  # a person pauses the task while this step runs
                from steering_app.services import steering_submit

                steering_submit(task=Task.objects.get(id=ctx.task_id), command_type="pause", expected_version=None,
                                reason="mid-step", requested_by="user:test")
            elif kind == "delete_task":  # as an operator or the retention purge might, mid-step
                from tasks_app.audit.retention import purge_allowed

                with purge_allowed():
                    Task.objects.filter(id=ctx.task_id).delete()
        ctx.state["done"] = ctx.state.get("done", 0) + 1
        return {"done": ctx.state["done"]}

    def result(self, state):
        return {"done": state.get("done", 0)}

    def reconcile_effect(self, *, name, key, input):
        return landed(key) if input.get("workflow_reconcile") else None


@register
class OddResult(Scripted):
    name = "odd_result"
    description = "Test workflow: like scripted, but result() raises or returns a value JSON cannot keep."

    def result(self, state):
        if state.get("result_mode") == "raise":
            raise ValueError("cannot summarise")
        return {"when": ODD_VALUES["decimal"]()}


@register
class Alternating(Workflow):
    name = "alternating"
    description = "Test workflow: `steps` steps alternating between two step names (the worst case for a plan)."
    input_schema = {"type": "object", "properties": {"steps": {"type": "integer"}}, "required": ["steps"]}

    def plan(self, goal, input, state):
        return ["ping", "pong"] * (input["steps"] // 2)

    @step
    def ping(self, ctx):
        ctx.state["n"] = ctx.state.get("n", 0) + 1

    @step
    def pong(self, ctx):
        ctx.state["n"] = ctx.state.get("n", 0) + 1


@register
class EndsEarly(Workflow):
    """Test workflow: plans `most` steps and ends the plan (ctx.end_plan) in the step that counts to `stop_at`."""

    name = "ends_early"
    description = "Test workflow: plans `most` steps, ends the plan at step `stop_at` (ctx.end_plan)."
    input_schema = {"type": "object", "properties": {"most": {"type": "integer"}, "stop_at": {"type": "integer"}},
                    "required": ["most", "stop_at"]}

    def plan(self, goal, input, state):
        return ["count"] * input["most"]

    def result(self, state):
        return {"counted": state.get("n", 0)}

    @step
    def count(self, ctx):
        ctx.state["n"] = ctx.state.get("n", 0) + 1
        external.append_line(EFFECTS_LOG, f"{ctx.task_id}:count:{ctx.state['n']}")
        if ctx.state["n"] >= ctx.input["stop_at"]:
            ctx.end_plan()


@register
class ToolCalls(Workflow):
    """One downstream tool call per step: input {"calls": [[server, tool, arguments], …]} (tests/test_tool_calls.py)."""

    name = "tool_calls"
    description = "Calls downstream tools, one per step."
    version = "1"
    input_schema = {"type": "object", "required": ["calls"],
                    "properties": {"calls": {"type": "array", "items": {"type": "array"}}}}

    def plan(self, goal, input, state):
        return ["call"] * len(input["calls"])

    @step
    def call(self, ctx):
        server, tool, arguments = ctx.input["calls"][ctx.step_index]
        ctx.state.setdefault("results", [])
        ctx.state["results"] = [*ctx.state["results"], ctx.tool(server, tool, arguments)]

    def result(self, state):
        return state.get("results")
