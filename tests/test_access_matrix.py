"""The access matrix: roles × interfaces × actions, generated from the tables below (a new role, interface or action
adds its cases), all decided by the one rule (tasks_app.access).

- Another tenant's task: every interface answers exactly as for an id that does not exist (404, the admin's "does
  not exist", MCP's -32602), for every role, and lists none of it.
- In its own tenant, each role does what MAY says and is refused the rest: an auditor cannot steer, a viewer cannot
  cancel, an operator cannot edit the tool policy, read the audit trail or revoke a token; a tenant admin manages
  its tenant's members, tokens, tool servers and policy and reads its audit trail; only an auditor exports it.

Fast: one set of rows, committed once for the module (every interface but the Django test client reads them from
connections of its own); REST and the admin through Django's test client; SSE, MCP and the CLI (tasks_app.client,
over httpx2's ASGI transport) through the real ASGI entry point's layers, in process, on one event loop kept for the
module — no server process.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import threading
import uuid
from dataclasses import dataclass
from types import SimpleNamespace

import httpx2
import pytest
from django.apps import apps as global_apps
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.db import connection, connections
from django.db.models.functions import Now
from django.test import Client
from rest_framework.test import APIClient

from agents_app.models import TenantToolPolicy, ToolServer
from tasks_app import access
from tasks_app.audit.retention import purge_allowed
from tasks_app.client import errors as client_errors
from tasks_app.client._async import AsyncRuntimeClient
from tasks_app.models import ApiToken, Task, Tenant
from tasks_app.services import api_token_create, task_create, tenant_get_or_create, tenant_membership_ensure

pytestmark = [pytest.mark.django_db]

roles_migration = importlib.import_module("steering_app.migrations.0007_audit_trail_roles")  # (the latest copy)

ROLES = ("viewer", "auditor", "operator", "tenant-admin")
# The admin's managing pages: the policy's add page, a POST to its change page (a GET of it only reads: an auditor's
# read-only view), a tool server's delete page,
# a token's revoke (a bulk action), a membership's add page; and the audit trail's page and its CSV export.
_MANAGING = {"edit_policy", "post_policy", "delete_tool_server", "revoke_token", "add_member"}
ACTIONS = ("read", "list", "stream", "download", "steer", "cancel", "fork", *sorted(_MANAGING), "read_audit", "export")
_READS = {"read", "list", "stream", "download"}
# What each role may do in its own tenant — written here, not read from tasks_app.access, so the test can disagree.
MAY = {
    "viewer": _READS,
    "auditor": _READS | {"read_audit", "export"},
    "operator": _READS | {"steer", "cancel", "fork"},
    "tenant-admin": _READS | _MANAGING | {"read_audit"},
}
# What each interface offers.
OFFERS = {
    "rest": {"read", "list", "download", "steer", "cancel", "fork"},  # a bearer token
    "rest_session": {"read", "list", "download", "steer", "cancel", "fork"},  # signed in
    "sse": {"stream"},
    "admin": {"read", "list", "download", "steer", "cancel", "fork", *_MANAGING, "read_audit", "export"},
    "mcp": {"read", "steer", "cancel", "fork"},  # (no tasks/list on the 2026-07-28 wire)
    "cli": {"read", "list", "stream", "download", "steer", "cancel", "fork"},
}
TASK_ACTIONS = ("read", "stream", "download", "steer", "cancel", "fork")  # the ones naming a task


@dataclass
class World:
    a: Tenant
    b: Tenant
    a_task: str
    b_task: str
    users: dict
    tokens: dict
    loop: asyncio.AbstractEventLoop
    app: object
    policies: dict  # tenant slug -> its TenantToolPolicy id
    servers: dict  # tenant slug -> a ToolServer id
    spare_token: int  # a token of tenant a that the managing roles may revoke (nobody uses it)

    def run(self, coroutine):
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout=30)


def _asgi_app():
    """The entry point's layers as config.asgi builds them, made fresh for this module's event loop (the MCP SDK's
    session manager and the snapshot edge's pool belong to the loop they started on)."""
    from config.base.asgi_handler import OneHopASGIHandler
    from config.base.asgi_limits import BodySizeLimit
    from mcp_bridge.asgi import McpEndpoint
    from mcp_bridge.bridge import retention_days
    from mcp_bridge.poll_edge import PollEdge
    from mcp_bridge.server import SERVER_NAME, SERVER_VERSION, build_manager, build_server
    from tasks_app.web.snapshot_edge import SnapshotEdge

    edge = SnapshotEdge(BodySizeLimit(OneHopASGIHandler(), max_bytes=settings.RUNTIME_MAX_REQUEST_BYTES),
                        pool_size=2, pool_timeout=5)
    mcp = McpEndpoint(build_manager(build_server()), max_bytes=settings.MCP_MAX_REQUEST_BYTES,
                      poll_edge=PollEdge(edge, server_info={"name": SERVER_NAME, "version": SERVER_VERSION},
                                         retention_days=retention_days))

    async def app(scope, receive, send):
        if scope["type"] == "http" and mcp.owns(scope["path"]):
            return await mcp(scope, receive, send)
        return await edge(scope, receive, send)

    app.mcp, app.edge = mcp, edge
    return app


@pytest.fixture(scope="module")
def world(django_db_setup, django_db_blocker):
    # The ASGI requests' sync code runs on threads of their own: their connections close when each request ends
    # (as under a web process's pool), so none outlives the module (the test database is dropped at the end).
    db_settings = connections.settings["default"]
    kept_max_age, db_settings["CONN_MAX_AGE"] = db_settings["CONN_MAX_AGE"], 0
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True, name="access-matrix-loop")
    thread.start()
    with django_db_blocker.unblock():
        roles_migration.create_roles(global_apps, SimpleNamespace(connection=connection))
        a, b = tenant_get_or_create(slug="matrix-a"), tenant_get_or_create(slug="matrix-b")
        User = get_user_model()
        users, tokens = {}, {}
        for role in ROLES:
            user = User.objects.create_user(f"matrix-{role}", is_staff=True)
            user.groups.add(Group.objects.get(name=role))
            users[role] = user
            tokens[role] = api_token_create(tenant=a, user=user, name="matrix")[1]
        b_owner = User.objects.create_user("matrix-b-owner")
        tenant_membership_ensure(user=b_owner, tenant=b)
        spare = api_token_create(tenant=a, user=User.objects.create_user("matrix-a-spare"), name="spare")[0]
        policies = {t.slug: TenantToolPolicy.objects.create(tenant=t, deny=["x.*"]).id for t in (a, b)}
        servers = {t.slug: ToolServer.objects.create(tenant=t, name="matrix", url="https://tools.invalid/mcp").id
                   for t in (a, b)}
        a_task = task_create(tenant=a, owner=users["operator"], workflow="demo_steps", input={"steps": 1}).task
        b_task = task_create(tenant=b, owner=b_owner, workflow="demo_steps", input={"steps": 1}).task
        # Finished: a stream ends after its snapshot, and an allowed steer or cancel changes nothing (409/422).
        Task.objects.filter(id__in=[a_task.id, b_task.id]).update(status="completed", progress=1.0,
                                                                  completed_at=Now())
        world = World(a=a, b=b, a_task=str(a_task.id), b_task=str(b_task.id), users=users, tokens=tokens,
                      loop=loop, app=_asgi_app(), policies=policies, servers=servers, spare_token=spare.id)
    yield world
    with django_db_blocker.unblock():
        if world.app.edge.pool is not None:
            world.run(world.app.edge.pool.close())
        with purge_allowed():  # (the events are append-only outside the retention purge's transaction)
            Task.objects.filter(tenant__in=[a, b]).delete()
            ToolServer.objects.filter(tenant__in=[a, b]).delete()
            TenantToolPolicy.objects.filter(tenant__in=[a, b]).delete()
            User.objects.filter(username__startswith="matrix-").delete()
            Tenant.objects.filter(id__in=[a.id, b.id]).delete()
    db_settings["CONN_MAX_AGE"] = kept_max_age
    world.run(_cancel_the_rest())
    loop.call_soon_threadsafe(loop.stop)
    thread.join(timeout=5)
    loop.close()


async def _cancel_the_rest():
    tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


UNKNOWN = "00000000-0000-7000-8000-000000000000"
MODERN, EXT = "2026-07-28", "io.modelcontextprotocol/tasks"  # (MCP: the stateless wire, the tasks extension)
ALLOWED, REFUSED, NOT_FOUND = "allowed", "refused", "not found"


def _http(status: int) -> str:
    return REFUSED if status == 403 else NOT_FOUND if status == 404 else ALLOWED if status < 500 and status != 401 \
        else f"broken ({status})"


# -- each interface: do `action` (to task `task_id`) as `role` and say what came of it ------------------------------
def via_rest(world: World, role: str, action: str, task_id: str, *, session: bool = False):
    client = APIClient()
    if session:
        client.force_login(world.users[role])
    else:
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {world.tokens[role]}")
    base = f"/runtime/tasks/{task_id}"
    response = {
        "read": lambda: client.get(base),
        "list": lambda: client.get("/runtime/tasks"),
        "download": lambda: client.get(f"{base}/artifacts"),
        "steer": lambda: client.post(f"{base}/steering", {"type": "set_priority", "expectedVersion": 1,
                                                          "payload": {"priority": 7}}, format="json"),
        "cancel": lambda: client.post(f"{base}/cancel", {}, format="json"),
        "fork": lambda: client.post(f"{base}/fork", {}, format="json"),
    }[action]()
    return _http(response.status_code), (response.status_code, response.content if action == "list" else b"")


def via_rest_session(world, role, action, task_id):
    return via_rest(world, role, action, task_id, session=True)


def via_admin(world: World, role: str, action: str, task_id: str):
    client = Client()
    client.force_login(world.users[role])
    page = f"/admin/tasks_app/task/{task_id}"
    policy = f"/admin/agents_app/tenanttoolpolicy/{world.policies['matrix-a']}"
    response = {
        "read": lambda: client.get(f"{page}/change/"),
        "list": lambda: client.get("/admin/tasks_app/task/"),
        "download": lambda: client.get(f"{page}/artifacts/"),
        "steer": lambda: client.post(f"{page}/steer/", {"type": "set_priority", "priority": 9, "reason": "x",
                                                        "expected_version": 1}),
        "cancel": lambda: client.post(f"{page}/steer/", {"type": "cancel", "reason": "x", "expected_version": 1}),
        "fork": lambda: client.get(f"{page}/fork/"),
        "edit_policy": lambda: client.get("/admin/agents_app/tenanttoolpolicy/add/"),
        "post_policy": lambda: client.post(f"{policy}/change/", {"tenant": world.a.id, "deny": '["x.*"]',
                                                                  "require_approval": "[]"}),
        "delete_tool_server": lambda: client.get(f"/admin/agents_app/toolserver/{world.servers['matrix-a']}/delete/"),
        "revoke_token": lambda: client.post("/admin/tasks_app/apitoken/", {"action": "revoke", "index": 0,
                                                                           "_selected_action": [world.spare_token]}),
        "add_member": lambda: client.get("/admin/tasks_app/tenantmembership/add/"),
        "read_audit": lambda: client.get("/admin/audit/events/", {"task": task_id}),
        "export": lambda: client.get("/admin/audit/events.csv", {"task": task_id}),
    }[action]()
    if response.status_code == 302 and response.url.rstrip("/") == "/admin":
        outcome = NOT_FOUND  # the admin's "Task with ID … doesn't exist. Perhaps it was deleted?"
    else:
        outcome = _http(response.status_code)
    return outcome, (response.status_code, response.content if action == "list" else b"")


async def _sse(world: World, role: str, task_id: str):
    async with httpx2.AsyncClient(transport=httpx2.ASGITransport(app=world.app), base_url="http://testserver") as c:
        async with c.stream("GET", f"/runtime/tasks/{task_id}/events",
                            headers={"Authorization": f"Bearer {world.tokens[role]}"}) as response:
            await response.aread()
            return response.status_code


def via_sse(world, role, action, task_id):
    status = world.run(_sse(world, role, task_id))
    return _http(status), (status,)


async def _mcp(world: World, role: str, method: str, params: dict):
    params = {**params, "_meta": {"io.modelcontextprotocol/protocolVersion": MODERN,
                                  "io.modelcontextprotocol/clientCapabilities": {"extensions": {EXT: {}}}}}
    headers = {"Authorization": f"Bearer {world.tokens[role]}", "MCP-Protocol-Version": MODERN, "Mcp-Method": method,
               "Accept": "application/json, text/event-stream"}
    if "taskId" in params:
        headers["Mcp-Name"] = params["taskId"]
    elif "name" in params:
        headers["Mcp-Name"] = params["name"]
    async with httpx2.AsyncClient(transport=httpx2.ASGITransport(app=world.app), base_url="http://testserver") as c:
        response = await c.post("/mcp", headers=headers, json={"jsonrpc": "2.0", "id": 1, "method": method,
                                                               "params": params})
    text = response.text
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        frames = [json.loads(line[5:]) for line in text.splitlines() if line.startswith("data:")]
        body = frames[-1] if frames else None
    else:
        body = json.loads(text) if text.strip() else None
    return response.status_code, body


def via_mcp(world: World, role: str, action: str, task_id: str):
    method, params = {
        "read": ("tasks/get", {"taskId": task_id}),
        "steer": ("tools/call", {"name": "steer_task", "arguments": {"taskId": task_id, "action": "set_priority",
                                                                      "priority": 7, "expectedVersion": 1}}),
        "cancel": ("tasks/cancel", {"taskId": task_id}),
        "fork": ("tools/call", {"name": "fork_task", "arguments": {"taskId": task_id}}),
    }[action]
    status, body = world.run(_mcp(world, role, method, params))
    error = (body or {}).get("error") if isinstance(body, dict) else None
    result = (body or {}).get("result") if isinstance(body, dict) else None
    if status == 403:
        return REFUSED, (status, error)
    if isinstance(error, dict) and error.get("code") == -32602 and "not found" in error.get("message", "").lower():
        return NOT_FOUND, (status, error.get("code"))
    if isinstance(result, dict) and result.get("isError") and "not found" in json.dumps(result).lower():
        return NOT_FOUND, (status, "tool: not found")  # (steer_task and fork_task answer as tools do)
    return (ALLOWED if status == 200 else f"broken ({status}: {body})"), (status, json.dumps(body) if
                                                                         action == "list" else "")


async def _cli(world: World, role: str, action: str, task_id: str):
    client = AsyncRuntimeClient(url="http://testserver", token=world.tokens[role],
                                transport=httpx2.ASGITransport(app=world.app))
    async with client:
        try:
            if action == "read":
                await client.get_task(task_id)
            elif action == "list":
                return ALLOWED, [task.task_id for task in (await client.list_tasks()).tasks]
            elif action == "stream":
                stream = client.watch(task_id)
                try:
                    await anext(stream, None)  # (its snapshot: the task is finished, the stream ends there)
                finally:
                    await stream.aclose()
            elif action == "download":
                await client.artifacts(task_id)
            elif action == "steer":
                await client.set_priority(task_id, 7, expected_version=1)
            elif action == "cancel":
                await client.cancel(task_id)
            elif action == "fork":
                await client.fork(task_id)
        except client_errors.NotFound:
            return NOT_FOUND, ()
        except client_errors.ApiError as error:
            return (REFUSED if error.status == 403 else ALLOWED if error.status in (400, 409, 422) else
                    f"broken ({error.status})"), (error.status,)
    return ALLOWED, ()


def via_cli(world, role, action, task_id):
    return world.run(_cli(world, role, action, task_id))


INTERFACES = {"rest": via_rest, "rest_session": via_rest_session, "sse": via_sse, "admin": via_admin,
              "mcp": via_mcp, "cli": via_cli}
assert set(INTERFACES) == set(OFFERS)


def _cases(actions):
    return [pytest.param(role, interface, action, id=f"{role}-{interface}-{action}")
            for role in ROLES for interface in INTERFACES for action in actions if action in OFFERS[interface]]


# -- the matrix --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("role", "interface", "action"), _cases(TASK_ACTIONS))
def test_it_answers_another_tenants_task_exactly_as_an_unknown_one(world, role, interface, action):
    outcome, signature = INTERFACES[interface](world, role, action, world.b_task)
    unknown_outcome, unknown_signature = INTERFACES[interface](world, role, action, UNKNOWN)

    assert outcome != ALLOWED
    assert (outcome, signature) == (unknown_outcome, unknown_signature)  # nothing tells that it exists
    if action in MAY[role]:
        assert outcome == NOT_FOUND  # (a role that may not do it at all may be refused before any task is read)
    assert Task.objects.get(id=world.b_task).status == "completed"


@pytest.mark.parametrize(("role", "interface", "action"), _cases(["list"]))
def test_it_lists_none_of_another_tenants_tasks(world, role, interface, action):
    outcome, listed = INTERFACES[interface](world, role, action, "")

    assert outcome == ALLOWED
    text = listed if isinstance(listed, list) else listed[-1]
    text = json.dumps(text) if isinstance(text, list) else text if isinstance(text, str) else text.decode()
    assert world.a_task in text or world.a_task[-12:] in text  # (the admin's list shows an id's end)
    assert world.b_task not in text and world.b_task[-12:] not in text


@pytest.mark.parametrize(("role", "interface", "action"), _cases([a for a in ACTIONS if a != "list"]))
def test_it_lets_each_role_do_in_its_tenant_only_what_the_role_allows(world, role, interface, action):
    outcome, _ = INTERFACES[interface](world, role, action, world.a_task)

    assert outcome == (ALLOWED if action in MAY[role] else REFUSED)


# -- the named cases, and the rule's own invariants --------------------------------------------------------
@pytest.mark.parametrize("interface", [i for i in INTERFACES if "steer" in OFFERS[i]])
def test_it_refuses_an_auditor_every_steering(world, interface):
    assert INTERFACES[interface](world, "auditor", "steer", world.a_task)[0] == REFUSED


@pytest.mark.parametrize("interface", [i for i in INTERFACES if "cancel" in OFFERS[i]])
def test_it_refuses_a_viewer_a_cancel(world, interface):
    assert INTERFACES[interface](world, "viewer", "cancel", world.a_task)[0] == REFUSED


def test_it_refuses_an_operator_the_tool_policy_and_tool_servers_in_the_admin(world):
    client = Client()
    client.force_login(world.users["operator"])

    assert client.get("/admin/agents_app/tenanttoolpolicy/add/").status_code == 403
    assert client.post("/admin/agents_app/tenanttoolpolicy/add/", {"tenant": world.a.id}).status_code == 403
    assert client.get("/admin/agents_app/toolserver/add/").status_code == 403


def test_it_refuses_an_operator_every_write_to_the_policy_and_the_audit_trail(world):
    client = Client()
    client.force_login(world.users["operator"])
    policy = f"/admin/agents_app/tenanttoolpolicy/{world.policies['matrix-a']}"

    posted = client.post(f"{policy}/change/", {"tenant": world.a.id, "deny": "[]", "require_approval": "[]"})
    deleted = client.post(f"{policy}/delete/", {"post": "yes"})
    audit = client.get("/admin/audit/events/", {"task": world.a_task})

    assert (posted.status_code, deleted.status_code) == (403, 403)
    assert TenantToolPolicy.objects.get(id=world.policies["matrix-a"]).deny == ["x.*"]
    assert audit.status_code == 403 and "auditors and tenant admins" in audit.content.decode()


def test_it_keeps_a_tenant_admin_to_its_own_tenants_rows_and_audit_trail(world):
    client = Client()
    client.force_login(world.users["tenant-admin"])
    b_policy = f"/admin/agents_app/tenanttoolpolicy/{world.policies['matrix-b']}"

    posted = client.post(f"{b_policy}/change/", {"tenant": world.b.id, "deny": "[]", "require_approval": "[]"})
    deleted = client.post(f"/admin/agents_app/toolserver/{world.servers['matrix-b']}/delete/", {"post": "yes"})
    b_events = client.get("/admin/audit/events/", {"task": world.b_task})
    a_events = client.get("/admin/audit/events/", {"task": world.a_task})
    export = client.get("/admin/audit/events.csv", {"task": world.a_task})

    # Another tenant's row: "does not exist" (the admin's redirect to its index), and nothing changed.
    assert posted.status_code == deleted.status_code == 302 and posted.url.rstrip("/") == "/admin"
    assert TenantToolPolicy.objects.get(id=world.policies["matrix-b"]).deny == ["x.*"]
    assert ToolServer.objects.filter(id=world.servers["matrix-b"]).exists()
    assert b_events.status_code == 200 and b_events.context["rows"] == []  # (as for an unknown task)
    assert a_events.status_code == 200 and a_events.context["rows"]
    assert {row["tenant"] for row in a_events.context["rows"]} == {"matrix-a"}
    assert export.status_code == 403 and "auditor role" in export.content.decode()
    assert access.allows(access.actor_for_user(world.users["tenant-admin"]), access.Action.MANAGE_POLICY,
                         tenant=world.a)
    assert not access.allows(access.actor_for_user(world.users["tenant-admin"]), access.Action.MANAGE_POLICY,
                             tenant=world.b)


def test_it_lets_a_token_only_narrow_its_users_role(world):
    operator = world.users["operator"]
    read_only = api_token_create(tenant=world.a, user=operator, name="narrow", scopes=["tasks:read"])[0]
    viewer_token = ApiToken.objects.get(user=world.users["viewer"])

    narrowed = access.actor_for_token(ApiToken.objects.select_related("tenant", "user").get(id=read_only.id))
    viewer = access.actor_for_token(ApiToken.objects.select_related("tenant", "user").get(id=viewer_token.id))

    assert access.allows(narrowed, access.Action.READ_TASK) and not access.allows(narrowed, access.Action.STEER)
    assert viewer.scopes >= {"steer", "tasks:write"}  # every scope, and still only what a viewer may
    assert access.allowed_actions(viewer) == [access.Action.READ_TASK, access.Action.LIST_TASKS,
                                              access.Action.STREAM, access.Action.DOWNLOAD_ARTIFACT]
    assert not any(access.allows(viewer, action) for action in (access.Action.MANAGE_TOKENS,
                                                                access.Action.MANAGE_POLICY))


def test_it_records_who_started_a_task(world):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {world.tokens['operator']}")
    token = ApiToken.objects.get(user=world.users["operator"], name="matrix")

    created = client.post("/runtime/tasks", {"workflow": "demo_steps", "input": {"steps": 1},
                                             "budget": {"maxSteps": 5}}, format="json")

    task = Task.objects.get(id=created.json()["taskId"])
    assert created.status_code == 201
    assert (task.tenant_id, task.owner_id) == (world.a.id, world.users["operator"].id)
    assert task.agent_identity == f"token:{token.prefix}" and task.created_by_token_id == token.id
    assert task.budget_steps == 5


def test_it_gives_every_role_the_reads_the_snapshot_edges_answer_without_reading_roles():
    # The one-statement edges (tasks_app.web.snapshot_edge, mcp_bridge.poll_edge) check membership and tasks:read
    # only: the rule must let every member read, whatever their role.
    for action in access.TASK_READS:
        assert access.RULES[action].permissions == () and access.RULES[action].scope == "tasks:read"


def test_it_makes_the_groups_the_rule_describes():
    assert roles_migration.ROLES == access.ROLES  # (the migration keeps a frozen copy)
    assert not {"add_steeringcommand", "kill_task"} & set(access.ROLES["auditor"].get("steering_app", []))
    assert "kill_task" not in access.ROLES["operator"]["steering_app"]  # (granted per person)


def test_it_keeps_the_legacy_groups_working_and_maps_their_members(db):
    legacy = importlib.import_module("steering_app.migrations.0003_auditors_and_operators_groups")
    editor = SimpleNamespace(connection=connection)
    legacy.create_groups(global_apps, editor)
    tenant = tenant_get_or_create(slug="legacy")
    oscar = get_user_model().objects.create_user("oscar-legacy", is_staff=True)
    oscar.groups.add(Group.objects.get(name="operators"))
    tenant_membership_ensure(user=oscar, tenant=tenant)
    before = access.actor_for_user(get_user_model().objects.get(id=oscar.id))

    roles_migration.create_roles(global_apps, editor)

    after = access.actor_for_user(get_user_model().objects.get(id=oscar.id))
    assert access.allows(before, access.Action.STEER) and not access.allows(before, access.Action.KILL)
    assert set(oscar.groups.values_list("name", flat=True)) == {"operators", "operator"}
    assert access.allows(after, access.Action.CREATE_TASK)


def test_it_answers_an_unknown_id_not_found_in_the_rule(world):
    actor = access.actor_for_user(world.users["operator"])
    with pytest.raises(access.AccessNotFound):
        access.task_for(actor, access.Action.READ_TASK, uuid.uuid4())


def test_it_lets_a_member_in_no_role_read_signed_in_and_its_tokens_keep_their_scopes(world):
    member = get_user_model().objects.create_user("matrix-no-role", is_staff=True)
    tenant_membership_ensure(user=member, tenant=world.a)
    token = api_token_create(tenant=world.a, user=member, name="old client")[0]
    session = access.actor_for_user(get_user_model().objects.get(id=member.id))
    bearer = access.actor_for_token(ApiToken.objects.select_related("tenant", "user").get(id=token.id))
    client = APIClient()
    client.force_login(member)

    forked = client.post(f"/runtime/tasks/{world.a_task}/fork", {}, format="json")

    # Signed in: what a viewer may (the reader), no longer create or fork.
    assert access.allowed_actions(session) == sorted(access.TASK_READS, key=list(access.Action).index)
    assert forked.status_code == 403
    # Its tokens: what their scopes say, as before roles — never kill, the audit trail, export or managing.
    assert set(access.allowed_actions(bearer)) == access.MEMBER_TOKEN
    assert client.get(f"/runtime/tasks/{world.a_task}").status_code == 200
