"""Expired OAuth rows removed: what django-oauth-toolkit's `cleartokens` and `clearcimdapplications` do, and
registrations nobody used, run by the beat task runtime.oauth_cleanup (mcp_bridge/tasks.py; its schedule, "runtime:
clear expired OAuth tokens", made by mcp_bridge migration 0002). Expired access tokens, expired grants, refresh tokens
idle past OAUTH_REFRESH_TOKEN_SECONDS (revoked ones too, once they no longer guard against replay), expired Client ID
Metadata Document clients with nothing live, and dynamically registered clients never issued a token within
oauth.unused_client_hours of registering: rows nothing accepts any more, or that nobody uses, which would otherwise
grow forever (one per sign-in and refresh; one per registration, which anyone may make). Their tenant bindings go with
them (CASCADE). Safe to run at any time, twice at once included: each is a batched delete of rows re-checked under
their lock."""

from __future__ import annotations

import io
import logging
from datetime import timedelta

from django.conf import settings
from django.core.management import call_command
from django.db import transaction
from django.db.models import DateTimeField, ExpressionWrapper, Value
from django.db.models.functions import Now
from oauth2_provider.models import Application, Grant

from mcp_bridge.oauth.models import OAuthClientUse
from mcp_bridge.oauth.tokens import client_actor
from tasks_app.services import admin_action_record

logger = logging.getLogger(__name__)

UNUSED_BATCH = 500


def oauth_expired_clear() -> None:
    call_command("cleartokens")
    call_command("clearcimdapplications", stdout=io.StringIO())  # (it prints a count; the toolkit logs the rest)
    oauth_unused_clients_clear()


def _unused(hours: float):
    """Dynamically registered clients older than ``hours`` (the database's clock) never issued a token, with no
    consent in flight (a live grant: the person is between the consent and the code exchange)."""
    registered_before = ExpressionWrapper(Now() - Value(timedelta(hours=hours)), output_field=DateTimeField())
    return (Application.objects.filter(registration_source=Application.RegistrationSource.DCR,
                                       created__lt=registered_before)
            .exclude(pk__in=OAuthClientUse.objects.values("application_id"))
            .exclude(pk__in=Grant.objects.filter(expires__gt=Now()).values("application_id")))


def oauth_unused_clients_clear(*, hours: float | None = None) -> int:
    """Delete the registrations nobody used (see the module's docstring), each recorded for the audit trail in the
    transaction that deletes it; returns how many. Their registration tokens (RFC 7592) go with them."""
    hours = settings.RUNTIME.oauth.unused_client_hours if hours is None else hours
    deleted, last_pk = 0, 0
    while True:
        batch = list(_unused(hours).filter(pk__gt=last_pk).order_by("pk").values_list("pk", flat=True)[:UNUSED_BATCH])
        if not batch:
            break
        last_pk = batch[-1]
        with transaction.atomic():
            # Locked and checked again: a token being issued takes a share lock on its client's row (the foreign
            # key), so it either committed its OAuthClientUse before this lock (the client is kept) or waits for the
            # delete and then fails — never a token of a client deleted under it.
            for application in _unused(hours).filter(pk__in=batch).select_for_update(of=("self",)):
                admin_action_record(actor="system:oauth-cleanup", action="oauth_expire_registration",
                                    obj=application,
                                    message=f"Deleted the OAuth client {client_actor(application.client_id)}: "
                                            f"registered (RFC 7591) more than {hours:g} hours ago and never issued "
                                            f"a token (oauth.unused_client_hours).")
                application.delete()
                deleted += 1
    if deleted:
        logger.info("OAuth cleanup: %d unused client registration(s) deleted", deleted)
    return deleted
