"""An agent's conversation as rebuildable facts (docs/architecture.md §11): not the model's session but its messages,
each stored once by the digest of its content (TranscriptMessage); the task's state keeps only the digests, turn by
turn, so a checkpoint holds references and a step's state change is one turn's digests, whatever the length of the
conversation before it.

A message row is written before the step that refers to it commits and is never changed: a step that does not commit
leaves at most an unreferenced row, and the same message written twice (a re-run) is the same row. Rows are read back
through a bounded per-process cache keyed by (task, digest) — safe because a digest names one content forever — so a
worker running one task's turns after each other reads each message once.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import OrderedDict
from typing import Any

from agents_app.models import TranscriptMessage

CACHE_SIZE = 4096
_cache: OrderedDict[tuple[str, str], dict] = OrderedDict()


def message_digest(message: dict[str, Any]) -> str:
    text = json.dumps(message, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()


def _remember(task_id, digest: str, message: dict) -> None:
    _cache[(str(task_id), digest)] = message
    _cache.move_to_end((str(task_id), digest))
    while len(_cache) > CACHE_SIZE:
        _cache.popitem(last=False)


def messages_store(task_id, messages: list[dict[str, Any]]) -> list[str]:
    """Store the messages (each once: a row that exists stays as it is); their digests, in order."""
    digests = [message_digest(message) for message in messages]
    if messages:
        TranscriptMessage.objects.bulk_create(
            [TranscriptMessage(task_id=task_id, digest=digest, role=str(message.get("role", "")), message=message)
             for digest, message in zip(digests, messages, strict=True)], ignore_conflicts=True)
        for digest, message in zip(digests, messages, strict=True):
            _remember(task_id, digest, message)
    return digests


def messages_load(task_id, digests: list[str]) -> list[dict[str, Any]]:
    """The messages these digests name, in order (one query for those this process has not read yet)."""
    missing = sorted({digest for digest in digests if (str(task_id), digest) not in _cache})
    if missing:
        rows = TranscriptMessage.objects.filter(task_id=task_id, digest__in=missing).values_list("digest", "message")
        for digest, message in rows:
            _remember(task_id, digest, message)
    found = []
    for digest in digests:
        message = _cache.get((str(task_id), digest))
        if message is None:
            raise LookupError(f"transcript message {digest[:12]} of task {task_id} is missing")
        found.append(message)
    return found


_DIGEST = re.compile(r"^[0-9a-f]{64}$")


def refs_in(variables: dict[str, Any]) -> set[str]:
    """Every message digest an agent's state refers to (its turns' lists, the answer, the summary), found by shape:
    a state holds no other 64-hex strings, and one more copied row would only be an unreferenced one."""
    found: set[str] = set()

    def walk(value: Any) -> None:
        if isinstance(value, str):
            if _DIGEST.match(value):
                found.add(value)
        elif isinstance(value, dict):
            for item in value.values():
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)

    walk(variables)
    return found


def messages_copy(from_task_id, to_task_id, digests: set[str]) -> int:
    """Copy these messages of one task to another (a fork inherits its original's conversation up to the fork);
    the rows are immutable, so a copy is the same fact under the new task. How many were copied."""
    rows = TranscriptMessage.objects.filter(task_id=from_task_id, digest__in=sorted(digests))
    copies = [TranscriptMessage(task_id=to_task_id, digest=row.digest, role=row.role, message=row.message)
              for row in rows]
    TranscriptMessage.objects.bulk_create(copies, ignore_conflicts=True)
    return len(copies)
