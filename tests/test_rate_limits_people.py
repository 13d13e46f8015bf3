"""Rate limits of people and tenants (issue 37, finding 10): the admin's forms counted as REST requests are (8 forks
through the admin after a 5/minute limit all went through), one bucket per person across their session and their
tokens (they were separate buckets), and a tenant-wide limit beside the per-person one."""

import importlib
from types import SimpleNamespace

import pytest
from django.apps import apps as global_apps
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.db import connection
from django.test import Client
from rest_framework.test import APIClient

from config.base.rate_limits import rate_parse
from steering_app.models import SteeringCommand
from tasks_app.models import Task
from tasks_app.services import api_token_create, task_create, tenant_get_or_create, tenant_membership_ensure
from tests.engine_support import drive

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("external_root")]

BODY = {"workflow": "demo_steps", "input": {"steps": 1}}


@pytest.fixture(autouse=True)
def roles(db):
    importlib.import_module("steering_app.migrations.0007_audit_trail_roles").create_roles(
        global_apps, SimpleNamespace(connection=connection))


@pytest.fixture
def limits(settings):
    """limits(create=…, steer=…, tenant_create=…, tenant_steer=…): the deployment's rates for this test."""
    def set_(**rates):
        settings.RATE_LIMITS = {**settings.RATE_LIMITS, **{k: rate_parse(v) for k, v in rates.items()
                                                             if not k.startswith("tenant_")}}
        settings.RATE_LIMITS_TENANT = {**settings.RATE_LIMITS_TENANT, **{
            k.removeprefix("tenant_"): rate_parse(v) for k, v in rates.items() if k.startswith("tenant_")}}
    return set_


def person(tenant, name: str, role: str = "operator"):
    """An operator of ``tenant``: (their admin session, their REST session, their token's REST client, user)."""
    user = get_user_model().objects.create_user(name, is_staff=True)
    user.groups.add(Group.objects.get(name=role))
    tenant_membership_ensure(user=user, tenant=tenant)
    admin_session, rest_session, token = Client(), APIClient(), APIClient()
    admin_session.force_login(user)
    rest_session.force_login(user)
    token.credentials(HTTP_AUTHORIZATION=f"Bearer {api_token_create(tenant=tenant, user=user, name=name)[1]}")
    return SimpleNamespace(admin=admin_session, session=rest_session, token=token, user=user)


def finished(tenant) -> Task:
    task = task_create(tenant=tenant, owner=None, workflow="demo_steps", input={"steps": 3, "effect": False}).task
    drive(task.id)
    return task


def test_it_refuses_the_sixth_of_eight_admin_forks_over_a_limit_of_five_a_minute(tenant, limits):
    limits(create="5/minute")
    alice = person(tenant, "alice")
    original = finished(tenant)

    answers = [alice.admin.post(f"/admin/tasks_app/task/{original.id}/fork/", {"from_step": "1"}) for _ in range(8)]

    assert [a.status_code for a in answers] == [302] * 5 + [429] * 3, [a.status_code for a in answers]
    assert Task.objects.filter(forked_from=original).count() == 5  # nothing made by a refused form
    refused = answers[5]
    assert 1 <= int(refused["Retry-After"]) <= 60
    page = refused.content.decode()
    assert "Too many requests" in page and "5 times per minute" in page and "your account" in page


def test_it_counts_the_call_a_tool_and_steering_forms_in_the_persons_buckets(tenant, limits):
    from agents_app.models import ToolServer

    limits(create="1/minute", steer="2/minute")
    admin = person(tenant, "tia", role="tenant-admin")
    server = ToolServer.objects.create(tenant=tenant, name="tools", url="https://tools.invalid/mcp",
                                       tools=[{"name": "echo", "inputSchema": {"type": "object"}}])
    call = {"tool": "echo", "arguments": "{\"text\": \"hi\"}"}
    calls = [admin.admin.post(f"/admin/agents_app/toolserver/{server.pk}/call/", call) for _ in range(2)]
    assert [c.status_code for c in calls] == [302, 429], [c.content[:500] for c in calls]
    assert Task.objects.filter(workflow_name="mcp_tool").count() == 1

    oscar = person(tenant, "oscar")
    tasks = [task_create(tenant=tenant, owner=None, workflow="demo_steps", input={"steps": 3}).task for _ in range(3)]
    steer = {"type": "set_priority", "priority": 7, "reason": "why", "expected_version": 1}
    steered = [oscar.admin.post(f"/admin/tasks_app/task/{tasks[0].id}/steer/", steer).status_code,
               oscar.token.post(f"/runtime/tasks/{tasks[1].id}/steering", {
                   "type": "set_priority", "payload": {"priority": 7}, "expectedVersion": 1}, format="json").status_code,
               oscar.admin.post(f"/admin/tasks_app/task/{tasks[2].id}/steer/", steer).status_code]
    bulk = oscar.admin.post("/admin/tasks_app/task/", {"action": "pause_tasks", "reason": "maintenance",
                                                       "_selected_action": [str(t.id) for t in tasks]})

    assert steered[:2] == [302, 200] or steered[:2] == [302, 202], steered
    assert steered[2] == 429 and bulk.status_code == 429
    assert SteeringCommand.objects.count() == 2  # nothing sent by a refused form or bulk action


def test_it_keeps_one_bucket_per_person_across_their_session_and_their_token(tenant, limits):
    from mcp_bridge.auth import principal_for_token
    from tasks_app.models import ApiToken

    limits(create="4/minute")
    bob, carol = person(tenant, "bob"), person(tenant, "carol")

    alternating = [client.post("/runtime/tasks", BODY, format="json")
                   for client in (bob.token, bob.session, bob.token, bob.session, bob.token, bob.session)]

    assert [a.status_code for a in alternating] == [201, 201, 201, 201, 429, 429]
    assert "this token's account" in alternating[4].json()["detail"]
    assert "your account" in alternating[5].json()["detail"]
    assert alternating[4].json()["bucket"] == "person"
    # Another person of the tenant has their own bucket.
    assert carol.token.post("/runtime/tasks", BODY, format="json").status_code == 201
    # MCP counts a token in its person's bucket too (mcp_bridge.asgi asks config.base.rate_limits with this identity).
    raw = api_token_create(tenant=tenant, user=bob.user, name="mcp")[1]
    assert principal_for_token(raw, resource="http://testserver/mcp").rate_identity == f"user-{bob.user.pk}"
    assert ApiToken.objects.filter(user=bob.user).count() == 2


def test_it_limits_a_tenant_as_a_whole_across_its_people(tenant, other_tenant, limits):
    limits(create="100/minute", tenant_create="3/minute")
    dana, erin = person(tenant, "dana"), person(tenant, "erin")
    frank = person(other_tenant, "frank")

    statuses = [dana.token.post("/runtime/tasks", BODY, format="json").status_code,
                erin.session.post("/runtime/tasks", BODY, format="json").status_code,
                dana.session.post("/runtime/tasks", BODY, format="json").status_code]
    refused = erin.token.post("/runtime/tasks", BODY, format="json")

    assert statuses == [201, 201, 201] and refused.status_code == 429
    problem = refused.json()
    assert problem["bucket"] == "tenant" and problem["limit"] == "3/minute" and "your tenant" in problem["detail"]
    assert Task.objects.filter(tenant=tenant).count() == 3
    # Another tenant is not held by it.
    assert frank.token.post("/runtime/tasks", BODY, format="json").status_code == 201
    # A request the tenant's bucket refused was not counted in the person's (both or neither): at 2 a minute, erin
    # (one counted) has room for one more.
    limits(create="2/minute", tenant_create="off")
    assert [erin.token.post("/runtime/tasks", BODY, format="json").status_code for _ in range(2)] == [201, 429]


def test_it_says_on_the_tenant_page_that_its_rates_are_per_person(tenant, admin_client):
    page = admin_client.get(f"/admin/tasks_app/tenant/{tenant.id}/change/").content.decode()
    assert "Task creations per person (their session and tokens together)" in page
    assert "RATE_LIMIT_TENANT_CREATE" in page
