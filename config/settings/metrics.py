"""Who may read /metrics (web) and where a worker serves its own (tasks_app.observability.metrics)."""

from config.settings.env import env

# A scraper sends `Authorization: Bearer <METRICS_TOKEN>`; empty: no token is accepted, only the networks below.
METRICS_TOKEN = env.str("METRICS_TOKEN", default="")
# Scrapes without a token are served to these networks (the TCP peer's address: behind a proxy, the proxy's).
METRICS_ALLOWED_NETWORKS = env.list("METRICS_ALLOWED_NETWORKS", default=["127.0.0.0/8", "::1/128"])
# A Celery worker's main process serves /metrics on this port (0: not at all), bound to WORKER_METRICS_HOST.
WORKER_METRICS_PORT = env.int("WORKER_METRICS_PORT", default=0)
WORKER_METRICS_HOST = env.str("WORKER_METRICS_HOST", default="127.0.0.1")
