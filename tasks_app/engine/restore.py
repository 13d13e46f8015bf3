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
    state = CheckpointState(plan_version=claim.plan_version, next_step=claim.next_step_index,
                            steering_cursor=claim.steering_cursor)
    if not claim.steps_completed and not claim.checkpoint_sequence:
        return Restored(state=state, steps_since_checkpoint=0)
    task_id = claim.fence.task_id
    row = store.checkpoint_latest(task_id) if claim.checkpoint_sequence else None
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
        # Rows from before checksums existed carry their checksum from the migration that added them.
        if delta_sha256(text) != checksum:
            raise DeadLetter("step_delta_corrupt", f"step {seq} ({name}): its stored state delta does not match "
                                                   f"its checksum; it was altered or damaged")
        delta = json.loads(text)
        state_apply_delta(state.variables, delta)
        state.artifact_refs.update(delta.get("artifacts", {}))
        state.effects_succeeded += delta.get("effects", 0)
        if "wait" in delta:  # the step asked for input: the task waits after it until the wait is answered
            state.open_wait = delta["wait"]
        state.through_seq, state.last_step = seq, name
        last = (plan_version, step_index, name)
    # The cursor, the history and the plan must tell the same story; if not, stop rather than guess.
    if state.through_seq != claim.steps_completed:
        raise DeadLetter("checkpoint_corrupt", f"state rebuilt through step {state.through_seq} but the task has "
                                               f"{claim.steps_completed} committed steps")
    state.next_step = claim.next_step_index
    state.plan_version = claim.plan_version
    state.steering_cursor = max(state.steering_cursor, claim.steering_cursor)
    if last and last[0] == claim.plan_version and claim.plan_chunk is not None \
            and chunk_of(last[1]) == chunk_of(claim.next_step_index):
        try:
            planned = chunk_step_name(claim.plan_chunk, last[1])
        except IndexError:
            planned = None
        if planned != last[2]:
            raise DeadLetter("plan_mismatch", f"step {last[1]} ran as {last[2]!r} but the plan now says {planned!r}")
    return Restored(state=state, steps_since_checkpoint=len(deltas))
