"""Resources: the fixed and templated ones that resource workflows serve (mcp_kind "resource", run in the
foreground), and every task's committed artifacts, ``runtime://tasks/{taskId}/artifacts/{name}``, for whoever may
read the task. Committed artifacts never change (ARCHITECTURE §4): a client may cache a read."""

from __future__ import annotations

import base64
import logging
import re

from django.core.files.storage import default_storage
from mcp.shared.exceptions import MCPError

from mcp_bridge import bridge, mapping
from mcp_bridge.auth import Principal
from tasks_app import selectors
from tasks_app.registry import Workflow
from tasks_app.web.artifacts import artifact_content_type

logger = logging.getLogger(__name__)


def resource_workflow_for(principal: Principal, uri: str) -> tuple[type[Workflow], dict] | None:
    """The resource workflow serving ``uri`` (its own uri, or a uriTemplate that matches), with the template's
    parameters."""
    for workflow in bridge.visible_workflows(principal, "resource"):
        resource = workflow.mcp_resource
        if resource.get("uri") == uri:
            return workflow, {}
        template = resource.get("uriTemplate")
        if template:
            match = _template_pattern(template).fullmatch(uri)
            if match:
                return workflow, match.groupdict()
    return None


def _template_pattern(template: str) -> re.Pattern:
    parts = re.split(r"\{([A-Za-z_][A-Za-z0-9_]*)\}", template)
    return re.compile("".join(re.escape(part) if i % 2 == 0 else f"(?P<{part}>[^/]+)"
                              for i, part in enumerate(parts)))


# -- a task's artifacts as resources (runtime://tasks/{taskId}/artifacts/{name}) ------------------------------------
ARTIFACT_URI = re.compile(r"^runtime://tasks/(?P<task>[0-9a-fA-F-]{36})/artifacts/(?P<name>[^/]+)$")
ARTIFACT_TEMPLATE = "runtime://tasks/{taskId}/artifacts/{name}"
RESOURCES_PAGE = 50


def artifact_resources(principal: Principal, cursor: str | None) -> tuple[list[dict], str | None]:
    """The artifacts of the caller's tenant's tasks, a page of tasks at a time, newest first."""
    tasks, next_cursor = bridge.tenant_tasks_page(principal, cursor, size=RESOURCES_PAGE,
                                           only=("id", "created_at", "workflow_name"))
    resources = []
    for task in tasks:
        for name, artifact in selectors.task_artifacts(task_id=task.id).items():
            resources.append({"uri": mapping.resource_uri(task.id, name), "name": name,
                              "description": f"Artifact {name!r} of {task.workflow_name} task {task.id}",
                              "mimeType": artifact_content_type(name), "size": artifact["bytes"]})
    return resources, next_cursor


def artifact_read(principal: Principal, uri: str) -> dict | None:
    """A committed artifact's contents (text, or base64 blob), or None when ``uri`` names no artifact the caller
    may read. Committed artifacts never change (ARCHITECTURE §4), so a client may cache a read."""
    match = ARTIFACT_URI.match(uri)
    if match is None:
        return None
    try:
        task = bridge.task_read(principal, match["task"])
    except MCPError:
        return None
    artifact = selectors.task_artifacts(task_id=task.id).get(match["name"])
    if artifact is None:
        return None
    try:
        with default_storage.open(artifact["ref"], "rb") as file:
            data = file.read()
    except FileNotFoundError:
        logger.error("artifact %s of task %s is listed but its file is missing", match["name"], task.id)
        return None
    mime = artifact_content_type(match["name"])
    if mime.startswith("text/") or mime in ("application/json", "application/xml"):
        try:
            return {"uri": uri, "mimeType": mime, "text": data.decode("utf-8")}
        except UnicodeDecodeError:
            pass
    return {"uri": uri, "mimeType": mime, "blob": base64.b64encode(data).decode("ascii")}
