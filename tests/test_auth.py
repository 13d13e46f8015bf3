import hashlib
import io

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from rest_framework.test import APIClient

from tasks_app.models import ApiToken
from tasks_app.services import api_token_revoke
from tests.helpers import create_task


def test_it_prints_a_token_that_is_stored_only_as_a_hash(db):
    out = io.StringIO()
    call_command("create_api_token", "--tenant", "acme", "--user", "bob", "--create", stdout=out)
    raw = out.getvalue().strip()

    token = ApiToken.objects.get(user__username="bob")
    assert raw.startswith("art_") and len(raw) > 40
    assert token.token_hash == hashlib.sha256(raw.encode()).hexdigest()
    assert not ApiToken.objects.filter(token_hash=raw).exists() and raw not in token.prefix + token.name
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert create_task(client).status_code == 201


def test_it_refuses_unknown_tenants_and_users_without_create(db):
    with pytest.raises(CommandError, match="no tenant"):
        call_command("create_api_token", "--tenant", "nope", "--user", "bob")


def test_it_refuses_a_user_of_another_tenant(api, other_tenant):
    with pytest.raises(CommandError, match="belongs to tenant 'acme'"):
        call_command("create_api_token", "--tenant", other_tenant.slug, "--user", "alice", stdout=io.StringIO())


def test_it_refuses_a_revoked_token(api):
    api_token_revoke(token=ApiToken.objects.get(user=api.user))

    assert create_task(api).status_code == 401


def test_it_accepts_a_session_of_a_tenant_member(api):
    client = APIClient()
    client.force_login(api.user)

    assert client.get("/runtime/tasks").status_code == 200


def test_it_forbids_a_signed_in_user_without_a_tenant(db):
    client = APIClient()
    client.force_login(get_user_model().objects.create_user("loner"))

    response = client.get("/runtime/tasks")

    assert response.status_code == 403
    assert response.json()["type"] == "/runtime/problems/permission-denied"


def test_it_requires_authentication_for_the_api_schema_and_docs(api):
    assert APIClient().get("/runtime/schema").status_code == 401
    assert api.get("/runtime/docs").status_code == 200
    schema = api.get("/runtime/schema?format=json").json()
    assert {"/runtime/tasks", "/runtime/tasks/{task_id}", "/runtime/tasks/{task_id}/cancel"} <= set(schema["paths"])


def test_it_generates_a_valid_openapi_schema_without_warnings(db):
    out = io.StringIO()

    call_command("spectacular", "--validate", "--fail-on-warn", stdout=out)

    assert "bearerToken" in out.getvalue() and "TaskCreateRequest" in out.getvalue()
