"""What a step function gets (`ctx`): state tracking, logs, artifacts and effects through the ledger."""

from decimal import Decimal

import pytest

from config.base.canonical import NotJson, canonical_json_strict
from tasks_app.engine.state import DurableState

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("external_root")]


def test_it_redacts_step_logs_before_they_become_events(step_context):
    ctx = step_context()

    ctx.log("calling the API with Bearer abcdefghijklmnop for bob@example.com")

    assert ctx.events == [("log", {"step": "s", "message": "calling the API with Bearer [redacted] for "
                                                           "[redacted-email]"})]


def test_it_refuses_the_same_effect_name_twice_in_one_step(step_context):
    ctx = step_context()
    calls = []
    ctx.effect("send", lambda key: calls.append(key))

    with pytest.raises(ValueError, match="names must be unique"):
        ctx.effect("send", lambda key: calls.append(key))
    assert len(calls) == 1


def test_it_writes_every_artifact_under_a_fresh_name_and_never_overwrites_one(step_context, settings):
    ctx = step_context()

    first = ctx.artifact("report.md", "the committed report")
    second = ctx.artifact("report.md", "a later version")

    assert first != second
    assert (settings.MEDIA_ROOT / first).read_text() == "the committed report"
    assert (settings.MEDIA_ROOT / second).read_text() == "a later version"
    assert ctx.artifacts == {"report.md": second}  # the step sees its newest; only the commit makes it durable


def test_it_refuses_state_values_json_cannot_keep_naming_where(step_context):
    ctx = step_context()

    with pytest.raises(NotJson, match=r"state\.total: a Decimal"):  # at once, in the step
        ctx.state["total"] = Decimal("1.5")
    assert "total" not in ctx.state
    ctx.state["pairs"] = [(1, 2)]  # dumps would turn it into a list silently: the commit's strict check refuses it
    with pytest.raises(NotJson, match=r"state\.set\.pairs\.0: a tuple"):
        canonical_json_strict(ctx.state.delta(), "state")


def test_it_tracks_in_place_changes_and_rolls_a_failed_attempt_back():
    variables = {"items": [1], "kept": "x"}
    state = DurableState(variables)

    state["items"].append(2)
    state["new"] = True
    assert state.delta() == {"set": {"items": [1, 2], "new": True}}

    state.discard_changes()
    assert variables == {"items": [1], "kept": "x"}


def test_it_refuses_to_count_spending_that_is_not_a_finite_positive_amount(step_context):
    ctx = step_context()
    ctx.spend("0.25")

    for bad in (-1, "NaN", "Infinity"):
        with pytest.raises(ValueError):
            ctx.spend(bad)
    assert ctx.cost == Decimal("0.25")
