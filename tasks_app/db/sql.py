"""The engine's hot statements, named, in one place (the ORM cannot say them in one round trip).

Each is a single statement, so each is its own transaction: no lock is ever held across a step's I/O. The
fenced writes share two fixed fragments (the fence and the event insert), joined once at import; no statement
is assembled from data at run time.

The per-step ones (the fenced writes, the effect's `started` row) run as prepared statements
(tasks_app.db.prepared), so their parameters arrive typed: a text parameter used twice, or where the context does
not fix its type, is cast.
"""

from pathlib import Path

from django.contrib.auth import get_user_model

from tasks_app.models import RUNNABLE_STATUSES, TERMINAL_STATUSES, Task, Tenant

# The liveness locks' first key (tasks_app.engine.failover.LIVENESS_NAMESPACE, "LIVE"), repeated: db is below engine
# (tests/test_layers.py); tests/test_fair_share.py checks the two are equal.
LIVENESS_NAMESPACE = 0x4C495645

RUNNABLE = sorted(RUNNABLE_STATUSES)
# The same statuses as SQL literals, for the "is anyone waiting for a slot?" probe inside prepared statements:
# with a literal list the generic plan can use task_waiting_tenant_idx, whose predicate names these statuses; with a
# parameter it could not prove the partial index applies and would scan the table. (Constants of the model,
# joined once at import.)
_RUNNABLE_IN = "(" + ", ".join(f"'{status}'" for status in RUNNABLE) + ")"

# Create: the task row and its first event in one statement — one round trip and one commit instead of BEGIN,
# two INSERTs and COMMIT. The run_step hint is marked pending (hint_at) by the database's clock. With an
# Idempotency-Key, a second request with the same key inserts nothing (the partial unique index
# task_idempotency_key_per_tenant: a concurrent one waits until the first commits) and returns no row; the
# caller then reads the winner. Every other column comes from the model instance the service built (its
# Python defaults applied), in the model's column order, fixed at import. statement_timestamp() is what
# Django's Now() (the columns' db_default) writes: tasks created in one transaction still get distinct times.
TASK_CREATE_BY_DATABASE = ("hint_at", "created_at", "updated_at")
_TASK_CREATE_COLUMNS = [f.column for f in Task._meta.concrete_fields if f.column not in TASK_CREATE_BY_DATABASE]
TASK_CREATE = f"""
WITH task AS (
    INSERT INTO tasks_app_task ({", ".join(_TASK_CREATE_COLUMNS)}, {", ".join(TASK_CREATE_BY_DATABASE)})
    VALUES ({", ".join(f"%({column})s" for column in _TASK_CREATE_COLUMNS)},
            statement_timestamp(), statement_timestamp(), statement_timestamp())
    ON CONFLICT (tenant_id, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING id, hint_at, created_at, updated_at
), first_event AS (
    INSERT INTO tasks_app_taskevent (task_id, seq, type, data, at, prev_hash, hash)
    SELECT task.id, %(first_event_seq)s, %(first_event_type)s, %(first_event_data)s, statement_timestamp(), '',
           %(first_event_hash)s
      FROM task
)
SELECT hint_at, created_at, updated_at FROM task
"""

# A tenant's stored tasks, counted up to its max_stored_tasks (an index-only range of task_tenant_created_idx of at
# most that many entries), under a per-tenant transaction lock taken first by a statement of its own — so this
# count's snapshot comes after every create of the tenant that held the lock before, and two creates cannot both
# take the last place (services.tenant_task_room_check). Only for a tenant with a limit.
STORED_TASKS_ADVISORY_LOCK = 731043271
TENANT_STORED_TASKS_LOCK = f"""
SELECT pg_advisory_xact_lock({STORED_TASKS_ADVISORY_LOCK}, (%(tenant_id)s %% 2147483647)::int)
"""
TENANT_STORED_TASKS = """
SELECT count(*) FROM (SELECT 1 FROM tasks_app_task WHERE tenant_id = %(tenant_id)s LIMIT %(limit)s) stored
"""

# The live text of runtime_lease_claim, the one place it is defined: migrations apply it (0020 on; older ones keep
# the text they applied), and tests/test_lease_claim_sql.py checks the database's function against it.
LEASE_CLAIM_FUNCTION_PATH = Path(__file__).with_name("lease_claim.sql")
# The transaction-level advisory lock runtime_lease_claim takes first (pg_advisory_xact_lock, the literal in
# lease_claim.sql): it serialises every claim of the fleet, so that counting the live leases and taking one are not
# raced by a concurrent claim — without it two claims could both see one free slot and exceed max_concurrent_tasks.
# Any other code that takes this number would queue behind (and hold up) every claim.
CLAIM_ADVISORY_LOCK = 731043270

# Claim: take the lease if the task is runnable and nobody holds a live lease, bumping the epoch (the fencing
# token) so a previous holder's writes fail, and consume the pending hint (hint_at = NULL). The function
# runtime_lease_claim (its live text: LEASE_CLAIM_FUNCTION_PATH) serializes claims on an advisory lock
# (CLAIM_ADVISORY_LOCK) and counts leases on a snapshot taken after the lock, so two concurrent claims cannot
# both take the last free slot: max_concurrent_tasks is exact, and so is the task's tenant's max_running_tasks
# (counted only for a tenant that has one), or for a tenant without one the deployment's default share of the live fleet
# (%(share)s: runtime.yaml tenants.default_running_share, None for none). When the fleet or the tenant is full it only
# consumes the hint: the task
# then waits, hint-less, for a released slot. It also returns the plan chunk holding the cursor, the effects a
# previous lease left without an outcome, and the tenant's running cap (a worker that lets a capped tenant's task go
# hands the slot on: dispatch.hints_for_waiting).
CLAIM = """
SELECT lease_epoch, status, workflow_name, workflow_version, input, goal, plan_version, plan_length, next_step_index,
       steps_completed, event_seq, event_head_hash, checkpoint_sequence, budget_steps, budget_cost, cost_spent,
       priority, deadline_passed, seconds_since_checkpoint, state_version, steering_cursor, plan_chunk, open_effects,
       answers, approval_policy, checkpoint_policy, tenant_id, budget_tokens, tokens_spent, budget_on_exhausted,
       tenant_max_running,
       -- How long the consumed hint waited (schedule-to-start, for metrics). This subquery reads the row as this
       -- statement's snapshot saw it, before the function's UPDATE cleared hint_at: the function's own statements
       -- come later in the transaction. A primary-key lookup in the same round trip; no change to the function.
       (SELECT extract(epoch FROM now() - h.hint_at)::double precision FROM tasks_app_task h
         WHERE h.id = %(task_id)s) AS hint_waited
  FROM runtime_lease_claim(%(task_id)s, %(owner)s, %(ttl)s, %(max_concurrent)s, %(runnable)s, %(chunk_steps)s,
                           %(share)s)
"""

# Why a claim failed, read only when it did: runnable and unleased means the fleet is at max_concurrent_tasks (or,
# after a release that found the lease gone, that the task waits for a hint).
CLAIM_PROBE = """
SELECT status = ANY(%(runnable)s) AND (lease_expires_at IS NULL OR lease_expires_at < now()), priority
  FROM tasks_app_task WHERE id = %(task_id)s
"""

# Heartbeat: extend our lease, fenced; the status and the deadline come back so a pause, a cancel or a passed
# deadline is seen during a long step.
RENEW = """
UPDATE tasks_app_task SET lease_expires_at = now() + %(ttl)s * interval '1 second'
 WHERE id = %(task_id)s AND lease_owner = %(owner)s AND lease_epoch = %(epoch)s
RETURNING status, deadline_at IS NOT NULL AND deadline_at < now(), state_version
"""

LATEST_CHECKPOINT = """
SELECT sequence, schema_version, payload, checksum FROM checkpoints_app_checkpoint
 WHERE task_id = %(task_id)s AND NOT quarantined ORDER BY sequence DESC LIMIT 1
"""

DELTAS_AFTER = """
SELECT seq, plan_version, step_index, name, state_delta, delta_sha256 FROM tasks_app_step
 WHERE task_id = %(task_id)s AND seq > %(after)s AND status = 'committed' ORDER BY seq
"""

# The next chunk of the plan, loaded when the cursor crosses a chunk boundary (once per PLAN_CHUNK_STEPS).
PLAN_CHUNK = """
SELECT steps FROM tasks_app_planchunk WHERE task_id = %(task_id)s AND plan_version = %(plan_version)s
   AND chunk = %(chunk)s
"""

# A task's effects without an outcome, read before a terminal decision (rare: once per task, so a scan of the
# task's effects through its primary key is affordable; no index on status, see SideEffect).
OPEN_EFFECTS = """
SELECT key, name, step_seq, status FROM checkpoints_app_sideeffect
 WHERE task_id = %(task_id)s AND status IN ('started', 'unknown') ORDER BY step_seq, key
"""

# An open effect's rule (effects.decide), what a person asked whether it happened is told, and how long its call may still land (seconds, on this
# clock: negative once its deadline has passed; NULL: no deadline recorded).
EFFECT_UNKNOWN_FACTS = """
SELECT started_at, deadline, unknown_why, status, EXTRACT(EPOCH FROM deadline - now())::float8, name, recovery,
       asks, about
  FROM checkpoints_app_sideeffect
 WHERE task_id = %(task_id)s AND step_seq = %(step_seq)s AND key = %(key)s
"""

# Give the lease back without a status change (the status moved under us, or the slice stopped on an
# infrastructure error), marking the hint the caller sends next as pending.
RELEASE = """
UPDATE tasks_app_task SET lease_owner = NULL, lease_expires_at = NULL, hint_at = now(),
       cost_spent = cost_spent + %(cost)s, tokens_spent = tokens_spent + %(tokens)s::bigint
 WHERE id = %(task_id)s AND lease_owner = %(owner)s AND lease_epoch = %(epoch)s
RETURNING status, priority
"""

# A step waits for something outside (a downstream MCP task): the lease goes, and the hint is pending from the
# moment the task should be looked at again (now() + seconds), so the reaper's lost-hint sweep re-sends it only
# after that moment (plus its grace) if the delayed hint itself is lost with a worker or the broker.
# Race: a pause or cancel that came in meanwhile was applied at the safe point before this (slice._park), and any
# command after it finds the task unleased and applies as for any waiting task.
PARK = """
UPDATE tasks_app_task SET lease_owner = NULL, lease_expires_at = NULL,
       hint_at = now() + %(seconds)s * interval '1 second', status_message = %(message)s,
       cost_spent = cost_spent + %(cost)s, tokens_spent = tokens_spent + %(tokens)s::bigint, updated_at = now()
 WHERE id = %(task_id)s AND lease_owner = %(owner)s AND lease_epoch = %(epoch)s
RETURNING status, priority
"""

# After a fenced write matched nothing: was it the lease (LeaseLost) or did someone append an event?
HEAD = """
SELECT lease_owner, lease_epoch, event_seq, event_head_hash, status, state_version FROM tasks_app_task
 WHERE id = %(task_id)s
"""

# Hand free slots to the tasks waiting for one (runnable, unleased, no hint pending), tenant by tenant: each tenant
# offers its most urgent waiting tasks, as many as its running cap leaves room for (Tenant.max_running_tasks, or for a
# tenant without one the default share of the live fleet, DEFAULT_SHARE_CAP; counted over the live leases; a tenant at
# its cap offers none), and the tenants take turns — every tenant's first before any tenant's second, the tenant
# running fewest first — so one tenant's backlog never stands before another's tasks. At most as many as the fleet has
# free slots (max_concurrent_tasks less the live leases).
# Between tenants running as many, the tenant whose task just let go (%(releasing)s; NULL from the reaper) comes last.
# Why: the older task used to win that tie — and a tenant's backlog is always older than a newcomer's task, so each
# slot a flooding tenant freed went back to it (its count had just dropped to the other's), and a second tenant's
# refused task waited until the whole backlog had run (7.3 s in tests/test_quotas.py's measurement on a loaded
# machine). Now the freed slot goes to the other tenant; the releasing tenant's own room is handed with the second of
# the two hand-outs a letting-go asks for (dispatch.hints_for_waiting). Fewest running still comes first: a tenant
# whose count dropped below the others' (a full fleet) gets its slot back.
# Per tenant the rows come from task_waiting_tenant_idx (a range scan of LIMIT rows): the statement reads one index
# range per tenant, never the whole backlog. The caller holds CLAIM_ADVISORY_LOCK (dispatch.hints_for_waiting), so
# the running counts are those every claim sees, and two hand-outs never pick the same task; the re-check in the
# UPDATE still guards against anything that set a hint meanwhile without it (a create, a release).
# The live fleet: the processes holding a liveness lock in this database (tasks_app.engine.failover.LIVENESS_NAMESPACE),
# as runtime_lease_claim counts them (tasks_app/db/lease_claim.sql); read once per hand-out, only with a share and
# more than one tenant (a deployment of one tenant has no one to be fair to, as in the claim).
LIVE_WORKERS = f"""(SELECT count(*) FROM pg_locks l
   WHERE l.locktype = 'advisory' AND l.classid = {LIVENESS_NAMESPACE}::oid AND l.objsubid = 2 AND l.granted
     AND l.database = (SELECT d.oid FROM pg_database d WHERE d.datname = current_database()))"""
DEFAULT_SHARE_CAP = f"greatest(1, floor(%(share)s::float8 * {LIVE_WORKERS}))::int"
HINT_WAITING = f"""
WITH running AS (
    SELECT tenant_id, count(*) AS n FROM tasks_app_task WHERE lease_expires_at > now() GROUP BY tenant_id
), fleet AS (
    SELECT greatest(%(max_concurrent)s - coalesce((SELECT sum(n) FROM running), 0), 0) AS free,
           CASE WHEN %(share)s::float8 IS NULL OR (SELECT count(*) FROM tasks_app_tenant) < 2 THEN NULL
                ELSE {DEFAULT_SHARE_CAP} END AS share_cap
), offered AS (
    SELECT w.id, coalesce(r.n, 0) AS running, n.id IS NOT DISTINCT FROM %(releasing)s::bigint AS releasing,
           w.priority, w.created_at,
           row_number() OVER (PARTITION BY n.id ORDER BY w.priority DESC, w.created_at) AS turn
      FROM tasks_app_tenant n
     CROSS JOIN fleet
      LEFT JOIN running r ON r.tenant_id = n.id
     CROSS JOIN LATERAL (
           SELECT t.id, t.priority, t.created_at FROM tasks_app_task t
            WHERE t.tenant_id = n.id AND t.status IN {_RUNNABLE_IN} AND t.lease_owner IS NULL AND t.hint_at IS NULL
            ORDER BY t.priority DESC, t.created_at
            LIMIT least(%(limit)s, greatest(coalesce(coalesce(n.max_running_tasks, fleet.share_cap)
                                                     - coalesce(r.n, 0), %(limit)s), 0))
       ) w
), next AS (
    SELECT id FROM offered ORDER BY turn, running, releasing, priority DESC, created_at
     LIMIT least(%(limit)s, (SELECT free FROM fleet))
)
UPDATE tasks_app_task t SET hint_at = now() FROM next
 WHERE t.id = next.id AND t.lease_owner IS NULL AND t.hint_at IS NULL
RETURNING t.id, t.priority
"""

# A new task of a tenant with max_running_tasks joins the tenant's waiting tasks (its pending hint dropped before
# it is sent) when some already wait: services.task_join_waiting. The new row's own hint_at is set, so the probe
# never finds the task itself; task_waiting_tenant_idx answers it with one entry.
TASK_JOIN_WAITING = f"""
UPDATE tasks_app_task SET hint_at = NULL
 WHERE id = %(task_id)s AND EXISTS (
       SELECT 1 FROM tasks_app_task w WHERE w.tenant_id = %(tenant_id)s AND w.status IN {_RUNNABLE_IN}
          AND w.lease_owner IS NULL AND w.hint_at IS NULL)
RETURNING id
"""

# A tenant's live leases (over task_lease_expiry_idx: the fleet's leases at most).
TENANT_LEASED = """
SELECT count(*) FROM tasks_app_task WHERE tenant_id = %(tenant_id)s AND lease_expires_at > now()
"""

# A hint could not be sent (broker down): nothing is pending after all, so the task counts as waiting and the
# reaper's next sweep (or the next released slot) hands it one — seconds, not the lost-message horizon.
HINT_UNSENT = """
UPDATE tasks_app_task SET hint_at = NULL WHERE id = %(task_id)s AND lease_owner IS NULL
"""

# The reaper's sweep, first: which of its parts have anything to look at, in one statement (each EXISTS reads one
# partial index: task_lease_expiry_idx, task_runnable_idx, task_deadline_idx, task_retention_idx — the statuses are
# literals so that the planner can prove those indexes' predicates), while it samples the step table's insert counter
# for the console's steps-per-minute chart (kept by PostgreSQL's statistics, so the steps pay nothing for it) and
# forgets samples older than an hour. An idle fleet's sweep is this statement.
# leased: any lease (expired or held by a gone process: the lease part; the failover watch mostly took them already);
# runnable: any runnable task (lost hints, waiting tasks); overdue: a deadline passed; purgeable: past retention.
_TERMINAL_IN = "(" + ", ".join(f"'{status}'" for status in sorted(TERMINAL_STATUSES)) + ")"
SWEEP_DUE = f"""
WITH sample AS (
    INSERT INTO tasks_app_throughputsample (at, steps_inserted)
    SELECT now(), coalesce((SELECT n_tup_ins FROM pg_stat_user_tables WHERE relid = 'tasks_app_step'::regclass), 0)
), forgotten AS (
    DELETE FROM tasks_app_throughputsample WHERE at < now() - interval '1 hour'
)
SELECT EXISTS (SELECT FROM tasks_app_task WHERE lease_expires_at IS NOT NULL),
       EXISTS (SELECT FROM tasks_app_task WHERE status IN {_RUNNABLE_IN}),
       EXISTS (SELECT FROM tasks_app_task WHERE deadline_at < now() AND status NOT IN {_TERMINAL_IN}
                  AND status <> 'dead_lettered'),
       %(retention_days)s::int > 0 AND EXISTS (
           SELECT FROM tasks_app_task WHERE status IN {_TERMINAL_IN}
              AND completed_at < now() - make_interval(days => %(retention_days)s::int))
"""

# Free slots right now, for the reaper's hand-out to waiting tasks (reads only leased rows).
FREE_SLOTS = """
SELECT %(max_concurrent)s - count(*) FROM tasks_app_task WHERE lease_expires_at > now()
"""

# -- fenced writes ----------------------------------------------------------------------------------------------
# Every write a worker makes to its task goes through one of these. The fence is the WHERE of the task row's
# UPDATE: owner and epoch (and the event head we chained from, and the allowed source statuses) must still match.
# Every other part reads `upd`, so when the fence fails nothing at all is written. The UPDATE locks the row
# itself, and a concurrent claim or reaper that updated it first makes PostgreSQL re-check the fence against
# the newest version (READ COMMITTED's EvalPlanQual): no separate SELECT … FOR NO KEY UPDATE, whose lock would
# cost a WAL record of its own on every write.
_FENCE = """
     WHERE t.id = %(task_id)s AND t.lease_owner = %(owner)s AND t.lease_epoch = %(epoch)s
       AND t.event_seq = %(expected_seq)s AND t.status = ANY(%(sources)s)"""

_EVENTS = """
, ev AS (
    INSERT INTO tasks_app_taskevent (task_id, seq, type, data, at, prev_hash, hash)
    SELECT %(task_id)s, e.seq, e.type, e.data, now(), e.prev_hash, e.hash
      FROM upd, jsonb_to_recordset(%(events)s::jsonb) AS e(seq bigint, type text, data jsonb, prev_hash text, hash text)
)"""

# Effect outcomes known in memory (the call returned) are recorded with the step's commit: the rows are named by
# task, step and key, all three columns of its primary key, and each result is picked from a JSON object by
# key. Joined with a set of outcomes instead, the prepared statement's generic plan (which takes any set for 100
# rows) hash-joined it with every effect of the task, or scanned the whole table: one step cost more the longer
# the task and the bigger the ledger (found by `bench --scenario growth` and by auto_explain in the bench).
_EFFECTS = """
, fx AS (
    UPDATE checkpoints_app_sideeffect s
       SET status = 'succeeded', result = %(effect_results)s::jsonb -> s.key, finished_at = now()
      FROM upd
     WHERE s.task_id = %(task_id)s AND s.step_seq = %(step_seq)s AND s.key = ANY(%(effect_keys)s::text[])
)"""

_CHECKPOINT = """
, cp AS (
    INSERT INTO checkpoints_app_checkpoint (task_id, sequence, schema_version, payload, checksum, size_bytes,
                                            quarantined, created_at)
    SELECT %(task_id)s, %(cp_sequence)s, %(cp_schema)s, %(cp_payload)s, %(cp_checksum)s, %(cp_size)s, false, now()
      FROM upd WHERE %(cp_sequence)s::int IS NOT NULL
)"""

_SET_EVENT_HEAD = "event_seq = %(new_seq)s, event_head_hash = %(new_head)s, updated_at = now()"

# What a write that lets the lease go returns (writes.Written): besides the status and the steering version,
# whether the deadline passed and whether tasks wait for a slot — then the worker hands the freed one on.
_RETURNING_LETTING_GO = f"""RETURNING t.status, t.state_version,
              (t.deadline_at IS NOT NULL AND t.deadline_at < now()) AS deadline_passed,
              EXISTS (SELECT 1 FROM tasks_app_task w WHERE w.status IN {_RUNNABLE_IN} AND w.lease_owner IS NULL
                         AND w.hint_at IS NULL) AS waiting"""

# Commit one step: the step row with its checksummed delta, the cursor and progress, events, effect outcomes,
# the plan (first commit only), a checkpoint when the policy says so, and, at the end of a slice, the lease's
# release (the hint sent next is marked pending in the same statement). Quarantined checkpoints are never
# pruned: an operator's retry keeps them for forensics.
# Within a slice the commit changes no indexed column of the task row (the heartbeat thread, not the commit,
# extends the lease), so PostgreSQL updates the row in place on its page (a HOT update, room kept by the table's
# fillfactor): no new entry in any of the task's indexes per step.
COMMIT_STEP = f"""
WITH upd AS (
    UPDATE tasks_app_task t
       SET progress = %(progress)s, phase = coalesce(%(phase)s, t.phase), next_step_index = %(next_index)s,
           steps_completed = %(step_seq)s, cost_spent = t.cost_spent + %(cost)s, recoveries_since_progress = 0,
           tokens_spent = t.tokens_spent + %(tokens)s::bigint,
           -- A task resumed or answered said "…: waiting for a worker" (steering_app.application) until anything
           -- else changed its message: hundreds of steps later. A committed step means a worker has it.
           status_message = CASE WHEN t.status_message LIKE '%%: waiting for a worker' THEN ''
                                 ELSE t.status_message END,
           plan_length = coalesce(%(plan_length)s::int, t.plan_length),
           checkpoint_sequence = coalesce(%(cp_sequence)s::int, t.checkpoint_sequence),
           checkpoint_at = CASE WHEN %(cp_sequence)s::int IS NULL THEN t.checkpoint_at ELSE now() END,
           lease_owner = CASE WHEN %(release)s THEN NULL ELSE t.lease_owner END,
           lease_expires_at = CASE WHEN %(release)s THEN NULL ELSE t.lease_expires_at END,
           hint_at = CASE WHEN %(release)s THEN now() ELSE t.hint_at END,
           {_SET_EVENT_HEAD}
{_FENCE}
    RETURNING t.status, t.state_version,
              (t.deadline_at IS NOT NULL AND t.deadline_at < now()) AS deadline_passed,
              CASE WHEN %(release)s THEN EXISTS (
                  SELECT 1 FROM tasks_app_task w WHERE w.status IN {_RUNNABLE_IN} AND w.lease_owner IS NULL
                     AND w.hint_at IS NULL) ELSE false END AS waiting
){_EVENTS}{_EFFECTS}{_CHECKPOINT}
, st AS (
    INSERT INTO tasks_app_step (task_id, seq, plan_version, step_index, name, status, attempt, lease_epoch,
                                state_delta, delta_sha256, output, started_at, finished_at)
    SELECT %(task_id)s, %(step_seq)s, %(plan_version)s, %(step_index)s, %(step_name)s, 'committed', %(attempt)s,
           %(epoch)s, %(delta)s, %(delta_sha256)s, %(output)s::jsonb, %(started_at)s, now() FROM upd
), pc AS (
    INSERT INTO tasks_app_planchunk (task_id, plan_version, chunk, steps)
    SELECT %(task_id)s, %(plan_version)s, p.chunk, p.steps
      FROM upd, jsonb_to_recordset(%(plan_chunks)s::jsonb) AS p(chunk int, steps jsonb)
), pr AS (
    DELETE FROM checkpoints_app_checkpoint c USING upd
     WHERE c.task_id = %(task_id)s AND c.sequence <= %(prune_through)s::int AND NOT c.quarantined
)
SELECT status, state_version, waiting, deadline_passed FROM upd
"""

# queued/recovering → working at the start of a slice (with a task.snapshot event after a recovery).
START_WORKING = f"""
WITH upd AS (
    UPDATE tasks_app_task t SET status = 'working', status_message = '', {_SET_EVENT_HEAD}
{_FENCE}
    RETURNING t.status, t.state_version,
              (t.deadline_at IS NOT NULL AND t.deadline_at < now()) AS deadline_passed, false AS waiting
){_EVENTS}
SELECT status, state_version, waiting, deadline_passed FROM upd
"""

# The one completion path: after the last step committed (or for an empty plan), store the result and let go.
COMPLETE = f"""
WITH upd AS (
    UPDATE tasks_app_task t
       SET status = 'completed', status_message = 'Completed', result = %(result)s::jsonb,
           result_ref = %(result_ref)s, progress = 1, completed_at = now(),
           plan_length = coalesce(%(plan_length)s::int, t.plan_length),
           lease_owner = NULL, lease_expires_at = NULL, hint_at = NULL, {_SET_EVENT_HEAD}
{_FENCE}
    {_RETURNING_LETTING_GO}
){_EVENTS}
SELECT status, state_version, waiting, deadline_passed FROM upd
"""

# The task fails: the error, the spending of failed attempts and the failed step's row when a step failed (the
# outcomes of effects that returned before the failure are recorded first, by effects_mark).
FAIL = f"""
WITH upd AS (
    UPDATE tasks_app_task t
       SET status = 'failed', status_message = %(message)s, error = %(error)s::jsonb, completed_at = now(),
           cost_spent = t.cost_spent + %(cost)s, tokens_spent = t.tokens_spent + %(tokens)s::bigint,
           lease_owner = NULL, lease_expires_at = NULL, hint_at = NULL,
           {_SET_EVENT_HEAD}
{_FENCE}
    {_RETURNING_LETTING_GO}
){_EVENTS}
, st AS (
    INSERT INTO tasks_app_step (task_id, seq, plan_version, step_index, name, status, attempt, lease_epoch,
                                state_delta, delta_sha256, output, started_at, finished_at)
    SELECT %(task_id)s, %(step_seq)s, %(plan_version)s, %(step_index)s, %(step_name)s, 'failed', %(attempt)s,
           %(epoch)s, '{{}}', '', %(output)s::jsonb, NULL, now()
      FROM upd WHERE %(step_seq)s::int IS NOT NULL
)
SELECT status, state_version, waiting, deadline_passed FROM upd
"""

# Park the task for an operator (what is known — effects that returned — is recorded first, by effects_mark).
DEAD_LETTER = f"""
WITH upd AS (
    UPDATE tasks_app_task t
       SET status = 'dead_lettered', status_message = %(message)s, error = %(error)s::jsonb,
           cost_spent = t.cost_spent + %(cost)s, tokens_spent = t.tokens_spent + %(tokens)s::bigint,
           lease_owner = NULL, lease_expires_at = NULL, hint_at = NULL,
           {_SET_EVENT_HEAD}
{_FENCE}
    {_RETURNING_LETTING_GO}
){_EVENTS}
SELECT status, state_version, waiting, deadline_passed FROM upd
"""

# Pause or cancel at a safe point: a checkpoint (unless the state is too large for one: the deltas still
# rebuild it), the transition, the steering cursor of the command that asked for it, and the lease released. A
# killed task keeps the kill's message (who, why: steering_app.application) when it ends cancelled, so it shows as
# killed wherever its status shows, not as any other "Cancelled".
STOP_AT_SAFE_POINT = f"""
WITH upd AS (
    UPDATE tasks_app_task t
       SET status = %(status)s::varchar,
           status_message = CASE WHEN %(status)s::varchar = 'cancelled' AND t.status_message LIKE 'Killed by %%'
                                 THEN t.status_message ELSE %(message)s END,
           completed_at = CASE WHEN %(status)s::varchar = 'cancelled' THEN now() ELSE t.completed_at END,
           checkpoint_sequence = coalesce(%(cp_sequence)s::int, t.checkpoint_sequence),
           checkpoint_at = CASE WHEN %(cp_sequence)s::int IS NULL THEN t.checkpoint_at ELSE now() END,
           steering_cursor = coalesce(%(steering_cursor)s::bigint, t.steering_cursor),
           cost_spent = t.cost_spent + %(cost)s, tokens_spent = t.tokens_spent + %(tokens)s::bigint,
           lease_owner = NULL, lease_expires_at = NULL, hint_at = NULL, {_SET_EVENT_HEAD}
{_FENCE}
    {_RETURNING_LETTING_GO}
){_EVENTS}{_CHECKPOINT}
SELECT status, state_version, waiting, deadline_passed FROM upd
"""

# A safe-point handler's decision that does not stop the task (e.g. a steering command applied: its events, the
# cursor past it, a new priority, goal or budgets), written atomically with the fence. The budgets are written whole
# (set_budget: the worker's budgets with the command's changes): while the task is leased nothing else writes them,
# since set_budget is applied at its submission only to a task no worker holds (steering_app.application.apply_now).
APPLY_SAFE_POINT = f"""
WITH upd AS (
    UPDATE tasks_app_task t
       SET steering_cursor = coalesce(%(steering_cursor)s::bigint, t.steering_cursor),
           priority = coalesce(%(priority)s::smallint, t.priority),
           budget_steps = CASE WHEN %(set_budget)s THEN %(budget_steps)s::int ELSE t.budget_steps END,
           budget_cost = CASE WHEN %(set_budget)s THEN %(budget_cost)s::numeric ELSE t.budget_cost END,
           budget_tokens = CASE WHEN %(set_budget)s THEN %(budget_tokens)s::bigint ELSE t.budget_tokens END,
           goal = CASE WHEN %(set_goal)s THEN %(goal)s::jsonb ELSE t.goal END,
           status_message = coalesce(%(status_message)s, t.status_message), {_SET_EVENT_HEAD}
{_FENCE}
    RETURNING t.status, t.state_version,
              (t.deadline_at IS NOT NULL AND t.deadline_at < now()) AS deadline_passed, false AS waiting
){_EVENTS}
SELECT status, state_version, waiting, deadline_passed FROM upd
"""

# The task waits for a person (ctx.wait_for_input after its step committed, an effect that needs approval, a spent
# budget): the wait record, a checkpoint (the design's "before an approval wait"; it makes the wait's end cheap to
# resume from), what a suspended attempt spent, and the lease released with no hint: nobody polls a waiting task. The
# answer (steering_app) moves it back to working and sends the hint.
# A budget wait is also guarded on the steering version the worker decided up to (state_version; NULL: not guarded).
# Race: a set_budget submitted while the worker was entering the wait finds the task leased and is left for the
# worker's next safe point — which a waiting task never reaches. Guarded, the entry fails instead (the writer raises
# SteeringArrived), and the worker applies the command and decides again (slice._wait_for_budget).
ENTER_WAIT = f"""
WITH upd AS (
    UPDATE tasks_app_task t
       SET status = 'input_required', status_message = %(message)s, wait = %(wait)s::jsonb,
           cost_spent = t.cost_spent + %(cost)s, tokens_spent = t.tokens_spent + %(tokens)s::bigint,
           checkpoint_sequence = coalesce(%(cp_sequence)s::int, t.checkpoint_sequence),
           checkpoint_at = CASE WHEN %(cp_sequence)s::int IS NULL THEN t.checkpoint_at ELSE now() END,
           lease_owner = NULL, lease_expires_at = NULL, hint_at = NULL, {_SET_EVENT_HEAD}
{_FENCE}
       AND (%(state_version)s::bigint IS NULL OR t.state_version = %(state_version)s::bigint)
    {_RETURNING_LETTING_GO}
){_EVENTS}{_CHECKPOINT}
SELECT status, state_version, waiting, deadline_passed FROM upd
"""

# adjust_goal applied at a safe point: the new goal, the next plan version (its chunks from the one holding the
# cursor on: a slice never reads an earlier one), the steering cursor past the command, with its events.
ADJUST_PLAN = f"""
WITH upd AS (
    UPDATE tasks_app_task t
       SET goal = %(goal)s::jsonb, plan_version = %(plan_version)s, plan_length = %(plan_length)s,
           steering_cursor = %(steering_cursor)s, priority = coalesce(%(priority)s::smallint, t.priority),
           status_message = %(message)s, {_SET_EVENT_HEAD}
{_FENCE}
    RETURNING t.status, t.state_version,
              (t.deadline_at IS NOT NULL AND t.deadline_at < now()) AS deadline_passed, false AS waiting
){_EVENTS}
, pc AS (
    INSERT INTO tasks_app_planchunk (task_id, plan_version, chunk, steps)
    SELECT %(task_id)s, %(plan_version)s, p.chunk, p.steps
      FROM upd, jsonb_to_recordset(%(plan_chunks)s::jsonb) AS p(chunk int, steps jsonb)
)
SELECT status, state_version, waiting, deadline_passed FROM upd
"""

# The rest of a plan from the chunk holding the cursor (a re-plan reads it once; steps never do).
PLAN_CHUNKS_FROM = """
SELECT chunk, steps FROM tasks_app_planchunk WHERE task_id = %(task_id)s AND plan_version = %(plan_version)s
   AND chunk >= %(chunk)s ORDER BY chunk
"""

# -- the ledger's storage, fenced (its rules are checkpoints_app.ledger's) ----------------------------------------
# The task row is locked FOR SHARE, which orders these against the reaper and claims (both UPDATE the row): a
# reaper that committed first makes the fence fail; one that comes later waits for this statement. An
# unlocked read would let a zombie start an effect in the instant after it was reaped.
_EFFECT_FENCE = """
WITH fence AS (
    SELECT id FROM tasks_app_task
     WHERE id = %(task_id)s AND lease_owner = %(owner)s AND lease_epoch = %(epoch)s FOR SHARE
)"""

# The first attempt at an effect: a plain INSERT. Nearly always the key is new; when it is not (a retried or
# recovered step), its primary key (task, step_seq, key) rejects it and the caller runs EFFECT_BEGIN_AGAIN.
# Not ON CONFLICT here: its speculative insertion costs a WAL record of its own on every effect.
# `deadline`: when the call can no longer land (its start + the seconds it may take, margin included), on this
# clock — never a worker's: a person is asked whether it happened only after it (tasks_app.engine.effects).
# `recovery`, `asks`, `about`: how an unknown outcome of it is decided and what a person is shown (the rule the
# effect carries, checkpoints_app.models.Recovery), written once with the row and never changed.
_EFFECT_DEADLINE = "now() + make_interval(secs => %(lands_within)s::float8)"
EFFECT_BEGIN = f"""{_EFFECT_FENCE}
INSERT INTO checkpoints_app_sideeffect (key, task_id, step_seq, name, status, lease_epoch, attempts, started_at,
                                        deadline, recovery, asks, about)
SELECT %(key)s, fence.id, %(step_seq)s, %(name)s, 'started', %(epoch)s, 1, now(), {_EFFECT_DEADLINE},
       %(recovery)s, %(asks)s, %(about)s::jsonb FROM fence
RETURNING true AS inserted, status, result
"""

# The key exists: return its row (locked, so a concurrent outcome is seen whole) — or insert it after all if the
# row that was in the way is gone (a retry cleared it). A concurrent insert of the same key by a zombie waits here
# for the zombie's transaction, never runs the effect a second time.
EFFECT_BEGIN_AGAIN = f"""{_EFFECT_FENCE}
INSERT INTO checkpoints_app_sideeffect (key, task_id, step_seq, name, status, lease_epoch, attempts, started_at,
                                        deadline, recovery, asks, about)
SELECT %(key)s, fence.id, %(step_seq)s, %(name)s, 'started', %(epoch)s, 1, now(), {_EFFECT_DEADLINE},
       %(recovery)s, %(asks)s, %(about)s::jsonb FROM fence
ON CONFLICT (task_id, step_seq, key) DO UPDATE SET attempts = checkpoints_app_sideeffect.attempts
RETURNING (xmax = 0) AS inserted, status, result
"""

EFFECT_MARK = f"""{_EFFECT_FENCE}
UPDATE checkpoints_app_sideeffect s
   SET status = %(status)s::varchar, result = %(result)s::jsonb, error = %(error)s::jsonb, lease_epoch = %(epoch)s,
       attempts = s.attempts + %(restart)s::int,
       started_at = CASE WHEN %(restart)s::int = 1 THEN now() ELSE s.started_at END,
       finished_at = CASE WHEN %(status)s::varchar IN ('succeeded', 'failed') THEN now() END,
       -- A server that answered (unusably) has ended the exchange: nothing more can land, the deadline is now.
       deadline = CASE WHEN %(restart)s::int = 1 THEN {_EFFECT_DEADLINE}
                       WHEN %(why)s::varchar = 'answer_unusable' THEN LEAST(s.deadline, now())
                       ELSE s.deadline END,
       -- Why it is unknown, from the first time it became so: the caller's reason (timed out, dropped after
       -- sending), else a row still `started` when met again — its worker died mid-call.
       unknown_why = CASE WHEN %(restart)s::int = 1 THEN NULL
                          WHEN %(status)s::varchar = 'unknown' THEN COALESCE(s.unknown_why, %(why)s::varchar,
                               CASE WHEN s.status = 'started' THEN 'worker_died' END)
                          ELSE s.unknown_why END
  FROM fence WHERE s.task_id = fence.id AND s.step_seq = %(step_seq)s AND s.key = %(key)s
RETURNING s.key
"""

# -- the web tier's hot reads -------------------------------------------------------------------------------------
# A bearer token's user and tenant in one prepared statement (tasks_app.web.authentication): the token by its hash, not
# revoked, its user active and still a member of the token's tenant. No row: refused, with one message for every
# reason. Nothing is cached, so a revocation holds from the next request on.
_USER = get_user_model()._meta
TOKEN_AUTH_USER_FIELDS = [f.attname for f in _USER.concrete_fields]
TOKEN_AUTH_TENANT_FIELDS = [f.attname for f in Tenant._meta.concrete_fields]
_TOKEN_AUTH_COLUMNS = ", ".join(["k.id", "k.prefix", "k.scopes", *(f"u.{f.column}" for f in _USER.concrete_fields),
                                 *(f"n.{f.column}" for f in Tenant._meta.concrete_fields)])
_VALID_TOKEN = f"""
  FROM tasks_app_apitoken k
  JOIN {_USER.db_table} u ON u.id = k.user_id AND u.is_active
  JOIN tasks_app_tenantmembership m ON m.user_id = k.user_id AND m.tenant_id = k.tenant_id"""
_VALID_TOKEN_WHERE = "WHERE k.token_hash = %(token_hash)s AND k.revoked_at IS NULL"
# The user's permissions ("app_label.codename", their own and their groups'), read in the same statement for the one
# access rule (tasks_app.access.permissions_of): a token's request costs no second round trip for them.
_TOKEN_USER_PERMISSIONS = """
       ARRAY(SELECT c.app_label || '.' || p.codename
               FROM auth_permission p JOIN django_content_type c ON c.id = p.content_type_id
              WHERE p.id IN (SELECT up.permission_id FROM auth_user_user_permissions up WHERE up.user_id = u.id
                             UNION
                             SELECT gp.permission_id FROM auth_user_groups ug
                               JOIN auth_group_permissions gp ON gp.group_id = ug.group_id
                              WHERE ug.user_id = u.id)) AS permissions"""
TOKEN_AUTH = f"""
SELECT {_TOKEN_AUTH_COLUMNS},{_TOKEN_USER_PERMISSIONS}{_VALID_TOKEN}
  JOIN tasks_app_tenant n ON n.id = k.tenant_id
 {_VALID_TOKEN_WHERE}
"""

# The task row's columns a snapshot shows (selectors.task_snapshot), not the input or goal it does not.
SNAPSHOT_FIELDS = ("id", "workflow_name", "workflow_version", "status", "status_message", "progress", "phase",
                   "priority", "state_version", "plan_version", "steps_completed", "recoveries",
                   "checkpoint_sequence", "checkpoint_at", "deadline_at", "created_at", "updated_at", "completed_at",
                   "result", "result_ref", "error", "wait", "approval_policy", "checkpoint_policy", "tool_policy",
                   "budget_steps", "budget_cost", "budget_tokens", "budget_on_exhausted", "cost_spent", "tokens_spent",
                   "forked_from_id", "forked_from_step")  # (a fork's `forkedFrom`)
# One task's snapshot for a bearer token, in one statement: the token as TOKEN_AUTH checks it, and the task in its
# tenant — what BearerTokenAuthentication and selectors.task_get read in two. No row means something else answers:
# an unknown or revoked token, an inactive user or one moved to another tenant, another tenant's task or none.
SNAPSHOT_FOR_TOKEN = f"""
SELECT {", ".join(f"t.{name}" for name in SNAPSHOT_FIELDS)}{_VALID_TOKEN}
  JOIN tasks_app_task t ON t.id = %(task_id)s AND t.tenant_id = k.tenant_id
 {_VALID_TOKEN_WHERE} AND k.scopes @> '["tasks:read"]'
"""

# A task's artifact events, in order (selectors.artifacts_from_events makes them the committed artifacts by name): the
# MCP poll edge's second statement, for a completed task only. Served by the primary key (task_id, seq).
TASK_ARTIFACT_EVENTS = """
SELECT seq, data, at FROM tasks_app_taskevent WHERE task_id = %(task_id)s AND type = 'artifact' ORDER BY seq
"""
