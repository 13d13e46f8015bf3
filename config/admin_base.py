"""Shared admin building blocks."""

from django.contrib import admin


class ReadOnlyAdmin(admin.ModelAdmin):
    """History and ledgers are written by services only; admin shows them, never edits them."""

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False
