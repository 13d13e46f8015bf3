"""OAuth 2.1 for MCP clients (mcp_bridge.oauth): the official `mcp` SDK client's OAuth support drives the whole flow
against a real uvicorn process — discovery from the 401, registration, PKCE, sign-in and consent over HTTP, the
token, a task run with it, a refresh, a revocation — and focused in-process tests for what a stock client never
does (plain PKCE, a foreign resource, a person in no tenant, a Client ID Metadata Document on loopback)."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import html
import importlib
import json
import re
import threading
import time
import urllib.request
from dataclasses import replace
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace
from urllib.parse import parse_qs, urlencode, urlsplit

import httpx2
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from django.apps import apps as global_apps
from django.contrib.auth import get_user_model
from django.db import connection
from django.utils import timezone
from django_celery_beat.models import PeriodicTask
from jwt.algorithms import RSAAlgorithm
from mcp import Client
from mcp.client.auth import OAuthClientProvider
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.auth import AuthorizationCodeResult, OAuthClientInformationFull, OAuthClientMetadata, OAuthMetadata
from oauth2_provider.models import AccessToken, Application, Grant, RefreshToken
from rest_framework.test import APIClient

from mcp_bridge.auth import principal_for_token
from mcp_bridge.oauth.models import OAuthTenantBinding
from steering_app.models import SteeringCommand
from tasks_app.client import RuntimeClient
from tasks_app.client.errors import AuthenticationError
from tasks_app.models import TOKEN_SCOPES, AdminAction, Task, TenantMembership
from tasks_app.services import task_create, tenant_get_or_create
from tests.mcp_support import TasksExtension, poll_until
from tests.support.mcp import rpc
from tests.support.oauth import CALLBACK, issued_token

cleanup_migration = importlib.import_module("mcp_bridge.migrations.0002_oauth_cleanup_schedule")

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("external_root")]

PASSWORD = "correct horse battery staple"
VERIFIER = "dBjftJeZ4CVP-mJ92K9qgKqI7gWHxkb8z5mX8Tyr4Bh"  # 43 characters, the least PKCE allows
CHALLENGE = base64.urlsafe_b64encode(hashlib.sha256(VERIFIER.encode()).digest()).decode().rstrip("=")  # S256


@pytest.fixture
def alice(transactional_db):
    tenant = tenant_get_or_create(slug="acme", name="Acme")
    user = get_user_model().objects.create_user("alice", password=PASSWORD)
    TenantMembership.objects.create(user=user, tenant=tenant)
    return tenant, user


def hidden_fields(page: str) -> dict[str, str]:
    return {name: html.unescape(value or "") for name, value in
            re.findall(r'<input type="hidden" name="([^"]+)"(?: value="([^"]*)")?', page)}


class MemoryStorage:
    """The SDK's TokenStorage, in memory."""

    def __init__(self):
        self.tokens = None
        self.client_info = None

    async def get_tokens(self):
        return self.tokens

    async def set_tokens(self, tokens):
        self.tokens = tokens

    async def get_client_info(self):
        return self.client_info

    async def set_client_info(self, client_info: OAuthClientInformationFull):
        self.client_info = client_info


class Browser:
    """The person's browser: signs in on the login page the authorization endpoint sends it to, and consents."""

    def __init__(self, server, username: str):
        self.server, self.username = server, username
        self.http = httpx2.AsyncClient(timeout=30)
        self.redirected_to: str | None = None
        self.consent_page = ""

    async def authorize(self, url: str) -> None:  # the SDK's redirect_handler
        page = await self.http.get(url)
        assert page.status_code == 302 and page.headers["location"].startswith("/oauth/login/"), page.text[:500]
        login_url = self.server.url(page.headers["location"])
        login = await self.http.get(login_url)
        assert login.status_code == 200 and 'id="login-form"' in login.text  # the admin's login page
        form = {**hidden_fields(login.text), "username": self.username, "password": PASSWORD,
                "next": parse_qs(urlsplit(login_url).query)["next"][0]}
        signed_in = await self.http.post(login_url, data=form)
        assert signed_in.status_code == 302, signed_in.text[:2000]
        consent = await self.http.get(self.server.url(signed_in.headers["location"]))
        assert consent.status_code == 200, consent.text[:2000]
        self.consent_page = consent.text
        answer = await self.http.post(url, data={**hidden_fields(consent.text), "allow": "Authorize"})
        assert answer.status_code == 302, answer.text[:2000]
        self.redirected_to = answer.headers["location"]

    async def callback(self) -> AuthorizationCodeResult:  # the SDK's callback_handler
        query = parse_qs(urlsplit(self.redirected_to).query)
        return AuthorizationCodeResult(code=query["code"][0], state=query["state"][0], iss=query.get("iss", [None])[0])


def mcp_status(url: str, token: str) -> int:
    status, _headers, _body = rpc(url, "tools/list", token=token)
    return status


# -- the whole flow, with the official client ------------------------------------------------------------------
def test_it_signs_in_an_mcp_client_with_oauth_and_runs_a_task(web, workers, alice):
    tenant, user = alice
    server = web(SESSION_COOKIE_SECURE="false", CSRF_COOKIE_SECURE="false")
    workers("oauth")
    storage, browser = MemoryStorage(), Browser(server, "alice")
    provider = OAuthClientProvider(
        server_url=server.url("/mcp"), storage=storage, redirect_handler=browser.authorize,
        callback_handler=browser.callback,
        client_metadata=OAuthClientMetadata(client_name="Test agent", redirect_uris=[CALLBACK],
                                            grant_types=["authorization_code", "refresh_token"],
                                            token_endpoint_auth_method="none"))

    async def scenario():
        async with httpx2.AsyncClient(auth=provider, timeout=httpx2.Timeout(60, read=120)) as http:
            async with Client(streamable_http_client(server.url("/mcp"), http_client=http),
                              extensions=[TasksExtension()]) as client:
                created = await client.session.call_tool("demo_steps", {"steps": 2}, allow_claimed=True)
                done = await poll_until(client.session, created.task_id, {"completed", "failed", "cancelled"})
                first = storage.tokens
                # The access token expires (as the client counts): the SDK refreshes it before the next request.
                provider.context.token_expiry_time = time.time() - 1
                tools = await client.list_tools()
                return created, done, first, storage.tokens, tools
        await browser.http.aclose()

    created, done, first, refreshed, tools = asyncio.run(scenario())

    # Discovery, registration (RFC 7591), consent and the code exchange all happened, by the book.
    assert provider.context.oauth_metadata.issuer is not None
    assert str(provider.context.protected_resource_metadata.resource) == server.url("/mcp")
    application = Application.objects.get(client_id=storage.client_info.client_id)
    assert application.registration_source == "dcr" and application.client_type == "public"
    assert "Test agent" in browser.consent_page and "Acme" in browser.consent_page
    assert first.access_token.startswith("aro_") and first.refresh_token.startswith("arr_")
    assert set(first.scope.split()) == set(TOKEN_SCOPES)
    # A task run with it, in alice's tenant, by the OAuth client.
    assert done.status == "completed", done
    task = Task.objects.get(id=created.task_id)
    assert task.tenant_id == tenant.id and task.workflow_name == "demo_steps"
    # The refresh rotated both tokens; the new access token works, the old one is gone.
    assert refreshed.access_token != first.access_token and refreshed.refresh_token != first.refresh_token
    assert "demo_steps" in {tool.name for tool in tools.tools}
    assert mcp_status(server.url("/mcp"), first.access_token) == 401
    assert mcp_status(server.url("/mcp"), refreshed.access_token) == 200
    # Stored as hashes only, bound to the person, the tenant and the resource.
    token = AccessToken.objects.get(token_checksum=hashlib.sha256(refreshed.access_token.encode()).hexdigest())
    assert token.token == "" and token.user_id == user.id and token.resource == [server.url("/mcp")]
    assert token.runtime_binding.tenant_id == tenant.id
    assert not RefreshToken.objects.exclude(token="").exists()

    # Revocation (RFC 7009) by the client: refused from then on, and recorded.
    revoked = httpx2.post(server.url("/oauth/revoke/"), data={"token": refreshed.access_token,
                                                              "client_id": application.client_id})
    assert revoked.status_code == 200
    assert mcp_status(server.url("/mcp"), refreshed.access_token) == 401
    refresh = httpx2.post(server.url("/oauth/token/"), data={
        "grant_type": "refresh_token", "refresh_token": refreshed.refresh_token, "client_id": application.client_id})
    assert refresh.status_code == 400 and refresh.json()["error"] == "invalid_grant"  # its refresh token went too

    # The audit trail: the registration, alice's consent, the revocation, each with its actor.
    actions = {action.action: action for action in AdminAction.objects.filter(action__startswith="oauth_")}
    assert actions["oauth_register"].actor == "oauth-registration"
    assert actions["oauth_authorize"].actor == "user:alice" and actions["oauth_authorize"].tenant_id == tenant.id
    assert actions["oauth_revoke"].actor == f"oauth:{application.client_id[:12]}"
    assert actions["oauth_revoke"].tenant_id == tenant.id
    assert not any(first.access_token in action.message or refreshed.access_token in action.message
                   for action in actions.values())


def test_it_refuses_at_mcp_a_token_issued_for_another_resource(web, alice):
    tenant, user = alice
    server = web(SESSION_COOKIE_SECURE="false", CSRF_COOKIE_SECURE="false")
    application = Application.objects.create(name="elsewhere", client_type="public", redirect_uris=CALLBACK,
                                             authorization_grant_type="authorization-code")

    def token_for(resource: list[str]) -> str:
        return issued_token(user, tenant, resource, application=application, scope="tasks:read")

    assert mcp_status(server.url("/mcp"), token_for([server.url("/mcp")])) == 200  # (the same row, right resource)
    assert mcp_status(server.url("/mcp"), token_for(["https://other.example/mcp"])) == 401
    assert mcp_status(server.url("/mcp"), token_for([server.url("/runtime")])) == 401
    assert mcp_status(server.url("/mcp"), token_for([])) == 401  # no audience is no audience of ours


# -- the REST API (and so the CLI and the Python client) -----------------------------------------------------------
def bearer(raw: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    return client


def test_it_lets_an_oauth_token_for_the_rest_api_act_in_its_tenant_under_the_access_rule(alice):
    tenant, user = alice
    api = bearer(issued_token(user, tenant, ["http://testserver/runtime"]))
    created = api.post("/runtime/tasks", {"workflow": "demo_steps", "input": {"steps": 1}}, format="json")
    assert created.status_code == 201, created.content
    task = Task.objects.get(id=created.json()["taskId"])
    assert task.tenant_id == tenant.id
    listed = api.get("/runtime/tasks")
    assert listed.status_code == 200 and [row["taskId"] for row in listed.json()["results"]] == [str(task.id)]
    # Another tenant's task does not exist for it.
    other = task_create(tenant=tenant_get_or_create(slug="initech", name="Initech"), owner=None,
                        workflow="demo_steps", input={"steps": 1}).task
    assert api.get(f"/runtime/tasks/{other.id}").status_code == 404
    # A command names the client, never the token.
    steered = api.post(f"/runtime/tasks/{task.id}/steering", {"type": "pause", "expectedVersion": 1}, format="json")
    assert steered.status_code in (200, 202), steered.content
    command = SteeringCommand.objects.get(task=task)
    assert command.requested_by.startswith("oauth:") and "aro_" not in command.requested_by
    assert command.requested_by == f"oauth:{Application.objects.get().client_id[:12]}"
    # Its scopes narrow it as an API token's do.
    reader = bearer(issued_token(user, tenant, ["http://testserver/runtime"], scope="tasks:read"))
    refused = reader.post("/runtime/tasks", {"workflow": "demo_steps", "input": {"steps": 1}}, format="json")
    assert refused.status_code == 403 and "`tasks:write` scope" in refused.json()["detail"]


def test_it_refuses_on_the_rest_api_a_token_for_mcp_a_revoked_one_and_an_expired_one(alice):
    tenant, user = alice
    for resource in (["http://testserver/mcp"], ["https://other.example/runtime"], []):
        refused = bearer(issued_token(user, tenant, resource)).get("/runtime/tasks")
        assert refused.status_code == 401, resource
        assert "aro_" not in refused.content.decode()
    expired = issued_token(user, tenant, ["http://testserver/runtime"], expires_in=timedelta(seconds=-1))
    assert bearer(expired).get("/runtime/tasks").status_code == 401
    raw = issued_token(user, tenant, ["http://testserver/runtime"])
    assert bearer(raw).get("/runtime/tasks").status_code == 200
    AccessToken.objects.filter(token_checksum=hashlib.sha256(raw.encode()).hexdigest()).delete()  # (revoked)
    assert bearer(raw).get("/runtime/tasks").status_code == 401
    # The person moved to another tenant: the token no longer acts.
    raw = issued_token(user, tenant, ["http://testserver/runtime"])
    TenantMembership.objects.filter(user=user).update(tenant=tenant_get_or_create(slug="initech", name="Initech"))
    assert bearer(raw).get("/runtime/tasks").status_code == 401


def test_it_issues_a_token_for_the_rest_api_when_asked_and_publishes_its_metadata(client, alice, public_client):
    tenant, user = alice
    client.force_login(user)
    page = client.get(authorize_url(public_client, resource="http://testserver/runtime"))
    answer = client.post("/oauth/authorize/", {**hidden_fields(page.content.decode()), "allow": "Authorize"})
    code = parse_qs(urlsplit(answer["Location"]).query)["code"][0]
    tokens = client.post("/oauth/token/", {"grant_type": "authorization_code", "code": code, "redirect_uri": CALLBACK,
                                           "client_id": public_client.client_id, "code_verifier": VERIFIER,
                                           "resource": "http://testserver/runtime"})
    assert tokens.status_code == 200, tokens.content
    raw = tokens.json()["access_token"]
    assert bearer(raw).get("/runtime/tasks").status_code == 200
    assert principal_for_token(raw, resource="http://testserver/mcp") is None  # (and not at /mcp)
    refused = client.get(authorize_url(public_client, resource="http://testserver/runtime/tasks"))
    assert parse_qs(urlsplit(refused["Location"]).query)["error"] == ["invalid_target"]


def test_it_serves_the_rest_api_to_the_python_client_with_an_oauth_token(web, alice):
    tenant, user = alice
    server = web()
    raw = issued_token(user, tenant, [server.url("/runtime")])
    with RuntimeClient(server.url(""), raw) as client:
        task = client.create_task("demo_steps", {"steps": 1})
        assert [row.task_id for row in client.list_tasks().tasks] == [task.task_id]
        assert client.get_task(task.task_id).task_id == task.task_id  # (the snapshot: Django answers, not the edge)
        assert client.events(task.task_id)  # (the event stream, SSE: the same authentication)
        client.pause(task.task_id, expected_version=1)
        assert client.steering_history(task.task_id)[0]["requestedBy"].startswith("oauth:")
    with urllib.request.urlopen(server.url("/.well-known/oauth-protected-resource/runtime"), timeout=10) as response:
        metadata = json.load(response)
    assert metadata["resource"] == server.url("/runtime") and metadata["authorization_servers"] == [server.url("")]
    mcp_token = issued_token(user, tenant, [server.url("/mcp")])
    with RuntimeClient(server.url(""), mcp_token) as client, pytest.raises(AuthenticationError) as refused:
        client.list_tasks()
    assert refused.value.status == 401


# -- expired rows removed --------------------------------------------------------------------------------------
def test_it_schedules_the_cleanup_of_expired_oauth_rows_and_the_task_removes_them(alice):
    # (the migration's rows are gone after an earlier transactional test: made again, as migrate makes them)
    PeriodicTask.objects.filter(name=cleanup_migration.CLEANUP_SCHEDULE).delete()
    cleanup_migration.schedule_cleanup(global_apps, SimpleNamespace(connection=connection))
    cleanup_migration.schedule_cleanup(global_apps, SimpleNamespace(connection=connection))  # safe to run twice
    schedule = PeriodicTask.objects.get(name=cleanup_migration.CLEANUP_SCHEDULE)
    assert schedule.task == "runtime.oauth_cleanup" and schedule.enabled and schedule.interval.every == 3600
    from config.celery import app

    app.loader.import_default_modules()  # (as a worker does: autodiscovery finds mcp_bridge/tasks.py)
    assert "runtime.oauth_cleanup" in app.tasks

    tenant, user = alice
    expired = issued_token(user, tenant, ["http://testserver/mcp"], expires_in=timedelta(seconds=-5))
    live = issued_token(user, tenant, ["http://testserver/mcp"])
    app.tasks["runtime.oauth_cleanup"].apply().get()

    def stored(raw: str) -> bool:
        return AccessToken.objects.filter(token_checksum=hashlib.sha256(raw.encode()).hexdigest()).exists()

    assert not stored(expired) and stored(live)
    assert OAuthTenantBinding.objects.count() == 1  # (the expired token's binding went with it)


# -- focused, in process -----------------------------------------------------------------------------------------
@pytest.fixture
def public_client(db):
    return Application.objects.create(name="Desk client", client_type="public", redirect_uris=CALLBACK,
                                      authorization_grant_type="authorization-code")


def authorize_url(application, **overrides) -> str:
    params = {"response_type": "code", "client_id": application.client_id, "redirect_uri": CALLBACK,
              "state": "s1", "scope": "tasks:read tasks:write", "code_challenge": CHALLENGE,
              "code_challenge_method": "S256", **overrides}
    return "/oauth/authorize/?" + urlencode({k: v for k, v in params.items() if v is not None})


def test_it_refuses_plain_pkce_and_a_missing_challenge(client, alice, public_client):
    client.force_login(alice[1])
    for overrides in ({"code_challenge_method": "plain", "code_challenge": VERIFIER},
                      {"code_challenge_method": None, "code_challenge": VERIFIER},
                      {"code_challenge_method": None, "code_challenge": None}):
        response = client.get(authorize_url(public_client, **overrides))
        assert response.status_code == 302, overrides
        answer = parse_qs(urlsplit(response["Location"]).query)
        assert response["Location"].startswith(CALLBACK) and answer["error"] == ["invalid_request"], overrides
        assert answer["state"] == ["s1"]
    # A consent form altered to plain after the page was served is refused too, with no grant.
    page = client.get(authorize_url(public_client))
    assert page.status_code == 200
    altered = {**hidden_fields(page.content.decode()), "code_challenge_method": "plain", "allow": "Authorize"}
    assert client.post("/oauth/authorize/", altered).status_code == 400
    assert not Grant.objects.exists()


def test_it_refuses_a_resource_other_than_its_mcp_endpoint(client, alice, public_client):
    client.force_login(alice[1])
    response = client.get(authorize_url(public_client, resource="https://other.example/mcp"))
    assert parse_qs(urlsplit(response["Location"]).query)["error"] == ["invalid_target"]
    # Without one, the token is for this server's /mcp (RFC 8707 lets the server default it).
    page = client.get(authorize_url(public_client))
    assert hidden_fields(page.content.decode())["resource"] == "http://testserver/mcp"


def test_it_refuses_consent_to_a_person_in_no_tenant(client, public_client):
    loner = get_user_model().objects.create_user("loner", password=PASSWORD)
    client.force_login(loner)
    page = client.get(authorize_url(public_client))
    assert page.status_code == 403 and b"belongs to no tenant" in page.content
    assert "oauth/no_tenant.html" in [template.name for template in page.templates]
    assert client.post("/oauth/authorize/", {"client_id": public_client.client_id, "allow": "Authorize"}
                       ).status_code == 403
    assert not Grant.objects.exists()


def test_it_sends_a_signed_out_person_to_the_sign_in_page_in_the_admins_look(client, alice, public_client):
    response = client.get(authorize_url(public_client))
    assert response.status_code == 302 and response["Location"].startswith("/oauth/login/?next=")
    login = client.get(response["Location"])
    assert "admin/login.html" in [template.name for template in login.templates]


def test_it_exchanges_a_code_for_tokens_bound_to_the_tenant_and_the_resource(client, alice, public_client):
    tenant, user = alice
    client.force_login(user)
    page = client.get(authorize_url(public_client))
    answer = client.post("/oauth/authorize/", {**hidden_fields(page.content.decode()), "allow": "Authorize"})
    query = parse_qs(urlsplit(answer["Location"]).query)
    assert query["iss"] == ["http://testserver"]  # RFC 9207
    token = client.post("/oauth/token/", {"grant_type": "authorization_code", "code": query["code"][0],
                                          "redirect_uri": CALLBACK, "client_id": public_client.client_id,
                                          "code_verifier": VERIFIER, "resource": "http://testserver/mcp"})
    assert token.status_code == 200, token.content
    body = token.json()
    assert body["scope"] == "tasks:read tasks:write" and body["expires_in"] == 3600
    stored = AccessToken.objects.get(token_checksum=hashlib.sha256(body["access_token"].encode()).hexdigest())
    assert stored.runtime_binding.tenant_id == tenant.id and stored.resource == ["http://testserver/mcp"]
    # The code is single-use; a wrong verifier is refused (PKCE).
    again = client.post("/oauth/token/", {"grant_type": "authorization_code", "code": query["code"][0],
                                          "redirect_uri": CALLBACK, "client_id": public_client.client_id,
                                          "code_verifier": VERIFIER})
    assert again.status_code == 400


def test_it_binds_tokens_to_the_tenant_the_person_consented_in(client, alice, public_client):
    tenant, user = alice
    client.force_login(user)
    page = client.get(authorize_url(public_client))
    answer = client.post("/oauth/authorize/", {**hidden_fields(page.content.decode()), "allow": "Authorize"})
    code = parse_qs(urlsplit(answer["Location"]).query)["code"][0]
    tokens = client.post("/oauth/token/", {"grant_type": "authorization_code", "code": code, "redirect_uri": CALLBACK,
                                           "client_id": public_client.client_id, "code_verifier": VERIFIER}).json()
    principal = principal_for_token(tokens["access_token"], resource="http://testserver/mcp")
    assert principal.tenant.id == tenant.id and principal.user.id == user.id
    assert principal.scopes == {"tasks:read", "tasks:write"}
    assert principal.actor == f"oauth:{public_client.client_id[:12]}" and tokens["access_token"] not in principal.actor
    assert principal_for_token(tokens["access_token"], resource="http://elsewhere.example/mcp") is None
    tokens = client.post("/oauth/token/", {"grant_type": "refresh_token", "refresh_token": tokens["refresh_token"],
                                           "client_id": public_client.client_id}).json()  # (a refresh keeps the tenant)
    assert principal_for_token(tokens["access_token"], resource="http://testserver/mcp").tenant.id == tenant.id
    # Moved to another tenant: the token no longer acts, and cannot be refreshed into the new tenant either.
    TenantMembership.objects.filter(user=user).update(tenant=tenant_get_or_create(slug="initech", name="Initech"))
    assert principal_for_token(tokens["access_token"], resource="http://testserver/mcp") is None
    refreshed = client.post("/oauth/token/", {"grant_type": "refresh_token", "refresh_token": tokens["refresh_token"],
                                              "client_id": public_client.client_id})
    assert refreshed.status_code == 400 and refreshed.json()["error"] == "invalid_grant"


def test_it_publishes_authorization_server_metadata_a_client_can_use(client):
    response = client.get("/.well-known/oauth-authorization-server")
    assert response.status_code == 200
    metadata = response.json()
    OAuthMetadata.model_validate(metadata)  # the SDK's model reads it
    assert metadata["issuer"] == "http://testserver"
    assert metadata["authorization_endpoint"] == "http://testserver/oauth/authorize/"
    assert metadata["token_endpoint"] == "http://testserver/oauth/token/"
    assert metadata["registration_endpoint"] == "http://testserver/oauth/register/"
    assert metadata["revocation_endpoint"] == "http://testserver/oauth/revoke/"
    assert metadata["code_challenge_methods_supported"] == ["S256"]
    assert metadata["response_types_supported"] == ["code"]
    assert metadata["grant_types_supported"] == ["authorization_code", "refresh_token"]
    assert metadata["scopes_supported"] == sorted(TOKEN_SCOPES)
    assert "none" in metadata["token_endpoint_auth_methods_supported"]
    assert metadata["client_id_metadata_document_supported"] is True
    assert metadata["authorization_response_iss_parameter_supported"] is True
    assert "introspection_endpoint" not in metadata


def test_it_registers_authorization_code_clients_only_and_records_them(client):
    refused = client.post("/oauth/register/", json.dumps({"redirect_uris": [CALLBACK],
                                                          "grant_types": ["client_credentials"]}),
                          content_type="application/json")
    assert refused.status_code == 400 and refused.json()["error"] == "invalid_client_metadata"
    registered = client.post("/oauth/register/", json.dumps({
        "redirect_uris": [CALLBACK], "client_name": "Agent", "token_endpoint_auth_method": "none",
        "grant_types": ["authorization_code", "refresh_token"]}), content_type="application/json")
    assert registered.status_code == 201
    client_id = registered.json()["client_id"]
    record = AdminAction.objects.get(action="oauth_register")
    assert record.actor == "oauth-registration" and record.object_id == str(Application.objects.get(
        client_id=client_id).pk)
    assert Application.objects.count() == 1


class _Document(BaseHTTPRequestHandler):
    documents: dict = {}
    fetched: list = []

    def do_GET(self):  # noqa: N802 (http.server's name)
        self.fetched.append(self.path)
        body = json.dumps(self.documents.get(self.path, {})).encode()
        self.send_response(200 if self.path in self.documents else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def document_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Document)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _Document.fetched.clear()
    yield server
    server.shutdown()


def test_it_reads_a_client_id_metadata_document_from_loopback_only_when_told(client, alice, settings,
                                                                               document_server):
    client.force_login(alice[1])
    port = document_server.server_address[1]
    for path in ("/refused.json", "/client.json"):
        _Document.documents[path] = {"client_id": f"https://127.0.0.1:{port}{path}", "client_name": "Doc client",
                                     "redirect_uris": [CALLBACK], "grant_types": ["authorization_code"],
                                     "token_endpoint_auth_method": "none"}
    # By default a loopback client_id is never fetched (SSRF): an unknown client.
    refused = client.get(authorize_url(SimpleApp(f"https://127.0.0.1:{port}/refused.json")))
    assert refused.status_code == 400 and _Document.fetched == []
    settings.OAUTH_CIMD_ALLOW_LOOPBACK = True
    page = client.get(authorize_url(SimpleApp(f"https://127.0.0.1:{port}/client.json")))
    assert page.status_code == 200, page.content[:2000]
    assert _Document.fetched == ["/client.json"]
    assert b"Doc client" in page.content and b"127.0.0.1" in page.content  # the document's host is shown
    application = Application.objects.get(client_id=f"https://127.0.0.1:{port}/client.json")
    assert application.registration_source == "cimd" and application.client_type == "public"


class SimpleApp:
    def __init__(self, client_id):
        self.client_id = client_id


# -- an external OpenID Connect provider instead ---------------------------------------------------------------
@pytest.fixture
def provider_keys(document_server, settings):
    """An OpenID provider's signing key, its JWKS served on loopback, and the settings that trust it."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    public = json.loads(RSAAlgorithm.to_jwk(key.public_key()))
    _Document.documents["/jwks.json"] = {"keys": [{**public, "kid": "k1", "use": "sig", "alg": "RS256"}]}
    settings.MCP_AUTHORIZATION_SERVER = "https://id.example.com"
    settings.OAUTH_EXTERNAL_JWKS_URL = f"http://127.0.0.1:{document_server.server_address[1]}/jwks.json"
    return key


def test_it_accepts_an_external_providers_jwt_for_its_resource_mapped_by_claims(alice, provider_keys):
    tenant, user = alice
    resource = "http://127.0.0.1:8000/mcp"

    def signed(key=provider_keys, **claims):
        body = {"iss": "https://id.example.com", "aud": resource, "exp": int(time.time()) + 300,
                "sub": "u-1", "preferred_username": "alice", "tenant": "acme", "scope": "openid tasks:read steer",
                "client_id": "desktop-app", **claims}
        return jwt.encode(body, key, algorithm="RS256", headers={"kid": "k1"})

    principal = principal_for_token(signed(), resource=resource)
    assert principal.tenant.id == tenant.id and principal.user.id == user.id
    assert principal.scopes == {"tasks:read", "steer"} and principal.actor == "oauth:desktop-app"
    for refused in (signed(aud="https://other.example/mcp"),  # another resource
                    signed(iss="https://evil.example"),  # another issuer
                    signed(exp=int(time.time()) - 600),  # expired
                    signed(tenant="initech"),  # another tenant than the person's
                    signed(preferred_username="nobody"),  # no such account
                    signed(key=rsa.generate_private_key(public_exponent=65537, key_size=2048))):  # not its key
        assert principal_for_token(refused, resource=resource) is None


# -- issue 37, finding 9: redirect URIs, open registration ---------------------------------------------------------
def register(client, redirect_uris, *, address="127.0.0.1", **metadata):
    return client.post("/oauth/register/", json.dumps({
        "redirect_uris": redirect_uris, "client_name": "Agent", "token_endpoint_auth_method": "none",
        "grant_types": ["authorization_code", "refresh_token"], **metadata}), content_type="application/json",
        REMOTE_ADDR=address)


def test_it_sends_a_code_only_to_an_https_or_loopback_redirect_uri_at_registration_and_at_authorize(client, alice):
    # The attacker registered http://evil.example/cb and received the code after consent. Refused at registration
    # (RFC 7591 invalid_redirect_uri, as problem details), with every form a plain-http URL on another host takes.
    for refused in (["http://evil.example/cb"], [CALLBACK, "http://evil.example/cb"], ["http://127.0.0.1.evil.example/"],
                    ["http://127.0.0.1@evil.example/cb"], ["http://localhost.evil.example/cb"], ["javascript:alert(1)"],
                    ["https://app.example/cb#frag"]):
        answer = register(client, refused)
        assert answer.status_code == 400, (refused, answer.content)
        assert answer["Content-Type"] == "application/problem+json"
        assert answer.json()["error"] == "invalid_redirect_uri" and "https" in answer.json()["detail"], refused
    assert not Application.objects.exists()
    # Loopback over http on any port (native clients, RFC 8252) and any https URL are registered.
    for accepted in (CALLBACK, "http://[::1]:43117/cb", "http://localhost/callback", "https://app.example/oauth/cb"):
        assert register(client, [accepted]).status_code == 201, accepted
    # RFC 7592's update holds to the same rule.
    registration = register(client, ["https://app.example/cb"]).json()
    changed = client.put(f"/oauth/register/{registration['client_id']}/", json.dumps({
        "redirect_uris": ["http://evil.example/cb"], "grant_types": ["authorization_code"],
        "token_endpoint_auth_method": "none"}), content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {registration['registration_access_token']}")
    assert changed.status_code == 400 and changed.json()["error"] == "invalid_redirect_uri"
    assert Application.objects.get(client_id=registration["client_id"]).redirect_uris == "https://app.example/cb"

    # A client registered before the rule (or made in the admin) is held to it at the authorization endpoint: the
    # person sees the error page, and the browser is never sent there — neither from the page nor from a consent.
    old = Application.objects.create(name="Old", client_type="public", redirect_uris="http://evil.example/cb",
                                     authorization_grant_type="authorization-code")
    client.force_login(alice[1])
    for redirect_uri in ("http://evil.example/cb", None):  # named, or the client's only one by default
        page = client.get(authorize_url(old, redirect_uri=redirect_uri))
        assert page.status_code == 400 and "Location" not in page, redirect_uri
        assert b"https" in page.content and b"evil.example" in page.content
    consent = client.post("/oauth/authorize/", {"client_id": old.client_id, "redirect_uri": "http://evil.example/cb",
                                                "response_type": "code", "scope": "tasks:read", "state": "s1",
                                                "code_challenge": CHALLENGE, "code_challenge_method": "S256",
                                                "resource": "http://testserver/mcp", "allow": "Authorize"})
    assert not (consent.get("Location") or "").startswith("http://evil.example")
    assert not Grant.objects.exists()


def test_it_keeps_registrations_per_address_under_the_rate_and_refuses_them_when_closed(client, settings):
    # The attacker kept 30 of 30 unauthenticated registrations. With the default rate (20/hour per address):
    answers = [register(client, [CALLBACK]).status_code for _ in range(30)]
    assert answers == [201] * 20 + [429] * 10
    refused = register(client, [CALLBACK])
    assert refused["Content-Type"] == "application/problem+json" and int(refused["Retry-After"]) > 0
    assert refused.json()["limit"] == "20/hour" and refused.json()["status"] == 429
    assert Application.objects.count() == 20
    # Another address has its own count; an IPv6 host's whole /64 shares one.
    assert register(client, [CALLBACK], address="203.0.113.9").status_code == 201
    settings.RUNTIME = replace(settings.RUNTIME, oauth=replace(settings.RUNTIME.oauth, registration_rate="1/hour"))
    assert register(client, [CALLBACK], address="2001:db8::1").status_code == 201
    assert register(client, [CALLBACK], address="2001:db8::2").status_code == 429
    assert register(client, [CALLBACK], address="2001:db8:0:1::1").status_code == 201

    # Closed by setting: refused before anything is read or counted, saying how else to get a client.
    settings.RUNTIME = replace(settings.RUNTIME, oauth=replace(settings.RUNTIME.oauth, registration="closed"))
    closed = register(client, [CALLBACK], address="198.51.100.7")
    assert closed.status_code == 403 and closed["Content-Type"] == "application/problem+json"
    assert closed.json()["error"] == "access_denied" and "closed" in closed.json()["detail"]
    assert Application.objects.count() == 23


def test_it_deletes_a_registration_never_used_for_a_token_after_unused_client_hours(client, alice):
    unused, used, fresh = (register(client, [CALLBACK], address=f"192.0.2.{n}").json()["client_id"]
                           for n in (1, 2, 3))
    manual = Application.objects.create(name="Operator's", client_type="public", redirect_uris=CALLBACK,
                                        authorization_grant_type="authorization-code")
    # `used` gets a token through the real flow (consent, code exchange), then its token expires and is cleared.
    client.force_login(alice[1])
    page = client.get(authorize_url(SimpleApp(used)))
    answer = client.post("/oauth/authorize/", {**hidden_fields(page.content.decode()), "allow": "Authorize"})
    code = parse_qs(urlsplit(answer["Location"]).query)["code"][0]
    assert client.post("/oauth/token/", {"grant_type": "authorization_code", "code": code, "redirect_uri": CALLBACK,
                                         "client_id": used, "code_verifier": VERIFIER}).status_code == 200
    AccessToken.objects.filter(application__client_id=used).exclude(scope="").update(
        expires=timezone.now() - timedelta(days=40))
    RefreshToken.objects.filter(application__client_id=used).delete()
    # Time moves (the rows' own timestamps): three of them registered two days ago, `fresh` just now.
    Application.objects.exclude(client_id=fresh).update(created=timezone.now() - timedelta(days=2))

    from mcp_bridge.tasks import oauth_cleanup

    oauth_cleanup.apply().get()

    remaining = set(Application.objects.values_list("client_id", flat=True))
    assert remaining == {used, fresh, manual.client_id}  # only the registration nobody ever used is gone
    record = AdminAction.objects.get(action="oauth_expire_registration")
    assert record.actor == "system:oauth-cleanup" and unused[:12] in record.message
    assert not AccessToken.objects.filter(application__client_id=unused).exists()  # its registration token too


def test_it_warns_at_check_deploy_while_client_registration_is_open(settings):
    from mcp_bridge.checks import open_client_registration

    settings.DEBUG = False
    warnings = open_client_registration(None)
    assert [warning.id for warning in warnings] == ["mcp_bridge.W012"]
    assert "20/hour" in warnings[0].msg and "registration: closed" in warnings[0].hint
    settings.RUNTIME = replace(settings.RUNTIME, oauth=replace(settings.RUNTIME.oauth, registration_rate="off"))
    assert "NO rate limit" in open_client_registration(None)[0].msg
    settings.RUNTIME = replace(settings.RUNTIME, oauth=replace(settings.RUNTIME.oauth, registration="closed"))
    assert open_client_registration(None) == []
    settings.RUNTIME = replace(settings.RUNTIME, oauth=replace(settings.RUNTIME.oauth, registration="open"))
    from django.core.checks import Tags, run_checks

    # `check --deploy` prints it (security, as W021 and W004); the dev run's start check (`--tag runtime`) does not.
    assert "mcp_bridge.W012" in [m.id for m in run_checks(tags=[Tags.security], include_deployment_checks=True)]
    assert "mcp_bridge.W012" not in [m.id for m in run_checks(tags=["runtime"], include_deployment_checks=True)]


def test_it_refuses_an_oauth_setting_that_is_not_one_at_start(monkeypatch):
    from django.core.exceptions import ImproperlyConfigured

    from config.base.runtime import load_runtime_config

    assert load_runtime_config().oauth.registration_rate == "20/hour"
    for key, value, says in (("REGISTRATION", "maybe", "one of open, closed"),
                             ("REGISTRATION_RATE", "lots", "a rate"),
                             ("UNUSED_CLIENT_HOURS", "0", "hours > 0"),
                             ("STREAM_TOKEN_CHECK_SECONDS", "0", "seconds from 0.2 to 300")):
        monkeypatch.setenv(f"RUNTIME_OAUTH__{key}", value)
        with pytest.raises(ImproperlyConfigured, match=f"oauth.{key.lower()}.*{says}"):
            load_runtime_config()
        monkeypatch.delenv(f"RUNTIME_OAUTH__{key}")
    monkeypatch.setenv("RUNTIME_OAUTH__REGISTRATION", "closed")
    assert load_runtime_config().oauth.registration == "closed"


@pytest.mark.django_db(transaction=True)
def test_it_counts_registrations_by_the_peer_not_by_an_x_forwarded_for_the_client_wrote(web):
    """The outside check's move: past the per-address limit, each registration sent with its own made-up
    X-Forwarded-For was a new address (12 × 201) — uvicorn believed the header from 127.0.0.1, every caller of a run on
    one machine. The run command's web tier believes no forwarded header unless FORWARDED_ALLOW_IPS names the proxies
    (deploy/dev.py forwarded_args), and never '*' (the leftmost entry, the client's own)."""
    import importlib.util
    import json
    import urllib.error
    import urllib.request

    from tests.embedded_support import ROOT

    server = web(private=True, RUNTIME_OAUTH__REGISTRATION_RATE="2/hour")

    def register(n: int, forwarded: str | None = None) -> int:
        body = json.dumps({"redirect_uris": [f"https://x{n}.example/cb"], "token_endpoint_auth_method": "none",
                           "client_name": f"c{n}"}).encode()
        headers = {"Content-Type": "application/json", **({"X-Forwarded-For": forwarded} if forwarded else {})}
        request = urllib.request.Request(server.url("/oauth/register/"), data=body, method="POST", headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status
        except urllib.error.HTTPError as error:
            return error.code

    answers = [register(n) for n in range(3)]
    assert answers[-1] == 429, answers  # (the peer's bucket is full: 2/hour)
    assert [register(10 + n, f"198.51.100.{n}") for n in range(4)] == [429] * 4

    spec = importlib.util.spec_from_file_location("dev_script_forwarded", ROOT / "deploy" / "dev.py")
    dev = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(dev)
    assert dev.forwarded_args(None) == ["--no-proxy-headers"]
    assert dev.forwarded_args("10.0.0.0/8") == ["--proxy-headers", "--forwarded-allow-ips", "10.0.0.0/8"]
    with pytest.raises(SystemExit, match="choose its own address"):
        dev.forwarded_args("*")
    dockerfile = (ROOT / "deploy" / "Dockerfile").read_text()  # (the image names its proxies too)
    assert '--forwarded-allow-ips \\"$FORWARDED_ALLOW_IPS\\"' in dockerfile and "allow-ips '*'" not in dockerfile
