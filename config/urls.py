from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularRedocView, SpectacularSwaggerView

from config import health, problems

urlpatterns = [
    path("healthz", health.healthz, name="healthz"),
    path("readyz", health.readyz, name="readyz"),
    path("admin/", admin.site.urls),
    path("runtime/", include("tasks_app.urls")),
    path("runtime/schema", SpectacularAPIView.as_view(), name="openapi-schema"),
    path("runtime/docs", SpectacularSwaggerView.as_view(url_name="openapi-schema"), name="openapi-docs"),
    path("runtime/redoc", SpectacularRedocView.as_view(url_name="openapi-schema"), name="openapi-redoc"),
    path("runtime/problems/<slug:slug>", problems.problem_type_doc, name="problem-type"),
]

handler404 = "config.problems.not_found"
handler500 = "config.problems.server_error"
