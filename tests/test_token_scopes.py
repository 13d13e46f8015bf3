"""Bearer tokens carry scopes (tasks:read, tasks:write, steer): each endpoint checks the one it needs; a session is
narrowed only by its permissions. A token made before scopes existed has all three."""

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from rest_framework.test import APIClient

from tasks_app.models import ApiToken, TenantMembership
from tasks_app.services import api_token_create, task_create, tenant_get_or_create
from tests.asgi_support import asgi_request
from tests.web_support import WebProcess, call

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("external_root")]


@pytest.fixture
def tenant_user(transactional_db):
    tenant = tenant_get_or_create(slug="acme", name="Acme")
    user = get_user_model().objects.create_user("scoped")
    TenantMembership.objects.create(user=user, tenant=tenant)
    return tenant, user


def client_with(tenant, user, *scopes):
    raw = api_token_create(tenant=tenant, user=user, name="scoped", scopes=scopes)[1]
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    return client, raw


def test_it_lets_a_read_only_token_read_and_refuses_it_every_write(tenant_user):
    tenant, user = tenant_user
    task = task_create(tenant=tenant, owner=None, workflow="demo_steps", input={"steps": 1}).task
    reader, raw = client_with(tenant, user, "tasks:read")

    assert reader.get(f"/runtime/tasks/{task.id}").status_code == 200
    assert reader.get("/runtime/tasks").status_code == 200
    created = reader.post("/runtime/tasks", {"workflow": "demo_steps", "input": {"steps": 1}}, format="json")
    steered = reader.post(f"/runtime/tasks/{task.id}/steering", {"type": "pause", "expectedVersion": 1},
                          format="json")
    cancelled = reader.post(f"/runtime/tasks/{task.id}/cancel", {}, format="json")
    for refused, scope in ((created, "tasks:write"), (steered, "steer"), (cancelled, "tasks:write")):
        assert refused.status_code == 403 and f"`{scope}` scope" in refused.json()["detail"]


def test_it_lets_a_token_without_steer_create_and_cancel_but_not_steer(tenant_user):
    tenant, user = tenant_user
    writer, _ = client_with(tenant, user, "tasks:read", "tasks:write")

    created = writer.post("/runtime/tasks", {"workflow": "demo_steps", "input": {"steps": 1}}, format="json")
    task_id = created.json()["taskId"]
    steered = writer.post(f"/runtime/tasks/{task_id}/steering", {"type": "pause", "expectedVersion": 1},
                          format="json")
    cancelled = writer.post(f"/runtime/tasks/{task_id}/cancel", {"reason": "no"}, format="json")

    assert created.status_code == 201 and steered.status_code == 403 and cancelled.status_code == 202


def test_it_checks_tasks_read_on_the_snapshot_edge_and_the_stream_of_a_real_web_process(tenant_user, tmp_path):
    tenant, user = tenant_user
    task = task_create(tenant=tenant, owner=None, workflow="demo_steps", input={"steps": 1}).task
    _, reader = client_with(tenant, user, "tasks:read")
    _, writer = client_with(tenant, user, "tasks:write")
    server = WebProcess(tmp_path)
    try:
        read = call(server.url(f"/runtime/tasks/{task.id}"), reader)  # answered by the edge (no query string)
        refused = call(server.url(f"/runtime/tasks/{task.id}"), writer)  # the edge finds no row: Django says why
        stream = asgi_request("GET", f"/runtime/tasks/{task.id}/events",
                              headers={"Authorization": f"Bearer {writer}"})
    finally:
        server.stop()

    assert read[0] == 200 and read[2]["taskId"] == str(task.id)
    assert refused[0] == 403 and "`tasks:read` scope" in refused[2]["detail"]
    assert stream.status == 403 and "tasks:read" in stream.json()["detail"]


def test_it_gives_new_tokens_every_scope_unless_told_and_refuses_unknown_ones(tenant_user, capsys):
    tenant, user = tenant_user

    call_command("create_api_token", "--tenant", "acme", "--user", "scoped")
    call_command("create_api_token", "--tenant", "acme", "--user", "scoped", "--scopes", "tasks:read")

    assert [t.scopes for t in ApiToken.objects.order_by("id")] == [["tasks:read", "tasks:write", "steer"],
                                                                   ["tasks:read"]]
    with pytest.raises(ValueError):
        api_token_create(tenant=tenant, user=user, scopes=["admin"])


def test_it_lets_a_signed_in_person_steer_through_the_api_only_with_the_steering_permission(tenant_user):
    from django.contrib.auth.models import Permission

    tenant, user = tenant_user
    task = task_create(tenant=tenant, owner=None, workflow="demo_steps", input={"steps": 1}).task
    client = APIClient()
    client.force_login(user)

    read = client.get(f"/runtime/tasks/{task.id}")
    refused = client.post(f"/runtime/tasks/{task.id}/steering", {"type": "set_priority", "expectedVersion": 1,
                                                                  "payload": {"priority": 7}}, format="json")
    refused_cancel = client.post(f"/runtime/tasks/{task.id}/cancel", {}, format="json")
    user.user_permissions.add(Permission.objects.get(codename="add_steeringcommand"))
    client.force_login(get_user_model().objects.get(id=user.id))  # (permissions are cached per user object)
    accepted = client.post(f"/runtime/tasks/{task.id}/steering", {"type": "set_priority", "expectedVersion": 1,
                                                                   "payload": {"priority": 7}}, format="json")

    assert read.status_code == 200
    assert refused.status_code == refused_cancel.status_code == 403
    assert "may read tasks but not steer" in refused.json()["detail"]
    assert accepted.status_code == 202
