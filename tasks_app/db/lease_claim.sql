-- runtime_lease_claim: the claim's live text (ARCHITECTURE §4.1), called by tasks_app.db.sql.CLAIM.
--
-- This file is the function's one definition. A migration applies it (tasks_app 0020 first, then 0025, 0029, 0031
-- and 0032; the older migrations keep the text they applied, as history), and tests/test_lease_claim_sql.py checks
-- that the database's function is this text. To change it: edit this file and add a migration that applies it again
-- (copy 0020, or 0032 when the parameters or result columns change: it pins the file's sha256), in the same commit.
--
-- pg_advisory_xact_lock(731043270) is tasks_app.db.sql.CLAIM_ADVISORY_LOCK: it serialises claims fleet-wide, so the
-- counts of live leases and the UPDATE that takes one see every earlier claim (max_concurrent_tasks and a tenant's
-- max_running_tasks are exact). The lock is held to the end of the claim's transaction: in autocommit, the claim
-- statement itself.
--
-- A tenant's running cap (Tenant.max_running_tasks, docs/quotas.md), counted over the live leases in the same scan as
-- the fleet's (task_lease_expiry_idx: at most the fleet's leases, whatever the backlog). A tenant without a cap of its
-- own gets the deployment's default share of the live fleet (p_share, runtime.yaml tenants.default_running_share;
-- NULL: none): at most greatest(1, floor(p_share * live worker processes)), the live ones being the processes that
-- hold a liveness lock in this database (tasks_app.engine.failover, LIVENESS_NAMESPACE 0x4C495645 = 1279874629). They
-- are counted (pg_locks, one read of the lock table) only when the tenant already runs a task: a cap is at least 1, so
-- a tenant's first task needs no count. A deployment of one tenant has no one to be fair to: no share applies (its
-- own max_running_tasks still does). Why a share at all: a step holds its worker for as long as its tool call
-- waits, and without it one tenant's calls to a server that never answers held every worker of the fleet.
-- A refused claim consumes the hint as a full fleet does: the task waits hint-less, and a free slot is handed to it
-- later, tenant by tenant (tasks_app.db.dispatch.hints_for_waiting), so the hints of a capped tenant's backlog cost
-- one short claim each and never hold up another tenant's tasks behind them.
-- tenant_max_running (returned) is the cap the claim applied: the tenant's own, or, under the default share, the
-- share's (1 when it was not counted): not NULL tells the slice to hand its slot on when it lets the task go
-- (tasks_app.engine.slice.Slice._hand_on names the race).
CREATE OR REPLACE FUNCTION runtime_lease_claim(
    p_task_id uuid, p_owner text, p_ttl double precision, p_max_concurrent integer, p_runnable text[],
    p_chunk_steps integer, p_share double precision)
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
    v_leased bigint;
    v_tenant_leased bigint;
BEGIN
    PERFORM pg_advisory_xact_lock(731043270);
    SELECT t.tenant_id, n.max_running_tasks INTO v_tenant, v_cap
      FROM tasks_app_task t JOIN tasks_app_tenant n ON n.id = t.tenant_id WHERE t.id = p_task_id;
    SELECT count(*), count(*) FILTER (WHERE busy.tenant_id = v_tenant) INTO v_leased, v_tenant_leased
      FROM tasks_app_task busy WHERE busy.lease_expires_at > now();
    IF v_cap IS NULL AND p_share IS NOT NULL AND EXISTS (SELECT 1 FROM tasks_app_tenant o WHERE o.id <> v_tenant) THEN
        v_cap := 1;
        IF v_tenant_leased > 0 THEN
            v_cap := greatest(1, floor(p_share * (
                SELECT count(*) FROM pg_locks l
                 WHERE l.locktype = 'advisory' AND l.classid = 1279874629::oid AND l.objsubid = 2 AND l.granted
                   AND l.database = (SELECT d.oid FROM pg_database d WHERE d.datname = current_database()))))::integer;
        END IF;
    END IF;
    IF v_leased >= p_max_concurrent OR (v_cap IS NOT NULL AND v_tenant_leased >= v_cap) THEN
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
