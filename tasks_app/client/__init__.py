"""The runtime's Python client: what the `runtime` CLI is built on, and what a user installs on a laptop.

    from tasks_app.client import RuntimeClient

    with RuntimeClient() as client:            # RUNTIME_URL / RUNTIME_TOKEN, or ~/.config/agent-runtime/config.toml
        task = client.create_and_wait("demo_steps", {"steps": 3})
        print(task.status, task.result)

It imports nothing of the server (no Django): only httpx2 and the standard library."""

from tasks_app.client._async import AsyncRuntimeClient
from tasks_app.client.errors import (
    ApiError,
    AuthenticationError,
    ConfigurationError,
    Conflict,
    ConnectionFailed,
    InvalidRequest,
    NoOpenWait,
    NotFound,
    RuntimeClientError,
    ServerError,
    VersionConflict,
    WaitTimeout,
)
from tasks_app.client.models import (
    Artifact,
    Event,
    SteeringResult,
    Task,
    TaskPage,
    TaskSummary,
    ToolServer,
    Wait,
)
from tasks_app.client.sync import RuntimeClient

__all__ = [
    "ApiError", "Artifact", "AsyncRuntimeClient", "AuthenticationError", "ConfigurationError", "Conflict",
    "ConnectionFailed", "Event", "InvalidRequest", "NoOpenWait", "NotFound", "RuntimeClient", "RuntimeClientError",
    "ServerError", "SteeringResult", "Task", "TaskPage", "TaskSummary", "ToolServer", "VersionConflict", "Wait",
    "WaitTimeout",
]
