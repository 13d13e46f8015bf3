"""The agent layer's rows: the downstream MCP servers a tenant's tasks may call, and the tenant's tool policy.

Credentials are names: a server's bearer token is read from the deployment's environment (or secret store) by the
name stored here, at the moment of the call, and never stored, logged or put in an event (§12) — and only a name the
deployment grants to the row's tenant for its URL's host (agents_app.credentials, docs/credentials.md)."""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator, RegexValidator
from django.db import models
from django.db.models.functions import Now

from config.base.runtime import CREDENTIAL_NAME as CREDENTIAL_NAME_PATTERN
from config.base.runtime import MAX_RATE_PER_MINUTE, TOOL_PATTERN, TOOL_PATTERN_HELP, TOOL_SERVER_NAME, host_entry_error
from tasks_app.models import TOOL_POLICY_MAX_PATTERNS, Tenant

# A server's name is the first part of a tool's policy name ("github.create_issue"): no dots, nothing a glob means.
SERVER_NAME = RegexValidator(TOOL_SERVER_NAME.pattern, "Lower-case letters, digits, '-' and '_' (at most 63), "
                             "starting with a letter or digit: it is the first part of each tool's name "
                             "(server.tool) in the tool policy.")
CREDENTIAL_NAME = RegexValidator(CREDENTIAL_NAME_PATTERN.pattern, "The NAME of an environment variable (upper-case "
                                 "letters, digits, '_'), never the secret itself.")


def validate_credential_granted(*, credential: str, tenant_id, url: str) -> None:
    """A row's credential must be one the deployment grants to its tenant for its URL's host (agents_app.credentials,
    docs/credentials.md): checked by the models' clean(), which every write path runs (the admin's forms, the
    tool_servers command through services.tool_server_add); a row written past it fails closed at call time."""
    if not credential or tenant_id is None or not CREDENTIAL_NAME_PATTERN.match(credential):
        return  # (no credential; or the form's own errors say what is wrong first)
    from agents_app import credentials

    slug = Tenant.objects.filter(id=tenant_id).values_list("slug", flat=True).first()
    refused = credentials.refusal(name=credential, tenant_slug=slug, url=url)
    if refused is not None:
        raise ValidationError({"credential": refused.message})


def validate_tool_patterns(value) -> None:
    """A tenant's list of tool patterns (globs on server.tool), checked as the deployment's are (config.base.runtime)."""
    if value is None:
        return
    if not isinstance(value, list) or len(value) > TOOL_POLICY_MAX_PATTERNS:
        raise ValidationError(f"A JSON list of at most {TOOL_POLICY_MAX_PATTERNS} tool patterns, e.g. "
                              f'["github.delete_*"].')
    for pattern in value:
        if not isinstance(pattern, str) or not TOOL_PATTERN.match(pattern):
            raise ValidationError(f"{pattern!r} is not {TOOL_PATTERN_HELP}.")


def validate_allowed_hosts(value) -> None:
    if value is None:
        return
    if not isinstance(value, list) or len(value) > TOOL_POLICY_MAX_PATTERNS:
        raise ValidationError(f"A JSON list of at most {TOOL_POLICY_MAX_PATTERNS} host names, addresses or networks, "
                              f'e.g. ["mcp.example.com", "10.1.0.0/16"].')
    for entry in value:
        if (error := host_entry_error(entry)) is not None:
            raise ValidationError(error + ".")


class ToolServer(models.Model):
    """A downstream MCP server (Streamable HTTP) a tenant's tasks may call through the policy gateway."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="tool_servers")
    name = models.CharField(max_length=63, validators=[SERVER_NAME])
    url = models.URLField(max_length=500, help_text="The server's Streamable HTTP endpoint, e.g. "
                                                    "http://127.0.0.1:8765/mcp")
    credential = models.CharField(max_length=128, blank=True, default="", validators=[CREDENTIAL_NAME],
                                  help_text="The name of the environment variable holding its bearer token "
                                            "(read at each call, never stored); empty: no Authorization header.")
    enabled_tools = models.JSONField(null=True, blank=True,
                                     help_text='The tools of this server tasks may see and call, e.g. ["lookup", '
                                               '"upsert"]; empty: all of them (the policy still applies).')
    class Protocol(models.TextChoices):
        AUTO = "auto", "negotiate (2026-07-28 server/discover, else 2025-11-25 initialize)"
        LEGACY = "legacy", "2025-11-25 only (initialize)"
        MODERN = "2026-07-28", "2026-07-28 only"

    protocol = models.CharField(max_length=20, choices=Protocol.choices, default=Protocol.AUTO,
                                help_text="Which MCP era to speak to it (negotiated unless pinned).")
    timeout_seconds = models.FloatField(default=30, validators=[MinValueValidator(0.1), MaxValueValidator(3600)])
    # The tenant admin's word that the server deduplicates calls by the Idempotency-Key the runtime sends (this runtime
    # as a downstream server does): a call of unknown outcome is then sent again with the same key instead of being
    # put to a person (checkpoints_app.models.Recovery.REPEAT_WITH_KEY). Wrongly set, only this server's own effects
    # can repeat.
    honours_idempotency_key = models.BooleanField(
        default=False, help_text="The server deduplicates calls by their Idempotency-Key header (_meta "
                                 "io.agentruntime/idempotency-key): a call whose outcome is unknown is sent again with "
                                 "the same key rather than asked about.")
    max_concurrent_calls = models.PositiveIntegerField(default=4, validators=[MinValueValidator(1),
                                                                              MaxValueValidator(1000)])
    rate_per_minute = models.PositiveIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1), MaxValueValidator(MAX_RATE_PER_MINUTE)],
        help_text="Calls started per minute at most, across all workers; empty: the deployment's "
                  "tools.rate_per_minute.")
    # The server's tool list as last read (names, schemas, annotations), with a digest of it: a change of the list
    # is a new version, so a call is checked against the schema the server publishes now, not a stale one.
    tools = models.JSONField(null=True, blank=True, editable=False)
    tools_version = models.CharField(max_length=64, blank=True, default="", editable=False)
    tools_read_at = models.DateTimeField(null=True, blank=True, editable=False)
    protocol_version = models.CharField(max_length=20, blank=True, default="", editable=False)
    created_at = models.DateTimeField(db_default=Now(), editable=False)
    updated_at = models.DateTimeField(db_default=Now(), editable=False)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["tenant", "name"], name="toolserver_tenant_name_unique")]
        ordering = ["tenant", "name"]

    def clean(self) -> None:
        super().clean()
        validate_credential_granted(credential=self.credential, tenant_id=self.tenant_id, url=self.url)

    # -- the deployment's timeout maximum (runtime.yaml tools.max_timeout_seconds, docs/quotas.md) ------------------
    # A call holds its worker for up to timeout_seconds, so a tenant admin's 3600 let one tenant's calls to a server
    # that never answers hold workers for an hour each. The field's own bound (3600) is the widest any deployment may
    # allow; the deployment's maximum is checked here, at save (the admin's form and services.tool_server_add both
    # run full_clean), not as a field validator: it is configuration, which a migration must not freeze.
    def clean_fields(self, exclude=None) -> None:
        errors: dict = {}
        try:
            super().clean_fields(exclude=exclude)
        except ValidationError as invalid:
            errors = invalid.update_error_dict(errors)
        limit = tool_timeout_maximum()
        if ("timeout_seconds" not in (exclude or ()) and "timeout_seconds" not in errors
                and self.timeout_seconds is not None and self.timeout_seconds > limit):
            errors["timeout_seconds"] = [ValidationError(
                f"At most {limit:g} seconds: the deployment's maximum (tools.max_timeout_seconds). A call holds a "
                f"worker while it waits; a slower server can answer with an MCP task, which is waited for without "
                f"one.", code="max_value")]
        if errors:
            raise ValidationError(errors)

    @classmethod
    def from_db(cls, db, field_names, values):
        """A row above the deployment's maximum (saved before it was lowered, or written by SQL) is clamped as it is
        loaded: every call path (the gateway's calls, tool lists and downstream polls, the admin's "Call a tool")
        reads the row through here, so none can use the larger value."""
        server = super().from_db(db, field_names, values)
        if "timeout_seconds" in server.__dict__ and server.timeout_seconds is not None:
            server.timeout_seconds = min(server.timeout_seconds, tool_timeout_maximum())
        return server

    def __str__(self) -> str:
        return f"{self.name} ({self.tenant})"


def tool_timeout_maximum() -> float:
    """The longest a tool server's timeout_seconds may be: runtime.yaml tools.max_timeout_seconds."""
    from django.conf import settings

    return settings.RUNTIME.tools.max_timeout_seconds


class TenantToolPolicy(models.Model):
    """A tenant's narrowing of the deployment's tool policy (config/runtime.yaml `tools`): it can only take away —
    deny more, allow fewer, ask for approval more often, reach fewer hosts, call fewer times — never widen it."""

    tenant = models.OneToOneField(Tenant, on_delete=models.CASCADE, related_name="tool_policy")
    deny = models.JSONField(default=list, blank=True, validators=[validate_tool_patterns],
                            help_text='Glob patterns of tools (server.tool) never called, e.g. ["github.delete_*"].')
    allow = models.JSONField(null=True, blank=True, validators=[validate_tool_patterns],
                             help_text="If set, only tools matching one of these patterns may be called (on top of "
                                       "the deployment's allow list).")
    require_approval = models.JSONField(default=list, blank=True, validators=[validate_tool_patterns],
                                        help_text="Patterns of tools that wait for a person's approval before each "
                                                  "call.")
    allowed_hosts = models.JSONField(null=True, blank=True, validators=[validate_allowed_hosts],
                                     help_text="If set, only these hosts (names, addresses or networks) of the "
                                               "deployment's list.")
    max_calls_per_task = models.PositiveIntegerField(null=True, blank=True, validators=[MinValueValidator(1)],
                                                     help_text="Tool calls one task may make; the smaller of this and "
                                                               "the deployment's tools.max_calls_per_task applies.")
    updated_at = models.DateTimeField(db_default=Now(), editable=False)

    def __str__(self) -> str:
        return f"tool policy of {self.tenant}"


class TenantModel(models.Model):
    """A tenant's own language model endpoint for its agents, in place of the deployment's (config/runtime.yaml
    `model`): any OpenAI-compatible Chat Completions endpoint. Its host must be one tools.allowed_hosts (narrowed by
    the tenant's tool policy) lets through, checked before each request; its API key is the NAME of an environment
    variable, read at each call, never stored."""

    tenant = models.OneToOneField(Tenant, on_delete=models.CASCADE, related_name="model_endpoint")
    base_url = models.URLField(max_length=500, help_text="The endpoint's base URL, e.g. https://api.openai.com/v1 or "
                                                         "http://127.0.0.1:11434/v1 (Ollama).")
    name = models.CharField(max_length=200, help_text="The model's name there, e.g. gpt-4.1 or llama3.1; a task's "
                                                      "input.model replaces it.")
    credential = models.CharField(max_length=128, blank=True, default="", validators=[CREDENTIAL_NAME],
                                  help_text="The name of the environment variable holding its API key (read at each "
                                            "call, never stored); empty: none sent.")
    context_window = models.PositiveIntegerField(null=True, blank=True, validators=[MinValueValidator(1024)],
                                                 help_text="Tokens; empty: the deployment's model.context_window.")
    input_price = models.DecimalField(max_digits=12, decimal_places=6, null=True, blank=True,
                                      validators=[MinValueValidator(0)],
                                      help_text="Per million input tokens, in the unit budget.maxCost counts.")
    output_price = models.DecimalField(max_digits=12, decimal_places=6, null=True, blank=True,
                                       validators=[MinValueValidator(0)],
                                       help_text="Per million output tokens.")
    updated_at = models.DateTimeField(db_default=Now(), editable=False)

    def clean(self) -> None:
        super().clean()
        validate_credential_granted(credential=self.credential, tenant_id=self.tenant_id, url=self.base_url)

    def __str__(self) -> str:
        return f"model of {self.tenant}: {self.name} at {self.base_url}"


class DownstreamTask(models.Model):
    """A task a downstream MCP server answered one of our tool calls with (MCP Tasks). Its handle is the call's result
    in the ledger (so it is never created twice); this row is the index of the ones still running, so that a task of
    ours that ends while one runs (cancelled, failed) has it cancelled downstream by the reaper's sweep
    (agents_app.gateway.downstream.downstream_tasks_release) instead of leaving it running for nobody."""

    class State(models.TextChoices):
        OPEN = "open"  # running downstream, as far as we know
        FINISHED = "finished"  # its result (or failure) came back
        CANCEL_SENT = "cancel_sent"  # our task ended first: tasks/cancel was sent (or it had finished meanwhile)

    task = models.ForeignKey("tasks_app.Task", on_delete=models.CASCADE, related_name="downstream_tasks",
                             db_constraint=False)
    effect_key = models.CharField(max_length=300)
    server = models.ForeignKey(ToolServer, on_delete=models.SET_NULL, null=True, related_name="downstream_tasks")
    downstream_id = models.CharField(max_length=200)
    state = models.CharField(max_length=20, choices=State.choices, default=State.OPEN)
    # A 2025-11-25 downstream task's question as it was asked on its tasks/result stream, not yet answered ({"id": the
    # JSON-RPC request id, "params", "session": the server's Mcp-Session-Id or null}): kept so that the answer, given
    # by a person later, goes back as the response to that very request (gateway.downstream.relay_legacy_question).
    # Not shown to anyone (a session id lets its holder speak in the session); the question itself is our task's wait.
    question = models.JSONField(null=True, blank=True, editable=False)
    questions_answered = models.PositiveIntegerField(default=0, editable=False)  # (so a question asked again is new)
    created_at = models.DateTimeField(db_default=Now(), editable=False)
    updated_at = models.DateTimeField(db_default=Now(), editable=False)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["task", "effect_key"], name="downstreamtask_key_unique")]
        indexes = [models.Index(fields=["state"], condition=models.Q(state="open"), name="downstreamtask_open_idx")]

    def __str__(self) -> str:
        return f"{self.downstream_id} ({self.state}) for {self.effect_key}"


class TranscriptMessage(models.Model):
    """One message of an agent's conversation with its model (agents_app.transcript), stored once by its content's
    digest: the task's state keeps only the digests, in order (the checkpoint holds references, not the model
    session), and a message is never changed — a row is written before the step that refers to it commits, so one
    whose step never committed is merely unreferenced."""

    pk = models.CompositePrimaryKey("task", "digest")
    # No database foreign key, no index of its own: see TASK_CHILD in tasks_app.models.
    task = models.ForeignKey("tasks_app.Task", on_delete=models.CASCADE, related_name="transcript_messages",
                             db_constraint=False)
    digest = models.CharField(max_length=64)  # sha256 of the message's canonical JSON
    role = models.CharField(max_length=20)
    message = models.JSONField()
    created_at = models.DateTimeField(db_default=Now(), editable=False)

    def __str__(self) -> str:
        return f"{self.role} {self.digest[:12]}"
