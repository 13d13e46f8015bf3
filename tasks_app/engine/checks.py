"""System checks for operators: `manage.py check --database default` warns when recovery is not scheduled;
`manage.py check --deploy --database default` also when the deployment lets tenants' tool servers reach this machine's
loopback (agents_app.W021) or connects to PostgreSQL as a superuser (tasks_app.W004).

The last two are tagged `security` (as Django's own deployment checks), not `runtime`: the development run
(deploy/dev.py) checks the `runtime` tag, and development is exactly loopback tool servers and a superuser database
role. A production `check --deploy` runs every tag."""

import ipaddress

from django.core.checks import Tags, Warning, register

REAPER_NAME = "runtime: lease reaper"


@register("runtime", deploy=True)
def lease_reaper_scheduled(app_configs, databases=None, **kwargs):
    """Without the reaper, a task whose worker died stays `working` forever: say so loudly."""
    if not databases:
        return []  # needs the database; run with --database default (the dev run and deploys do)
    from django.db import DatabaseError
    from django_celery_beat.models import PeriodicTask

    try:
        reaper = PeriodicTask.objects.filter(name=REAPER_NAME).first()
    except DatabaseError:
        return []  # not migrated yet: migrate creates it
    if reaper is None:
        return [Warning("The lease reaper periodic task is missing: crashed workers' tasks will never recover.",
                        hint=f"Re-create it: python manage.py migrate tasks_app 0003 && python manage.py migrate "
                             f"(or add a periodic task '{REAPER_NAME}' for runtime.reap in admin).",
                        id="runtime.W001")]
    if not reaper.enabled:
        return [Warning("The lease reaper periodic task is disabled: crashed workers' tasks will not recover.",
                        hint="Enable it in admin → Periodic tasks.", id="runtime.W002")]
    return []


@register("runtime", deploy=True)
def audit_signing_key_present(app_configs, **kwargs):
    """Without the seals' key, the beat task that anchors the audit chains fails at every run: say so at start."""
    from pathlib import Path

    from django.conf import settings

    if settings.AUDIT_SIGNING_KEY_GENERATE or Path(settings.AUDIT_SIGNING_KEY_FILE).exists():
        return []
    return [Warning(f"No audit signing key at {settings.AUDIT_SIGNING_KEY_FILE}: the event chains' heads will not be "
                    f"sealed, and verify_events --anchors cannot check them.",
                    hint="python manage.py audit_key --generate, or mount the deployment's key and point "
                         "AUDIT_SIGNING_KEY_FILE at it (docs/audit.md).", id="runtime.W003")]


# Loopback, as an allowed_hosts entry can name it: an address or network (IPv4-mapped IPv6 included) or a name that
# resolves to this machine by definition (RFC 6761: localhost and its subdomains).
_LOOPBACK_NETWORKS = (ipaddress.ip_network("127.0.0.0/8"), ipaddress.ip_network("::1/128"),
                      ipaddress.ip_network("::ffff:127.0.0.0/104"))


def _reaches_loopback(entry: str) -> bool:
    name = entry.strip().lower().rstrip(".")
    if name in ("localhost", "*.localhost") or name.endswith(".localhost"):
        return True
    try:
        network = ipaddress.ip_network(name, strict=False)
    except ValueError:
        return False  # a host name other than localhost: resolved and checked at each call (agents_app.hosts)
    return any(network.version == loopback.version and network.overlaps(loopback) for loopback in _LOOPBACK_NETWORKS)


@register(Tags.security, deploy=True)
def tool_hosts_without_loopback(app_configs, **kwargs):
    """A tool server is a URL a tenant admin chooses: with loopback allowed, it can be this machine's own services —
    the web tier's internal endpoints, PostgreSQL, Redis, a metrics port, another tenant's local tool server. The
    shipped configuration allows loopback for development (the example tool server); production lists its servers'
    real hosts."""
    from django.conf import settings

    loopback = [entry for entry in settings.RUNTIME.tools.allowed_hosts if _reaches_loopback(entry)]
    if not loopback:
        return []
    return [Warning(f"tools.allowed_hosts lets tool servers (and tenants' model endpoints) reach loopback: "
                    f"{', '.join(loopback)}. A tenant admin can then point a server at this machine's own services.",
                    hint="List only the hosts or networks of your real tool servers in config/runtime.yaml "
                         "tools.allowed_hosts (or RUNTIME_TOOLS__ALLOWED_HOSTS='[\"mcp.example.com\"]'); loopback is "
                         "for development (docs/tool-policy.md).", id="agents_app.W021")]


@register(Tags.security, deploy=True)
def database_role_not_superuser(app_configs, databases=None, **kwargs):
    """A superuser role bypasses every grant and row-level rule, may read files and run programs on the database
    host (COPY … PROGRAM) and can ALTER the append-only audit tables' triggers away: one SQL injection, or one stolen
    DATABASE_URL, would be all of it. The runtime needs only its own tables."""
    if not databases:
        return []  # needs the database: run with --database default (the dev run and deploys do)
    from django.db import DatabaseError, connections

    try:
        with connections["default"].cursor() as cursor:
            cursor.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user")
            row = cursor.fetchone()
    except DatabaseError:
        return []  # (unreachable: other checks and the first request say so)
    if not row or not row[0]:
        return []
    return [Warning("The runtime connects to PostgreSQL as a superuser role (DATABASE_URL).",
                    hint="Create a role that owns the runtime's database and nothing else (CREATE ROLE runtime LOGIN "
                         "PASSWORD '…' NOSUPERUSER; ALTER DATABASE … OWNER TO runtime, and its tables), run migrate "
                         "as it, and put it in DATABASE_URL.", id="tasks_app.W004")]
