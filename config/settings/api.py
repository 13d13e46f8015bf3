"""REST API (DRF), OpenAPI (drf-spectacular) and request limits."""

from django.core.exceptions import ImproperlyConfigured

from config.base.rate_limits import rate_parse
from config.settings.env import env

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "tasks_app.web.authentication.BearerTokenAuthentication",
        # OAuth access tokens (aro_…) issued for this API's resource, origin + /runtime (RFC 8707): the same access
        # rule as an API token. BearerTokenAuthentication leaves those tokens to it (its `claims_token`).
        "mcp_bridge.oauth.rest.OAuthAccessTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["tasks_app.web.authentication.IsTenantMember",
                                   "tasks_app.web.authentication.HasTokenScope"],
    # The size limit, then the nesting cap, UTF-8 only, no lone surrogates (config.base.json_input).
    "DEFAULT_PARSER_CLASSES": ["config.base.json_input.JsonBodyParser"],
    # DRF's JSON renderer, which shows a stored value too deep for json.dumps cut at the cap instead of a 500.
    "DEFAULT_RENDERER_CLASSES": ["config.base.json_input.BoundedJSONRenderer"],
    "EXCEPTION_HANDLER": "config.base.problems.problem_exception_handler",
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
}

# Rate limits per person (an account, whichever of its tokens or its session it uses), shared by every web process
# through Redis (config.base.rate_limits): "N/second|minute|hour|day" (at most N in any such window, sliding) or "off".
# create: POST /runtime/tasks, a fork, an MCP tools/call that starts a task or fork_task, the admin's fork and "Call a
# tool" forms; steer: steering commands, cancel, MCP tasks/cancel, tasks/update and steer_task, the admin's steering
# forms and bulk actions. Over it: 429 with Retry-After, nothing done. A tenant may set its own (admin: Tenant).
RATE_LIMIT_CREATE = env.str("RATE_LIMIT_CREATE", default="300/minute")
RATE_LIMIT_STEER = env.str("RATE_LIMIT_STEER", default="600/minute")
try:
    RATE_LIMITS = {"create": rate_parse(RATE_LIMIT_CREATE), "steer": rate_parse(RATE_LIMIT_STEER)}
except ValueError as error:
    raise ImproperlyConfigured(f"RATE_LIMIT_CREATE / RATE_LIMIT_STEER: {error}") from None
# The limits above are per person: one bucket per account across its session (admin forms, REST) and all its tokens
# (REST, MCP). Beside them, one per tenant across all its people (config.base.rate_limits): a tenant's many accounts
# together stay under these. Four people at the default per-person rate fit.
RATE_LIMIT_TENANT_CREATE = env.str("RATE_LIMIT_TENANT_CREATE", default="1200/minute")
RATE_LIMIT_TENANT_STEER = env.str("RATE_LIMIT_TENANT_STEER", default="2400/minute")
try:
    RATE_LIMITS_TENANT = {"create": rate_parse(RATE_LIMIT_TENANT_CREATE), "steer": rate_parse(RATE_LIMIT_TENANT_STEER)}
except ValueError as error:
    raise ImproperlyConfigured(f"RATE_LIMIT_TENANT_CREATE / RATE_LIMIT_TENANT_STEER: {error}") from None

# Largest accepted request body; bigger inputs belong in storage, referenced from the input.
RUNTIME_MAX_REQUEST_BYTES = env.int("RUNTIME_MAX_REQUEST_BYTES", default=1024 * 1024)
DATA_UPLOAD_MAX_MEMORY_SIZE = RUNTIME_MAX_REQUEST_BYTES
# How deeply the objects and arrays of an accepted JSON body may nest (REST, /mcp, OAuth registration, the admin's
# JSON fields: config.base.json_input); deeper is a 400. Values shown (pages, exports, answers) are cut at this depth with
# a marker. Python's parser recurses once per level; at most 200, so json.dumps of a value at the cap always fits.
RUNTIME_MAX_JSON_DEPTH = env.int("RUNTIME_MAX_JSON_DEPTH", default=64)
if not 1 <= RUNTIME_MAX_JSON_DEPTH <= 200:
    raise ImproperlyConfigured(f"RUNTIME_MAX_JSON_DEPTH must be 1 to 200, not {RUNTIME_MAX_JSON_DEPTH}.")

SPECTACULAR_SETTINGS = {
    "TITLE": "Agent Runtime API",
    "DESCRIPTION": "Durable, steerable long-running agent tasks. Errors are RFC 9457 problem details.",
    "VERSION": "0.1.0",
    "SERVE_INCLUDE_SCHEMA": False,
    # The schema and docs are behind the same authentication as the API they describe.
    "SERVE_PERMISSIONS": ["tasks_app.web.authentication.IsTenantMember"],
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "tasks_app.web.schema.workflow_inputs",
    ],
}

# The MCP endpoint (mcp_bridge). Its requests are JSON-RPC messages: the same body cap as the API.
MCP_MAX_REQUEST_BYTES = env.int("MCP_MAX_REQUEST_BYTES", default=RUNTIME_MAX_REQUEST_BYTES)
# How long a tools/call from a client without the tasks extension waits for its task to finish before answering
# with an error that names the task (it goes on running: read it through the API or the console).
MCP_SYNC_WAIT_SECONDS = env.float("MCP_SYNC_WAIT_SECONDS", default=60.0)
# How long a 2025-11-25 tasks/result waits for the task to finish before answering "still running, ask again".
MCP_RESULT_WAIT_SECONDS = env.float("MCP_RESULT_WAIT_SECONDS", default=300.0)
# A 2025-11-25 tasks/cancel answers with the cancelled task: the bridge waits this long for the task's next safe point
# (a running step finishes first), then answers with the task as it is (working, "Cancelling at the next safe point").
MCP_CANCEL_WAIT_SECONDS = env.float("MCP_CANCEL_WAIT_SECONDS", default=10.0)
# A question a 2025-11-25 tasks/result asks (an elicitation, mcp_bridge.elicitation) can be answered this long; its
# signed request id expires then (the answer is refused; calling tasks/result again asks anew).
MCP_ELICITATION_ANSWER_SECONDS = env.int("MCP_ELICITATION_ANSWER_SECONDS", default=3600)
# A task started by a foreground call (and its rounds of input, SEP-2322) ends by this deadline if the client walks
# away; its requestState is valid as long.
MCP_FOREGROUND_TASK_SECONDS = env.int("MCP_FOREGROUND_TASK_SECONDS", default=3600)
# Browser origins allowed besides those of ALLOWED_HOSTS and CSRF_TRUSTED_ORIGINS (a bad Origin is a 403).
MCP_ALLOWED_ORIGINS = env.list("MCP_ALLOWED_ORIGINS", default=[])
# The authorization server named in /.well-known/oauth-protected-resource (empty: this deployment, whose tokens come
# from `manage.py create_api_token`).
MCP_AUTHORIZATION_SERVER = env.str("MCP_AUTHORIZATION_SERVER", default="")
# The conformance fixtures (mcp_bridge/fixtures): off unless asked for; with them, a token-less request from
# loopback acts in the dedicated fixture tenant. Set it for the web process and the workers alike.
MCP_CONFORMANCE_FIXTURES = env.bool("MCP_CONFORMANCE_FIXTURES", default=False)
