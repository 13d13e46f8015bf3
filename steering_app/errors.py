"""The problems steering answers with (problem-details bodies; config.base.problems): raised by validation,
submission and the interfaces alike, so they live below all of them."""

from __future__ import annotations

from config.base.problems import Problem


class VersionConflict(Problem):
    """409: expectedVersion is not the task's state_version (the API adds the current snapshot)."""

    status_code = 409
    slug = "version-conflict"


class CommandRefused(Problem):
    """422: the command makes no sense in the task's status, or its payload is wrong (the detail says why)."""

    status_code = 422
    slug = "command-refused"


class KillNotAllowed(Problem):
    status_code = 403
    slug = "permission-denied"
