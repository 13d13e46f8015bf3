"""Expired OAuth rows removed: what django-oauth-toolkit's `cleartokens` and `clearcimdapplications` do, run by the
beat task runtime.oauth_cleanup (mcp_bridge/tasks.py; its schedule, "runtime: clear expired OAuth tokens", made by
mcp_bridge migration 0002). Expired access tokens, expired grants, refresh tokens idle past
OAUTH_REFRESH_TOKEN_SECONDS (revoked ones too, once they no longer guard against replay), and expired Client ID
Metadata Document clients with nothing live: rows nothing accepts any more, which would otherwise grow forever (one
per sign-in and refresh). Their tenant bindings go with them (CASCADE). Safe to run at any time, twice at once
included: each is the toolkit's batched delete of rows already refused."""

from __future__ import annotations

import io

from django.core.management import call_command


def oauth_expired_clear() -> None:
    call_command("cleartokens")
    call_command("clearcimdapplications", stdout=io.StringIO())  # (it prints a count; the toolkit logs the rest)
