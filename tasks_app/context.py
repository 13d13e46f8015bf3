"""What a step function gets: durable state, progress, logs, artifacts and effects through the ledger.

Everything a step does is buffered here and written by the engine in the step's one commit statement, except
an effect's ``started`` record, which must be committed before the effect is called (that is the point).
"""

from __future__ import annotations

import concurrent.futures
import copy
import re
from decimal import Decimal
from typing import Any, Callable

from django.core.files.base import ContentFile
from django.core.files.storage import default_storage

from checkpoints_app.fencing import Fence
from checkpoints_app.ledger import EffectOutcome, EffectOutcomeUnknown, effect_begin, effect_mark
from config.canonical import canonical_json
from tasks_app import faults
from tasks_app.redaction import redact
from tasks_app.registry import ToolTimeout

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
            self._read_mutable[key] = canonical_json(value)
        return value

    def get(self, key: str, default: Any = None) -> Any:
        return self[key] if key in self._vars else default

    def __setitem__(self, key: str, value: Any) -> None:
        if not isinstance(key, str):
            raise TypeError("state keys are strings")
        canonical_json(value)  # fail now, in the step, if the value is not JSON
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
        """{"set": {k: v}, "unset": [k]} for this step, then start tracking the next one."""
        changed = set(self._set)
        for key, before in self._read_mutable.items():
            if key in self._vars and canonical_json(self._vars[key]) != before:
                changed.add(key)
        delta: dict[str, Any] = {}
        if changed:
            delta["set"] = {key: self._vars[key] for key in sorted(changed)}
        if self._unset:
            delta["unset"] = sorted(self._unset)
        self._set, self._unset, self._read_mutable, self._originals = set(), set(), {}, {}
        return delta

    def discard_changes(self) -> None:
        """A failed attempt's changes must not leak into the retry: put back what it touched."""
        for key, original in self._originals.items():
            if original is _MISSING:
                self._vars.pop(key, None)
            else:
                self._vars[key] = original
        self._set, self._unset, self._read_mutable, self._originals = set(), set(), {}, {}


def state_apply_delta(variables: dict[str, Any], delta: dict[str, Any]) -> None:
    variables.update(delta.get("set", {}))
    for key in delta.get("unset", []):
        variables.pop(key, None)


_ARTIFACT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,120}$")


class StepContext:
    """Handed to each step function as ``ctx``."""

    def __init__(self, *, fence: Fence, task_id, step_seq: int, step_index: int, step_name: str, attempt: int,
                 goal: Any, input: dict, state: DurableState, artifact_refs: dict[str, str]):
        self.task_id = task_id
        self.step_seq = step_seq
        self.step_index = step_index
        self.step_name = step_name
        self.attempt = attempt
        self.goal = goal
        self.input = input
        self.state = state
        self._fence = fence
        self._artifact_refs = artifact_refs
        self.events: list[tuple[str, dict]] = []
        self.progress_value: tuple[float, str | None] | None = None
        self.effect_outcomes: list[dict] = []  # succeeded effects, written with the step's commit
        self.new_artifacts: dict[str, str] = {}
        self.force_checkpoint = False
        self.cost = Decimal(0)
        self._effect_keys: set[str] = set()

    # -- reporting ---------------------------------------------------------------------------------------------
    def progress(self, fraction: float, phase: str | None = None) -> None:
        """Report progress (0…1) and optionally the phase; written with the step's commit."""
        if not 0 <= fraction <= 1:
            raise ValueError("progress fraction must be between 0 and 1")
        self.progress_value = (float(fraction), phase[:200] if phase else None)

    def log(self, message: str) -> None:
        """A line for the task's event stream. Redacted: tokens, keys, e-mail addresses are masked."""
        text = redact(str(message)).replace("\x00", "\ufffd")[:2000]  # NUL cannot be stored in PostgreSQL
        self.events.append(("log", {"step": self.step_name, "message": text}))

    def spend(self, amount: float | Decimal | str) -> None:
        """Count spending (model tokens, API credits) against the task's cost budget (budget.maxCost).

        Committed with the step; once the total reaches the budget the task fails at its next safe point."""
        amount = Decimal(str(amount))
        if amount < 0:
            raise ValueError("spend() takes a non-negative amount")
        self.cost += amount

    def checkpoint(self) -> None:
        """Ask for a full checkpoint right after this step (as @step(costly=True) does)."""
        self.force_checkpoint = True

    # -- artifacts -----------------------------------------------------------------------------------------------
    def artifact(self, name: str, content: str | bytes) -> str:
        """Store a file through Django's storage API; the task keeps only its reference (returned).

        The path carries the lease epoch: a worker that lost its lease (a zombie) can still finish writing a
        file, but never over the one the current owner commits a reference to. A re-run under the same lease
        overwrites its own file.
        """
        if not _ARTIFACT_NAME.match(name):
            raise ValueError("artifact names are 1–121 letters, digits, '.', '_' or '-'")
        path = f"tasks/{self.task_id}/{self._fence.epoch}/{name}"
        if default_storage.exists(path):
            default_storage.delete(path)
        stored = default_storage.save(path, ContentFile(content.encode() if isinstance(content, str) else content))
        self._artifact_refs[name] = stored
        self.new_artifacts[name] = stored
        self.events.append(("artifact", {"name": name, "ref": stored, "bytes": len(content)}))
        return stored

    # -- effects -------------------------------------------------------------------------------------------------
    def effect_key(self, name: str) -> str:
        # Never includes the attempt number: a retried or recovered step must find the same key.
        return f"{self.task_id}:{self.step_seq}:{name}"

    def effect(self, name: str, fn: Callable[[str], Any], *, reconcile: Callable[[str], EffectOutcome] | None = None,
               timeout: float | None = None) -> Any:
        """Run ``fn(idempotency_key)`` at most once for this step; return its (recorded) result.

        ``reconcile(key)`` is asked when an earlier run started the effect and died before recording the
        outcome; it returns EffectOutcome.was_applied(result) or EffectOutcome.not_applied(). Without it such
        a task is dead-lettered (effect_outcome_unknown) rather than calling the effect blindly again.
        ``timeout``: raise ToolTimeout if fn has not returned after that many seconds (the call keeps running
        in its thread and may still land: that is why fn gets the idempotency key).
        """
        key = self.effect_key(name)
        if key in self._effect_keys:
            # The same name twice in one step would be the same key twice: the second call could not be told
            # apart from a retry of the first. Name each effect of a step differently.
            raise ValueError(f"effect {name!r} was already used in step {self.step_name!r}; names must be unique "
                             f"within a step")
        self._effect_keys.add(key)
        begin = effect_begin(self._fence, key=key, step_seq=self.step_seq, name=name)
        if begin.status == "succeeded":
            return begin.result
        if not begin.inserted and not (begin.status == "started" and begin.lease_epoch == self._fence.epoch):
            # Started by a run that died (or marked unknown): the remote side may or may not have it.
            if reconcile is None:
                effect_mark(self._fence, key=key, status="unknown")
                raise EffectOutcomeUnknown(key)
            outcome = reconcile(key)
            if outcome.applied:
                effect_mark(self._fence, key=key, status="succeeded", result=outcome.result)
                self.events.append(("effect", {"name": name, "key": key, "status": "reconciled"}))
                self.effect_outcomes.append({"key": key, "result": outcome.result, "already_recorded": True})
                return outcome.result
            effect_mark(self._fence, key=key, status="started")  # now ours: call it again, same key
        try:
            result = _call_with_timeout(fn, key, timeout)
        except Exception as error:
            effect_mark(self._fence, key=key, status="failed", error={"type": type(error).__name__,
                                                                       "message": redact(str(error))[:500]})
            raise
        try:
            canonical_json(result)
        except (TypeError, ValueError):
            # The effect happened; only its return value cannot be recorded. Never mark it failed (that would
            # invite a second call): record a marker instead.
            result = {"unrecordable_result": type(result).__name__}
        faults.point("after_effect_before_commit", step_seq=self.step_seq)
        self.effect_outcomes.append({"key": key, "result": result})
        self.events.append(("effect", {"name": name, "key": key, "status": "succeeded"}))
        return result


def _call_with_timeout(fn: Callable[[str], Any], key: str, timeout: float | None) -> Any:
    if timeout is None:
        return fn(key)
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="effect")
    try:
        return pool.submit(fn, key).result(timeout=timeout)
    except concurrent.futures.TimeoutError:
        raise ToolTimeout(f"effect call did not return within {timeout} s") from None
    finally:
        pool.shutdown(wait=False)
