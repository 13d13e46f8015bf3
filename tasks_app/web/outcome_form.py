"""The one form for "did this effect happen?" (issue 38, build 3), wherever the console asks it: the task page's open
wait (steering_app.admin, a provide_input answer) and a dead letter's retry (tasks_app.admin, one per open effect).

Both render templates/admin/outcome_question.html: the facts a person decides by (tasks_app.engine.waits.
outcome_facts: what was called, when, why nobody knows, the tool's annotations, that the deadline has passed) and
the same three answers as radio buttons with NONE chosen. A preselected answer was the bug this replaces: the wait's
schema made a <select> whose first option, "applied" with a null result, was sent by anyone who only pressed the
button — and a wrong "applied" skips an effect as surely as a wrong "not_applied" repeats one.

It lives in tasks_app's interface layer (not steering_app) because the dead letters, which are tasks_app's, use it
too and tasks_app may not import steering_app (tests/test_layers.py).
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.db import connection

from config.base.json_input import JsonFormField
from tasks_app.engine import waits

ANSWERS = [
    ("applied", "applied — it happened (give its result below if the task needs it)"),
    ("not_applied", "not_applied — it did not happen: it is called again with the same key"),
    ("abandon", "abandon — nobody can tell: fail the task"),
]


class OutcomeForm(forms.Form):
    """One answer to "did this happen?": outcome (required, no initial value), result (optional, with applied)."""

    outcome = forms.ChoiceField(choices=ANSWERS, widget=forms.RadioSelect, label="Did it happen?")
    result = JsonFormField(required=False, widget=forms.Textarea(attrs={"rows": 3}),
                           label="Its result, as the step should receive it",
                           help_text="Optional, JSON; only with applied (empty: the step receives null).")

    def __init__(self, *args, effect: dict, number: int | None = None, **kwargs):
        kwargs.pop("initial", None)  # never an answer chosen for the person
        super().__init__(*args, **kwargs)
        self.effect, self.number = effect, number
        self.facts = waits.outcome_facts(effect)

    def add_prefix(self, field_name: str) -> str:
        # A dead letter's page answers several effects, numbered: answer_<n> / result_<n>, the names its retry form
        # has always posted (scripts and bookmarks keep working); the task page's one question uses the prefix.
        if self.number is not None:
            return f"{'answer' if field_name == 'outcome' else field_name}_{self.number}"
        return super().add_prefix(field_name)

    def clean(self):
        data = super().clean()
        if data.get("outcome") != "applied" and data.get("result") is not None:
            self.add_error("result", "A result goes only with applied.")
        return data

    def value(self) -> dict[str, Any]:
        """The answer as the wait's schema (waits.OUTCOME_SCHEMA) takes it."""
        value = {"outcome": self.cleaned_data["outcome"]}
        if value["outcome"] == "applied" and self.cleaned_data.get("result") is not None:
            value["result"] = self.cleaned_data["result"]
        return value


def is_outcome_question(wait: dict | None) -> bool:
    return bool(wait) and wait.get("kind") == waits.INPUT and wait.get("name") == "effect_outcome" and \
        wait.get("schema") == waits.OUTCOME_SCHEMA


def open_effect_shown(effect, *, now) -> dict:
    """A dead letter's open ledger row (checkpoints_app.models.SideEffect) as a wait's ``effect``, for the same facts:
    what the row recorded when the call started (its ``about``: redacted arguments, server, tool, annotations), sent
    at, why, deadline, and whether that has passed at ``now`` (the DATABASE's clock, as the deadline was set by it):
    a dead letter can come before its call's deadline, and then the page says the call may still land (and the
    retry refuses an answer until it has)."""
    about = effect.about if isinstance(effect.about, dict) else {}
    return {"name": effect.name, "key": effect.key, "arguments": about.get("arguments"),
            "server": about.get("server"), "tool": about.get("tool"), "annotations": about.get("annotations"),
            "sentAt": effect.started_at.isoformat() if effect.started_at else None,
            "deadline": effect.deadline.isoformat() if effect.deadline else None,
            "deadlinePassed": effect.deadline <= now if effect.deadline else None,
            "unknownWhy": effect.unknown_why or ("worker_died" if effect.status == "started" else None)}


def database_now():
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        return cursor.fetchone()[0]
