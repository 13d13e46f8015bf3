"""Errors a client can fix, raised by services and rendered as problem details by the API layer."""

from rest_framework import status

from config.problems import Problem


class UnknownWorkflowProblem(Problem):
    status_code = status.HTTP_422_UNPROCESSABLE_ENTITY
    slug = "unknown-workflow"


class InputSchemaViolation(Problem):
    status_code = status.HTTP_422_UNPROCESSABLE_ENTITY
    slug = "input-schema-violation"


class InvalidIdempotencyKey(Problem):
    status_code = status.HTTP_400_BAD_REQUEST
    slug = "invalid-idempotency-key"


class IdempotencyKeyReused(Problem):
    status_code = status.HTTP_409_CONFLICT
    slug = "idempotency-key-reused"


class InvalidTransition(Problem):
    """A guarded UPDATE matched no row: the task is not in a status this change may start from."""

    status_code = status.HTTP_409_CONFLICT
    slug = "invalid-transition"
