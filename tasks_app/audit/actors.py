"""How the audit trail names who acted — one name per actor, the same on every page, export and interface.

    token:<prefix>   a bearer API token (its first 12 characters, `art_1a2b3c4d`: never the token)
    user:<name>      a person signed in (the admin, the REST API with a session, `manage.py … --as`)
    oauth:<client>   an OAuth access token, by the client it was issued to (its metadata document's host, or the
                     start of its client_id): never the token, never a name the client chose for itself

Made by ``actor_name`` (REST and the admin through tasks_app.web.authentication.requested_by_of, the access rule's
Actor, the MCP bridge's principals) and shown by ``actor_shown`` (the audit pages and their CSV, the task page's
events and steering history). Stored as text with the command, event or admin action: the record outlives a token
or an account that is deleted.

Why ``actor_shown`` and not tasks_app.redaction.redact: the redaction's pattern for `token: <value>` assignments
(`token=…`, `token: …` in a log line) matched the name itself, so the audit pages and the CSV showed
`token=[redacted]` where the task page showed `token:art_1a2b3c4d`, and an auditor could not tell which token acted
(issue 37). The name is ours and its kind is not a secret: its kind is kept, its value part is still redacted (a
value that is a token, a key or an assignment of one — anything the redaction masks — stays masked; a prefix is
too short to be one). Text that is not an actor name is redacted whole, as before.
"""

from __future__ import annotations

import re

from tasks_app.redaction import redact

TOKEN, USER, OAUTH = "token", "user", "oauth"
# Every kind the trail holds: those above, and the deployment's own (`cli:<OS login>` from management commands,
# `system:…`, `mcp:<fixture tenant>` of the conformance fixtures, `operator` of the oldest rows).
KINDS = (TOKEN, USER, OAUTH, "cli", "system", "mcp")
_NAME = re.compile(rf"^({'|'.join(KINDS)}):(\S+)$")
OAUTH_CLIENT_CHARS = 40  # at most this much of a client's name


def actor_name(*, token=None, user=None, oauth_client: str | None = None) -> str:
    """The actor's name, from exactly one of: ``token`` (an ApiToken, or anything with its ``prefix``), ``user``
    (an account: its username) or ``oauth_client`` (what names the client: a metadata document's host or a
    client_id's start)."""
    given = [value is not None for value in (token, user, oauth_client)]
    if sum(given) != 1:
        raise ValueError("an actor is one of a token, a user or an OAuth client")
    if token is not None:
        return f"{TOKEN}:{getattr(token, 'prefix', '') or '?'}"
    if user is not None:
        return f"{USER}:{getattr(user, 'username', user)}"
    return f"{OAUTH}:{str(oauth_client)[:OAUTH_CLIENT_CHARS]}"


def actor_shown(text: str | None) -> str:
    """An actor's name for people (a page, an export): as ``actor_name`` made it, its value redacted; any other
    text redacted whole."""
    text = "" if text is None else str(text)
    match = _NAME.match(text)
    if match is None:
        return redact(text)
    return f"{match.group(1)}:{redact(match.group(2))}"
