"""The side-effect ledger: each external effect runs at most once per key (ARCHITECTURE §5).

``execute_once`` in tasks_app.context drives it: begin (a committed ``started`` row, fenced on the lease) →
call the effect with the key as its Idempotency-Key → the outcome is written with the step's commit. A crash
between the call and the commit leaves ``started``; whoever runs the step next finds it and must reconcile
(the effect's ``reconcile`` hook asks the remote side) — never a blind retry.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from django.db import connection

from checkpoints_app.fencing import Fence, LeaseLost


class EffectOutcomeUnknown(Exception):
    """A started effect has no recorded outcome and no reconcile hook: a person must decide."""

    def __init__(self, key: str):
        super().__init__(key)
        self.key = key


@dataclass(frozen=True)
class EffectOutcome:
    """What a reconcile hook found out from the remote side."""

    applied: bool
    result: Any = None

    @classmethod
    def was_applied(cls, result: Any = None) -> "EffectOutcome":
        return cls(applied=True, result=result)

    @classmethod
    def not_applied(cls) -> "EffectOutcome":
        return cls(applied=False)


@dataclass(frozen=True)
class EffectBegin:
    inserted: bool
    status: str
    lease_epoch: int
    result: Any


# Records `started` for a new key, fenced on the lease (a zombie worker cannot start an effect). On a key
# that exists, a `failed` attempt is restarted under our epoch; any other row is returned unchanged (the
# no-op DO UPDATE is what makes RETURNING yield the existing row). `xmax = 0` is true only for an insert.
EFFECT_BEGIN_SQL = """
INSERT INTO checkpoints_app_sideeffect (key, task_id, step_seq, name, status, lease_epoch, attempts, started_at)
SELECT %(key)s, t.id, %(step_seq)s, %(name)s, 'started', %(epoch)s, 1, now()
  FROM tasks_app_task t
 WHERE t.id = %(task_id)s AND t.lease_owner = %(owner)s AND t.lease_epoch = %(epoch)s
ON CONFLICT (key) DO UPDATE SET
    status = CASE WHEN checkpoints_app_sideeffect.status = 'failed' THEN 'started'
                  ELSE checkpoints_app_sideeffect.status END,
    attempts = checkpoints_app_sideeffect.attempts
               + CASE WHEN checkpoints_app_sideeffect.status = 'failed' THEN 1 ELSE 0 END,
    lease_epoch = CASE WHEN checkpoints_app_sideeffect.status = 'failed' THEN EXCLUDED.lease_epoch
                       ELSE checkpoints_app_sideeffect.lease_epoch END
RETURNING (xmax = 0) AS inserted, status, lease_epoch, result
"""

# Outcome written outside a step commit (a failed call, a reconciliation), fenced on the lease.
EFFECT_MARK_SQL = """
UPDATE checkpoints_app_sideeffect s
   SET status = %(status)s, result = %(result)s::jsonb, error = %(error)s::jsonb, lease_epoch = %(epoch)s,
       finished_at = CASE WHEN %(status)s IN ('succeeded', 'failed') THEN now() END
  FROM tasks_app_task t
 WHERE s.key = %(key)s AND t.id = %(task_id)s AND t.lease_owner = %(owner)s AND t.lease_epoch = %(epoch)s
RETURNING s.key
"""


def _json(value: Any) -> str | None:
    return None if value is None else json.dumps(value)


def effect_begin(fence: Fence, *, key: str, step_seq: int, name: str) -> EffectBegin:
    with connection.cursor() as cursor:
        cursor.execute(EFFECT_BEGIN_SQL, {**fence.params(), "key": key, "step_seq": step_seq, "name": name})
        row = cursor.fetchone()
    if row is None:
        raise LeaseLost(f"lease lost before effect {key}")
    inserted, status, lease_epoch, result = row
    # Django registers jsonb to load as text (JSONField decodes it); raw cursors get the text.
    result = json.loads(result) if isinstance(result, str) else result
    return EffectBegin(inserted=inserted, status=status, lease_epoch=lease_epoch, result=result)


def effect_mark(fence: Fence, *, key: str, status: str, result: Any = None, error: Any = None) -> None:
    with connection.cursor() as cursor:
        cursor.execute(EFFECT_MARK_SQL, {**fence.params(), "key": key, "status": status, "result": _json(result),
                                         "error": _json(error)})
        if cursor.fetchone() is None:
            raise LeaseLost(f"lease lost while recording effect {key}")
