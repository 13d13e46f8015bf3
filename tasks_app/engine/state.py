"""A step's durable variables (``ctx.state``) and how a recorded delta is applied to them on restore.

What a step changes is recorded as a per-step delta (written with the step's commit; tasks_app.engine.restore
applies the deltas after the latest checkpoint to rebuild the state).
"""

from __future__ import annotations

import copy
import json
from typing import Any

from config.base.canonical import canonical_json_strict

_MUTABLE = (dict, list)
_MISSING = object()


class DurableState:
    """The task's durable variables (JSON values). Changes are recorded as a per-step delta.

    Assigning (``state["k"] = v``) and deleting are tracked directly. A dict or list that was read may be
    changed in place; its canonical JSON is compared at commit, so such edits are kept too — at a cost
    proportional to the values the step touched, never to the whole state.
    """

    def __init__(self, variables: dict[str, Any]):
        self._vars = variables
        self._set: set[str] = set()
        self._unset: set[str] = set()
        self._read_mutable: dict[str, str] = {}
        # Undo log of the keys this step touched (their values before it), so a failed attempt can be rolled
        # back without copying the whole state at every step.
        self._originals: dict[str, Any] = {}

    def _remember(self, key: str) -> None:
        if key not in self._originals:
            self._originals[key] = copy.deepcopy(self._vars[key]) if key in self._vars else _MISSING

    def __getitem__(self, key: str) -> Any:
        value = self._vars[key]
        if isinstance(value, _MUTABLE) and key not in self._set and key not in self._read_mutable:
            self._remember(key)
            self._read_mutable[key] = canonical_json_strict(value)
        return value

    def get(self, key: str, default: Any = None) -> Any:
        return self[key] if key in self._vars else default

    def __setitem__(self, key: str, value: Any) -> None:
        if not isinstance(key, str):
            raise TypeError(f"state keys are strings, not {type(key).__name__}")
        json_check_quick(value, f"state.{key}")  # fail now, in the step; the commit checks the whole delta strictly
        self._remember(key)
        self._vars[key] = value
        self._set.add(key)
        self._unset.discard(key)

    def __delitem__(self, key: str) -> None:
        self._remember(key)
        del self._vars[key]
        self._unset.add(key)
        self._set.discard(key)
        self._read_mutable.pop(key, None)

    def setdefault(self, key: str, default: Any) -> Any:
        if key not in self._vars:
            self[key] = default
        return self[key]

    def __contains__(self, key: str) -> bool:
        return key in self._vars

    def keys(self):
        return self._vars.keys()

    def delta(self) -> dict[str, Any]:
        """{"set": {k: v}, "unset": [k]} for this step. Values changed in place since they were read count too;
        a value that is not JSON raises NotJson naming it. Tracking goes on until commit() or discard_changes()."""
        changed = set(self._set)
        for key, before in self._read_mutable.items():
            if key in self._vars and canonical_json_strict(self._vars[key], f"state.{key}") != before:
                changed.add(key)
        delta: dict[str, Any] = {}
        if changed:
            delta["set"] = {key: self._vars[key] for key in sorted(changed)}
        if self._unset:
            delta["unset"] = sorted(self._unset)
        return delta

    def commit(self) -> None:
        """The step's changes are durable: start tracking the next step."""
        self._set, self._unset, self._read_mutable, self._originals = set(), set(), {}, {}

    def discard_changes(self) -> None:
        """A failed attempt's changes must not leak into the retry (or the next slice): put back what it touched."""
        for key, original in self._originals.items():
            if original is _MISSING:
                self._vars.pop(key, None)
            else:
                self._vars[key] = original
        self.commit()


def json_check_quick(value: Any, path: str) -> None:
    """The cheap half of canonical_json_strict, on assignment: types JSON cannot carry at all (Decimal, datetime,
    set, NaN …) fail in the step that assigns them; what dumps converts silently is caught at commit."""
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        canonical_json_strict(value, path)  # raises NotJson naming the place
        raise


def state_apply_delta(variables: dict[str, Any], delta: dict[str, Any]) -> None:
    variables.update(delta.get("set", {}))
    for key in delta.get("unset", []):
        variables.pop(key, None)
