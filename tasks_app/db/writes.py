"""Executing the engine's named fenced writes (tasks_app.db.sql) with the task's event chain.

The worker keeps the head of the event chain it last wrote; a web replica (cancel, steering) may append
events meanwhile, which makes the fence's ``event_seq`` guard miss. Then the head is re-read and, if the lease
is still ours and the status still allows the write, the events are chained after the newcomers and the
statement runs again.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from django.db import connection, transaction

from checkpoints_app.fencing import Fence, LeaseLost
from tasks_app.db import sql
from tasks_app.db.prepared import prepared_fetchone
from tasks_app.events import Event, chain_events
from tasks_app.streaming import events_publish


class StatusMoved(Exception):
    """A status-guarded write found the task in another status (e.g. cancelled from the web meanwhile)."""

    def __init__(self, status: str | None):
        super().__init__(status)
        self.status = status


@dataclass(frozen=True)
class Written:
    status: str
    state_version: int
    waiting: bool  # tasks wait for a slot: the releasing worker hands one on
    deadline_passed: bool  # seen at every commit, so a deadline stops the task at its next safe point


class FencedWriter:
    def __init__(self, fence: Fence, *, event_seq: int, event_head: str, status: str, tenant_id: int | None = None):
        self.fence = fence
        self.tenant_id = tenant_id
        self.event_seq = event_seq
        self.event_head = event_head
        self.status = status

    def write(self, statement: str, *, events: list[Event], sources: list[str], **params) -> Written:
        """Run one fenced statement; LeaseLost if the lease is not ours, StatusMoved if the status forbids it."""
        for _ in range(10):
            rows, new_seq, new_head = chain_events(self.fence.task_id, events, seq=self.event_seq,
                                                   head=self.event_head)
            values = {
                **self.fence.params(), **params, "sources": sources, "runnable": sql.RUNNABLE,
                "expected_seq": self.event_seq, "new_seq": new_seq, "new_head": new_head,
                "events": json.dumps([{"seq": r.seq, "type": r.type, "data": r.data, "prev_hash": r.prev_hash,
                                       "hash": r.hash} for r in rows]),
            }
            row = prepared_fetchone(statement, values)
            if row is not None:
                self.event_seq, self.event_head, self.status = new_seq, new_head, row[0]
                if rows:  # live subscribers hear of them once committed (at once, outside a transaction)
                    transaction.on_commit(lambda rows=rows: events_publish(
                        task_id=self.fence.task_id, tenant_id=self.tenant_id, events=rows))
                return Written(status=row[0], state_version=row[1], waiting=row[2], deadline_passed=row[3])
            with connection.cursor() as cursor:
                cursor.execute(sql.HEAD, {"task_id": self.fence.task_id})
                head = cursor.fetchone()
            if head is None:  # the row is gone (purged or deleted by an operator): nothing of ours can be written
                raise LeaseLost(f"task {self.fence.task_id} no longer exists")
            owner, epoch, event_seq, event_head, status = head
            if owner != self.fence.owner or epoch != self.fence.epoch:
                raise LeaseLost(f"task {self.fence.task_id}: lease now {owner}/{epoch}")
            if status not in sources:
                raise StatusMoved(status)
            # Someone (steering, cancel) appended events: chain ours after theirs and try again.
            self.event_seq, self.event_head, self.status = event_seq, event_head, status
        raise LeaseLost(f"task {self.fence.task_id}: could not commit after 10 attempts")
