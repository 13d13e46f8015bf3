"""Runtime configuration: config/runtime.yaml, overridden by RUNTIME_* environment variables.

Loaded once by the settings module, so an invalid value stops web, workers and beat at start with a message
that names the key, instead of misbehaving later.
"""

from __future__ import annotations

import ipaddress
import os
import re
import types
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any, get_type_hints

import yaml
from django.core.exceptions import ImproperlyConfigured

DEFAULT_PATH = Path(__file__).resolve().parent.parent / "runtime.yaml"


@dataclass(frozen=True)
class CheckpointPolicy:
    every_steps: int = 10
    max_interval_seconds: float = 60
    max_bytes: int = 1024 * 1024
    keep: int = 3
    # The range a task's own checkpointPolicy may choose from (POST /runtime/tasks).
    task_min_every_steps: int = 1
    task_max_every_steps: int = 10_000
    task_min_seconds: float = 1
    task_max_seconds: float = 3600


@dataclass(frozen=True)
class RedactionPolicy:
    keys: tuple[str, ...] = ("password", "passwd", "secret", "token", "api_key", "apikey", "authorization",
                             "cookie", "credential", "private_key")
    patterns: tuple[str, ...] = ()


@dataclass(frozen=True)
class InputFilesPolicy:
    max_bytes: int = 512 * 1024
    max_files: int = 5


@dataclass(frozen=True)
class StepRetryPolicy:
    max_attempts: int = 3
    backoff_seconds: float = 0.5
    backoff_max_seconds: float = 30
    tool_timeout_attempts: int = 2


@dataclass(frozen=True)
class ToolsPolicy:
    """The deployment's tool policy (docs/tool-policy.md): the widest any tenant or task gets; they only narrow it."""

    # Glob patterns (fnmatch, case-sensitive) on "server.tool": never called.
    deny: tuple[str, ...] = ("shell.root", "filesystem.delete_recursive")
    # None: every tool not denied; a list: only tools matching one of its patterns.
    allow: tuple[str, ...] | None = None
    # Patterns of tools that wait for a person's approval before each call.
    require_approval: tuple[str, ...] = ()
    # Hosts a tool server's URL may resolve to: names, addresses or CIDR networks (agents_app.hosts).
    allowed_hosts: tuple[str, ...] = ("127.0.0.1", "::1", "localhost")
    max_calls_per_task: int = 1000
    # Calls started per minute per tool server, unless the server's own rate_per_minute says fewer or more.
    rate_per_minute: int = 600
    # A call's concurrency slot is renewed every third of this while the call runs; a crashed worker's slot frees
    # itself at most this long after its last renewal.
    slot_seconds: float = 30
    # A server not reached (refused connection, 502/503/504/429 in front of it, its concurrency cap full: nothing
    # was sent) is waited for this long — the step parked without a worker, tried again with backoff — before the
    # step fails with tool_unavailable; 0: no waiting beyond the attempt's own quick tries.
    unreachable_wait_seconds: float = 600
    # What a tool result the injection screen flags becomes before a workflow or model sees it
    # (docs/tool-screening.md): "pass" (as it is, with a tool.flagged event), "redact" (the flagged spans removed,
    # with the event), "hold" (the task waits for a person to pass, redact or reject it).
    screening: str = "redact"
    # The longest a tool server's timeout_seconds may be (a tenant admin sets it per server): a step holds its worker
    # for as long as its call waits, so this bounds how long one call can hold one. A larger value is refused when the
    # server is saved; a row above it (written before, or by SQL) is clamped to it at each call (docs/quotas.md).
    max_timeout_seconds: float = 300
    # The largest answer read from a tool server (one HTTP response: a tools/list page, a call's result, a downstream
    # task's state), counted as it streams and cut there: the call fails, nothing past it is held in memory.
    max_answer_bytes: int = 16 * 1024 * 1024


@dataclass(frozen=True)
class ModelConfig:
    """The deployment's language model (agents_app.llm): any OpenAI-compatible Chat Completions endpoint."""

    # None: no model configured here (MODEL_BASE_URL / MODEL_NAME from the environment stand in; without them an
    # agent task is refused at create, saying so).
    base_url: str | None = None
    name: str | None = None
    # The NAME of the environment variable (or secret) holding the API key, read at each call, never stored.
    credential: str | None = None
    context_window: int = 128_000  # tokens; older turns are summarised before a request would outgrow it
    timeout_seconds: float = 120  # one request (a streamed one: between chunks too)
    max_retries: int = 3  # 429 / 5xx / connection errors, with backoff, honouring Retry-After (the SDK's)
    # Still not answering past those retries (down, overloaded, a stream broken off): an agent's turn is waited for
    # this long — the step parked without a worker, asked again with backoff — before the step's own retries and
    # then the task fail with model_unavailable. Counted from the task's last event, on the database's clock.
    unavailable_wait_seconds: float = 600
    # Per million tokens, by model name: [input, output] in the deployment's cost unit (budget.maxCost counts it).
    prices: dict[str, tuple[float, float]] | None = None
    # The largest answer read from the model endpoint (one response: a whole streamed reply), cut there.
    max_answer_bytes: int = 32 * 1024 * 1024


@dataclass(frozen=True)
class AgentConfig:
    """The built-in agent loop (agents_app.agent)."""

    max_turns: int = 30  # a task's maxTurns may be lower, never higher
    max_tool_calls_per_turn: int = 8  # more in one model answer: the rest are answered with an error, not called
    # The same tool called with the same arguments this many times in one task: the loop stops and asks a person.
    loop_repeats: int = 3
    # When a task's token or cost budget is spent: "wait" (input_required until an operator raises the budget with
    # set_budget) or "fail".
    on_budget: str = "wait"


@dataclass(frozen=True)
class DocumentReviewExample:
    """Where the shipped document_review workflow publishes its report when its input names no publish_to."""

    # The tenant's downstream tool server it publishes through, when the task's tenant has one of that name (else, or
    # null, the local outbox file, a stand-in for a remote system), and that server's tool it calls.
    publish_server: str | None = "reports"
    publish_tool: str = "append"


@dataclass(frozen=True)
class ExamplesConfig:
    """Settings of the shipped example workflows (tasks_app/examples)."""

    document_review: DocumentReviewExample = DocumentReviewExample()


@dataclass(frozen=True)
class CredentialGrant:
    """A secret the deployment lets tenants use (config/runtime.yaml `credentials`, docs/credentials.md): where its
    value comes from — an environment variable or a file (a mounted secret), read at each call, never stored — which
    tenants' tool servers and model endpoints may name it, and the hosts it may be sent to. Without tenants it is
    held by name only (provide_input may name it; nothing sends it)."""

    name: str
    env: str | None = None  # the environment variable holding the value
    file: str | None = None  # or an absolute path of a file holding it (surrounding whitespace dropped)
    tenants: tuple[str, ...] = ()  # tenant slugs, or ("*",): every tenant
    hosts: tuple[str, ...] = ()  # host names, '*.example.com', addresses or networks the URL's host must match

    def for_tenant(self, slug: str | None) -> bool:
        return "*" in self.tenants or (slug is not None and slug in self.tenants)


@dataclass(frozen=True)
class OAuthConfig:
    """The authorization server MCP clients sign in with (mcp_bridge.oauth; docs/mcp-bridge-plan.md, "OAuth")."""

    # RFC 7591 dynamic registration: "open" (anyone may register a client: what MCP clients expect; rate-limited per
    # client address) or "closed" (refused with 403: clients use a Client ID Metadata Document, or an operator makes
    # them in the admin). `check --deploy` warns while it is open (mcp_bridge.W012).
    registration: str = "open"
    # Registrations per client address (an IPv6 client's /64), "N/second|minute|hour|day" or "off".
    registration_rate: str = "20/hour"
    # A dynamically registered client never issued a token this long after it registered is deleted by the hourly
    # OAuth cleanup (runtime.oauth_cleanup): open registration cannot pile up clients nobody uses.
    unused_client_hours: float = 24
    # How often an open stream (SSE task events, MCP tasks/result and subscriptions/listen, a foreground tools/call)
    # re-checks the token that opened it (one statement per token per web process); at the token's expiry it ends
    # without asking. A revoked token's streams end within this many seconds.
    stream_token_check_seconds: float = 5


@dataclass(frozen=True)
class TenantsConfig:
    """Fairness between tenants (docs/quotas.md, "The default share")."""

    # A tenant without a max_running_tasks of its own runs at most this share of the live fleet's worker processes
    # at once (at least one task): with 0.5, one tenant can hold at most half the workers, whatever it asks. null: no
    # default (such a tenant may hold every worker); 1: the whole fleet.
    default_running_share: float | None = 0.5


@dataclass(frozen=True)
class EffectsPolicy:
    """Effects of unknown outcome (docs/tools.md, "Never asked while the call can still land")."""

    # A call whose outcome is unknown (its worker died mid-call, it timed out, its connection dropped after sending)
    # may still land until its deadline: the moment it was sent plus the timeout it was sent with (a tool call: the
    # bound the gateway gives it, from its server's timeout_seconds) plus this margin, on the database's clock. No
    # person is asked whether it happened before then: the task waits without a worker.
    unknown_outcome_margin_seconds: float = 5


@dataclass(frozen=True)
class RuntimeConfig:
    max_concurrent_tasks: int = 64
    lease_seconds: float = 30
    heartbeat_seconds: float = 10
    max_recoveries: int = 3
    slice_seconds: float = 2.0
    progress_event_seconds: float = 0.25
    step_timeout_seconds: float = 900
    reaper_interval_seconds: float = 10
    failover_idle_pass_seconds: float = 10
    failover_idle_after_seconds: float = 15
    redispatch_after_seconds: float = 30
    retention_days: int = 30
    checkpoint: CheckpointPolicy = CheckpointPolicy()
    step_retry: StepRetryPolicy = StepRetryPolicy()
    # Effect names that always wait for a person's approval (a task's approvalPolicy and ctx.effect(approval=True)
    # add to these, never remove them).
    require_approval: tuple[str, ...] = ()
    # The secrets this deployment holds, by name (credentials_parse, docs/credentials.md): provide_input may refer to
    # any of them by name; a tenant's tool server or model endpoint may send one only where its grant says — to the
    # tenants and hosts it names. Nothing is granted by default.
    credentials: dict[str, CredentialGrant] = field(default_factory=dict)
    input_files: InputFilesPolicy = InputFilesPolicy()
    redaction: RedactionPolicy = RedactionPolicy()
    tools: ToolsPolicy = ToolsPolicy()
    model: ModelConfig = ModelConfig()
    agent: AgentConfig = AgentConfig()
    examples: ExamplesConfig = ExamplesConfig()
    tenants: TenantsConfig = TenantsConfig()
    oauth: OAuthConfig = OAuthConfig()
    effects: EffectsPolicy = EffectsPolicy()


# A glob (fnmatch) on a tool's policy name "server.tool": a server name ([a-z0-9_-]), a dot, an MCP tool name
# (letters, digits, '_', '-', '.'), with * ? [ ] ! as glob characters. The one definition for the deployment's,
# a tenant's and a task's lists.
TOOL_PATTERN = re.compile(r"^[A-Za-z0-9_.*?\[\]!-]{1,200}$")
TOOL_PATTERN_HELP = ("a glob on server.tool: letters, digits, '_', '-', '.', and * ? [ ] ! (at most 200 characters), "
                     "e.g. 'github.*'")
# A tool server's name (agents_app.models.ToolServer): the first part of its tools' policy names, so no dots.
TOOL_SERVER_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")
# An MCP tool's name (the specification's characters and length).
TOOL_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")
# Bounds the sliding window each tool server keeps in Redis (one entry per call started in the last minute).
MAX_RATE_PER_MINUTE = 10_000

# (key, check, what a valid value is)
_RULES = [
    ("max_concurrent_tasks", lambda v: v >= 1, "an integer ≥ 1"),
    ("lease_seconds", lambda v: v >= 1, "seconds ≥ 1"),
    ("heartbeat_seconds", lambda v: v > 0, "seconds > 0"),
    ("max_recoveries", lambda v: v >= 0, "an integer ≥ 0"),
    ("slice_seconds", lambda v: v >= 0, "seconds ≥ 0"),
    ("progress_event_seconds", lambda v: v >= 0, "seconds ≥ 0 (0: one progress event per step)"),
    ("step_timeout_seconds", lambda v: v > 0, "seconds > 0"),
    ("reaper_interval_seconds", lambda v: v >= 1, "seconds ≥ 1"),
    ("failover_idle_pass_seconds", lambda v: v >= 1, "seconds ≥ 1"),
    ("failover_idle_after_seconds", lambda v: v >= 0, "seconds ≥ 0"),
    ("redispatch_after_seconds", lambda v: v >= 1, "seconds ≥ 1"),
    ("retention_days", lambda v: v >= 0, "days ≥ 0 (0 keeps tasks forever)"),
    ("checkpoint.every_steps", lambda v: v >= 1, "an integer ≥ 1"),
    ("checkpoint.max_interval_seconds", lambda v: v > 0, "seconds > 0"),
    ("checkpoint.max_bytes", lambda v: v >= 1024, "bytes ≥ 1024"),
    ("checkpoint.keep", lambda v: v >= 1, "an integer ≥ 1"),
    ("step_retry.max_attempts", lambda v: v >= 1, "an integer ≥ 1"),
    ("step_retry.backoff_seconds", lambda v: v >= 0, "seconds ≥ 0"),
    ("step_retry.backoff_max_seconds", lambda v: v >= 0, "seconds ≥ 0"),
    ("step_retry.tool_timeout_attempts", lambda v: v >= 1, "an integer ≥ 1"),
    ("checkpoint.task_min_every_steps", lambda v: v >= 1, "an integer ≥ 1"),
    ("checkpoint.task_max_every_steps", lambda v: v >= 1, "an integer ≥ 1"),
    ("checkpoint.task_min_seconds", lambda v: v > 0, "seconds > 0"),
    ("checkpoint.task_max_seconds", lambda v: v > 0, "seconds > 0"),
    ("input_files.max_bytes", lambda v: v >= 1, "bytes ≥ 1"),
    ("input_files.max_files", lambda v: v >= 0, "an integer ≥ 0"),
    ("tools.max_calls_per_task", lambda v: v >= 1, "an integer ≥ 1"),
    ("tools.rate_per_minute", lambda v: 1 <= v <= MAX_RATE_PER_MINUTE, f"an integer from 1 to {MAX_RATE_PER_MINUTE}"),
    ("tools.slot_seconds", lambda v: v >= 1, "seconds ≥ 1"),
    ("effects.unknown_outcome_margin_seconds", lambda v: 0 <= v <= 3600, "seconds from 0 to 3600"),
    ("tools.unreachable_wait_seconds", lambda v: 0 <= v <= 7 * 86400, "seconds from 0 to 604800 (a week)"),
    ("tools.screening", lambda v: v in ("pass", "redact", "hold"), "one of pass, redact, hold"),
    ("tools.max_timeout_seconds", lambda v: 0.1 <= v <= 3600, "seconds from 0.1 to 3600"),
    ("tenants.default_running_share", lambda v: v is None or 0 < v <= 1, "a share from 0 (excluded) to 1, or null"),
    ("tools.max_answer_bytes", lambda v: v >= 1024, "bytes ≥ 1024"),
    ("model.context_window", lambda v: v >= 1024, "tokens ≥ 1024"),
    ("model.timeout_seconds", lambda v: v > 0, "seconds > 0"),
    ("model.max_retries", lambda v: 0 <= v <= 10, "an integer from 0 to 10"),
    ("model.unavailable_wait_seconds", lambda v: 0 <= v <= 7 * 86400, "seconds from 0 to 604800 (a week)"),
    ("model.max_answer_bytes", lambda v: v >= 1024, "bytes ≥ 1024"),
    ("agent.max_turns", lambda v: 1 <= v <= 1000, "an integer from 1 to 1000"),
    ("agent.max_tool_calls_per_turn", lambda v: 1 <= v <= 100, "an integer from 1 to 100"),
    ("agent.loop_repeats", lambda v: v >= 2, "an integer ≥ 2"),
    ("agent.on_budget", lambda v: v in ("wait", "fail"), "one of wait, fail"),
    ("examples.document_review.publish_server", lambda v: v is None or TOOL_SERVER_NAME.match(v),
     "a tool server's name (lower-case letters, digits, '-', '_'; at most 63) or null (the outbox file)"),
    ("examples.document_review.publish_tool", lambda v: TOOL_NAME.match(v),
     "an MCP tool's name (letters, digits, '_', '-', '.'; at most 128)"),
    ("oauth.registration", lambda v: v in ("open", "closed"), "one of open, closed"),
    ("oauth.registration_rate", lambda v: _is_rate(v), "a rate, N/second|minute|hour|day (N ≥ 1), or off"),
    ("oauth.unused_client_hours", lambda v: v > 0, "hours > 0"),
    ("oauth.stream_token_check_seconds", lambda v: 0.2 <= v <= 300, "seconds from 0.2 to 300"),
]


def _is_rate(value: str) -> bool:
    from config.base.rate_limits import rate_parse  # (imported here: that module reads settings, which load this one)

    try:
        rate_parse(value)
    except ValueError:
        return False
    return True


_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]{0,99}$")
# Lists of regular expressions rather than names.
_REGEX_LISTS = {"redaction.patterns"}
# Lists of tool patterns (globs on "server.tool") and of hosts.
_TOOL_PATTERN_LISTS = {"tools.deny", "tools.allow", "tools.require_approval"}
_HOST_LISTS = {"tools.allowed_hosts"}

_HOST_LABEL = re.compile(r"^(?!-)[a-z0-9-]{1,63}(?<!-)$")


def host_entry_error(entry) -> str | None:
    """What is wrong with an allowed_hosts entry, or None: an IP address, a CIDR network without host bits
    ('10.0.0.0/8'), a host name ('mcp.example.com') or a wildcard for its subdomains ('*.example.com')."""
    if not isinstance(entry, str) or not entry:
        return f"{entry!r} is not a host name, an address or a network"
    if "/" in entry:
        try:
            ipaddress.ip_network(entry)
        except ValueError as error:
            return f"{entry!r} is not a network: {error}"
        return None
    try:
        ipaddress.ip_address(entry)
        return None
    except ValueError:
        pass
    name = entry.lower().removeprefix("*.")
    if len(name) > 253 or not all(_HOST_LABEL.match(label) for label in name.split(".")):
        return (f"{entry!r} is not a host name ('mcp.example.com', '*.example.com'), an address ('10.1.2.3') or "
                f"a network ('10.0.0.0/8')")
    return None


# -- credentials: what the deployment grants (docs/credentials.md) ------------------------------------------------
# A credential's name as a ToolServer or TenantModel stores it (agents_app.models).
CREDENTIAL_NAME = re.compile(r"^[A-Z][A-Z0-9_]{0,127}$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
_TENANT_SLUG = re.compile(r"^[-a-zA-Z0-9_]{1,64}$")  # (tasks_app.models.Tenant.slug: a SlugField)
# The runtime's own secrets and settings: never granted, neither as a name nor as a source, whatever the file says —
# a grant of one would hand the deployment's keys (session signing, database, broker, metrics, the deployment's model
# key, the audit signing key) to whoever may name it. PG*: libpq reads its password and service files from them.
RUNTIME_OWN_NAMES = frozenset({
    "SECRET_KEY", "DATABASE_URL", "DATABASE_SESSION_URL", "REDIS_URL", "STREAM_REDIS_URL", "CELERY_BROKER_URL",
    "METRICS_TOKEN", "MODEL_API_KEY", "MODEL_BASE_URL", "MODEL_NAME", "AUDIT_SIGNING_KEY_FILE"})
RUNTIME_OWN_PREFIXES = ("RUNTIME_", "DJANGO_", "DATABASE_", "REDIS_", "CELERY_", "OAUTH_", "OTEL_", "PG")
_GRANT_KEYS = ("env", "file", "tenants", "hosts")


def runtime_own(name: str) -> bool:
    """Whether ``name`` is one of the runtime's own environment variables (never grantable)."""
    return name.upper() in RUNTIME_OWN_NAMES or name.upper().startswith(RUNTIME_OWN_PREFIXES)


def credentials_parse(value, *, key: str = "credentials") -> dict[str, CredentialGrant]:
    """The deployment's credential grants from runtime.yaml `credentials` (or RUNTIME_CREDENTIALS, JSON):

    - a mapping NAME → {env: VAR | file: /path, tenants: [slug, …] | "*", hosts: [host, …]} — NAME is what a tool
      server or model endpoint stores; the value is read from VAR (default: NAME itself) or the file at each call;
      only the listed tenants may name it, and only for a URL whose host one of `hosts` matches;
    - the older list of names [A, B]: each held by name only (provide_input may name it; granted to no tenant).

    Anything else stops every process at start with a message naming the key. The runtime's own variables
    (RUNTIME_OWN_NAMES, RUNTIME_OWN_PREFIXES) are refused as names and as sources."""
    if value is None:
        return {}
    if isinstance(value, list):  # the older form: names provide_input may refer to, granted to nobody's servers
        grants = {}
        for name in value:
            if not isinstance(name, str) or not _NAME.match(name):
                raise _fail(key, f"must be a mapping of credential grants (or a list of names: letters, digits, "
                                 f"'_', '.', '-'), got {name!r} in the list")
            if runtime_own(name):
                raise _fail(key, f"{name!r} is one of the runtime's own secrets or settings and cannot be granted")
            grants[name] = CredentialGrant(name=name)
        return grants
    if not isinstance(value, dict):
        raise _fail(key, "must map credential names to {env or file, tenants, hosts} (docs/credentials.md), got "
                         f"{value!r}")
    return {name: _grant_parse(name, spec, f"{key}.{name}") for name, spec in value.items()}


def _grant_parse(name, spec, key: str) -> CredentialGrant:
    if not isinstance(name, str) or not CREDENTIAL_NAME.match(name):
        raise _fail(key, "a credential's name is upper-case letters, digits and '_' (at most 128), starting with a "
                         "letter, e.g. GITHUB_TOKEN")
    if runtime_own(name):
        raise _fail(key, f"{name} is one of the runtime's own secrets or settings and cannot be granted")
    spec = {} if spec is None else spec
    if not isinstance(spec, dict):
        raise _fail(key, f"must be a mapping with env or file, tenants and hosts, got {spec!r}")
    unknown = sorted(set(spec) - set(_GRANT_KEYS))
    if unknown:
        raise _fail(f"{key}.{unknown[0]}", f"unknown key; known keys: {', '.join(_GRANT_KEYS)}")
    env, file = spec.get("env"), spec.get("file")
    if env is not None and file is not None:
        raise _fail(key, "takes env or file, not both")
    if file is not None:
        if not isinstance(file, str) or not file.startswith("/") or \
                os.path.normpath(file).startswith(("/proc/", "/sys/", "/dev/")):
            raise _fail(f"{key}.file", f"must be an absolute path of a file holding the secret (not under /proc, "
                                       f"/sys or /dev), got {file!r}")
        signing_key = os.environ.get("AUDIT_SIGNING_KEY_FILE")
        if signing_key and os.path.realpath(file) == os.path.realpath(signing_key):
            raise _fail(f"{key}.file", "is the audit signing key, one of the runtime's own secrets")
    else:
        env = name if env is None else env
        if not isinstance(env, str) or not _ENV_NAME.match(env):
            raise _fail(f"{key}.env", f"must be an environment variable's name, got {env!r}")
        if runtime_own(env):
            raise _fail(f"{key}.env", f"{env} is one of the runtime's own secrets or settings and cannot be granted")
    tenants = spec.get("tenants") or ()
    tenants = (tenants,) if tenants == "*" else tenants
    if not isinstance(tenants, list | tuple) or not all(
            isinstance(slug, str) and (slug == "*" or _TENANT_SLUG.match(slug)) for slug in tenants):
        raise _fail(f"{key}.tenants", f'must be a list of tenant slugs, or "*" for every tenant, got {tenants!r}')
    hosts = spec.get("hosts") or ()
    if not isinstance(hosts, list | tuple):
        raise _fail(f"{key}.hosts", f"must be a list of host names ('api.example.com', '*.example.com'), addresses "
                                    f"or networks, got {hosts!r}")
    for entry in hosts:
        if (error := host_entry_error(entry)) is not None:
            raise _fail(f"{key}.hosts", error)
    if tenants and not hosts:
        # A grant to tenants without hosts would go wherever their URLs point: the very leak grants close.
        raise _fail(f"{key}.hosts", "a credential granted to tenants must list the hosts it may be sent to")
    return CredentialGrant(name=name, env=env if file is None else None, file=file, tenants=tuple(tenants),
                           hosts=tuple(hosts))


def _regex_list(key: str, value) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise _fail(key, f"must be a list of regular expressions, got {value!r}")
    for pattern in value:
        try:
            re.compile(pattern)
        except re.error as error:
            raise _fail(key, f"{pattern!r} is not a valid regular expression: {error}") from None
    return tuple(value)


def _fail(key: str, message: str) -> ImproperlyConfigured:
    return ImproperlyConfigured(f"runtime configuration `{key}`: {message}")


def _env_yaml(key: str, text: str):
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        raise _fail(key, "cannot parse the environment's value as JSON or YAML") from None  # (never echoed: a secret?)


def _cast(key: str, kind: type, value: Any) -> Any:
    text = value if isinstance(value, str) else None
    if isinstance(value, str):  # from the environment
        try:
            value = yaml.safe_load(value)
        except yaml.YAMLError:
            raise _fail(key, f"cannot parse {value!r}") from None
    if isinstance(kind, types.UnionType) and type(None) in kind.__args__:  # optional: null means "not set"
        if value is None:
            return None
        kind = next(arg for arg in kind.__args__ if arg is not type(None))
    if getattr(kind, "__origin__", None) is dict:  # a price table: {model name: [input, output]}
        if not isinstance(value, dict) or not all(
                isinstance(name, str) and isinstance(pair, list) and len(pair) == 2
                and all(isinstance(n, int | float) and not isinstance(n, bool) and n >= 0 for n in pair)
                for name, pair in value.items()):
            raise _fail(key, f"must map model names to [input, output] prices per million tokens (numbers ≥ 0), "
                             f"got {value!r}")
        return {name: (float(pair[0]), float(pair[1])) for name, pair in value.items()}
    if getattr(kind, "__origin__", None) is tuple:  # a list of names (e.g. RUNTIME_REQUIRE_APPROVAL='[a, b]')
        if value is None:
            return ()
        if key in _REGEX_LISTS:
            return _regex_list(key, value)
        if key in _TOOL_PATTERN_LISTS:
            if not isinstance(value, list):
                raise _fail(key, f"must be a list of tool patterns, got {value!r}")
            for pattern in value:
                if not isinstance(pattern, str) or not TOOL_PATTERN.match(pattern):
                    raise _fail(key, f"{pattern!r} is not {TOOL_PATTERN_HELP}")
            return tuple(value)
        if key in _HOST_LISTS:
            if not isinstance(value, list):
                raise _fail(key, f"must be a list of host names, addresses or networks, got {value!r}")
            for entry in value:
                if (error := host_entry_error(entry)) is not None:
                    raise _fail(key, error)
            return tuple(value)
        if not isinstance(value, list) or not all(isinstance(v, str) and _NAME.match(v) for v in value):
            raise _fail(key, f"must be a list of names (letters, digits, '_', '.', '-'), got {value!r}")
        return tuple(value)
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if kind is str and text is not None and isinstance(value, int | float):
        return text  # a name from the environment that YAML reads as a number (RUNTIME_…_PUBLISH_SERVER=42)
    if not isinstance(value, kind) or isinstance(value, bool):
        expected = {float: "a number", str: "a string"}.get(kind, "an integer")
        raise _fail(key, f"must be {expected}, got {value!r}")
    return value


def _build(cls, raw: dict, prefix: str = ""):
    if not isinstance(raw, dict):
        raise _fail(prefix.rstrip(".") or "(top level)", "must be a mapping")
    hints = get_type_hints(cls)
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise _fail(prefix + unknown[0], f"unknown key; known keys: {', '.join(sorted(known))}")
    values = {}
    for f in fields(cls):
        key = prefix + f.name
        env_value = os.environ.get("RUNTIME_" + key.replace(".", "__").upper())
        kind = hints[f.name]
        if key == "credentials":  # (its own shape: credentials_parse; JSON or YAML from RUNTIME_CREDENTIALS)
            values[f.name] = credentials_parse(raw.get(f.name) if env_value is None else _env_yaml(key, env_value),
                                               key=key if env_value is None else "RUNTIME_CREDENTIALS")
        elif is_dataclass(kind):
            values[f.name] = _build(kind, raw.get(f.name, {}) or {}, key + ".")
        elif env_value is not None:
            values[f.name] = _cast(key, kind, env_value)
        elif f.name in raw:
            values[f.name] = _cast(key, kind, raw[f.name])
    return cls(**values)


def _get(config: RuntimeConfig, dotted: str):
    value = config
    for part in dotted.split("."):
        value = getattr(value, part)
    return value


def load_runtime_config(path: Path | str | None = None) -> RuntimeConfig:
    path = Path(path or os.environ.get("RUNTIME_CONFIG_FILE") or DEFAULT_PATH)
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except OSError as error:
        raise ImproperlyConfigured(f"runtime configuration file {path}: {error.strerror}") from None
    except yaml.YAMLError as error:
        raise ImproperlyConfigured(f"runtime configuration file {path} is not valid YAML: {error}") from None
    config = _build(RuntimeConfig, raw)
    for key, check, expected in _RULES:
        value = _get(config, key)
        if not check(value):
            raise _fail(key, f"must be {expected}, got {value!r}")
    if config.heartbeat_seconds > config.lease_seconds / 3:
        raise _fail("heartbeat_seconds", f"must be at most lease_seconds / 3 ({config.lease_seconds / 3:g}) so "
                                         f"a renewal can fail twice before the lease expires")
    if config.checkpoint.task_max_every_steps < config.checkpoint.task_min_every_steps:
        raise _fail("checkpoint.task_max_every_steps", "must be ≥ checkpoint.task_min_every_steps")
    if config.checkpoint.task_max_seconds < config.checkpoint.task_min_seconds:
        raise _fail("checkpoint.task_max_seconds", "must be ≥ checkpoint.task_min_seconds")
    if config.step_retry.backoff_max_seconds < config.step_retry.backoff_seconds:
        raise _fail("step_retry.backoff_max_seconds", "must be ≥ step_retry.backoff_seconds")
    for name, grant in config.credentials.items():
        if config.model.credential and grant.env == config.model.credential:
            raise _fail(f"credentials.{name}", f"{grant.env} holds the deployment's model key (model.credential), one "
                                               f"of the runtime's own secrets: it cannot be granted")
    return config
