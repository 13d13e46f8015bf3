"""Liveness and readiness probes for load balancers and orchestrators.

They are the only unauthenticated endpoints and reveal nothing but up/down per dependency: no hosts, URLs or
error texts (those go to the log).
"""

import logging

import redis
from django.conf import settings
from django.db import connection
from django.http import JsonResponse
from django.views.decorators.http import require_GET

logger = logging.getLogger(__name__)


@require_GET
def healthz(request):
    """The process is up and serving requests."""
    return JsonResponse({"status": "ok"})


def _database_ok() -> bool:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        return True
    except Exception:  # any failure means "not ready"; the reason is logged, never returned
        logger.warning("readiness: database unreachable", exc_info=True)
        return False


def _broker_ok() -> bool:
    try:
        client = redis.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=1, socket_timeout=1)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except Exception:
        logger.warning("readiness: broker unreachable", exc_info=True)
        return False


@require_GET
def readyz(request):
    """The database and the broker are reachable: this replica can take traffic."""
    checks = {"database": "ok" if _database_ok() else "unavailable", "broker": "ok" if _broker_ok() else "unavailable"}
    ready = all(value == "ok" for value in checks.values())
    return JsonResponse({"status": "ok" if ready else "unavailable", "checks": checks}, status=200 if ready else 503)
