"""The audit pages, under /admin/audit/ (config/urls.py includes them before the admin's own URLs, whose catch-all
would otherwise answer them). Each is wrapped by the admin site's admin_view: staff only (else the admin login),
never cached, CSRF-protected; each view then checks its view permission (steering_app.audit)."""

from django.contrib import admin
from django.urls import path

from steering_app import audit

app_name = "audit"

urlpatterns = [
    path("", admin.site.admin_view(audit.index_view), name="index"),
    path("events/", admin.site.admin_view(audit.events_view), name="events"),
    path("events.csv", admin.site.admin_view(audit.events_csv_view), name="events_csv"),
    path("commands/", admin.site.admin_view(audit.commands_view), name="commands"),
    path("commands.csv", admin.site.admin_view(audit.commands_csv_view), name="commands_csv"),
    path("admin-actions/", admin.site.admin_view(audit.admin_actions_view), name="admin_actions"),
    path("admin-actions.csv", admin.site.admin_view(audit.admin_actions_csv_view), name="admin_actions_csv"),
    path("verify/", admin.site.admin_view(audit.verify_view), name="verify"),
]
