"""A complete workflow to copy: its input, three steps, one wait for a person, one effect, its result.

Run it: EXTRA_APPS=examples.greeting python3.11 deploy/dev.py run, then create a task of workflow "greeting".
"""

from pathlib import Path

from django.conf import settings

from checkpoints_app.ledger import EffectOutcome
from tasks_app.registry import Workflow, register, step

WORDING = {"type": "object", "properties": {"text": {"type": "string", "minLength": 1, "maxLength": 200}},
           "required": ["text"], "additionalProperties": False}


def outbox() -> Path:
    """The remote system this example sends to: a folder (a mail API would take the key as its Idempotency-Key)."""
    folder = Path(settings.EXTERNAL_ROOT) / "greetings"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def sent_already(key):  # after a crash mid-call: did it land? (never a blind second call)
    sent = outbox() / f"{key}.txt"  # (module-level: its name is recorded with the effect, for whoever meets it again)
    return EffectOutcome.was_applied({"file": sent.name}) if sent.exists() else EffectOutcome.not_applied()


@register
class Greeting(Workflow):
    name = "greeting"
    description = "Drafts a greeting, asks a person for the final wording, then sends it exactly once."
    version = "1"
    input_schema = {"type": "object", "properties": {"name": {"type": "string", "minLength": 1, "maxLength": 100}},
                    "required": ["name"], "additionalProperties": False}

    def plan(self, goal, input, state):  # the steps, in order
        return ["draft", "ask", "send"]

    @step
    def draft(self, ctx):
        ctx.state["draft"] = f"Hello, {ctx.input['name']}!"  # ctx.input: the task's validated input
        ctx.progress(0.3, "drafted")

    @step
    def ask(self, ctx):
        # The task waits (input_required) once this step commits; a person answers in the console, the API or MCP.
        ctx.wait_for_input("wording", WORDING, f"Send {ctx.state['draft']!r}? Answer with the text to send.")

    @step
    def send(self, ctx):
        text = ctx.answers["wording"]["text"]  # the answer, validated against WORDING

        def deliver(key):  # called at most once for this key, even if a worker dies here and the step runs again
            (outbox() / f"{key}.txt").write_text(text)
            return {"file": f"{key}.txt"}

        receipt = ctx.effect("send_greeting", deliver, reconcile=sent_already)
        ctx.state["result"] = {"sent": text, **receipt}  # the task's result: state["result"] by default
