"""Problem details (RFC 9457) for every error the API returns: what was wrong and how to fix it.

Every error body is ``application/problem+json`` with ``type`` (a URI under /runtime/problems/ that documents
the problem), ``title``, ``status``, ``detail`` and, for bad input, ``errors``: a list of
``{"field": "input.steps", "message": "..."}``.
"""

from __future__ import annotations

import io
import logging
import re

from django.conf import settings
from django.db import InterfaceError, OperationalError, connection
from django.http import Http404, JsonResponse
from django.urls import URLResolver, get_resolver, resolve
from django.urls.exceptions import Resolver404
from django.urls.resolvers import RoutePattern
from django.views import defaults as django_defaults
from django.views.decorators.csrf import csrf_exempt
from psycopg_pool import PoolTimeout
from rest_framework import exceptions, status
from rest_framework.parsers import JSONParser
from rest_framework.renderers import JSONRenderer
from rest_framework.response import Response

logger = logging.getLogger(__name__)

PROBLEM_CONTENT_TYPE = "application/problem+json"

# slug -> (title, how to fix). The slug is the last part of the problem's type URI.
PROBLEM_TYPES: dict[str, tuple[str, str]] = {
    "invalid-request": ("Invalid request", "Correct the fields listed in `errors` and send the request again."),
    "malformed-json": ("Malformed JSON", "Send a valid JSON document with Content-Type: application/json."),
    "json-too-deep": ("JSON nested too deeply", "Nest objects and arrays at most RUNTIME_MAX_JSON_DEPTH levels deep "
                                                "(`detail` says how deep); flatten the value or store it and pass a "
                                                "reference."),
    "unsupported-media-type": ("Unsupported media type", "Send the body as JSON with Content-Type: application/json."),
    "payload-too-large": (
        "Request body too large",
        "Keep the body under the limit; put large inputs in storage and pass a reference in the input.",
    ),
    "unknown-workflow": ("Unknown workflow",
                         "Use one of the workflow names listed in the error (GET /runtime/workflows)."),
    "input-schema-violation": (
        "Input does not match the workflow's schema",
        "Fix the fields listed in `errors`; the schema is in GET /runtime/workflows.",
    ),
    "invalid-idempotency-key": (
        "Invalid Idempotency-Key header",
        "Send 1 to 255 visible ASCII characters (a UUID is a good choice), without spaces.",
    ),
    "idempotency-key-reused": (
        "Idempotency-Key already used with a different request",
        "Use a new key for a new request, or resend exactly the body first sent with this key.",
    ),
    "version-conflict": ("The task changed since you read it",
                         "Read the snapshot in this answer, decide again, and send its stateVersion as "
                         "expectedVersion."),
    "command-refused": ("The command does not apply", "Read `detail`: the task's status or the payload does not "
                                                      "allow it."),
    "invalid-transition": ("Not allowed in the task's current status", "Read the task's snapshot for its status."),
    "fork-refused": ("This task cannot be forked there",
                     "Read `detail`: the workflow's code, the task's history or its plan does not allow a fork at that "
                     "step; fork another step, or start a new task."),
    "not-an-agent-task": ("The task has no conversation with a model",
                          "Only an agent task (the `agent` workflow, or one built on it) has a transcript; follow "
                          "this task through its snapshot and events."),
    "not-authenticated": (
        "Authentication required",
        "Send `Authorization: Bearer <token>` (python manage.py create_api_token) or sign in.",
    ),
    "permission-denied": ("Permission denied", "Use an account that belongs to a tenant."),
    "not-found": ("Not found", "Check the URL and the id; tasks of other tenants are not visible."),
    "method-not-allowed": ("Method not allowed", "Use one of the methods in the Allow header."),
    "throttled": ("Too many requests", "Wait for the number of seconds in Retry-After; nothing of the refused request "
                                       "was done. The limit is per token (or signed-in user): see `limit`."),
    "task-limit-reached": ("The tenant's task limit is reached",
                           "Make room: finished tasks are removed after the retention period, or an operator removes "
                           "them or raises the tenant's max_stored_tasks (admin: Tenants). Then send it again."),
    "server-error": ("Internal server error", "Retry later; the error was logged for the operators."),
    "database-unavailable": ("Database unavailable",
                             "The database could not be reached for a moment; retry after the seconds in Retry-After. "
                             "Nothing of your request was written."),
}


# The two details of a 503 database-unavailable problem (the Django path and tasks_app.web.snapshot_edge).
DATABASE_BUSY = "Too many requests are waiting for the database; retry after the seconds in Retry-After."
DATABASE_UNAVAILABLE = "The database is unavailable for a moment; retry shortly."


def problem_type_uri(slug: str) -> str:
    return f"/runtime/problems/{slug}"


def problem_body(*, status_code: int, slug: str, detail: str, errors: list[dict] | None = None, **extra) -> dict:
    title, _ = PROBLEM_TYPES[slug]
    body = {"type": problem_type_uri(slug), "title": title, "status": status_code, "detail": detail}
    if errors:
        body["errors"] = errors
    body.update(extra)
    return body


class Problem(exceptions.APIException):
    """An error that is the client's to fix. Services raise subclasses; the API layer renders them."""

    status_code = status.HTTP_400_BAD_REQUEST
    slug = "invalid-request"

    def __init__(self, detail: str, *, errors: list[dict] | None = None, status_code: int | None = None, **extra):
        super().__init__(detail)
        if status_code is not None:
            self.status_code = status_code
        self.errors = errors
        self.extra = extra


class PayloadTooLarge(Problem):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    slug = "payload-too-large"


class SizeLimitedJSONParser(JSONParser):
    """JSON parser that refuses bodies over RUNTIME_MAX_REQUEST_BYTES with a 413 instead of reading them all."""

    def parse(self, stream, media_type=None, parser_context=None):
        limit = settings.RUNTIME_MAX_REQUEST_BYTES
        raw = stream.read(limit + 1) if stream is not None else b""
        if len(raw) > limit:
            raise PayloadTooLarge(f"The request body is larger than {limit} bytes.", limit=limit)
        return super().parse(io.BytesIO(raw), media_type, parser_context)


def flatten_errors(detail, prefix: str = "") -> list[dict]:
    """DRF's nested error dict/list -> [{"field": "a.b.0", "message": "..."}]."""
    if isinstance(detail, dict):
        out = []
        for key, value in detail.items():
            field = prefix if key == "non_field_errors" else (f"{prefix}.{key}" if prefix else str(key))
            out.extend(flatten_errors(value, field))
        return out
    if isinstance(detail, list):
        if all(not isinstance(item, (dict, list)) for item in detail):
            return [{"field": prefix or None, "message": str(item)} for item in detail]
        out = []
        for index, item in enumerate(detail):
            out.extend(flatten_errors(item, f"{prefix}.{index}" if prefix else str(index)))
        return out
    return [{"field": prefix or None, "message": str(detail)}]


_DRF_SLUGS = [
    (exceptions.ParseError, "malformed-json"),
    (exceptions.UnsupportedMediaType, "unsupported-media-type"),
    (exceptions.NotAuthenticated, "not-authenticated"),
    (exceptions.AuthenticationFailed, "not-authenticated"),
    (exceptions.PermissionDenied, "permission-denied"),
    (exceptions.NotFound, "not-found"),
    (exceptions.MethodNotAllowed, "method-not-allowed"),
    (exceptions.Throttled, "throttled"),
]


def problem_exception_handler(exc, context):
    """DRF exception handler: every handled error becomes problem+json; anything else stays a logged 500."""
    response = _problem_response(exc, context)
    request = context.get("request")
    if response is not None and request is not None:
        # Rendered as JSON whatever the view renders: the docs views render HTML templates and the schema view
        # YAML, which turned a 401 into "401 Unauthorized" text or YAML under a problem+json Content-Type.
        request.accepted_renderer, request.accepted_media_type = JSONRenderer(), "application/json"
    return response


def validation_summary(errors: list[dict], *, shown: int = 5) -> str:
    """One sentence for `detail`: "workflow: This field is required; input: Must be a JSON object."

    Messages are sentences of their own; their final period is dropped before joining so the summary never
    reads ".;".
    """
    parts = [f"{e['field']}: {e['message'].rstrip('.')}" if e["field"] else e["message"].rstrip(".")
             for e in errors[:shown]]
    if not parts:
        return "Invalid request."
    more = f" (and {len(errors) - shown} more in `errors`)" if len(errors) > shown else ""
    return "; ".join(parts) + more + "."


def _problem_response(exc, context):
    if isinstance(exc, Http404):
        exc = exceptions.NotFound("No such resource.")
    if isinstance(exc, (OperationalError, InterfaceError)):
        # The database went away (restart, failover, a killed connection, too many clients) or every connection
        # of this process's pool stayed busy past its timeout (overload): a condition to retry, not a server bug.
        # Drop this thread's connection so the next request connects afresh. Each request's writes are one
        # transaction, so nothing was half-written.
        busy = isinstance(exc.__cause__, PoolTimeout)
        logger.warning("database %s during %s: %s", "busy" if busy else "unavailable", context["request"].path,
                       str(exc).strip()[:300])
        try:
            connection.close()
        except Exception:  # already gone
            pass
        detail = DATABASE_BUSY if busy else DATABASE_UNAVAILABLE
        response = Response(problem_body(status_code=503, slug="database-unavailable", detail=detail), status=503,
                            headers={"Retry-After": "2"}, content_type=PROBLEM_CONTENT_TYPE)
        # Logged once, above, as the warning it is: under overload Django's own ERROR line per 503 doubled the log.
        response._has_been_logged = True
        return response
    if not isinstance(exc, exceptions.APIException):
        return None
    headers = {}
    if isinstance(exc, Problem):
        body = problem_body(status_code=exc.status_code, slug=exc.slug, detail=str(exc.detail), errors=exc.errors,
                            **exc.extra)
    elif isinstance(exc, exceptions.ValidationError):
        errors = flatten_errors(exc.detail)
        body = problem_body(status_code=400, slug="invalid-request", detail=validation_summary(errors),
                            errors=errors)
    else:
        slug = next((s for cls, s in _DRF_SLUGS if isinstance(exc, cls)), "invalid-request")
        detail = str(exc.detail)
        if isinstance(exc, exceptions.ParseError):
            detail = f"The body is not valid JSON: {detail.removeprefix('JSON parse error - ')}"
        if isinstance(exc, exceptions.UnsupportedMediaType):
            sent = (context["request"].content_type or "").split(";")[0].strip() if context.get("request") else ""
            detail = ("The request has no Content-Type" if not sent else f"Content-Type {sent!r} is not accepted") + \
                ": send the body as JSON with `Content-Type: application/json`."
        body = problem_body(status_code=exc.status_code, slug=slug, detail=detail)
    if isinstance(exc, (exceptions.NotAuthenticated, exceptions.AuthenticationFailed)):
        headers["WWW-Authenticate"] = 'Bearer realm="runtime"'
    if getattr(exc, "wait", None):
        headers["Retry-After"] = str(int(exc.wait))
    return Response(body, status=exc.status_code, headers=headers, content_type=PROBLEM_CONTENT_TYPE)


# Paths whose every answer, errors included, is JSON: the REST API and the MCP endpoint.
API_PATH = re.compile(r"/(?:runtime|mcp)(?:/|$)")


def _wants_problem(request) -> bool:
    return bool(API_PATH.match(request.path)) or request.path in {"/healthz", "/readyz", "/metrics"}


def problem_response(*, status_code: int, slug: str, detail: str, **extra) -> JsonResponse:
    """A problem+json answer from a plain Django view (DRF views raise a Problem instead)."""
    body = problem_body(status_code=status_code, slug=slug, detail=detail, **extra)
    return JsonResponse(body, status=status_code, content_type=PROBLEM_CONTENT_TYPE)


def not_found(request, exception=None):
    if not _wants_problem(request):
        return django_defaults.page_not_found(request, exception)
    return problem_response(status_code=404, slug="not-found", detail=unknown_path_detail(request.path))


def server_error(request):
    if not _wants_problem(request):
        return django_defaults.server_error(request)
    return problem_response(status_code=500, slug="server-error", detail="The server failed to handle this request.")


def answers_unknown_paths(view):
    """Marks a catch-all view: a 404 never suggests its paths. CSRF-exempt like the DRF views it stands beside,
    so an unknown path answers 404 to a POST too rather than Django's HTML CSRF page."""
    view = csrf_exempt(view)
    view.answers_unknown_paths = True
    return view


@answers_unknown_paths
def path_not_found(request, *args, **kwargs):
    """The last URL pattern under /runtime/ and /mcp: problem+json 404 whatever DEBUG says.

    A view answers rather than raising Http404 because with DEBUG on Django bypasses handler404 and serves its
    technical 404 page (HTML listing every URL pattern of the project).
    """
    return problem_response(status_code=404, slug="not-found", detail=unknown_path_detail(request.path))


def unknown_path_detail(path: str) -> str:
    """The 404's detail: "No resource at /runtime/tasks/; did you mean /runtime/tasks?" when a near path exists
    (no trailing slash, lower case), else the API's routes."""
    for candidate in dict.fromkeys([path.rstrip("/"), path.rstrip("/").lower()]):
        if candidate and candidate != path and _is_resource(candidate):
            return f"No resource at {path}; did you mean {candidate}?"
    routes = api_routes()
    return f"No resource at {path}. The API has: {', '.join(routes)}." if routes else f"No resource at {path}."


def _is_resource(path: str) -> bool:
    try:
        match = resolve(path)
    except Resolver404:
        return False
    return not getattr(match.func, "answers_unknown_paths", False)


def api_routes() -> list[str]:
    """The API's routes as a client writes them: /runtime/tasks/{task_id}, … (the URLconf in order)."""
    routes = []

    def walk(patterns, prefix):
        for entry in patterns:
            route = prefix + str(entry.pattern)
            if not API_PATH.match("/" + route):
                continue  # the admin, health checks; a catch-all's regex
            if isinstance(entry, URLResolver):
                walk(entry.url_patterns, route)
            elif isinstance(entry.pattern, RoutePattern) and not getattr(entry.callback, "answers_unknown_paths",
                                                                         False):
                routes.append("/" + re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", route))

    walk(get_resolver().url_patterns, "")
    return routes


def problem_type_doc(request, slug: str):
    """The page a problem's `type` URI points at: its title and how to fix it."""
    if slug not in PROBLEM_TYPES:
        return not_found(request)
    title, fix = PROBLEM_TYPES[slug]
    return JsonResponse({"type": problem_type_uri(slug), "title": title, "howToFix": fix})
