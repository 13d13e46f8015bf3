"""What operators do with dead-lettered tasks (ARCHITECTURE §7): list them, answer their effects of unknown outcome,
retry from the last good checkpoint, or abandon. The admin, the console and `manage.py dead_letters` call these."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.db.models import Q
from django.db.models.functions import Now

from checkpoints_app.checkpoints import CheckpointCorrupt, checkpoint_verify
from checkpoints_app.ledger import EffectOutcome, resolution
from checkpoints_app.models import Checkpoint, EffectStatus, SideEffect
from tasks_app import access
from tasks_app.db.dispatch import task_dispatch
from tasks_app.db.transitions import task_transition
from tasks_app.models import Task, TaskStatus


class DeadLetterError(ValueError):
    pass


@dataclass(frozen=True)
class EffectAnswer:
    """An operator's answer for one effect of unknown outcome, after checking the remote system."""

    applied: bool
    result: Any = None  # what the step receives as the effect's result when it did happen

    def outcome(self) -> EffectOutcome:
        return (EffectOutcome.was_applied(self.result, by="person") if self.applied
                else EffectOutcome.not_applied(by="person"))


def dead_letter_open_effects(*, task_id) -> list[SideEffect]:
    """The effects of a task whose outcome nobody knows: each needs an operator's answer before a retry. Each with
    ``still_landing``: its call's deadline has not passed on the database's clock (no answer is taken before it)."""
    return list(SideEffect.objects.filter(task_id=task_id, status__in=[EffectStatus.STARTED, EffectStatus.UNKNOWN])
                .annotate(still_landing=Q(deadline__gt=Now())).order_by("step_seq", "key"))


def dead_letter_retry(*, task_id, answers: dict[str, EffectAnswer] | None = None, requested_by: str = "",
                      reason: str = "") -> Task:
    """Resume a dead-lettered task from its last good checkpoint.

    Checkpoints that fail verification are quarantined (kept for forensics, skipped by recovery), so the task
    resumes from the newest good one plus the step deltas after it. Every effect of unknown outcome needs its
    own answer (``answers[key]``): applied, with the result the step should receive, or not applied, which lets
    the step call it again with the same idempotency key. One answer cannot fit two effects of which one landed.
    """
    answers = answers or {}
    with transaction.atomic():
        task = Task.objects.select_for_update(no_key=True).get(id=task_id)
        if task.status != TaskStatus.DEAD_LETTERED:
            raise DeadLetterError(f"task {task_id} is {task.status}, not dead_lettered")
        open_effects = dead_letter_open_effects(task_id=task_id)
        unanswered = [effect.key for effect in open_effects if effect.key not in answers]
        if unanswered:
            raise DeadLetterError(f"effects with unknown outcome need an answer each: {', '.join(unanswered)}. Check "
                                  f"the remote system, then answer per effect: admin → the task → 'Retry…', or "
                                  f"manage.py dead_letters retry ID --effect KEY=applied[:RESULT_JSON] "
                                  f"--effect KEY=not_applied")
        unknown_keys = sorted(set(answers) - {effect.key for effect in open_effects})
        if unknown_keys:
            raise DeadLetterError(f"these effects are not open on task {task_id}: {', '.join(unknown_keys)}")
        # Never a person's answer while the call can still land (issue 38): a dead letter can come before a call's
        # deadline (a stop or a failure cannot wait for it), and an answer given then — "not_applied", because
        # nothing shows yet — would call the effect a second time. Refused until the deadline, on the database's clock.
        landing = [effect for effect in open_effects if effect.still_landing]
        if landing:
            raise DeadLetterError("the call may still land, so nobody can say yet whether it happened: "
                                  + "; ".join(f"{effect.key} until {effect.deadline.isoformat()}" for effect in landing)
                                  + ". Answer after that.")
        for effect in open_effects:
            row = resolution(answers[effect.key].outcome(), by=requested_by or "operator")
            SideEffect.objects.filter(task_id=task_id, step_seq=effect.step_seq, key=effect.key,
                                      status=effect.status).update(finished_at=Now(), **row)
        # Sequences keep counting past quarantined checkpoints; recovery reads the newest good one.
        quarantined = _quarantine_corrupt_checkpoints(task_id)
        task = task_transition(task_id=task_id, to=TaskStatus.RECOVERING,
                               message="Retrying from the last good checkpoint",
                               event_data={"requestedBy": requested_by, "reason": reason,
                                           "quarantinedCheckpoints": quarantined,
                                           "effects": {key: "applied" if answer.applied else "not_applied"
                                                       for key, answer in sorted(answers.items())}},
                               recoveries_since_progress=0, error=None, hint_at=Now())
        transaction.on_commit(lambda: task_dispatch(task.id, priority=task.priority))
    return task


def _quarantine_corrupt_checkpoints(task_id) -> list[int]:
    quarantined = []
    for checkpoint in Checkpoint.objects.filter(task_id=task_id, quarantined=False).order_by("-sequence"):
        try:
            checkpoint_verify(payload=checkpoint.payload, checksum=checkpoint.checksum,
                              schema_version=checkpoint.schema_version)
            break
        except CheckpointCorrupt:
            Checkpoint.objects.filter(id=checkpoint.id).update(quarantined=True)
            quarantined.append(checkpoint.sequence)
    return quarantined


def dead_letter_abandon(*, task_id, requested_by: str = "", reason: str = "") -> Task:
    """Give up on a dead-lettered task: it fails with the dead-letter reason kept in its error, and who gave up and
    why in its error and the audit trail."""
    task = Task.objects.get(id=task_id)
    if task.status != TaskStatus.DEAD_LETTERED:
        raise DeadLetterError(f"task {task_id} is {task.status}, not dead_lettered")
    error = {**(task.error or {}), "abandonedBy": requested_by, "abandonReason": reason}
    return task_transition(task_id=task_id, to=TaskStatus.FAILED, message="Abandoned by an operator",
                           event_data={"requestedBy": requested_by, "reason": reason}, error=error,
                           completed_at=Now())


def dead_letters(*, actor: access.Actor):
    """The dead-lettered tasks ``actor`` may see (the one access rule, tasks_app.access.visible), most recently
    changed first: a tenant's members see their tenant's, staff of no tenant every tenant's. The actor is required:
    a list without one showed every tenant's task ids, reasons and effect keys to any tenant's viewer (issue 37)."""
    return access.visible(actor, Task.objects.filter(status=TaskStatus.DEAD_LETTERED)).order_by("-updated_at")
