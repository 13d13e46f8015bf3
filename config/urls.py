from django.contrib import admin
from django.urls import include, path, re_path

from config import api_docs, health
from config.base import problems
from tasks_app.web.metrics import metrics_view

urlpatterns = [
    path("healthz", health.healthz, name="healthz"),
    path("readyz", health.readyz, name="readyz"),
    path("metrics", metrics_view, name="metrics"),  # (a bearer METRICS_TOKEN or METRICS_ALLOWED_NETWORKS)
    # The OAuth 2.1 authorization server of MCP clients: /.well-known/oauth-authorization-server and /oauth/…
    path("", include("mcp_bridge.oauth.urls")),
    path("admin/audit/", include("steering_app.audit_urls")),  # before the admin's catch-all
    path("admin/", admin.site.urls),
    path("runtime/", include("steering_app.urls")),  # before tasks_app's: its last pattern takes any task path
    path("runtime/", include("agents_app.urls")),  # (the same)
    path("runtime/", include("tasks_app.web.urls")),
    path("runtime/schema", api_docs.SchemaApi.as_view(), name="openapi-schema"),
    path("runtime/docs", api_docs.SwaggerDocsView.as_view(url_name="openapi-schema"), name="openapi-docs"),
    path("runtime/redoc", api_docs.RedocDocsView.as_view(url_name="openapi-schema"), name="openapi-redoc"),
    path("runtime/problems/<slug:slug>", problems.problem_type_doc, name="problem-type"),
    # Last (the MCP endpoint goes above it): every other path under /runtime/ and /mcp answers a problem+json
    # 404, also with DEBUG on, when Django would otherwise show its HTML page listing every URL pattern.
    re_path(r"^(?:runtime|mcp)(?:/[\s\S]*)?$", problems.path_not_found, name="api-path-not-found"),
]

handler404 = "config.base.problems.not_found"
handler500 = "config.base.problems.server_error"
