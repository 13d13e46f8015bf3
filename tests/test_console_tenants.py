"""The console under the one access rule, generated (issue 37, finding 4): every URL of the admin — read from the
URLconf, so a page added later is visited too — as each role of tenant A, with tenant B's objects present (a task
of B that is dead-lettered with an effect of unknown outcome, one that was recovered and steered, its checkpoint,
its audit entries, token, member, tool server, policy and model, an OAuth client of B's user).

- No page shows anything of B: no id, name, key, reason or URL of B's (the markers below, each unique to B).
- A page naming one of B's objects (its change, history and delete pages, a task's custom pages, the "Call a tool"
  page, the audit's verification) answers 404, 403 or a redirect — never 200.
- Each role sees its own tenant's objects where it may (the same markers of A's are found), and staff of no tenant
  see B's (so a marker, were it leaked, would be found: the check can fail).
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass, field
from types import SimpleNamespace
from urllib.parse import urlsplit

import pytest
from django.apps import apps as global_apps
from django.contrib import admin
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.contrib.contenttypes.models import ContentType
from django.db import connection
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver
from django.urls.resolvers import RegexPattern, RoutePattern

from agents_app.models import TenantModel, TenantToolPolicy, ToolServer
from checkpoints_app.models import Checkpoint, SideEffect
from steering_app.models import SteeringCommand
from steering_app.services import steering_submit
from tasks_app.audit.retention import purge_allowed
from tasks_app.models import AdminAction, ApiToken, Task, Tenant, TenantMembership
from tasks_app.services import admin_action_record, api_token_create, task_create, tenant_get_or_create, \
    tenant_membership_ensure

pytestmark = [pytest.mark.django_db]

roles_migration = importlib.import_module("steering_app.migrations.0007_audit_trail_roles")
ROLES = ("viewer", "auditor", "operator", "tenant-admin")
PREFIX = "ctn-"  # every username of this module (removed at the end)


@dataclass
class Side:
    """One tenant's objects: by model label, the primary keys; and the texts that are this tenant's alone."""

    tenant: Tenant
    objects: dict[str, list] = field(default_factory=dict)
    markers: list[str] = field(default_factory=list)
    tasks: list[Task] = field(default_factory=list)
    server: int = 0


def _side(letter: str, word: str) -> Side:
    """A tenant and its objects, every text of them carrying ``word`` (unique to this tenant)."""
    User = get_user_model()
    tenant = tenant_get_or_create(slug=f"ctn-{word}", name=f"Tenant {word.capitalize()}")
    side = Side(tenant=tenant)
    owner = User.objects.create_user(f"{PREFIX}{word}-owner")
    tenant_membership_ensure(user=owner, tenant=tenant)
    token, _ = api_token_create(tenant=tenant, user=owner, name=f"{word}-token-name")
    dead = task_create(tenant=tenant, owner=owner, workflow="demo_steps", input={"steps": 2}).task
    Task.objects.filter(id=dead.id).update(status="dead_lettered", status_message=f"{word}-dead-message",
                                           error={"reason": f"{word}-dead-reason"}, recoveries=3)
    effect = SideEffect.objects.create(task=dead, step_seq=1, key=f"{dead.id}:1:{word}-effect-name",
                                       name=f"{word}-effect-name", status="unknown", lease_epoch=1)
    steered = task_create(tenant=tenant, owner=owner, workflow="demo_steps", input={"steps": 2}).task
    Task.objects.filter(id=steered.id).update(recoveries=2, status_message=f"{word}-recovered-message")
    steering_submit(task=Task.objects.get(id=steered.id), command_type="pause", expected_version=None,
                    reason=f"{word}-steer-reason", requested_by=f"token:{token.prefix}")
    checkpoint = Checkpoint.objects.create(task=steered, sequence=1, schema_version=1, payload="{}",
                                           checksum="0" * 64, size_bytes=2)
    server = ToolServer.objects.create(tenant=tenant, name=f"{word}-tools", url=f"https://{word}-tools.invalid/mcp",
                                       tools=[{"name": f"{word}_tool", "inputSchema": {"type": "object"}}])
    policy = TenantToolPolicy.objects.create(tenant=tenant, deny=[f"{word}_denied.*"])
    model = TenantModel.objects.create(tenant=tenant, name=f"{word}-model", base_url=f"https://{word}-model.invalid/v1")
    record = admin_action_record(actor=f"user:{owner.username}", action="change", obj=server,
                                 message=f"{word}-admin-message")
    membership = TenantMembership.objects.get(user=owner)
    side.tasks = [dead, steered]
    side.server = server.pk
    side.objects = {
        "tasks_app.task": [dead.id, steered.id], "tasks_app.tenant": [tenant.pk],
        "tasks_app.tenantmembership": [membership.pk], "tasks_app.apitoken": [token.pk],
        "checkpoints_app.checkpoint": [checkpoint.pk], "agents_app.toolserver": [server.pk],
        "agents_app.tenanttoolpolicy": [policy.pk], "agents_app.tenantmodel": [model.pk],
        get_user_model()._meta.label_lower: [owner.pk],
    }
    try:  # an OAuth client of the tenant's person (the OAuth toolkit's admin lists clients of every user)
        from oauth2_provider.models import Application

        app = Application.objects.create(name=f"{word}-oauth-client", user=owner, client_type="public",
                                         authorization_grant_type="authorization-code",
                                         redirect_uris=f"https://{word}-client.invalid/cb")
        side.objects["oauth2_provider.application"] = [app.pk]
    except ImportError:  # pragma: no cover
        pass
    # Texts that are this tenant's alone: a task's id (and its random end, as the task list shortens it), its
    # tenant, person, token, reason, effect key, steering reason, server, model, audit message.
    for task in (dead, steered):
        side.markers += [str(task.id), str(task.id)[-12:]]
    side.markers += [tenant.slug, tenant.name, owner.username, token.prefix, f"{word}-dead-reason",
                     f"{word}-dead-message", f"{word}-recovered-message", effect.key, f"{word}-effect-name",
                     f"{word}-steer-reason", f"{word}-tools", f"{word}-model", f"{word}_tool", f"{word}_denied",
                     f"{word}-admin-message", f"{word}-token-name", f"{word}-oauth-client"]
    assert record.tenant_id == tenant.pk
    return side


@dataclass
class World:
    a: Side
    b: Side
    users: dict
    everyone: object  # staff of no tenant: sees every tenant


@pytest.fixture(scope="module")
def world(django_db_setup, django_db_blocker):
    with django_db_blocker.unblock():
        roles_migration.create_roles(global_apps, SimpleNamespace(connection=connection))
        a, b = _side("a", "alpha"), _side("b", "bravo")
        User = get_user_model()
        users = {}
        for role in ROLES:
            user = User.objects.create_user(f"{PREFIX}{role}", is_staff=True)
            user.groups.add(Group.objects.get(name=role))
            tenant_membership_ensure(user=user, tenant=a.tenant)
            users[role] = user
        everyone = User.objects.create_user(f"{PREFIX}fleet-operator", is_staff=True)
        everyone.groups.add(Group.objects.get(name="auditor"), Group.objects.get(name="operator"))
        world = World(a=a, b=b, users=users, everyone=everyone)
    yield world
    with django_db_blocker.unblock():
        tenants = [a.tenant.id, b.tenant.id]
        with purge_allowed():  # (events and admin actions are append-only outside the retention purge)
            SteeringCommand.objects.filter(task__tenant_id__in=tenants).delete()
            SideEffect.objects.filter(task__tenant_id__in=tenants).delete()
            Checkpoint.objects.filter(task__tenant_id__in=tenants).delete()
            Task.objects.filter(tenant_id__in=tenants).delete()
            AdminAction.objects.filter(tenant_id__in=tenants).delete()
            AdminAction.objects.filter(actor__startswith=f"user:{PREFIX}").delete()
            for model in (ToolServer, TenantToolPolicy, TenantModel, ApiToken, TenantMembership):
                model.objects.filter(tenant_id__in=tenants).delete()
            try:
                from oauth2_provider.models import Application

                Application.objects.filter(user__username__startswith=PREFIX).delete()
            except ImportError:  # pragma: no cover
                pass
            User.objects.filter(username__startswith=PREFIX).delete()
            Tenant.objects.filter(id__in=tenants).delete()


# -- the admin's URLs, from the URLconf ----------------------------------------------------------------------------
_PARAMETER = re.compile(r"<(?:(?P<converter>[^>:]+):)?(?P<name>[^>]+)>")


def _route_text(pattern) -> str:
    if isinstance(pattern, RoutePattern):
        return str(pattern._route)
    if isinstance(pattern, RegexPattern):
        return str(pattern._regex)
    raise AssertionError(f"a URL pattern of a kind this test does not read: {pattern!r}")


def admin_routes() -> list[tuple[str, str | None]]:
    """(route, name) of every URL pattern under /admin/ (the audit pages' included), routes joined as written."""
    found = []

    def walk(patterns, prefix: str) -> None:
        for pattern in patterns:
            text = prefix + _route_text(pattern.pattern).lstrip("^")
            if isinstance(pattern, URLResolver):
                walk(pattern.url_patterns, text.rstrip("$"))
            elif isinstance(pattern, URLPattern):
                found.append((text, pattern.name))

    walk(get_resolver().url_patterns, "")
    return [(route, name) for route, name in found if route.startswith("admin/")]


def _model_of(route: str):
    """The model a route of a model admin is under (admin/<app>/<model>/…), if any."""
    parts = route.split("/")
    if len(parts) > 3:
        for model in admin.site._registry:
            if (model._meta.app_label, model._meta.model_name) == (parts[1], parts[2]):
                return model
    return None


def urls_for(side: Side) -> list[str]:
    """Every admin URL, each parameter filled with ``side``'s objects (every one of them where a parameter names an
    object): pages of lists and forms once, pages of an object once per object of the side."""
    urls = []
    task_ct = ContentType.objects.get_for_model(Task).pk
    for route, name in admin_routes():
        if name == "app_list":
            urls += [f"/admin/{label}/" for label in sorted({m._meta.app_label for m in admin.site._registry})]
            continue
        if "(?P<url>" in route:  # the admin's catch-all
            urls.append("/admin/no-such-page/")
            continue
        if name == "view_on_site":
            urls += [f"/admin/r/{task_ct}/{task.id}/" for task in side.tasks]
            continue
        names = [match.group("name") for match in _PARAMETER.finditer(route)]
        model = _model_of(route)
        values: dict[str, list] = {
            "object_id": side.objects.get(model._meta.label_lower, []) if model else [],
            "id": side.objects.get(model._meta.label_lower, []) if model else [],  # (a user's password page)
            "task_id": [task.id for task in side.tasks], "server_id": [side.server],
            "kind": ["events", "steps", "effects"], "name": ["report.txt"],
        }
        if not names:
            urls.append("/" + route.rstrip("$"))
            continue
        assert set(names) <= set(values), f"{route}: fill its parameters {names} in this test"
        for combination in _fill(names, values):
            url = route
            for parameter, value in combination.items():
                url = _PARAMETER.sub(lambda m, p=parameter, v=value: str(v) if m.group("name") == p else m.group(0),
                                     url)
            urls.append("/" + url.rstrip("$"))
    return sorted(set(urls))


def _fill(names: list[str], values: dict[str, list]) -> list[dict]:
    combinations = [{}]
    for name in names:
        combinations = [{**c, name: value} for c in combinations for value in values[name]]
    return combinations


def extra_urls(side: Side) -> list[str]:
    """Queries a person types: a search, a filter on the tenant, the autocomplete of each foreign key, the audit
    pages filtered on a task of the side (its events, commands, chain)."""
    urls = []
    for model, model_admin in admin.site._registry.items():
        base = f"/admin/{model._meta.app_label}/{model._meta.model_name}/"
        urls.append(f"{base}?q={side.tenant.slug}&_popup=1&_to_field=id")  # (a search, in the raw-id popup)
        if any(f.name == "tenant" for f in model._meta.get_fields()):
            urls.append(f"{base}?tenant__id__exact={side.tenant.pk}")
        for db_field in model._meta.get_fields():
            if db_field.is_relation and db_field.many_to_one and db_field.concrete:
                urls.append(f"/admin/autocomplete/?app_label={model._meta.app_label}&model_name="
                            f"{model._meta.model_name}&field_name={db_field.name}&term=")
    for task in side.tasks:
        for page in ("events/", "commands/", "events.csv", "commands.csv"):
            urls.append(f"/admin/audit/{page}?task={task.id}")
        urls.append(f"/admin/audit/verify/?task={task.id}")
        urls.append(f"/admin/checkpoints_app/checkpoint/?task__id__exact={task.id}")
    urls.append(f"/admin/audit/admin-actions/?tenant={side.tenant.slug}")
    urls.append(f"/admin/audit/admin-actions.csv?tenant={side.tenant.slug}")
    return urls


def body_of(response) -> str:
    if getattr(response, "streaming", False):
        return b"".join(response.streaming_content).decode(errors="replace")
    return response.content.decode(errors="replace")


def names_a_b_object(url: str, side: Side) -> bool:
    """A page of one of the side's objects: its id in the path (a query naming one is a filter: a list, empty)."""
    path = urlsplit(url).path
    ids = [str(v) for values in side.objects.values() for v in values] + [str(side.server)]
    return any(f"/{i}/" in path for i in ids)


def _request_of(user):
    """A request of ``user`` for asking a model admin which bulk actions it offers."""
    from django.test import RequestFactory

    request = RequestFactory().get("/admin/")
    request.user = user
    return request


def _state_of(side: Side) -> tuple:
    """What a bulk action could change of a side's objects: its tasks' states, commands, tokens, rows."""
    tenant = side.tenant.pk
    return (sorted(Task.objects.filter(tenant_id=tenant).values_list("id", "status", "state_version")),
            SteeringCommand.objects.filter(task__tenant_id=tenant).count(),
            sorted(ApiToken.objects.filter(tenant_id=tenant).values_list("id", "revoked_at")),
            ToolServer.objects.filter(tenant_id=tenant).count(), TenantModel.objects.filter(tenant_id=tenant).count(),
            TenantToolPolicy.objects.filter(tenant_id=tenant).count(),
            TenantMembership.objects.filter(tenant_id=tenant).count(), Tenant.objects.filter(id=tenant).count(),
            Checkpoint.objects.filter(task__tenant_id=tenant).count(),
            get_user_model().objects.filter(username__startswith=f"{PREFIX}bravo").count())


# -- the test -------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("role", ROLES)
def test_it_shows_no_object_of_another_tenant_on_any_admin_page_to_any_role(world, role):
    client = Client()
    client.force_login(world.users[role])
    leaks, opened, seen_own = [], [], set()
    plain = urls_for(world.a) + extra_urls(world.a)  # pages of lists, forms, and of A's objects
    of_b = [url for url in urls_for(world.b) + extra_urls(world.b) if url not in set(plain)]

    for url in sorted(set(plain)) + of_b:
        # (the logout page signs out; the password pages are the person's own: they name no tenant's object)
        if "/logout/" in url:
            continue
        response = client.get(url)
        client.cookies.pop("messages", None)  # (a redirect's "no such object" note echoes the id this test sent)
        assert response.status_code < 500, (url, response.status_code)
        body = body_of(response)
        said = [marker for marker in world.b.markers if marker in body and marker not in url]
        if said:
            leaks.append((url, response.status_code, said[:3]))
        if url in of_b and names_a_b_object(url, world.b) and response.status_code == 200:
            opened.append(url)
        seen_own.update(marker for marker in world.a.markers if marker in body)

    # Every bulk action of every admin, posted on B's objects (as a forged form would): none touches them.
    before = _state_of(world.b)
    for model, model_admin in admin.site._registry.items():
        chosen = world.b.objects.get(model._meta.label_lower)
        if not chosen:
            continue
        url = f"/admin/{model._meta.app_label}/{model._meta.model_name}/"
        for action in {*model_admin.get_action_choices(_request_of(world.users[role]), []), ("delete_selected", "")}:
            response = client.post(url, {"action": action[0], "_selected_action": chosen, "post": "yes",
                                         "reason": "forged", "index": 0})
            client.cookies.pop("messages", None)
            assert response.status_code < 500, (url, action[0], response.status_code)
            said = [marker for marker in world.b.markers if marker in body_of(response)]
            assert not said, (role, url, action[0], said)
    assert _state_of(world.b) == before, role

    assert not leaks, f"{role} was shown tenant B's objects: {leaks[:10]}"
    assert not opened, f"{role} opened pages of tenant B's objects (200): {opened[:10]}"
    # The check can fail: the same markers of its own tenant's are found (its tasks, at least; the roles that manage
    # or audit see more), so a marker of B's shown on a page would be found too.
    assert {str(task.id) for task in world.a.tasks} <= seen_own, (role, sorted(seen_own))
    if role in ("tenant-admin", "auditor"):
        assert {"alpha-tools", "alpha-admin-message"} <= seen_own, (role, sorted(seen_own))


def test_it_shows_every_tenant_to_staff_of_no_tenant(world):
    """The same pages, as staff who belong to no tenant (the deployment's operators): B's dead letter, recovery and
    audit entries are there — the markers are ones a page shows."""
    client = Client()
    client.force_login(world.everyone)
    dead, steered = world.b.tasks
    pages = {url: body_of(client.get(url)) for url in (
        "/admin/tasks_app/task/dead-letters/", "/admin/tasks_app/task/overview/", "/admin/audit/commands/",
        "/admin/tasks_app/task/")}

    assert str(dead.id) in pages["/admin/tasks_app/task/dead-letters/"]
    assert "bravo-dead-reason" in pages["/admin/tasks_app/task/dead-letters/"]
    assert str(steered.id) in pages["/admin/tasks_app/task/overview/"]
    assert "bravo-steer-reason" in pages["/admin/audit/commands/"]
    assert str(dead.id)[-4:] in pages["/admin/tasks_app/task/"]
