"""Fair by default (issue 37, finding 5; docs/quotas.md "The default share"): a tenant without a max_running_tasks of
its own runs at most the deployment's default share of the live fleet (runtime.yaml tenants.default_running_share).

runtime_lease_claim takes the share as a new parameter (p_share; NULL: no default share) and counts the fleet's and
the tenant's live leases in one scan: its parameters change, so the function is dropped and created again from
tasks_app/db/lease_claim.sql (as 0031 did), pinned to the sha256 of the text it was written for
(tests/test_lease_claim_sql.py). Reversed, the text 0031 applied comes back. No table changes: the live fleet is the
processes holding a liveness lock (tasks_app.engine.failover), read from pg_locks.
"""

import hashlib
import importlib
from pathlib import Path

from django.db import migrations

LEASE_CLAIM_FILE = Path(__file__).resolve().parent.parent / "db" / "lease_claim.sql"
LEASE_CLAIM_SHA256 = "3b4d05f00311f291d58a07be092d1f2bf00a7f8c2c954fd9dab89221450a2066"
_DROP_PREVIOUS = ("DROP FUNCTION IF EXISTS runtime_lease_claim(uuid, text, double precision, integer, text[], "
                  "integer);")
_DROP = ("DROP FUNCTION IF EXISTS runtime_lease_claim(uuid, text, double precision, integer, text[], integer, "
         "double precision);")

_function_text = importlib.import_module("tasks_app.migrations.0020_lease_claim_from_file").function_text
_TEXT = _function_text(LEASE_CLAIM_FILE)
_APPLIES = hashlib.sha256(_TEXT.encode()).hexdigest() == LEASE_CLAIM_SHA256

# What 0031 applied (its pinned sha256 d2bf84a5…): the claim with the tenant's own cap only.
_PREVIOUS = """CREATE OR REPLACE FUNCTION runtime_lease_claim(
    p_task_id uuid, p_owner text, p_ttl double precision, p_max_concurrent integer, p_runnable text[],
    p_chunk_steps integer)
RETURNS TABLE (lease_epoch bigint, status text, workflow_name text, workflow_version text, input jsonb, goal jsonb,
               plan_version integer, plan_length integer, next_step_index integer, steps_completed integer,
               event_seq bigint, event_head_hash text, checkpoint_sequence integer, budget_steps integer,
               budget_cost numeric, cost_spent numeric, priority smallint, deadline_passed boolean,
               seconds_since_checkpoint double precision, state_version bigint, steering_cursor bigint,
               plan_chunk jsonb, open_effects jsonb, answers jsonb, approval_policy jsonb,
               checkpoint_policy jsonb, tenant_id bigint, budget_tokens bigint, tokens_spent bigint,
               budget_on_exhausted text, tenant_max_running integer)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    v_tenant bigint;
    v_cap integer;
BEGIN
    PERFORM pg_advisory_xact_lock(731043270);
    SELECT t.tenant_id, n.max_running_tasks INTO v_tenant, v_cap
      FROM tasks_app_task t JOIN tasks_app_tenant n ON n.id = t.tenant_id WHERE t.id = p_task_id;
    IF (SELECT count(*) FROM tasks_app_task busy WHERE busy.lease_expires_at > now()) >= p_max_concurrent
       OR (v_cap IS NOT NULL
           AND (SELECT count(*) FROM tasks_app_task busy
                 WHERE busy.lease_expires_at > now() AND busy.tenant_id = v_tenant) >= v_cap) THEN
        UPDATE tasks_app_task t SET hint_at = NULL
         WHERE t.id = p_task_id AND t.status = ANY(p_runnable)
           AND (t.lease_expires_at IS NULL OR t.lease_expires_at < now());
        RETURN;
    END IF;
    RETURN QUERY
    WITH claimed AS (
        UPDATE tasks_app_task t
           SET lease_owner = p_owner, lease_epoch = t.lease_epoch + 1,
               lease_expires_at = now() + p_ttl * interval '1 second', hint_at = NULL
         WHERE t.id = p_task_id AND t.status = ANY(p_runnable)
           AND (t.lease_expires_at IS NULL OR t.lease_expires_at < now())
        RETURNING t.*
    )
    SELECT c.lease_epoch, c.status::text, c.workflow_name::text, c.workflow_version::text, c.input, c.goal,
           c.plan_version, c.plan_length, c.next_step_index, c.steps_completed, c.event_seq,
           c.event_head_hash::text, c.checkpoint_sequence, c.budget_steps, c.budget_cost::numeric,
           c.cost_spent::numeric, c.priority, (c.deadline_at IS NOT NULL AND c.deadline_at < now()),
           extract(epoch FROM now() - coalesce(c.checkpoint_at, c.created_at))::double precision,
           c.state_version, c.steering_cursor,
           (SELECT pc.steps FROM tasks_app_planchunk pc
             WHERE pc.task_id = c.id AND pc.plan_version = c.plan_version
               AND pc.chunk = c.next_step_index / p_chunk_steps),
           -- Only the step in flight can have effects without an outcome: the engine settles every open effect
           -- before a step commits past it (Slice._resolve_open_effects). Served by the ledger's primary key
           -- (task_id, step_seq, key): a range of one step's effects, whatever the task's length.
           (SELECT jsonb_agg(jsonb_build_object('key', s.key, 'name', s.name, 'step_seq', s.step_seq,
                                                'status', s.status) ORDER BY s.step_seq, s.key)
              FROM checkpoints_app_sideeffect s
             WHERE s.task_id = c.id AND s.step_seq > c.steps_completed AND s.status IN ('started', 'unknown')),
           c.answers, c.approval_policy, c.checkpoint_policy, c.tenant_id::bigint, c.budget_tokens, c.tokens_spent,
           c.budget_on_exhausted::text, v_cap
      FROM claimed c;
END
$$;
"""


class Migration(migrations.Migration):

    dependencies = [
        ('tasks_app', '0031_tenant_quotas'),
    ]

    operations = [
        migrations.RunSQL(_DROP_PREVIOUS + _TEXT, _DROP + _PREVIOUS) if _APPLIES
        else migrations.RunSQL(migrations.RunSQL.noop),
    ]
