"""System checks of the agent layer's rows (run by `manage.py check --database default`, by `migrate`, and by the
development run's start: deploy/dev.py).

W020: tool servers and model endpoints naming a credential the deployment does not grant to their tenant for their
URL's host (agents_app.credentials) — rows written past the models' clean() (SQL, an older release), or whose grant
was narrowed or taken away since. Their calls fail closed (credential_not_granted, nothing sent); the check says
which rows to mend. It names rows, tenants and credential names — never a value.
"""

from __future__ import annotations

from django.core.checks import Warning
from django.db import DatabaseError


def ungranted_credentials(app_configs=None, databases=None, **kwargs) -> list[Warning]:
    if not databases or "default" not in databases:
        return []  # (reads rows: only when the check is asked to look at the database)
    from agents_app.credentials import ungranted_rows

    try:
        rows = ungranted_rows()
    except DatabaseError:
        return []  # (no tables yet: `migrate` on an empty database runs the checks before it creates them)
    return [Warning(f"{row.kind} {row.label!r} (id {row.id}) of tenant {row.tenant} names the credential "
                    f"{row.credential}, which it may not use: {row.why}",
                    hint="Its calls fail (credential_not_granted) and nothing is sent. Grant the credential to the "
                         "tenant for that host in config/runtime.yaml `credentials` (docs/credentials.md), or "
                         "change or clear the row's credential in the admin.",
                    id="agents_app.W020")
            for row in rows]

