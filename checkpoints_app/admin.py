"""Read-only views of checkpoints, for operators and auditors (a task's side-effect ledger is on its admin page:
tasks_app.admin, the composite primary key keeps it out of an admin class of its own)."""

from django.contrib import admin

from checkpoints_app.models import Checkpoint
from config.base.admin_base import ReadOnlyAdmin


@admin.register(Checkpoint)
class CheckpointAdmin(ReadOnlyAdmin):
    list_display = ("task", "sequence", "schema_version", "size_bytes", "quarantined", "created_at")
    list_filter = ("quarantined", "schema_version")
    search_fields = ("=task__id",)
    raw_id_fields = ("task",)
    show_full_result_count = False

