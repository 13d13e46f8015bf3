"""The store's typed parameters (tasks_app.db.store): a value that does not fit its statement fails where it is made,
not as a KeyError from psycopg in the middle of a slice."""

from dataclasses import FrozenInstanceError, dataclass
from decimal import Decimal

import pytest

from tasks_app.db import sql, store


def test_it_refuses_a_misspelt_parameter_where_the_value_is_built():
    with pytest.raises(TypeError, match="eror"):
        store.TaskDeadLetter(message="m", eror="{}", cost=Decimal(0))


def test_it_refuses_a_missing_parameter_where_the_value_is_built():
    with pytest.raises(TypeError, match="cost"):
        store.TaskDeadLetter(message="m", error="{}")


def test_it_refuses_a_dataclass_that_does_not_match_its_statement():
    """Checked once, at import: a field the statement does not name, or a placeholder no field gives."""
    with pytest.raises(TypeError, match=r"missing \['cost'\], not in the statement \['costs'\]"):
        @store._binds(sql.DEAD_LETTER, supplied=store._WRITER_PARAMETERS)
        @dataclass(frozen=True)
        class Misnamed(store.Parameters):
            message: str
            error: str
            costs: Decimal
            tokens: int


def test_it_gives_every_placeholder_of_a_fenced_write_flat():
    """A nested checkpoint contributes its own columns; with what the writer adds, every placeholder has a value."""
    stop = store.SafePointStop(status="paused", message="Paused", steering_cursor=None, cost=Decimal(0), tokens=0,
                               checkpoint=store.NO_CHECKPOINT)
    params = stop.params()
    assert params["cp_sequence"] is None and "checkpoint" not in params
    supplied = set(params) | store._WRITER_PARAMETERS
    assert set(store._PLACEHOLDER.findall(sql.STOP_AT_SAFE_POINT)) == supplied
    assert stop.sources == ["input_required", "pausing", "working"]  # the statuses a pause may be entered from


def test_it_keeps_a_value_frozen():
    with pytest.raises(FrozenInstanceError):
        store.NO_CHECKPOINT.cp_sequence = 1
