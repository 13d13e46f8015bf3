"""The engine's hot statements, named, in one place (the ORM cannot say them in one round trip).

Each is a single statement, so each is its own transaction: no lock is ever held across a step's I/O.
"""

from tasks_app.models import RUNNABLE_STATUSES

RUNNABLE = sorted(RUNNABLE_STATUSES)

# Claim: take the lease if the task is runnable and nobody holds a live lease, bumping the epoch (the fencing
# token) so a previous holder's writes fail. The count keeps the fleet under max_concurrent_tasks; it reads
# only leased rows through task_lease_expiry_idx. No row back → someone else has it, it is done, or the
# fleet is full (the caller tells these apart only on this rare path).
CLAIM = """
UPDATE tasks_app_task
   SET lease_owner = %(owner)s, lease_epoch = lease_epoch + 1,
       lease_expires_at = now() + %(ttl)s * interval '1 second'
 WHERE id = %(task_id)s
   AND status = ANY(%(runnable)s)
   AND (lease_expires_at IS NULL OR lease_expires_at < now())
   AND (SELECT count(*) FROM tasks_app_task busy WHERE busy.lease_expires_at > now()) < %(max_concurrent)s
RETURNING lease_epoch, status, workflow_name, workflow_version, input, goal, plan, plan_version, next_step_index,
          steps_completed, event_seq, event_head_hash, checkpoint_sequence, budget_steps, budget_cost, cost_spent,
          priority,
          (deadline_at IS NOT NULL AND deadline_at < now()) AS deadline_passed,
          extract(epoch FROM now() - coalesce(checkpoint_at, created_at)) AS seconds_since_checkpoint
"""

# Why a claim failed, read only when it did: runnable and unleased means the fleet is at max_concurrent_tasks.
CLAIM_PROBE = """
SELECT status = ANY(%(runnable)s) AND (lease_expires_at IS NULL OR lease_expires_at < now()), priority
  FROM tasks_app_task WHERE id = %(task_id)s
"""

# Heartbeat: extend our lease, fenced; the status comes back so a pause/cancel is seen during a long step.
RENEW = """
UPDATE tasks_app_task SET lease_expires_at = now() + %(ttl)s * interval '1 second'
 WHERE id = %(task_id)s AND lease_owner = %(owner)s AND lease_epoch = %(epoch)s
RETURNING status
"""

LATEST_CHECKPOINT = """
SELECT sequence, schema_version, payload, checksum FROM checkpoints_app_checkpoint
 WHERE task_id = %(task_id)s AND NOT quarantined ORDER BY sequence DESC LIMIT 1
"""

DELTAS_AFTER = """
SELECT seq, plan_version, step_index, name, state_delta FROM tasks_app_step
 WHERE task_id = %(task_id)s AND seq > %(after)s AND status = 'committed' ORDER BY seq
"""

# Give the lease back without a status change (the status moved under us; someone else decides now).
RELEASE = """
UPDATE tasks_app_task SET lease_owner = NULL, lease_expires_at = NULL
 WHERE id = %(task_id)s AND lease_owner = %(owner)s AND lease_epoch = %(epoch)s
"""

# After a fenced write matched nothing: was it the lease (LeaseLost) or did someone append an event?
HEAD = """
SELECT lease_owner, lease_epoch, event_seq, event_head_hash, status FROM tasks_app_task WHERE id = %(task_id)s
"""

EVENTS_RECORDSET = "jsonb_to_recordset(%(events)s::jsonb) AS e(seq bigint, type text, data jsonb, prev_hash text, hash text)"


def fenced_write(*, set_clause: str, status_guard: bool, step: bool, checkpoint: bool, prune: bool,
                 effects: bool) -> str:
    """One statement that commits a step (or a transition) atomically, only if we still hold the lease.

    fence: lock the task row FOR NO KEY UPDATE where owner, epoch (and the event head we chained from) still
    match; every other part reads `upd`, so when the fence fails nothing at all is written.
    """
    parts = [f"""
WITH fence AS (
    SELECT id FROM tasks_app_task
     WHERE id = %(task_id)s AND lease_owner = %(owner)s AND lease_epoch = %(epoch)s
       AND event_seq = %(expected_seq)s {"AND status = ANY(%(sources)s)" if status_guard else ""}
       FOR NO KEY UPDATE
), upd AS (
    UPDATE tasks_app_task t
       SET {set_clause}, event_seq = %(new_seq)s, event_head_hash = %(new_head)s, updated_at = now()
      FROM fence WHERE t.id = fence.id
    RETURNING t.status
), ev AS (
    INSERT INTO tasks_app_taskevent (task_id, seq, type, data, at, prev_hash, hash)
    SELECT %(task_id)s, e.seq, e.type, e.data, now(), e.prev_hash, e.hash FROM upd, {EVENTS_RECORDSET}
)"""]
    if step:
        parts.append("""
, st AS (
    INSERT INTO tasks_app_step (task_id, seq, plan_version, step_index, name, status, attempt, lease_epoch,
                                state_delta, output, started_at, finished_at)
    SELECT %(task_id)s, %(step_seq)s, %(plan_version)s, %(step_index)s, %(step_name)s, %(step_status)s,
           %(attempt)s, %(epoch)s, %(delta)s::jsonb, %(output)s::jsonb, %(started_at)s, now() FROM upd
)""")
    if checkpoint:
        parts.append("""
, cp AS (
    INSERT INTO checkpoints_app_checkpoint (task_id, sequence, schema_version, payload, checksum, size_bytes,
                                            quarantined, created_at)
    SELECT %(task_id)s, %(cp_sequence)s, %(cp_schema)s, %(cp_payload)s, %(cp_checksum)s, %(cp_size)s, false, now()
      FROM upd
)""")
    if prune:
        parts.append("""
, pr AS (
    DELETE FROM checkpoints_app_checkpoint c USING upd
     WHERE c.task_id = %(task_id)s AND c.sequence <= %(prune_through)s
)""")
    if effects:
        parts.append("""
, fx AS (
    UPDATE checkpoints_app_sideeffect s SET status = 'succeeded', result = o.result, finished_at = now()
      FROM upd, jsonb_to_recordset(%(effects)s::jsonb) AS o(key text, result jsonb)
     WHERE s.key = o.key
)""")
    parts.append("\nSELECT status FROM upd")
    return "".join(parts)
