"""Safe-point handlers: how an upper app (steering) acts on a running task without the engine importing it.

Dependencies point down (steering_app → tasks_app), so steering registers a handler here from its
``AppConfig.ready()``. The slice loop calls every handler at each safe point — before each step, after each
commit, after a checkpoint, on entering a wait — with what it needs to decide, and writes the decisions it
returns in one fenced statement together with their events: a command is applied atomically with the task
change it causes, or not at all.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

from checkpoints_app.fencing import Fence
from tasks_app.events import Event


class SafePointKind(enum.Enum):
    BEFORE_STEP = "before_step"
    AFTER_COMMIT = "after_commit"
    AFTER_CHECKPOINT = "after_checkpoint"
    ENTERING_WAIT = "entering_wait"  # called by the slice loop once steps can wait for input or approval


@dataclass(frozen=True)
class SafePoint:
    """Where the task stands. ``state_version`` moves with every steering submission, so a handler can skip its
    query when it has not moved since ``steering_cursor`` was written."""

    kind: SafePointKind
    fence: Fence
    status: str
    state_version: int
    steering_cursor: int
    steps_completed: int
    next_step: int
    plan_version: int
    variables: MappingProxyType  # read-only view of the durable state
    goal: Any = None  # the task's current goal (adjust_goal builds the new one from it)

    @property
    def task_id(self):
        return self.fence.task_id


_UNSET: Any = object()


@dataclass(frozen=True)
class PlanAdjustment:
    """adjust_goal: the engine asks the workflow for the rest of the plan under ``goal`` and writes plan_version+1
    — or, if the workflow cannot re-plan, the command's rejection."""

    goal: Any
    command_id: str
    applied: Callable[[dict], Event]  # the applied event, given what changed ({planVersion, …})
    refused: Callable[[str], Event]  # the rejected event, given why


@dataclass
class SafePointDecision:
    """What a handler wants written at this safe point, atomically with the fence."""

    events: list[Event] = field(default_factory=list)
    steering_cursor: int | None = None  # commands up to here are applied (kept in the checkpoint too)
    stop: Literal["paused", "cancelled"] | None = None  # stop here: checkpoint, transition, release the lease
    priority: int | None = None
    goal: Any = _UNSET
    status_message: str | None = None
    adjust: PlanAdjustment | None = None  # ends the fold: one re-plan per write
    # set_budget: the budgets it changes ({maxSteps?, maxCost?, maxTokens?}, each a limit or None for none); the engine
    # writes them over its own, and decides on them before the next step (a lowered one may stop the task there).
    budget: dict | None = None

    @property
    def sets_goal(self) -> bool:
        return self.goal is not _UNSET


SafePointHandler = Callable[[SafePoint], "SafePointDecision | None"]

_handlers: list[SafePointHandler] = []


def safe_point_handler_register(handler: SafePointHandler) -> SafePointHandler:
    """Register a handler (idempotent: AppConfig.ready may run twice)."""
    if handler not in _handlers:
        _handlers.append(handler)
    return handler


def safe_point_handler_unregister(handler: SafePointHandler) -> None:
    if handler in _handlers:
        _handlers.remove(handler)


def safe_point_handlers() -> tuple[SafePointHandler, ...]:
    return tuple(_handlers)
