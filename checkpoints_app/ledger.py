"""The side-effect ledger's rules: each external effect runs at most once per key (ARCHITECTURE §5).

This module is the one definition of the execute-once protocol. It decides; the storage it decides over is a
small port (`EffectStore`) that the engine implements with statements fenced on its lease (tasks_app.db.sql), so
this app imports nothing from the apps above it.

    begin(key) ─ new ────────────────────────────▶ call(key) ─ returns ─▶ outcome written with the step commit
               ─ succeeded ─▶ the recorded result     └─ raises ─▶ failed (may be called again, same key)
               ─ failed ────▶ call again, same key     └─ timed out / interrupted ─▶ unknown
               ─ started / unknown ─▶ reconcile(key): applied ─▶ succeeded (its result, no call)
                                                      not applied ─▶ call again, same key
                                                      nobody can tell ─▶ EffectOutcomeUnknown (a person decides)

An outcome that is unknown is never turned into a blind second call.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from checkpoints_app.models import EffectStatus


class EffectOutcomeUnknown(Exception):
    """Effects were started and their outcome is unknown, and nothing can reconcile them: a person decides."""

    def __init__(self, keys: list[str] | str):
        self.keys = [keys] if isinstance(keys, str) else list(keys)
        super().__init__(", ".join(self.keys))

    @property
    def key(self) -> str:
        return self.keys[0]


@dataclass(frozen=True)
class EffectOutcome:
    """What a reconcile hook (or an operator) found out from the remote side. ``by``: who decided it, as the ledger
    row's resolution keeps it ("reconcile": the workflow's hook; "rule": the effect's recovery rule allows calling it
    again; "call": a timed-out call of this process answered after all; "person": an answer to "did this happen?")."""

    applied: bool
    result: Any = None
    by: str = "reconcile"

    @classmethod
    def was_applied(cls, result: Any = None, *, by: str = "reconcile") -> EffectOutcome:
        return cls(applied=True, result=result, by=by)

    @classmethod
    def not_applied(cls, *, by: str = "reconcile") -> EffectOutcome:
        return cls(applied=False, by=by)


@dataclass(frozen=True)
class EffectBegin:
    inserted: bool
    status: str
    result: Any


class EffectStore(Protocol):
    """Where the protocol's records live; every write is fenced on the caller's lease (LeaseLost otherwise)."""

    def begin(self, *, key: str, name: str) -> EffectBegin: ...  # (the row records the effect's recovery rule)

    def mark(self, *, key: str, status: str, result: Any = None, error: Any = None, restart: bool = False) -> None: ...


class Move(enum.Enum):
    CALL = "call"
    RETURN_RECORDED = "return_recorded"
    RECONCILE = "reconcile"


def effect_next_move(begin: EffectBegin) -> Move:
    """What to do with a key, given what the ledger holds for it."""
    if begin.inserted:
        return Move.CALL
    if begin.status == EffectStatus.SUCCEEDED:
        return Move.RETURN_RECORDED
    if begin.status == EffectStatus.FAILED:  # the call raised, or it was found not applied: same key again
        return Move.CALL
    return Move.RECONCILE  # started or unknown: it may have landed


def resolution(outcome: EffectOutcome, *, by: str) -> dict[str, Any]:
    """The ledger row an answer (a reconcile hook's or an operator's) turns an open effect into."""
    if outcome.applied:
        return {"status": EffectStatus.SUCCEEDED, "result": outcome.result,
                "error": {"resolution": "applied", "resolvedBy": by}}
    return {"status": EffectStatus.FAILED, "result": None, "error": {"resolution": "not_applied", "resolvedBy": by}}


@dataclass(frozen=True)
class EffectRun:
    result: Any
    called: bool  # True: fn ran now; its outcome is written with the step's commit (not yet recorded)


Reconciler = Callable[[str], "EffectOutcome | None"]


def execute_once(store: EffectStore, *, key: str, name: str, call: Callable[[str], Any],
                 reconcile: Reconciler | None, unknown_on: tuple[type[BaseException], ...] = ()) -> EffectRun:
    """Run ``call(key)`` at most once for ``key``; see the module docstring for every path.

    ``reconcile(key)`` answers for a started effect whose outcome is unknown (None: it cannot tell) — the engine's
    one decision, tasks_app.engine.effects.decide, by the rule the row carries.
    ``unknown_on``: exceptions that mean the call may have landed (a timeout, an interrupt): recorded unknown.
    """
    begin = store.begin(key=key, name=name)
    move = effect_next_move(begin)
    if move is Move.RETURN_RECORDED:
        return EffectRun(result=begin.result, called=False)
    if move is Move.RECONCILE:
        outcome = reconcile(key) if reconcile is not None else None
        if outcome is None:
            store.mark(key=key, status=EffectStatus.UNKNOWN)
            raise EffectOutcomeUnknown(key)
        if outcome.applied:
            store.mark(key=key, **resolution(outcome, by=outcome.by))
            return EffectRun(result=outcome.result, called=False)
    if not begin.inserted:  # a failed or not-applied effect is started again under this lease, same key
        store.mark(key=key, status=EffectStatus.STARTED, restart=True)
    try:
        result = call(key)
    except unknown_on as error:
        # Why it is unknown travels typed (the exception's `why`, checkpoints_app.models.UnknownWhy), never read back
        # out of its message.
        store.mark(key=key, status=EffectStatus.UNKNOWN, error={"type": type(error).__name__,
                                                                 "message": str(error)[:500],
                                                                 "why": getattr(error, "why", None)})
        raise
    except Exception as error:
        store.mark(key=key, status=EffectStatus.FAILED, error={"type": type(error).__name__,
                                                                "message": str(error)[:500]})
        raise
    return EffectRun(result=result, called=True)
