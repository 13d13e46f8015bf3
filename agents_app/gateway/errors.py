"""The gateway's errors: a tool call it could not make, each with the typed `reason` the task's error carries and
whether the step may try again (`retryable`); and the tool.denied event a refused call is told by."""

from __future__ import annotations


class ToolError(Exception):
    """A tool call the gateway could not make; `reason` is the typed reason the task's error carries."""

    reason = "tool_error"
    retryable = True

    def __init__(self, message: str, *, events: list | tuple = ()):
        super().__init__(message)
        self.events = list(events)


class ToolDenied(ToolError):
    """The policy (or the server's list of enabled tools, or its host) refuses the call: it never reaches the
    server, and trying again would be refused the same way."""

    reason = "tool_denied"
    retryable = False


class ToolUnknown(ToolError):
    """No such server for this tenant, or no such tool on the server."""

    reason = "tool_unknown"
    retryable = False


class ToolArgumentsInvalid(ToolError):
    reason = "tool_arguments_invalid"
    retryable = False

    def __init__(self, message: str, errors: list[dict]):
        super().__init__(message)
        self.errors = errors


class ToolUnavailable(ToolError):
    """The server could not be reached (every try): nothing was sent, so the step may try again later.
    ``transient``: worth waiting for (see mcp_client.NotSent); a 401 or a 404 is not. ``detail``: how it failed,
    for the log when the message shown leaves it out (tools_refresh)."""

    reason = "tool_unavailable"

    def __init__(self, message: str, *, transient: bool = True, events: list | tuple = (), detail: str = ""):
        super().__init__(message, events=events)
        self.transient = transient
        self.detail = detail


class ToolRefused(ToolError):
    """The server answered the call with a protocol error (no such method, invalid params): it did not run the tool,
    and the same request would be refused again — no retry."""

    reason = "tool_refused"
    retryable = False


class CredentialMissing(ToolError):
    reason = "credential_missing"
    retryable = False


class CredentialNotGranted(CredentialMissing):
    """The server's credential is not granted to its tenant for its host (agents_app.credentials): nothing is sent."""

    reason = "credential_not_granted"


class ToolResultRejected(ToolError):
    """A person rejected a flagged tool result (tools.screening: hold): the step fails, it never saw the result."""

    reason = "tool_result_rejected"
    retryable = False


def denied_event(name: str, *, rule: str) -> tuple[str, dict]:
    return "tool.denied", {"tool": name, "rule": rule}
