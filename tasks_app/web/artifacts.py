"""Serving a task's committed artifacts: one way for the API and the admin, so both send the same safe headers."""

from __future__ import annotations

import logging
import mimetypes

from django.core.files.storage import default_storage
from django.http import FileResponse

from tasks_app import selectors

logger = logging.getLogger(__name__)


class ArtifactNotFound(Exception):
    """No committed artifact of that name, or its file is gone from storage (the message says which)."""


def artifact_content_type(name: str) -> str:
    return mimetypes.guess_type(name)[0] or "application/octet-stream"


def artifact_response(*, task_id, name: str) -> FileResponse:
    """The artifact's file, streamed, with its content type and length, as a sandboxed attachment."""
    artifact = selectors.task_artifacts(task_id=task_id).get(name)
    if artifact is None:
        raise ArtifactNotFound(f"Task {task_id} has no artifact named {name!r}; GET /runtime/tasks/{task_id}/artifacts "
                               f"lists them.")
    try:
        file = default_storage.open(artifact["ref"], "rb")
    except FileNotFoundError:
        logger.error("artifact %s of task %s is listed but its file is missing", name, task_id)
        raise ArtifactNotFound(f"The file of artifact {name!r} is missing from storage; the operators were told.") \
            from None
    response = FileResponse(file, as_attachment=True, filename=name, content_type=artifact_content_type(name))
    # What a workflow wrote is data, never a page of this origin (it could hold HTML or SVG with scripts).
    response["Content-Security-Policy"] = "sandbox; default-src 'none'"
    return response
