"""Credentials the deployment grants (agents_app.credentials, docs/credentials.md; issue 37, finding 1).

The attack: a tenant admin saved SECRET_KEY (and MODEL_API_KEY, another tenant's tool credential) as their tool
server's or model endpoint's credential, pointed it at a listener of theirs, and received the value as
`Authorization: Bearer <value>`. Here the attacker's moves again — the admin's forms as a tenant admin, the shell,
REST — are refused at save; a row written by SQL naming one fails its call closed with credential_not_granted while
a listener counting every request receives none; a granted credential is sent, to its host only; the W020 check
lists the rows; and no interface reads a value back.
"""

from __future__ import annotations

import contextlib
import http.server
import importlib
import json
import threading
import uuid
from types import SimpleNamespace

import pytest
from django.apps import apps as global_apps
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.core.management import CommandError, call_command
from django.db import connection
from django.test import Client

from agents_app.models import TenantModel, ToolServer
from config.base.runtime import CredentialGrant, credentials_parse, load_runtime_config
from tasks_app.models import AdminAction, Task, TaskEvent
from tasks_app.services import task_create, tenant_membership_ensure
from tests.engine_support import configure, create_engine_task, credentials_grant, drive
from tests.scripted_model_support import unique_key
from tests.tool_server_support import running_tool_server

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("external_root")]

roles_migration = importlib.import_module("steering_app.migrations.0007_audit_trail_roles")  # (the latest copy)

# What the attacker named: the runtime's own secrets, and the credential the deployment granted to another tenant.
RUNTIME_OWN = ("SECRET_KEY", "DATABASE_URL", "MODEL_API_KEY")
THEIRS = "GLOBEX_TOKEN"


class Listener:
    """A plain HTTP listener on loopback, standing for the attacker's server: it counts every request of any kind and
    keeps each Authorization header it was sent; it answers 404."""

    def __init__(self):
        received = self.received = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def _any(self):
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)
                received.append((self.command, self.path, self.headers.get("Authorization")))
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()

            do_GET = do_POST = do_DELETE = do_PUT = _any

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@contextlib.contextmanager
def listening():
    listener = Listener()
    try:
        yield listener
    finally:
        listener.close()


@pytest.fixture
def grants(settings, monkeypatch, other_tenant):
    """acme may send ACME_TOKEN to loopback; globex, GLOBEX_TOKEN. The runtime's own secrets are set, with values
    a leak would show."""
    credentials_grant(settings, ACME_TOKEN={"tenants": ["acme"], "hosts": ["127.0.0.1"]},
                      GLOBEX_TOKEN={"tenants": ["globex"], "hosts": ["127.0.0.1"]},
                      FAR_TOKEN={"tenants": ["acme"], "hosts": ["api.example.com"]})
    values = {"ACME_TOKEN": f"acme-{uuid.uuid4().hex}", "GLOBEX_TOKEN": f"globex-{uuid.uuid4().hex}",
              "FAR_TOKEN": f"far-{uuid.uuid4().hex}", "SECRET_KEY": settings.SECRET_KEY,
              "DATABASE_URL": f"postgres://owner:{uuid.uuid4().hex}@db/x", "MODEL_API_KEY": f"sk-{uuid.uuid4().hex}"}
    for name, value in values.items():
        monkeypatch.setenv(name, value)
    return values


@pytest.fixture
def tenant_admin(tenant):
    """A staff user in the tenant-admin role of acme, signed in (as tests/test_access_matrix.py makes them)."""
    roles_migration.create_roles(global_apps, SimpleNamespace(connection=connection))
    user = get_user_model().objects.create_user("acme-admin", is_staff=True)
    user.groups.add(Group.objects.get(name="tenant-admin"))
    tenant_membership_ensure(user=user, tenant=tenant)
    client = Client()
    client.force_login(user)
    return client


def server_form(tenant, url: str, credential: str, name: str = "mine") -> dict:
    return {"tenant": tenant.id, "name": name, "url": url, "credential": credential, "protocol": "auto",
            "enabled_tools": "", "timeout_seconds": "5", "max_concurrent_calls": "4", "rate_per_minute": ""}


def model_form(tenant, url: str, credential: str) -> dict:
    return {"tenant": tenant.id, "base_url": url, "name": "their-model", "credential": credential,
            "context_window": "", "input_price": "", "output_price": ""}


def sql_set_credential(table: str, row_id: int, credential: str) -> None:
    """The row changed past every form and service, as a script or a restored dump would."""
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {table} SET credential = %s WHERE id = %s", [credential, row_id])


def test_it_refuses_a_tenant_admin_saving_a_credential_not_granted_to_its_tenant_or_host(tenant, grants,
                                                                                         tenant_admin):
    refused = {}
    for name in (*RUNTIME_OWN, THEIRS, "NEVER_GRANTED", "FAR_TOKEN"):
        server = tenant_admin.post("/admin/agents_app/toolserver/add/",
                                   server_form(tenant, "http://127.0.0.1:9/mcp", name))
        model = tenant_admin.post("/admin/agents_app/tenantmodel/add/",
                                  model_form(tenant, "http://127.0.0.1:9/v1", name))
        refused[name] = (server.status_code, model.status_code, server.content.decode(), model.content.decode())
    granted = tenant_admin.post("/admin/agents_app/toolserver/add/",
                                server_form(tenant, "http://127.0.0.1:9/mcp", "ACME_TOKEN"))
    granted_model = tenant_admin.post("/admin/agents_app/tenantmodel/add/",
                                      model_form(tenant, "http://127.0.0.1:9/v1", "ACME_TOKEN"))

    for name, (server_status, model_status, server_page, model_page) in refused.items():
        assert (server_status, model_status) == (200, 200), name  # the form again, with the refusal
        for page in (server_page, model_page):
            if name in RUNTIME_OWN:
                assert f"{name} is one of the runtime&#x27;s own secrets; no tenant may use it." in page
            elif name == "FAR_TOKEN":
                assert "granted to tenant acme only for api.example.com; this URL&#x27;s host is 127.0.0.1" in page
            else:  # (another tenant's and an unknown name alike: which tenant holds what is not acme's to learn)
                assert f"The credential {name} is not granted to tenant acme; credentials granted to it: " \
                       f"ACME_TOKEN, FAR_TOKEN" in page
            assert not any(value in page for value in grants.values())
    assert granted.status_code == granted_model.status_code == 302
    assert list(ToolServer.objects.values_list("credential", flat=True)) == ["ACME_TOKEN"]
    assert list(TenantModel.objects.values_list("credential", flat=True)) == ["ACME_TOKEN"]

    # A granted row pointed elsewhere afterwards (its URL changed, the credential kept): refused as well.
    row = ToolServer.objects.get()
    moved = tenant_admin.post(f"/admin/agents_app/toolserver/{row.id}/change/",
                              server_form(tenant, "http://localhost:9/mcp", "ACME_TOKEN"))
    assert moved.status_code == 200 and "this URL&#x27;s host is localhost" in moved.content.decode()
    assert ToolServer.objects.get().url == "http://127.0.0.1:9/mcp"


def test_it_refuses_the_shell_and_offers_rest_no_way_to_write_a_credential(tenant, grants, api):
    for name in ("SECRET_KEY", THEIRS):
        with pytest.raises(CommandError, match=f"credential: .*{name}"):
            call_command("tool_servers", "add", "shell", "http://127.0.0.1:9/mcp", "--tenant", "acme",
                         "--credential", name)
    posted = api.post("/runtime/tool-servers", {"name": "x", "url": "http://127.0.0.1:9/mcp",
                                                "credential": "SECRET_KEY"}, format="json")

    assert not ToolServer.objects.exists()
    assert posted.status_code == 405 and posted["Content-Type"] == "application/problem+json"


def test_it_fails_a_call_closed_and_sends_nothing_for_a_row_written_by_sql_naming_an_ungranted_credential(
        tenant, grants, tenant_admin):
    with listening() as listener:
        row = ToolServer.objects.create(tenant=tenant, name="mine", url=f"{listener.url}/mcp",
                                        credential="ACME_TOKEN")
        tasks, pages = {}, {}
        for name in ("SECRET_KEY", "DATABASE_URL", THEIRS):
            sql_set_credential("agents_app_toolserver", row.id, name)
            # The attacker's way: the server's "Call a tool" page (its GET reads the tool list), then a call.
            pages[name] = tenant_admin.get(f"/admin/agents_app/toolserver/{row.id}/call/").content.decode()
            task = task_create(tenant=tenant, owner=None, workflow="mcp_tool",
                               input={"server": "mine", "tool": "lookup", "arguments": {"key": "x"}}).task
            drive(task.id)
            tasks[name] = Task.objects.get(id=task.id)

        assert listener.received == []  # not one request of any kind: no discover, no list, no call

    for name, task in tasks.items():
        assert "The tool list could not be read now" in pages[name] and name in pages[name]
        assert task.status == "failed"
        assert task.error["reason"] == "credential_not_granted", task.error
        assert name in task.error["message"] and "Nothing was sent" in task.error["message"]
        shown = json.dumps([task.error, task.status_message, list(TaskEvent.objects.filter(task_id=task.id)
                                                                  .values_list("data", flat=True))])
        assert not any(value in shown for value in grants.values())


def test_it_fails_a_tenant_model_call_closed_for_a_credential_written_by_sql_and_sends_a_granted_one(
        tenant, grants, settings, monkeypatch, scripted_model, tmp_path):
    for name in ("MODEL_BASE_URL", "MODEL_NAME"):
        monkeypatch.delenv(name, raising=False)
    configure(settings, model={"base_url": None, "name": None})
    with listening() as listener:
        row = TenantModel.objects.create(tenant=tenant, base_url=f"{listener.url}/v1", name="their-model")
        failed = {}
        for name in ("SECRET_KEY", "MODEL_API_KEY", THEIRS):
            sql_set_credential("agents_app_tenantmodel", row.id, name)
            task = task_create(tenant=tenant, owner=None, workflow="agent", input={"goal": "hi", "servers": []}).task
            drive(task.id)
            failed[name] = Task.objects.get(id=task.id)
        assert listener.received == []

    for name, task in failed.items():
        assert task.status == "failed"
        assert task.error["reason"] == "credential_not_granted" and name in task.error["message"], task.error
        assert not any(value in json.dumps([task.error, task.status_message]) for value in grants.values())

    # Granted — here from a file, as a mounted secret — it is sent, to the endpoint's host, as the bearer token.
    secret_file = tmp_path / "model_key"
    secret_file.write_text(f"file-{uuid.uuid4().hex}\n")
    credentials_grant(settings, MODEL_KEY={"file": str(secret_file), "tenants": ["acme"], "hosts": ["127.0.0.1"]})
    TenantModel.objects.filter(id=row.id).update(base_url=scripted_model.url, credential="MODEL_KEY")
    key = unique_key("granted")
    scripted_model.script(key, [{"content": "hello"}])
    task = task_create(tenant=tenant, owner=None, workflow="agent", input={"goal": key, "servers": []}).task

    assert drive(task.id)[-1] == "completed"
    assert [request["authorization"] for request in scripted_model.requests(key)] == [secret_file.read_text().strip()]


def test_it_sends_a_granted_credential_to_its_tool_server(tenant, grants, tenant_admin, tmp_path):
    with running_tool_server(tmp_path, token=grants["ACME_TOKEN"]) as server:
        added = tenant_admin.post("/admin/agents_app/toolserver/add/",
                                  server_form(tenant, server.url, "ACME_TOKEN", name="shop"))
        assert added.status_code == 302
        task = create_engine_task(tenant, "mcp_tool", server="shop", tool="lookup", arguments={"key": "x"})

        assert drive(task.id)[-1] == "completed"  # (the server answers 401 to any other token)

        assert len(server.calls(tool="lookup")) >= 1
    assert AdminAction.objects.filter(model="agents_app.toolserver", action="add").exists()
    assert not any(value in str(ToolServer.objects.values().get()) for value in grants.values())


def test_it_lists_rows_naming_ungranted_credentials_in_the_w020_check_without_values(tenant, other_tenant, grants):
    fine = ToolServer.objects.create(tenant=tenant, name="fine", url="http://127.0.0.1:9/mcp", credential="ACME_TOKEN")
    bad = ToolServer.objects.create(tenant=tenant, name="bad", url="http://127.0.0.1:9/mcp", credential="SECRET_KEY")
    stolen = ToolServer.objects.create(tenant=tenant, name="stolen", url="http://127.0.0.1:9/mcp",
                                       credential=THEIRS)
    model = TenantModel.objects.create(tenant=other_tenant, base_url="http://localhost:9/v1", name="m",
                                       credential=THEIRS)  # (granted to globex, for 127.0.0.1 only)

    found = [message for message in checks.run_checks(databases=["default"], tags=["runtime"])
             if message.id == "agents_app.W020"]
    without_database = [message for message in checks.run_checks(tags=["runtime"]) if message.id == "agents_app.W020"]

    text = "\n".join(f"{message.msg} {message.hint}" for message in found)
    assert len(found) == 3 and without_database == []
    assert f"tool server 'bad' (id {bad.id}) of tenant acme names the credential SECRET_KEY" in text
    assert f"tool server 'stolen' (id {stolen.id}) of tenant acme names the credential {THEIRS}" in text
    assert f"model endpoint 'm' (id {model.id}) of tenant globex names the credential {THEIRS}" in text
    assert "'fine'" not in text and fine.id
    assert not any(value in text for value in grants.values())


def test_it_shows_only_a_credentials_name_never_its_value(tenant, grants, tenant_admin, api):
    row = ToolServer.objects.create(tenant=tenant, name="shop", url="http://127.0.0.1:9/mcp", credential="ACME_TOKEN")
    model = TenantModel.objects.create(tenant=tenant, base_url="http://127.0.0.1:9/v1", name="m",
                                       credential="ACME_TOKEN")
    pages = [tenant_admin.get(url).content.decode() for url in (
        "/admin/agents_app/toolserver/", f"/admin/agents_app/toolserver/{row.id}/change/",
        "/admin/agents_app/tenantmodel/", f"/admin/agents_app/tenantmodel/{model.id}/change/")]
    listed = api.get("/runtime/tool-servers").content.decode()

    assert all("ACME_TOKEN" in page for page in pages)  # the name, for the tenant admin who manages it
    assert not any(grants["ACME_TOKEN"] in page for page in (*pages, listed))
    assert "ACME_TOKEN" not in listed  # (REST: not even the name)


# -- the grant map (config/runtime.yaml `credentials`, RUNTIME_CREDENTIALS) ------------------------------------------
@pytest.mark.parametrize(("value", "key", "message"), [
    ({"SECRET_KEY": {}}, "credentials.SECRET_KEY", "runtime's own"),
    ({"X": {"env": "DATABASE_URL", "tenants": ["acme"], "hosts": ["h.example"]}}, "credentials.X.env", "runtime's own"),
    ({"X": {"env": "RUNTIME_ANYTHING"}}, "credentials.X.env", "runtime's own"),
    ({"X": {"env": "PGPASSWORD"}}, "credentials.X.env", "runtime's own"),
    ({"X": {"tenants": ["acme"]}}, "credentials.X.hosts", "must list the hosts"),
    ({"X": {"tenants": ["acme"], "hosts": ["*"]}}, "credentials.X.hosts", "is not a host name"),
    ({"X": {"file": "/proc/self/environ"}}, "credentials.X.file", "absolute path"),
    ({"X": {"file": "relative/key"}}, "credentials.X.file", "absolute path"),
    ({"X": {"env": "A", "file": "/run/secrets/a"}}, "credentials.X", "not both"),
    ({"X": {"tenant": ["acme"]}}, "credentials.X.tenant", "unknown key"),
    ({"x-token": {}}, "credentials.x-token", "upper-case"),
    ({"X": {"tenants": ["acme co"], "hosts": ["h.example"]}}, "credentials.X.tenants", "tenant slugs"),
    (["SECRET_KEY"], "credentials", "runtime's own"),
    ("GITHUB_TOKEN", "credentials", "must map credential names"),
])
def test_it_refuses_an_invalid_or_dangerous_grant_at_start_naming_the_key(value, key, message):
    with pytest.raises(ImproperlyConfigured, match=f"`{key}`: .*{message}"):
        credentials_parse(value)


def test_it_reads_grants_from_the_file_or_the_environment_and_keeps_the_older_list_of_names(tmp_path, monkeypatch):
    path = tmp_path / "runtime.yaml"
    path.write_text("credentials:\n  GITHUB_TOKEN:\n    tenants: [acme]\n    hosts: [api.github.com, '*.github.com']\n"
                    "  CRM_KEY:\n    file: /run/secrets/crm\n    tenants: '*'\n    hosts: [crm.example.com]\n")
    from_file = load_runtime_config(path).credentials
    monkeypatch.setenv("RUNTIME_CREDENTIALS", json.dumps({"OPS_TOKEN": {"env": "OPS", "tenants": ["ops"],
                                                                        "hosts": ["10.0.0.0/8"]}}))
    from_env = load_runtime_config(path).credentials
    monkeypatch.setenv("RUNTIME_CREDENTIALS", '{"SECRET_KEY": {}}')
    with pytest.raises(ImproperlyConfigured, match="`RUNTIME_CREDENTIALS.SECRET_KEY`"):
        load_runtime_config(path)
    monkeypatch.setenv("RUNTIME_CREDENTIALS", json.dumps({"M": {"env": "MY_MODEL_KEY"}}))
    monkeypatch.setenv("RUNTIME_MODEL__CREDENTIAL", "MY_MODEL_KEY")
    with pytest.raises(ImproperlyConfigured, match="deployment's model key"):
        load_runtime_config(path)
    monkeypatch.delenv("RUNTIME_CREDENTIALS")
    monkeypatch.delenv("RUNTIME_MODEL__CREDENTIAL")
    path.write_text("credentials: [CRM_API_KEY]\n")
    older = load_runtime_config(path).credentials

    assert from_file == {
        "GITHUB_TOKEN": CredentialGrant("GITHUB_TOKEN", env="GITHUB_TOKEN", tenants=("acme",),
                                        hosts=("api.github.com", "*.github.com")),
        "CRM_KEY": CredentialGrant("CRM_KEY", file="/run/secrets/crm", tenants=("*",), hosts=("crm.example.com",))}
    assert from_env == {"OPS_TOKEN": CredentialGrant("OPS_TOKEN", env="OPS", tenants=("ops",), hosts=("10.0.0.0/8",))}
    assert older == {"CRM_API_KEY": CredentialGrant("CRM_API_KEY")}  # held by name (provide_input), granted to none
    assert load_runtime_config().credentials == {}  # the shipped file grants nothing


@pytest.mark.parametrize(("url", "allowed"), [
    ("https://api.github.com/mcp", True), ("https://API.GitHub.com./mcp", True), ("https://x.y.github.com/", True),
    ("https://github.com/", False), ("https://api.github.com.evil.example/", False),
    ("https://evilgithub.com/", False), ("https://api.github.com@evil.example/", False),
    ("http://10.1.2.3:8080/mcp", True), ("http://[::1]/mcp", False), ("http://10.0.0.1.nip.io/", False),
])
def test_it_matches_the_urls_host_against_the_grants_hosts(settings, url, allowed):
    from agents_app import credentials

    credentials_grant(settings, GH={"tenants": ["acme"], "hosts": ["api.github.com", "*.github.com", "10.1.0.0/16"]})

    assert (credentials.refusal(name="GH", tenant_slug="acme", url=url) is None) is allowed
    assert credentials.refusal(name="GH", tenant_slug="globex", url="https://api.github.com/") is not None
