"""Read-only views of checkpoints and the side-effect ledger, for operators and auditors."""

from django.contrib import admin

from checkpoints_app.models import Checkpoint, SideEffect
from config.admin_base import ReadOnlyAdmin


@admin.register(Checkpoint)
class CheckpointAdmin(ReadOnlyAdmin):
    list_display = ("task", "sequence", "schema_version", "size_bytes", "quarantined", "created_at")
    list_filter = ("quarantined", "schema_version")
    search_fields = ("=task__id",)
    raw_id_fields = ("task",)
    show_full_result_count = False


@admin.register(SideEffect)
class SideEffectAdmin(ReadOnlyAdmin):
    list_display = ("key", "name", "status", "attempts", "lease_epoch", "started_at", "finished_at")
    list_filter = ("status", "name")
    search_fields = ("key", "=task__id")
    raw_id_fields = ("task",)
    show_full_result_count = False
