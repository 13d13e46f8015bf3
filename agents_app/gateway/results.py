"""A tool call's result on its way to the workflow: kept by reference when large (stored_if_large, read back whole by
loaded: a ledger row stays small whatever a tool answers), and screened for prompt injection before the workflow or
model sees it (screened; the screen itself is agents_app.screening)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.core.files.storage import default_storage

from agents_app.gateway.errors import ToolResultRejected
from agents_app.screening import screen
from tasks_app.engine import waits

if TYPE_CHECKING:
    from tasks_app.engine.context import StepContext


def screened(ctx: StepContext, name: str, key: str, result: dict) -> dict:
    """The result as the workflow (or model) may see it: screened for prompt injection (agents_app.screening), and
    per tools.screening passed as it is or redacted — both with a tool.flagged event — or held for a person. The
    same result screens the same way on a re-run, so a held result asks once and the answer decides it after."""
    screening = screen(result)
    if not screening.flagged:
        return result
    flagged = screening.as_event()
    rules = sorted({finding["rule"] for finding in flagged["findings"]})
    mode = settings.RUNTIME.tools.screening
    decision = "redact" if mode == "redact" else "pass"
    if mode == "hold":
        wait = waits.tool_result_review_wait(task_id=ctx.task_id, step_seq=ctx.step_seq,
                                             plan_version=ctx.plan_version, tool=name, effect_key=key,
                                             findings=flagged["findings"])
        answer = ctx.answer_for(wait["waitId"])
        if answer is None:
            raise waits.QuestionRequired(wait)
        decision = (answer.get("value") or {}).get("decision", "reject")
        if decision == "reject":
            raise ToolResultRejected(f"a person rejected the result of {name} after the injection screen flagged it "
                                     f"({', '.join(rules)})",
                                     events=[("tool.flagged", {"tool": name, "key": key, "rules": rules,
                                                               "action": "rejected by a person"})])
    action = {"pass": "passed", "redact": "redacted"}[decision] + (" by a person" if mode == "hold" else "")
    ctx.events.append(("tool.flagged", {"tool": name, "key": key, "rules": rules, "action": action,
                                        "findings": flagged["findings"][:20]}))
    return screening.cleaned if decision == "redact" else result


# A result larger than this is kept in storage (an artifact of the task) and the ledger holds its reference: a
# ledger row stays small whatever a tool answers, and the workflow still gets the whole result.
RESULT_INLINE_BYTES = 64 * 1024
RESULT_REF_META = "io.agentruntime/result-artifact"


def stored_if_large(ctx: StepContext, effect_name: str, result: dict) -> dict:
    text = json.dumps(result, ensure_ascii=False, separators=(",", ":"))
    if len(text.encode()) <= RESULT_INLINE_BYTES:
        return result
    name = "tool-" + effect_name.replace(":", "-") + ".json"
    ref = ctx.artifact(name, text)
    return {"content": [{"type": "text", "text": f"The result ({len(text.encode()):,} bytes) is the task's artifact "
                                                 f"{name}."}],
            "isError": bool(result.get("isError")),
            "_meta": {RESULT_REF_META: {"name": name, "ref": ref, "bytes": len(text.encode())}}}


def loaded(result: Any) -> Any:
    """A result kept by reference (stored_if_large), read back whole for the workflow."""
    ref = ((result or {}).get("_meta") or {}).get(RESULT_REF_META) if isinstance(result, dict) else None
    if not ref:
        return result
    with default_storage.open(ref["ref"]) as stored:
        return json.loads(stored.read().decode())
