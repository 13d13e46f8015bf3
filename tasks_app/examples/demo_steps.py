"""demo_steps: N steps that each sleep, write state and perform one external effect. For tests and benchmarks.

Every step body appends "task seq pid" to demo_executions.log and its effect appends the idempotency key to
demo_effects.log (both under EXTERNAL_ROOT), so a test can prove committed steps ran once and each effect
happened exactly once, whatever crashed in between.
"""

import base64
import os
import time

from checkpoints_app.ledger import EffectOutcome
from tasks_app.examples import external
from tasks_app.registry import ToolTimeout, Workflow, register, step

EXECUTIONS_LOG = "demo_executions.log"
EFFECTS_LOG = "demo_effects.log"
# What `ask_at` asks for.
NOTE_SCHEMA = {"type": "object", "properties": {"note": {"type": "string", "minLength": 1, "maxLength": 200}},
               "required": ["note"], "additionalProperties": False}


def record_effect(key: str, *, answer_after_ms: int = 0) -> dict:
    external.append_line(EFFECTS_LOG, key)
    if answer_after_ms:  # the effect landed, but the answer is slow to come back (a timeout may cut it off)
        time.sleep(answer_after_ms / 1000)
    return {"recorded": key}


def reconcile_effect(key: str) -> EffectOutcome:
    """Ask the 'remote side' whether the effect with this key landed."""
    if key in external.lines(EFFECTS_LOG):
        return EffectOutcome.was_applied({"recorded": key})
    return EffectOutcome.not_applied()


@register
class DemoSteps(Workflow):
    name = "demo_steps"
    description = ("Runs `steps` steps; each sleeps `sleep_ms`, keeps `payload_bytes` of state and records one "
                   "external effect. For tests and benchmarks.")
    version = "1"
    mcp_annotations = {"title": "Demo steps", "readOnlyHint": False, "destructiveHint": False, "idempotentHint": False,
                       "openWorldHint": False}
    input_schema = {
        "type": "object",
        "properties": {
            "steps": {"type": "integer", "minimum": 1, "maximum": 100_000, "description": "How many steps to run."},
            "sleep_ms": {"type": "integer", "minimum": 0, "maximum": 600_000, "default": 0,
                         "description": "Milliseconds each step sleeps (simulated tool latency)."},
            "payload_bytes": {"type": "integer", "minimum": 0, "maximum": 65_536, "default": 0,
                              "description": "Bytes of state each step writes."},
            "payload_fresh": {"type": "boolean", "default": False,
                              "description": "Make each step's payload new random text, which no compressor shrinks "
                                             "(false: one letter repeated, which TOAST squeezes to a few bytes)."},
            "effect": {"type": "boolean", "default": True,
                       "description": "Record one external effect per step through the ledger (false: steps only "
                                      "compute and write state)."},
            "reconcile_effects": {"type": "boolean", "default": True,
                                  "description": "Give effects a reconcile hook (false: an unknown outcome "
                                                 "after a crash dead-letters the task)."},
            "fail_step": {"type": "integer", "minimum": 0,
                          "description": "Index of a step that raises (to exercise retries)."},
            "fail_times": {"type": "integer", "minimum": 0, "default": 1_000_000,
                           "description": "How many attempts of fail_step raise before it succeeds."},
            "cost_per_step": {"type": "number", "minimum": 0, "default": 0,
                              "description": "Cost each step spends against budget.maxCost."},
            "result_bytes": {"type": "integer", "minimum": 0, "maximum": 1_048_576, "default": 0,
                             "description": "Pad the result to about this size (large results go to storage)."},
            "timeout_step": {"type": "integer", "minimum": 0,
                             "description": "Index of a step whose tool call always times out (ToolTimeout)."},
            "effect_answer_ms": {"type": "integer", "minimum": 0, "maximum": 600_000, "default": 0,
                                 "description": "Milliseconds the effect takes to answer after it landed."},
            "effect_timeout_ms": {"type": "integer", "minimum": 1, "maximum": 600_000,
                                  "description": "Give up waiting for the effect's answer after this long "
                                                 "(its outcome is then unknown and must be reconciled)."},
            "ask_at": {"type": "integer", "minimum": 0,
                       "description": "Index of a step that, after its effect, asks a person for a note "
                                      "(ctx.wait_for_input); the steps after it keep the answer."},
            "ask_parts_at": {"type": "integer", "minimum": 0,
                             "description": "Index of a step that asks two questions at once (a colour and a size, "
                                            "answerable one at a time); the steps after it keep the answers."},
            "approve_at": {"type": "integer", "minimum": 0,
                           "description": "Index of a step whose effect waits for a person's approval."},
        },
        "required": ["steps"],
        "additionalProperties": False,
    }

    def plan(self, goal, input, state):
        return ["tick"] * input["steps"]

    @step
    def tick(self, ctx):
        external.append_line(EXECUTIONS_LOG, f"{ctx.task_id} {ctx.step_seq} {os.getpid()}")
        sleep_ms = ctx.input.get("sleep_ms", 0)
        if sleep_ms:
            time.sleep(sleep_ms / 1000)
        if ctx.input.get("payload_bytes"):
            size = ctx.input["payload_bytes"]
            ctx.state["payload"] = (base64.b64encode(os.urandom(size * 3 // 4 + 3)).decode()[:size]
                                    if ctx.input.get("payload_fresh") else "x" * size)
        ctx.state["count"] = ctx.state.get("count", 0) + 1
        if ctx.input.get("result_bytes") and "result_bytes" not in ctx.state:
            ctx.state["result_bytes"] = ctx.input["result_bytes"]
        if ctx.input.get("cost_per_step"):
            ctx.spend(ctx.input["cost_per_step"])
        if ctx.step_index == ctx.input.get("fail_step") and ctx.attempt <= ctx.input.get("fail_times", 1_000_000):
            raise RuntimeError(f"demo failure at step {ctx.step_index}, attempt {ctx.attempt}")
        if ctx.step_index == ctx.input.get("timeout_step"):
            raise ToolTimeout(f"search tool did not answer within 30 s (step {ctx.step_index}, attempt {ctx.attempt})")
        if ctx.input.get("effect", True):
            reconcile = reconcile_effect if ctx.input.get("reconcile_effects", True) else None
            answer_ms = ctx.input.get("effect_answer_ms", 0)
            timeout_ms = ctx.input.get("effect_timeout_ms")
            ctx.effect("record", lambda key: record_effect(key, answer_after_ms=answer_ms), reconcile=reconcile,
                       timeout=timeout_ms / 1000 if timeout_ms else None,
                       approval=ctx.step_index == ctx.input.get("approve_at"),
                       arguments={"step": ctx.step_index, "count": ctx.state["count"]})
        if "note" in ctx.answers and "note" not in ctx.state:
            ctx.state["note"] = ctx.answers["note"]["note"]
        if "survey" in ctx.answers and "survey" not in ctx.state:
            ctx.state["survey"] = ctx.answers["survey"]
        if ctx.step_index == ctx.input.get("ask_parts_at"):
            ctx.wait_for_inputs("survey", {
                "colour": {"schema": {"type": "string", "enum": ["red", "green", "blue"]}, "prompt": "Which colour?"},
                "size": {"schema": {"type": "integer", "minimum": 1, "maximum": 10}, "prompt": "Which size (1–10)?"},
            }, "Two questions about the result")
        if ctx.step_index == ctx.input.get("ask_at"):
            ctx.wait_for_input("note", NOTE_SCHEMA, f"A note for step {ctx.step_index + 1}, please")
        return {"count": ctx.state["count"]}

    def reconcile_effect(self, *, name, key, input):
        # Asked when no re-run of the step asks itself (the task is cancelled or failed meanwhile).
        return reconcile_effect(key) if input.get("reconcile_effects", True) else None

    def result(self, state):
        result = {"steps": state.get("count", 0)}
        if "note" in state:
            result["note"] = state["note"]
        if "survey" in state:
            result["survey"] = state["survey"]
        if state.get("result_bytes"):
            result["padding"] = "r" * state["result_bytes"]
        return result
