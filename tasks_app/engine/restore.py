"""Rebuilding a claimed task's state: latest good checkpoint + the step deltas after it (ARCHITECTURE §4.4).

Both are integrity-checked: the checkpoint by its checksum and schema version, every delta by the sha256 of
its stored text (which the step's progress event also carries, so the audit chain covers it). Anything that
does not verify, or a history that does not add up, dead-letters the task — never a guess, never a blind re-run.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from checkpoints_app.checkpoints import CheckpointCorrupt, CheckpointState, checkpoint_state, checkpoint_verify
from tasks_app.db import store
from tasks_app.engine.decisions import DeadLetter
from tasks_app.engine.lease import Claim
from tasks_app.engine.plans import chunk_of, chunk_step_name
from tasks_app.engine.state import state_apply_delta


def delta_sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass
class Restored:
    state: CheckpointState
    steps_since_checkpoint: int


def state_restore(claim: Claim) -> Restored:
    """The task's state as of its last committed step, verified; DeadLetter if it cannot be trusted."""
    return _rebuild(task_id=claim.fence.task_id, plan_version=claim.plan_version,
                    next_step_index=claim.next_step_index, steering_cursor=claim.steering_cursor,
                    steps_completed=claim.steps_completed, checkpoint_sequence=claim.checkpoint_sequence,
                    plan_chunk=claim.plan_chunk)


def state_read(task) -> CheckpointState:
    """The same rebuild for a reader (the console, the API): from the task row as read, with no lease and no plan
    check (only a worker about to run the next step needs it). DeadLetter if the history does not add up — which a
    reader also meets when a step commits between its read of the row and of the deltas: read the row again."""
    return _rebuild(task_id=task.id, plan_version=task.plan_version, next_step_index=task.next_step_index,
                    steering_cursor=task.steering_cursor, steps_completed=task.steps_completed,
                    checkpoint_sequence=task.checkpoint_sequence, plan_chunk=None).state


def _apply_step(state: CheckpointState, seq: int, name: str, text: str, checksum: str) -> None:
    """One committed step's delta onto ``state``, verified first (DeadLetter if it does not match its checksum).
    Rows from before checksums existed carry their checksum from the migration that added them."""
    if delta_sha256(text) != checksum:
        raise DeadLetter("step_delta_corrupt", f"step {seq} ({name}): its stored state delta does not match its "
                                               f"checksum; it was altered or damaged")
    delta = json.loads(text)
    state_apply_delta(state.variables, delta)
    state.artifact_refs.update(delta.get("artifacts", {}))
    state.effects_succeeded += delta.get("effects", 0)
    if "wait" in delta:  # the step asked for input: the task waits after it until the wait is answered
        state.open_wait = delta["wait"]
    state.through_seq, state.last_step = seq, name


def state_through(task_id, seq: int) -> CheckpointState:
    """The task's state as it was right after its committed step ``seq`` (0: before any step) — what a fork starts
    from (tasks_app.forks). Steps are immutable once committed, so this reads a past nobody changes, whatever the
    task does meanwhile: the newest kept checkpoint at or before ``seq`` (the engine prunes old ones; none kept →
    from the start), then the verified deltas up to ``seq``. DeadLetter (its reason and message) if that history
    does not verify or add up. Cost: the deltas since that checkpoint, once per fork."""
    from checkpoints_app.models import Checkpoint  # (the engine's own reads go through the store's statements)
    from tasks_app.models import Step

    state = CheckpointState()
    for sequence, schema_version, payload, checksum in (
            Checkpoint.objects.filter(task_id=task_id, quarantined=False).order_by("-sequence")
            .values_list("sequence", "schema_version", "payload", "checksum")):
        try:
            candidate = checkpoint_state(checkpoint_verify(payload=payload, checksum=checksum,
                                                           schema_version=schema_version))
        except CheckpointCorrupt:
            continue  # an older one, or the deltas from the start, still rebuild it
        if candidate.through_seq <= seq:
            state = candidate
            break
    deltas = (Step.objects.filter(task_id=task_id, seq__gt=state.through_seq, seq__lte=seq, status="committed")
              .order_by("seq").values_list("seq", "name", "state_delta", "delta_sha256"))
    for step_seq, name, text, checksum in deltas:
        if step_seq != state.through_seq + 1:
            raise DeadLetter("checkpoint_corrupt", f"step {state.through_seq + 1} is missing from the history")
        _apply_step(state, step_seq, name, text, checksum)
    if state.through_seq != seq:
        raise DeadLetter("checkpoint_corrupt", f"the history ends at step {state.through_seq}, not {seq}")
    return state


def _rebuild(*, task_id, plan_version: int, next_step_index: int, steering_cursor: int, steps_completed: int,
             checkpoint_sequence: int | None, plan_chunk: list | None) -> Restored:
    state = CheckpointState(plan_version=plan_version, next_step=next_step_index, steering_cursor=steering_cursor)
    if not steps_completed and not checkpoint_sequence:
        return Restored(state=state, steps_since_checkpoint=0)
    row = store.checkpoint_latest(task_id) if checkpoint_sequence else None
    if row is not None:
        sequence, schema_version, payload, checksum = row
        try:
            state = checkpoint_state(checkpoint_verify(payload=payload, checksum=checksum,
                                                       schema_version=schema_version))
        except CheckpointCorrupt as corrupt:
            raise DeadLetter("checkpoint_corrupt", f"checkpoint {sequence}: {corrupt}") from None
    deltas = store.step_deltas_after(task_id, after=state.through_seq)
    last = None
    for seq, plan_version, step_index, name, text, checksum in deltas:
        _apply_step(state, seq, name, text, checksum)
        last = (plan_version, step_index, name)
    # The cursor, the history and the plan must tell the same story; if not, stop rather than guess.
    if state.through_seq != steps_completed:
        raise DeadLetter("checkpoint_corrupt", f"state rebuilt through step {state.through_seq} but the task has "
                                               f"{steps_completed} committed steps")
    state.next_step = next_step_index
    state.plan_version = plan_version
    state.steering_cursor = max(state.steering_cursor, steering_cursor)
    if last and last[0] == plan_version and plan_chunk is not None \
            and chunk_of(last[1]) == chunk_of(next_step_index):
        try:
            planned = chunk_step_name(plan_chunk, last[1])
        except IndexError:
            planned = None
        if planned != last[2]:
            raise DeadLetter("plan_mismatch", f"step {last[1]} ran as {last[2]!r} but the plan now says {planned!r}")
    return Restored(state=state, steps_since_checkpoint=len(deltas))
