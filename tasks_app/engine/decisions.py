"""The durable decisions a slice can end in, raised where they are found and written by the slice loop.

No exception leaves a slice without one of these being written (or the lease being lost, in which case the
new owner decides): TaskFails (the task fails with a message), DeadLetter (parked for an operator with a
reason), or the status having moved under the worker (tasks_app.db.store.StatusMoved: someone else decided).
"""

from __future__ import annotations

from decimal import Decimal


class DeadLetter(Exception):
    def __init__(self, reason: str, message: str, *, cost: Decimal = Decimal(0), tokens: int = 0):
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.cost = cost  # spent by attempts of the step that ended here, not committed by any step
        self.tokens = tokens  # (model tokens, counted like cost)


class TaskFails(Exception):
    """The task fails. ``error`` is stored on the task: {type, message, step?, stepIndex?, attempt?, attempts?}."""

    def __init__(self, error: dict, *, failed_step: bool = False, cost: Decimal = Decimal(0), tokens: int = 0,
                 events: list | tuple = ()):
        super().__init__(error["message"])
        self.error = error
        self.failed_step = failed_step  # a step's own failure: its row is written with status failed
        self.cost = cost
        self.tokens = tokens
        self.events = list(events)  # written with the failure (e.g. the tool.denied that caused it)


class EntersWait(Exception):
    """The step stopped before an effect that needs approval: the task waits (input_required) for a person."""

    def __init__(self, wait: dict, *, cost: Decimal = Decimal(0), tokens: int = 0):
        super().__init__(wait["prompt"])
        self.wait = wait
        self.cost = cost
        self.tokens = tokens


class Parks(Exception):
    """The step waits for something outside (a downstream MCP task): the task lets go of its worker and lease and is
    handed back to a worker after ``seconds`` (waits.ExternalWait, raised by the step, becomes this)."""

    def __init__(self, *, seconds: float, message: str, cost: Decimal = Decimal(0), tokens: int = 0):
        super().__init__(message)
        self.seconds = seconds
        self.message = message
        self.cost = cost
        self.tokens = tokens


class StepTimeLimitExceeded(BaseException):
    """Raised into a step that ran past its time limit. A BaseException, so step code that catches Exception
    broadly cannot swallow it and run on."""

    why = "timed_out"  # an effect it interrupted: no answer within its time (checkpoints_app.models.UnknownWhy)
