"""Calls raced against each other, as two workers, two requests or two operators would race."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from django.db import connection


def at_once(*calls: Callable[[], Any], timeout: float = 30) -> list:
    """Each call in a thread of its own, all let go at the same instant (a barrier; ``timeout`` seconds for every
    thread to arrive), each on its own database connection, closed after it (Django opens one per thread, and an
    open one would outlive the test and block its flush). Returns their outcomes in the calls' order: what a call
    returned, or the exception it raised — often the outcome under test (a conflict, a refusal), so it is returned,
    not raised. The same call twice: ``at_once(*[call] * 2)``."""
    barrier, outcomes = threading.Barrier(len(calls)), [None] * len(calls)

    def run(index: int) -> None:
        try:
            barrier.wait(timeout)
            outcomes[index] = calls[index]()
        except Exception as error:  # noqa: BLE001 — the outcome, for the test to judge
            outcomes[index] = error
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(index,)) for index in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return outcomes
