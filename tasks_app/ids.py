"""Task ids: UUID version 7 (RFC 9562), time-ordered.

A random (version 4) id sends every new task, and every step, event and ledger row keyed by it, to a random leaf
page of each B-tree index on it: with a million stored tasks nearly every insert touches a page not written since
the last checkpoint and writes it whole into the WAL (a full-page image). A version 7 id starts with the creation
time in milliseconds, so new tasks and their rows go to the few right-most pages, as in a log. The remaining 74
bits are random, so ids stay unguessable and unique across processes. The time in the id only orders the
index; the task's created_at is still the database's clock.
"""

from __future__ import annotations

import os
import time
import uuid


def uuid7(*, unix_ms: int | None = None) -> uuid.UUID:
    """A UUID version 7: 48 bits of Unix time in ms, version, 12 random bits, variant, 62 random bits."""
    ms = time.time_ns() // 1_000_000 if unix_ms is None else unix_ms
    value = (ms & (2**48 - 1)) << 80 | int.from_bytes(os.urandom(10), "big")
    value = value & ~(0xF << 76) | 0x7 << 76  # version 7
    value = value & ~(0x3 << 62) | 0x2 << 62  # variant 10 (RFC 9562)
    return uuid.UUID(int=value)
