"""Audit actors named the same everywhere (issue 37, finding 11): a steering command sent with an API token, by a
person signed in to the admin, and with an OAuth access token is named `token:<prefix>`, `user:<name>` and
`oauth:<client>` on the task page, the audit pages and their CSV exports — where the audit pages and the CSV showed
`token=[redacted]` (the redaction's `token: <value>` pattern matched the name). The actor filter narrows each page to
one of them. Real secrets are still masked."""

import re
import secrets
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone
from oauth2_provider.models import AccessToken, Application
from rest_framework.test import APIClient

from mcp_bridge.oauth.models import OAuthTenantBinding
from steering_app.models import SteeringCommand
from tasks_app.audit.actors import actor_name, actor_shown
from tasks_app.models import ApiToken, Task, TenantMembership
from tasks_app.services import task_create

pytestmark = pytest.mark.django_db

REDACTED_NAME = "token=[redacted]"


def queued(tenant) -> Task:
    return task_create(tenant=tenant, owner=None, workflow="demo_steps", input={"steps": 3}).task


def oauth_client_for(user, tenant) -> tuple[APIClient, Application]:
    """A REST client holding an OAuth access token of ``user`` in ``tenant`` (as the token endpoint issues one)."""
    application = Application.objects.create(name="Desk client", client_type="public",
                                             redirect_uris="http://127.0.0.1:8976/callback",
                                             authorization_grant_type="authorization-code")
    raw = "aro_" + secrets.token_urlsafe(24)
    token = AccessToken(user=user, application=application, scope="tasks:read tasks:write steer",
                        resource=["http://testserver/runtime"], expires=timezone.now() + timedelta(hours=1))
    token._raw_token, token.token = raw, ""
    token.save()
    OAuthTenantBinding.objects.create(access_token=token, tenant=tenant)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    return client, application


def csv_of(client, url: str) -> str:
    response = client.get(url)
    assert response.status_code == 200, (url, response.status_code)
    return b"".join(response.streaming_content).decode()


def page_of(client, url: str) -> str:
    response = client.get(url)
    assert response.status_code == 200, (url, response.status_code)
    return response.content.decode()


def test_it_names_each_actor_the_same_on_the_task_page_the_audit_pages_and_the_csv(tenant, api, admin_client):
    by_token, by_user, by_oauth = queued(tenant), queued(tenant), queued(tenant)
    bob = get_user_model().objects.create_user("bob")
    TenantMembership.objects.create(user=bob, tenant=tenant)
    oauth, application = oauth_client_for(bob, tenant)

    # (a queued task's priority is changed at once: the command is applied, with its steering.applied event)
    command = {"type": "set_priority", "payload": {"priority": 7}, "expectedVersion": 1}
    sent = [api.post(f"/runtime/tasks/{by_token.id}/steering", {**command, "reason": "by token"}, format="json"),
            oauth.post(f"/runtime/tasks/{by_oauth.id}/steering", {**command, "reason": "by oauth"}, format="json"),
            admin_client.post(f"/admin/tasks_app/task/{by_user.id}/steer/", {
                "type": "set_priority", "priority": 7, "reason": "by user", "expected_version": 1})]
    assert [response.status_code for response in sent] in ([200, 200, 302], [202, 202, 302]), \
        [r.content[:300] for r in sent]

    token = ApiToken.objects.get(user__username="alice")
    actors = {by_token.id: f"token:{token.prefix}", by_user.id: "user:admin",
              by_oauth.id: f"oauth:{application.client_id[:12]}"}
    # What was stored: one name per actor, from one function.
    assert {c.task_id: c.requested_by for c in SteeringCommand.objects.all()} == actors
    assert actors[by_token.id] == actor_name(token=token) and actors[by_user.id] == actor_name(
        user=get_user_model().objects.get(username="admin"))

    window = f"from={(timezone.now() - timedelta(hours=1)).strftime('%Y-%m-%dT%H:%M:%S')}"
    pages = {"commands": page_of(admin_client, f"/admin/audit/commands/?{window}"),
             "events": page_of(admin_client, f"/admin/audit/events/?{window}"),
             "commands.csv": csv_of(admin_client, f"/admin/audit/commands.csv?{window}"),
             "events.csv": csv_of(admin_client, f"/admin/audit/events.csv?{window}")}
    for task_id, actor in actors.items():
        task_page = page_of(admin_client, f"/admin/tasks_app/task/{task_id}/change/")
        assert f"set_priority by {actor} applied" in task_page, actor  # (the event tail's line)
        assert re.search(rf"<td>{re.escape(actor)}</td>", task_page), actor  # (the steering history)
        for name, text in pages.items():
            assert actor in text, (name, actor)
    for name, text in pages.items():
        assert REDACTED_NAME not in text, name

    # The actor filter narrows each page to one actor's decisions; each actor cell links to it.
    for task_id, actor in actors.items():
        for page in ("commands", "events"):
            narrowed = page_of(admin_client, f"/admin/audit/{page}/?{window}&actor={actor}")
            assert str(task_id) in narrowed, (page, actor)
            assert not [other for other in actors if other != task_id and str(other) in narrowed], (page, actor)
        narrowed_csv = csv_of(admin_client, f"/admin/audit/commands.csv?{window}&actor={actor}")
        assert str(task_id) in narrowed_csv and len(narrowed_csv.strip().splitlines()) == 2, actor
    assert "actor=token%3A" in pages["commands"]  # (the link of the token's cell)


def test_it_names_the_person_the_same_on_the_admin_actions_page_and_its_csv(tenant, admin_client):
    token_of = get_user_model().objects.create_user("carol")
    TenantMembership.objects.create(user=token_of, tenant=tenant)
    changed = admin_client.post(f"/admin/tasks_app/tenant/{tenant.id}/change/", {
        "slug": tenant.slug, "name": "Acme Renamed", "workflows": "", "max_running_tasks": "",
        "max_stored_tasks": "", "create_rate_limit": "", "steer_rate_limit": ""})
    assert changed.status_code == 302, changed.content[:2000]
    window = f"from={(timezone.now() - timedelta(hours=1)).strftime('%Y-%m-%dT%H:%M:%S')}"

    page = page_of(admin_client, f"/admin/audit/admin-actions/?{window}&actor=user:admin")
    export = csv_of(admin_client, f"/admin/audit/admin-actions.csv?{window}&actor=user:admin")
    nobody = page_of(admin_client, f"/admin/audit/admin-actions/?{window}&actor=user:carol")

    assert "user:admin changed tenant" in page and ",user:admin,change," in export
    assert "Acme Renamed" not in nobody and "user:admin" not in nobody.split('id="result_list"')[-1]


def test_it_still_masks_a_secret_where_an_actor_name_would_be():
    full_token = "art_" + "Q" * 40
    assert actor_shown("token:art_1a2b3c4d") == "token:art_1a2b3c4d"
    assert actor_shown("oauth:desk.example") == "oauth:desk.example"
    assert actor_shown(f"token:{full_token}") == "token:[redacted-token]"  # a whole token is not a prefix
    assert actor_shown("user:x password=hunter2") == "user:x password=[redacted]"  # (not a name: redacted whole)
    assert actor_shown("Bearer abcdefghijklmnop") == "Bearer [redacted]"
    with pytest.raises(ValueError):
        actor_name()
