"""PostgreSQL (the only truth), Redis/Valkey (broker and event fan-out only) and Celery."""

from django.core.exceptions import ImproperlyConfigured

from config.settings.env import env

# The default matches the embedded PostgreSQL that deploy/dev.py starts; production sets DATABASE_URL.
DATABASES = {"default": env.db_url("DATABASE_URL", default="postgres://postgres@127.0.0.1:54329/agent_runtime")}
DATABASES["default"]["CONN_MAX_AGE"] = env.int("DB_CONN_MAX_AGE", default=60)
DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
# The engine's per-step statements are prepared (tasks_app.db.prepared). Left to `auto`, PostgreSQL re-plans a
# prepared statement for each execution whenever its custom plan looks cheaper than the generic one, which it
# did for the step commit (planning on every step; figures: docs/performance.md, change 6). Their plans do not
# depend on the values (primary-key and unique-index lookups; the runnable statuses are literals), so plan once.
# Django's own queries are not prepared and are unaffected.
# Django turns psycopg's prepared statements off (prepare_threshold None, for transaction-mode poolers), which
# also ignores an explicit prepare=True. A threshold no query reaches keeps Django's own queries unprepared as
# before, and lets the engine prepare its statements. (A pooler in transaction mode in front of the workers
# must then support protocol-level prepared statements: PgBouncer ≥ 1.21 with max_prepared_statements.)
DATABASES["default"].setdefault("OPTIONS", {}).update(
    options="-c plan_cache_mode=force_generic_plan", prepare_threshold=2**31 - 1)
# A connection whose peer vanished (a host cut off, a partition) must fail, not hang for the kernel's ~15 minutes of
# retransmissions (or a new one wait out the kernel's SYN retries: DB_CONNECT_TIMEOUT): libpq's TCP keepalives find
# an idle one dead, and DB_TCP_USER_TIMEOUT_MS drops one whose sent statement goes unacknowledged (the kernel
# acknowledges at once: a long query is not affected). Then the engine's database-error paths apply (a claim is
# sent again, a renewal reconnects, the hint gate closes:
# tasks_app.engine.failover). The server needs its own tcp_keepalives_* for the liveness locks (docs/failover.md).
DB_TCP = {"keepalives": 1, "keepalives_idle": env.int("DB_KEEPALIVES_IDLE", default=10),
          "keepalives_interval": env.int("DB_KEEPALIVES_INTERVAL", default=5),
          "keepalives_count": env.int("DB_KEEPALIVES_COUNT", default=3),
          "tcp_user_timeout": env.int("DB_TCP_USER_TIMEOUT_MS", default=30_000),
          "connect_timeout": env.int("DB_CONNECT_TIMEOUT", default=10)}
DATABASES["default"]["OPTIONS"].update(DB_TCP)
# Behind a pooler in transaction mode that cannot carry prepared statements (PgBouncer before 1.21, or without
# max_prepared_statements): DATABASE_POOLER=transaction turns prepared statements, server-side cursors and the
# session option above off. Failover's two session-level locks (a worker's liveness lock, the fleet's watch lock:
# tasks_app.engine.failover) cannot live in a transaction pool — the pool would keep them after their process died,
# or hand them to another — so they need DATABASE_SESSION_URL: PostgreSQL itself, or a session-mode pool. One more
# connection per worker process and per watcher; every other statement goes through the pooler (docs/failover.md).
DATABASE_POOLER = env.str("DATABASE_POOLER", default="")
if DATABASE_POOLER not in ("", "transaction"):
    raise ImproperlyConfigured(f"DATABASE_POOLER is {DATABASE_POOLER!r}: leave it unset, or set 'transaction' when "
                               "DATABASE_URL goes through a transaction-mode pooler such as PgBouncer")
if DATABASE_POOLER == "transaction":
    DATABASES["default"]["OPTIONS"] = {"prepare_threshold": None, **DB_TCP}
    DATABASES["default"]["DISABLE_SERVER_SIDE_CURSORS"] = True
    if not env.str("DATABASE_SESSION_URL", default=""):
        raise ImproperlyConfigured("DATABASE_POOLER=transaction needs DATABASE_SESSION_URL: a URL of PostgreSQL itself "
                                   "(or of a session-mode pool) for failover's session-level locks (docs/failover.md)")
if env.str("DATABASE_SESSION_URL", default=""):
    DATABASES["session"] = env.db_url("DATABASE_SESSION_URL")
    DATABASES["session"]["OPTIONS"] = dict(DB_TCP)
    # Held for the process's life by the lease renewer's and the watch's threads (never by a request); in tests the
    # same database as default.
    DATABASES["session"].update(CONN_MAX_AGE=None, CONN_HEALTH_CHECKS=False, TEST={"MIRROR": "default"})

# Which kind of process this is: config/asgi.py says "web"; Celery workers and beat are the default.
RUNTIME_PROCESS = env.str("RUNTIME_PROCESS", default="worker")
# A web process shares a bounded pool of connections between its requests; workers and beat keep one persistent
# connection per process (CONN_MAX_AGE). Under ASGI each request's sync code runs on a thread of its own, and with
# persistent connections every such thread kept one open: 20 pollers took PostgreSQL to max_connections
# (docs/performance.md) and the workers then failed too. With the pool a web process holds at most WEB_DB_POOL_MAX
# connections whatever the load; a request that cannot get one within WEB_DB_POOL_TIMEOUT seconds is answered 503
# with Retry-After (config.base.problems), never a 500. With CONN_HEALTH_CHECKS Django has the pool check each connection
# as it is taken (one round trip), so a restarted database costs no failed request. Budget: web processes ×
# (WEB_DB_POOL_MAX + WEB_SNAPSHOT_POOL_MAX) + worker processes + beat + reaper must stay under PostgreSQL's
# max_connections.
if RUNTIME_PROCESS == "web":
    DATABASES["default"]["CONN_MAX_AGE"] = 0  # connections go back to the pool after each request
    DATABASES["default"]["OPTIONS"]["pool"] = {
        "min_size": env.int("WEB_DB_POOL_MIN", default=2),
        "max_size": env.int("WEB_DB_POOL_MAX", default=8),
        "timeout": env.float("WEB_DB_POOL_TIMEOUT", default=5.0),
        "max_idle": 300,
    }
# The snapshot edge's own async pool (tasks_app.web.snapshot_edge): its connections count in the budget above too.
WEB_SNAPSHOT_POOL_MAX = env.int("WEB_SNAPSHOT_POOL_MAX", default=4)
WEB_SNAPSHOT_POOL_TIMEOUT = env.float("WEB_SNAPSHOT_POOL_TIMEOUT", default=2.0)

REDIS_URL = env.str("REDIS_URL", default="redis://127.0.0.1:63799/0")
# Live events' pub/sub (tasks_app.streaming): the broker's Redis unless a deployment gives streaming its own.
STREAM_REDIS_URL = env.str("STREAM_REDIS_URL", default=REDIS_URL)

CELERY_BROKER_URL = REDIS_URL
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_RESULT_BACKEND = None  # results live in PostgreSQL (the task row), never in the broker
CELERY_TASK_IGNORE_RESULT = True
# A message is a hint, never truth: ack after the work, redeliver if the worker dies, take one at a time.
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_BROKER_TRANSPORT_OPTIONS = {
    "visibility_timeout": env.int("BROKER_VISIBILITY_TIMEOUT", default=3600),
    # Ten priority lists, consumed in order: task priority 9 (most urgent) maps to Redis priority 0.
    "priority_steps": list(range(10)),
    "sep": ":",
    "queue_order_strategy": "priority",
}
CELERY_TASK_DEFAULT_PRIORITY = 4
# Sending a run_step hint must not hang a request when the broker is down: try briefly, then leave it to the
# reaper's re-send (tasks_app.db.dispatch).
CELERY_TASK_PUBLISH_RETRY_POLICY = {"max_retries": 1, "interval_start": 0, "interval_step": 0.2, "interval_max": 0.2}
CELERY_BROKER_CONNECTION_TIMEOUT = 2
# A lost broker is tried again every 2 s at most (config.celery_consumer), and for as long as it takes: a worker
# without its broker can do nothing, and exiting after Celery's 100 tries would leave a fleet without a supervisor
# empty once the broker returns.
CELERY_WORKER_CONSUMER = "config.celery_consumer:RuntimeConsumer"
CELERY_BROKER_CONNECTION_MAX_RETRIES = None
# Remote control (pidbox) stays on, although with the Redis transport it is what makes a worker exit (code 1)
# when the broker restarts while a late-acked message is unacked: its pub/sub socket reports the loss first and
# the consumer's clean-up then fails on a transport whose client is gone (AttributeError on `hostname`, the
# kombu#582 pattern). Without it the worker does not crash, but its consumer never notices the loss and stops
# consuming for good (seen in `deploy/dev.py chaos --faults valkey_outage`: no task progressed after the first
# outage). A crash that a supervisor restarts costs seconds; a silent stall is unbounded. Workers run with
# --without-gossip --without-mingle --without-heartbeat (gossip is another pub/sub consumer that crashes alike).
# Celery's Django fixup closes every database connection before and after each task unless this is set, which
# forked a PostgreSQL backend per time slice. Connections are kept for the worker's life instead: run_step calls
# close_old_connections() first (as Django does per request), which drops one that is broken or older than
# CONN_MAX_AGE, and CONN_HEALTH_CHECKS pings a reused one before its first query.
CELERY_DB_REUSE_MAX = 10**9
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
CELERY_BEAT_SCHEDULER = "config.beat:RuntimeScheduler"  # DatabaseScheduler, its change check rate-limited
CELERY_TIMEZONE = "UTC"
