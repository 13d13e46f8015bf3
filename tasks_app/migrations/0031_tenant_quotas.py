"""Quotas per tenant (docs/quotas.md): a running-task cap the claim enforces, a stored-task cap creation enforces,
and the tenant's own rate limits (config.base.rate_limits).

- Tenant.max_running_tasks, max_stored_tasks (null: no limit), create_rate_limit, steer_rate_limit ("": the
  deployment's RATE_LIMIT_CREATE / RATE_LIMIT_STEER).
- task_waiting_idx becomes task_waiting_tenant_idx, led by the tenant: free slots are handed out tenant by tenant
  (sql.HINT_WAITING), one index range per tenant instead of a walk over one tenant's whole backlog.
- runtime_lease_claim counts the tenant's live leases when it has a cap, and returns the cap: its result columns
  change, so the function is dropped and created again from tasks_app/db/lease_claim.sql (as 0025 did), pinned to the
  sha256 of the text it was written for (tests/test_lease_claim_sql.py). Reversed, the text 0025 applied comes back.
"""

import hashlib
import importlib
from pathlib import Path

import django.core.validators
from django.db import migrations, models

import config.base.rate_limits

LEASE_CLAIM_FILE = Path(__file__).resolve().parent.parent / "db" / "lease_claim.sql"
LEASE_CLAIM_SHA256 = "d2bf84a518be9a2324cd511c73115747d0cc7a9aded52ec6445636fb04b88e80"
_DROP = "DROP FUNCTION IF EXISTS runtime_lease_claim(uuid, text, double precision, integer, text[], integer);"

_function_text = importlib.import_module("tasks_app.migrations.0020_lease_claim_from_file").function_text
_TEXT = _function_text(LEASE_CLAIM_FILE)
_APPLIES = hashlib.sha256(_TEXT.encode()).hexdigest() == LEASE_CLAIM_SHA256

# What 0025 applied (its pinned sha256 a302b82e…): the claim without the tenant's cap.
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
               budget_on_exhausted text)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
BEGIN
    PERFORM pg_advisory_xact_lock(731043270);
    IF (SELECT count(*) FROM tasks_app_task busy WHERE busy.lease_expires_at > now()) >= p_max_concurrent THEN
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
           c.budget_on_exhausted::text
      FROM claimed c;
END
$$;
"""

_RUNNABLE = ['cancelling', 'pausing', 'queued', 'recovering', 'working']


class Migration(migrations.Migration):

    dependencies = [
        ('tasks_app', '0030_task_agent_identity'),
    ]

    operations = [
        migrations.AddField(
            model_name='tenant',
            name='max_running_tasks',
            field=models.PositiveIntegerField(blank=True, help_text='At most this many of the tenant\'s tasks run at once (hold a worker); the rest wait queued. Empty: no limit of its own (the fleet\'s max_concurrent_tasks still holds).', null=True, validators=[django.core.validators.MinValueValidator(1)]),
        ),
        migrations.AddField(
            model_name='tenant',
            name='max_stored_tasks',
            field=models.PositiveIntegerField(blank=True, help_text='At most this many tasks stored, finished ones included: creating another is refused until tasks are purged (retention) or the limit is raised. Empty: no limit.', null=True, validators=[django.core.validators.MinValueValidator(1)]),
        ),
        migrations.AddField(
            model_name='tenant',
            name='create_rate_limit',
            field=models.CharField(blank=True, default='', help_text='Task creations per token or user, e.g. "60/minute"; "off" for none; empty: the deployment\'s RATE_LIMIT_CREATE.', max_length=32, validators=[config.base.rate_limits.rate_limit_validator]),
        ),
        migrations.AddField(
            model_name='tenant',
            name='steer_rate_limit',
            field=models.CharField(blank=True, default='', help_text='Steering commands and cancels per token or user, e.g. "120/minute"; "off" for none; empty: the deployment\'s RATE_LIMIT_STEER.', max_length=32, validators=[config.base.rate_limits.rate_limit_validator]),
        ),
        migrations.RemoveIndex(
            model_name='task',
            name='task_waiting_idx',
        ),
        migrations.AddIndex(
            model_name='task',
            index=models.Index(condition=models.Q(('hint_at__isnull', True), ('lease_owner__isnull', True), ('status__in', _RUNNABLE)), fields=['tenant', '-priority', 'created_at'], name='task_waiting_tenant_idx'),
        ),
        migrations.RunSQL(_DROP + _TEXT, _DROP + _PREVIOUS) if _APPLIES else migrations.RunSQL(migrations.RunSQL.noop),
    ]
