"""A task's status transition as one guarded UPDATE with the event that records it: the one statement the services,
the reaper and the operators' dead-letter actions share (ARCHITECTURE §3)."""

from __future__ import annotations

from django.db import transaction
from django.db.models.functions import Now

from tasks_app.errors import InvalidTransition
from tasks_app.events import chain_events, events_insert, transition_events
from tasks_app.models import Task, TaskStatus, sources_of


def task_transition(
    *, task_id, to: TaskStatus, message: str = "", event_data: dict | None = None, extra_events=(),
    sources: list[str] | None = None, guard: dict | None = None, **updates
) -> Task:
    """Move a task to ``to`` with one guarded UPDATE and record it as an event, in one transaction.

    The guard is ``status IN (sources of to)`` from models.TRANSITIONS, or the narrower ``sources`` given, plus
    any ``guard`` filters (e.g. {"lease_owner__isnull": True}); no row matched → InvalidTransition.
    """
    with transaction.atomic():
        # Lock first: the event seq/hash head must not move between reading it and writing the new events
        # (two web replicas cancelling at once would otherwise both write seq n+1).
        head = Task.objects.select_for_update(no_key=True).values("status", "event_seq", "event_head_hash",
                                                                  "tenant_id").get(id=task_id)
        events, seq, head_hash = chain_events(
            task_id, [*transition_events(to, message, **(event_data or {})), *extra_events],
            seq=head["event_seq"], head=head["event_head_hash"],
        )
        rows = Task.objects.filter(id=task_id, status__in=sources or sources_of(to), **(guard or {})).update(
            status=to, status_message=message, event_seq=seq, event_head_hash=head_hash, updated_at=Now(), **updates
        )
        if rows != 1:
            raise InvalidTransition(
                f"The task is {head['status']}; it cannot become {to}.", currentStatus=head["status"]
            )
        events_insert(events, tenant_id=head["tenant_id"])
    return Task.objects.get(id=task_id)
