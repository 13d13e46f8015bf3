"""A task through the REST API, as a test that plays the client does it, and a task's events.

Each function takes a task as its id (the API's ``taskId``, a UUID or its text) or as a ``Task`` row."""

from __future__ import annotations

from typing import Any

from django.db import connection

from tasks_app.models import Task, TaskEvent


def task_id_of(task) -> Any:
    """The id of a task given as a Task row or as its id (a UUID has no ``id`` attribute, a Task does)."""
    return getattr(task, "id", task)


def create(api, workflow: str = "demo_steps", **body) -> dict:
    """POST /runtime/tasks with ``{"workflow": workflow, **body}``; asserts the 201 and returns its JSON."""
    response = api.post("/runtime/tasks", {"workflow": workflow, **body}, format="json")
    assert response.status_code == 201, response.json()
    return response.json()


def create_row(api, workflow: str = "demo_steps", **body) -> Task:
    """``create``, then the task's row."""
    return Task.objects.get(id=create(api, workflow, **body)["taskId"])


def snapshot(api, task) -> dict:
    return api.get(f"/runtime/tasks/{task_id_of(task)}").json()


def steer(api, task, type_: str, *, version: int | None = None, **body):
    """POST a steering command of ``type_`` (``body``: payload, reason…) expecting ``version`` — by default the
    version the snapshot shows now; returns the response."""
    if version is None:
        version = snapshot(api, task)["stateVersion"]
    return api.post(f"/runtime/tasks/{task_id_of(task)}/steering",
                    {"type": type_, "expectedVersion": version, **body}, format="json")


def events_of(task, type_: str) -> list[dict]:
    """The data of the task's events of type ``type_``, in seq order."""
    return list(TaskEvent.objects.filter(task_id=task_id_of(task), type=type_).order_by("seq")
                .values_list("data", flat=True))


def first_working_at(task):
    """When a worker first took the task: the database's time of its first `working` status event (None: not yet)."""
    for data, at in TaskEvent.objects.filter(task_id=task_id_of(task), type="status").order_by("seq").values_list(
            "data", "at"):
        if data.get("status") == "working":
            return at
    return None


def leased_count(tenant) -> int:
    """How many of the tenant's tasks a worker holds a live lease on now (on the database's clock)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM tasks_app_task WHERE tenant_id = %s AND lease_expires_at > now()",
                       [tenant.id])
        return cursor.fetchone()[0]
