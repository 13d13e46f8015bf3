"""The one place that decides which credentials a tenant may send, and reads their values (docs/credentials.md).

A tool server (ToolServer.credential) or a tenant's model endpoint (TenantModel.credential) stores a credential's
NAME. The deployment grants names in config/runtime.yaml `credentials` (config.base.runtime.CredentialGrant): where the
value comes from, which tenants may name it, and the hosts it may be sent to. Before this, any environment variable
could be named — a tenant admin named SECRET_KEY and a listener of theirs received it as a bearer token (issue 37).

- `refusal` answers "may tenant T use credential N for URL U" — asked when a row is saved (the models' clean(),
  which every write path runs) and again at every call (`value`): a row written past clean() (SQL, an older
  release, a grant taken away since) fails closed, nothing sent.
- `value` reads the secret now, from the environment or its file, for the one request about to be made: it is never
  stored, logged, or put in an exception's message (messages name the credential, never its value).
- `ungranted_rows` lists the rows naming a credential not granted to them (the W020 system check).
"""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from django.conf import settings

from config.base.runtime import CredentialGrant, runtime_own

GRANTS_HELP = "a deployment operator grants credentials in config/runtime.yaml `credentials` (docs/credentials.md)"


class CredentialNotGranted(Exception):
    """The tenant may not send this credential to this host: refused at save, fails closed at call time."""

    reason = "credential_not_granted"


class CredentialUnavailable(Exception):
    """Granted, but this process has no value for it (its variable unset or empty, its file unreadable)."""

    reason = "credential_missing"


def grants() -> dict[str, CredentialGrant]:
    held = settings.RUNTIME.credentials
    return held if isinstance(held, dict) else {}  # (a bare list of names: held by name only, granted to nobody)


def grants_of(tenant_slug: str | None) -> list[CredentialGrant]:
    """The credentials the deployment grants to this tenant, by name."""
    return sorted((grant for grant in grants().values() if grant.for_tenant(tenant_slug)), key=lambda g: g.name)


def url_host(url: str | None) -> str | None:
    """The host a URL names, as it is matched against a grant's hosts: lower case, no trailing dot, no brackets."""
    try:
        host = urlsplit(url or "").hostname
    except ValueError:
        return None
    return host.rstrip(".") if host else None


def host_matches(host: str | None, entries: tuple[str, ...]) -> bool:
    """Whether ``host`` (a URL's) is one a grant lists: the very name, a subdomain of a '*.example.com' entry, or an
    address literal in a listed address or network. A name never matches an address entry (it is not resolved
    here: where the name leads is the host policy's question, agents_app.hosts)."""
    if not host:
        return False
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        address = None
    for entry in entries:
        if address is not None:
            try:
                if address in ipaddress.ip_network(entry):
                    return True
            except ValueError:
                continue
        elif entry.startswith("*."):
            if host.endswith(entry[1:].lower().rstrip(".")):
                return True
        elif host == entry.lower().rstrip("."):
            return True
    return False


@dataclass(frozen=True)
class Refusal:
    message: str  # for people: names the credential, the tenant and the host — never a value


def refusal(*, name: str, tenant_slug: str | None, url: str | None) -> Refusal | None:
    """Why this tenant may not send credential ``name`` with a request to ``url`` — or None: it may."""
    if runtime_own(name):
        return Refusal(f"{name} is one of the runtime's own secrets; no tenant may use it.")
    grant = grants().get(name)
    if grant is None or not grant.for_tenant(tenant_slug):
        # (one message whether it is granted to another tenant or to none: which tenants hold what is not this
        # tenant's to learn)
        names = ", ".join(g.name for g in grants_of(tenant_slug)) or "none"
        return Refusal(f"The credential {name} is not granted to tenant {tenant_slug}; credentials granted to it: "
                       f"{names} ({GRANTS_HELP}).")
    host = url_host(url)
    if not host_matches(host, grant.hosts):
        return Refusal(f"The credential {name} is granted to tenant {tenant_slug} only for "
                       f"{', '.join(grant.hosts)}; this URL's host is {host or 'missing'}.")
    return None


def value(*, name: str, tenant_slug: str | None, url: str | None) -> str:
    """The credential's value now, for one request to ``url`` on behalf of the tenant — checked first (the grant, the
    tenant, the URL's host), read from its environment variable or file, never kept. Raises CredentialNotGranted or
    CredentialUnavailable, whose messages name the credential only."""
    refused = refusal(name=name, tenant_slug=tenant_slug, url=url)
    if refused is not None:
        raise CredentialNotGranted(refused.message)
    grant = grants()[name]
    if grant.file is not None:
        try:
            secret = Path(grant.file).read_text().strip()
        except (OSError, UnicodeDecodeError):
            secret = ""  # (the error's text is not passed on: it could hold part of the file)
        where = "its file could not be read or is empty in this worker"
    else:
        secret = os.environ.get(grant.env or name, "")
        where = "it is not set in this worker's environment"
    if not secret:
        raise CredentialUnavailable(f"The credential {name} is granted, but {where}.")
    return secret


@dataclass(frozen=True)
class UngrantedRow:
    kind: str  # "tool server" or "model endpoint"
    id: int
    label: str  # the server's name, or the model's
    tenant: str
    credential: str
    why: str


def ungranted_rows() -> list[UngrantedRow]:
    """The tool servers and model endpoints naming a credential their tenant may not send to their URL's host (the
    W020 system check): rows written past clean(), or whose grant was narrowed or taken away since."""
    from agents_app.models import TenantModel, ToolServer

    rows = []
    for kind, model, url_field, label_field in (("tool server", ToolServer, "url", "name"),
                                                 ("model endpoint", TenantModel, "base_url", "name")):
        for row in model.objects.exclude(credential="").values("id", "credential", url_field, label_field,
                                                               "tenant__slug").order_by("id"):
            refused = refusal(name=row["credential"], tenant_slug=row["tenant__slug"], url=row[url_field])
            if refused is not None:
                rows.append(UngrantedRow(kind, row["id"], row[label_field], row["tenant__slug"], row["credential"],
                                         refused.message))
    return rows
