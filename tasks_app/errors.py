"""Errors a client can fix, raised by services and rendered as problem details by the API layer."""

from rest_framework import status

from config.base.problems import Problem


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


class TaskLimitReached(Problem):
    """The tenant stores as many tasks as its max_stored_tasks allows. 409, not 429: the request is valid and the
    tenant's state refuses it; waiting alone does not make room (tasks are purged only days after they finish), and
    clients retry a 429 on their own after Retry-After — in a loop that would never succeed."""

    status_code = status.HTTP_409_CONFLICT
    slug = "task-limit-reached"


class RateLimited(Problem):
    """Over a rate limit (config.base.rate_limits): 429 with Retry-After (``wait``, whole seconds), nothing done."""

    status_code = status.HTTP_429_TOO_MANY_REQUESTS
    slug = "throttled"

    def __init__(self, detail: str, *, wait: int, **extra):
        super().__init__(detail, **extra)
        self.wait = wait  # the problem handler's Retry-After
