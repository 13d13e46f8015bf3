"""``GET /metrics``: the Prometheus text exposition of the web tier — with PROMETHEUS_MULTIPROC_DIR, of every process
counting into that directory — plus the state read on scrape (tasks_app.observability.metrics has both, and who may
scrape: a bearer METRICS_TOKEN, or a scraper in METRICS_ALLOWED_NETWORKS; otherwise 401/403 problem details)."""

from __future__ import annotations

from django.http import HttpResponse

from config.base.problems import problem_response
from tasks_app.observability import metrics


def metrics_view(request):
    refusal = metrics.scrape_refusal(authorization=request.headers.get("Authorization"),
                                     remote_addr=request.META.get("REMOTE_ADDR"))
    if refusal is not None:
        response = problem_response(status_code=refusal.status, slug=refusal.slug, detail=refusal.detail)
        if refusal.status == 401:
            response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    if request.method not in ("GET", "HEAD"):
        response = problem_response(status_code=405, slug="method-not-allowed", detail="Scrape /metrics with GET.")
        response["Allow"] = "GET, HEAD"
        return response
    return HttpResponse(metrics.exposition(), content_type=metrics.CONTENT_TYPE)
