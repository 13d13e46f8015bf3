"""Named fault-injection points in the commit path, off unless a test or the chaos tool arms them.

Crash tests use these instead of guessing with sleeps (peers.md §3, after DBOS's debug triggers). Arm them in
a worker through the environment, e.g.

    RUNTIME_FAULT_POINTS="after_effect_before_commit:kill@step_seq=3"
    RUNTIME_FAULT_POINTS="during_lease_renewal:hang;after_commit_before_chain:raise"

Actions: kill (SIGKILL this process), raise (InjectedFault), hang (block until killed), sleep=<seconds>.
Conditions after @ (comma-separated key=value) must all equal the values passed at the point.
"""

from __future__ import annotations

import os
import signal
import time
from contextlib import contextmanager

POINTS = frozenset({"before_effect_call", "after_effect_before_commit", "after_commit_before_chain",
                    "during_lease_renewal"})


class InjectedFault(BaseException):
    """Stands for the process dying at this point: a BaseException, so no `except Exception` on the way out
    (a failed-call record, a step retry) treats it as an ordinary error."""


def parse(spec: str) -> dict[str, tuple[str, dict[str, str]]]:
    armed = {}
    for item in filter(None, (part.strip() for part in spec.split(";"))):
        target, _, conditions = item.partition("@")
        name, _, action = target.partition(":")
        if name not in POINTS:
            raise ValueError(f"unknown fault point {name!r}; known: {', '.join(sorted(POINTS))}")
        armed[name] = (action or "raise", dict(c.split("=", 1) for c in conditions.split(",") if c))
    return armed


_armed = parse(os.environ.get("RUNTIME_FAULT_POINTS", ""))


def point(name: str, **context) -> None:
    """Called at each named point; does nothing unless armed (one dict lookup)."""
    if not _armed or name not in _armed:
        return
    action, conditions = _armed[name]
    if any(str(context.get(key)) != value for key, value in conditions.items()):
        return
    if action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif action == "hang":
        while True:
            time.sleep(3600)
    elif action.startswith("sleep="):
        time.sleep(float(action.removeprefix("sleep=")))
    else:
        raise InjectedFault(f"fault injected at {name}")


@contextmanager
def armed(spec: str):
    """In-process tests: arm points for the duration of a block."""
    global _armed
    previous, _armed = _armed, parse(spec)
    try:
        yield
    finally:
        _armed = previous
