"""What can go wrong talking to the runtime, one class per thing a caller (or a script, through the CLI's exit code)
handles differently. An answer with problem details (RFC 9457) keeps them: `title`, `detail`, `errors`, `type`."""

from __future__ import annotations

from typing import Any

# The CLI's exit codes (also in `runtime --help` and the README): what a script can branch on.
EXIT_OK = 0
EXIT_TASK_UNSUCCESSFUL = 1  # the task ended failed or cancelled (create --wait, watch, fork --wait)
EXIT_USAGE = 2  # a bad command line, or a request the server refused as invalid (400, 413, 422)
EXIT_NOT_FOUND = 3
EXIT_CONFLICT = 4  # 409 (a stale expectedVersion, a finished task), or no open wait to answer
EXIT_AUTH = 5  # no token, or the server refused it (401, 403)
EXIT_UNAVAILABLE = 6  # the server could not be reached, or answered 5xx
EXIT_TIMEOUT = 7  # --timeout passed before the task ended


class RuntimeClientError(Exception):
    """Base of every error the client raises."""

    exit_code = EXIT_UNAVAILABLE


class ConfigurationError(RuntimeClientError):
    """No token (or no usable configuration) to talk to the server with."""

    exit_code = EXIT_AUTH


class ConnectionFailed(RuntimeClientError):
    """The server could not be reached (refused, reset, timed out), also after reconnecting for a while."""

    exit_code = EXIT_UNAVAILABLE


class WaitTimeout(RuntimeClientError):
    """The task did not end within the time the caller gave."""

    exit_code = EXIT_TIMEOUT


class NoOpenWait(RuntimeClientError):
    """answer / approve / reject without a wait id, and the task waits for nothing."""

    exit_code = EXIT_CONFLICT


class ApiError(RuntimeClientError):
    """The server answered an error: its status and problem details."""

    def __init__(self, status: int, problem: dict[str, Any] | None, *, url: str = ""):
        self.status = status
        self.problem = problem if isinstance(problem, dict) else {}
        self.url = url
        self.title = str(self.problem.get("title") or f"HTTP {status}")
        self.detail = str(self.problem.get("detail") or "")
        self.errors: list[dict[str, Any]] = [e for e in self.problem.get("errors") or [] if isinstance(e, dict)]
        self.type = str(self.problem.get("type") or "")
        super().__init__(self.describe())

    def describe(self) -> str:
        """The problem as a person reads it: title, detail, each field's message, where the type is documented."""
        lines = [f"{self.title} ({self.status})" + (f": {self.detail}" if self.detail else "")]
        lines += [f"  {error.get('field') or '(request)'}: {error.get('message')}" for error in self.errors]
        if self.type.startswith("/"):
            lines.append(f"  see {self.type}")
        return "\n".join(lines)


class InvalidRequest(ApiError):
    exit_code = EXIT_USAGE


class AuthenticationError(ApiError):
    exit_code = EXIT_AUTH


class NotFound(ApiError):
    exit_code = EXIT_NOT_FOUND


class Conflict(ApiError):
    """A 409 other than a stale version: a reused Idempotency-Key, a command a finished task cannot take."""

    exit_code = EXIT_CONFLICT


class VersionConflict(Conflict):
    """The task changed since the expectedVersion sent: `snapshot` is the task as it is now (nothing was queued)."""

    def __init__(self, status, problem, *, url: str = ""):
        super().__init__(status, problem, url=url)
        from tasks_app.client.models import Task

        raw = self.problem.get("snapshot")
        self.snapshot: Task | None = Task.from_api(raw) if isinstance(raw, dict) else None


class ServerError(ApiError):
    exit_code = EXIT_UNAVAILABLE


def error_for(status: int, problem: Any, *, url: str = "") -> ApiError:
    """The ApiError subclass for an error answer."""
    problem = problem if isinstance(problem, dict) else {}
    if status == 409:
        slug = str(problem.get("type") or "").rsplit("/", 1)[-1]
        return (VersionConflict if slug == "version-conflict" else Conflict)(status, problem, url=url)
    kind = {400: InvalidRequest, 413: InvalidRequest, 415: InvalidRequest, 422: InvalidRequest,
            401: AuthenticationError, 403: AuthenticationError, 404: NotFound}.get(status)
    if kind is None:
        kind = ServerError if status >= 500 else InvalidRequest
    return kind(status, problem, url=url)
