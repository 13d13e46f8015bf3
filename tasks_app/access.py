"""The one access rule: who may do what to which tenant's tasks, for every interface (REST, SSE, the admin, MCP, the
CLI through REST, management commands). Each interface resolves its caller to an ``Actor`` and asks
``access_check(actor, action, task=…)``; none decides on its own.

The rule, in order:
1. **Tenant first.** A task of another tenant is *not found* (AccessNotFound: 404, MCP -32602), whatever the
   action: its existence never leaks, not even as a 403. Staff without a tenant (the operators' console) and
   superusers, signed in, see every tenant; anyone else only the tenant of their membership (one per user), and a
   token always only its own.
2. **The role.** An action needs a Django permission (RULES), given by the role groups (ROLES, made by
   steering_app migration 0006): `tenant-admin`, `operator`, `auditor`, `viewer`. Reading a tenant's tasks (read,
   list, stream, download) needs no permission: every member may, which is what the one-statement snapshot edges
   (tasks_app.web.snapshot_edge, mcp_bridge.poll_edge) rely on — they check membership and tasks:read only.
3. **The token narrows.** A bearer token may do what its scopes allow *and* its user's role allows (scopes ∩ role):
   a token never does more than its user could signed in. No token manages members, tokens, tool servers or policy.

A tenant member in no role (no permission of RULES or ROLES, as every account was before roles): signed in, it
reads its tenant's tasks — what a viewer may, nothing more (it no longer creates or forks: that is an operator's).
Its bearer tokens keep what their scopes say (read; create and fork; steer, cancel, answer), as they did before
roles, for the API clients that hold them (kill still needs the kill permission, never audit, export or any
managing). Put the account in a role group to govern it by the role instead. The legacy groups `operators` and
`auditors` (migration 0003) keep working: the rule reads permissions, not group names; migration 0006 also makes
their members `operator` / `auditor`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from django.db.models import Q

from tasks_app.audit.actors import actor_name
from tasks_app.models import ApiToken, Task, Tenant, TenantMembership

READ, WRITE, STEER = "tasks:read", "tasks:write", "steer"


class Action(enum.StrEnum):
    READ_TASK = "read_task"
    LIST_TASKS = "list_tasks"
    STREAM = "stream"
    DOWNLOAD_ARTIFACT = "download_artifact"
    CREATE_TASK = "create_task"
    FORK = "fork"
    STEER = "steer"
    CANCEL = "cancel"
    ANSWER = "answer"  # provide input, approve or reject a wait
    KILL = "kill"
    READ_AUDIT = "read_audit"
    EXPORT = "export"
    MANAGE_TOKENS = "manage_tokens"
    MANAGE_TOOL_SERVERS = "manage_tool_servers"
    MANAGE_POLICY = "manage_policy"
    MANAGE_MEMBERS = "manage_members"


@dataclass(frozen=True)
class Rule:
    permissions: tuple[str, ...]  # all needed ("app_label.codename"); () for every member of the tenant
    scope: str | None  # the token scope it needs; None: no token may


STEER_PERMISSION = "steering_app.add_steeringcommand"
KILL_PERMISSION = "steering_app.kill_task"
EXPORT_PERMISSION = "tasks_app.export_task"
READ_AUDIT_PERMISSION = "tasks_app.view_taskevent"

RULES: dict[Action, Rule] = {
    Action.READ_TASK: Rule((), READ),
    Action.LIST_TASKS: Rule((), READ),
    Action.STREAM: Rule((), READ),
    Action.DOWNLOAD_ARTIFACT: Rule((), READ),
    Action.CREATE_TASK: Rule(("tasks_app.add_task",), WRITE),
    Action.FORK: Rule(("tasks_app.add_task",), WRITE),
    Action.STEER: Rule((STEER_PERMISSION,), STEER),
    Action.CANCEL: Rule((STEER_PERMISSION,), WRITE),
    Action.ANSWER: Rule((STEER_PERMISSION,), WRITE),
    Action.KILL: Rule((STEER_PERMISSION, KILL_PERMISSION), STEER),
    # The audit trail (steering_app.audit: events, steering commands, admin actions, chain verification, CSV):
    # an auditor's and a tenant admin's (of their tenant), not an operator's or a viewer's — they read a task's
    # own history on its page. Exporting it needs the export permission too: an auditor's.
    Action.READ_AUDIT: Rule((READ_AUDIT_PERMISSION,), READ),
    Action.EXPORT: Rule((READ_AUDIT_PERMISSION, EXPORT_PERMISSION), READ),
    Action.MANAGE_TOKENS: Rule(("tasks_app.change_apitoken",), None),
    Action.MANAGE_TOOL_SERVERS: Rule(("agents_app.change_toolserver",), None),
    Action.MANAGE_POLICY: Rule(("agents_app.change_tenanttoolpolicy",), None),
    Action.MANAGE_MEMBERS: Rule(("tasks_app.change_tenantmembership",), None),
}
TASK_READS = frozenset({Action.READ_TASK, Action.LIST_TASKS, Action.STREAM, Action.DOWNLOAD_ARTIFACT})
# What a tenant member in no role does (see the module's docstring): a session reads (a viewer); a token does what
# its scopes say (kill excepted), as every token did before roles.
MEMBER_SESSION = TASK_READS
MEMBER_TOKEN = TASK_READS | {Action.CREATE_TASK, Action.FORK, Action.STEER, Action.CANCEL, Action.ANSWER}

_TASK_READS_PERMS = {"tasks_app": ["view_task", "view_step", "view_tenant"], "checkpoints_app": ["view_checkpoint"]}
_AUDIT_READS = {
    "tasks_app": ["view_task", "view_step", "view_taskevent", "view_tenant", "view_tenantmembership",
                  "view_adminaction", "export_task"],
    "checkpoints_app": ["view_checkpoint", "view_sideeffect"],
    "steering_app": ["view_steeringcommand"],
    "agents_app": ["view_toolserver", "view_tenanttoolpolicy", "view_tenantmodel"],
}
# The roles: the permissions of each group (by app label). steering_app migration 0006 makes the groups with a
# frozen copy of this table; tests/test_access_matrix.py checks the two agree.
ROLES: dict[str, dict[str, list[str]]] = {
    "viewer": _TASK_READS_PERMS,
    "auditor": _AUDIT_READS,
    "operator": {  # (no view_taskevent, view_adminaction: the audit trail is not an operator's — steering_app 0007)
        "tasks_app": ["view_task", "view_step", "view_tenant", "add_task"],
        "checkpoints_app": ["view_checkpoint", "view_sideeffect"],
        "steering_app": ["view_steeringcommand", "add_steeringcommand"],  # kill_task: granted per person
    },
    "tenant-admin": {  # (the audit trail of its tenant: view_taskevent, view_adminaction, view_steeringcommand — 0007)
        "tasks_app": ["view_task", "view_step", "view_taskevent", "view_tenant", "view_tenantmembership",
                      "add_tenantmembership", "change_tenantmembership", "delete_tenantmembership", "view_apitoken",
                      "change_apitoken", "view_adminaction"],
        "steering_app": ["view_steeringcommand"],
        "agents_app": ["view_toolserver", "add_toolserver", "change_toolserver", "delete_toolserver",
                       "view_tenanttoolpolicy", "add_tenanttoolpolicy", "change_tenanttoolpolicy",
                       "view_tenantmodel", "add_tenantmodel", "change_tenantmodel"],
    },
}


# Holding any of these puts an account under its role (KILL_PERMISSION alone does not: it is given per person).
_ROLE_PERMISSIONS = frozenset({*(p for rule in RULES.values() for p in rule.permissions),
                               *(f"{app}.{codename}" for role in ROLES.values()
                                 for app, codenames in role.items() for codename in codenames)}) - {KILL_PERMISSION}


class AccessNotFound(Exception):
    """The task (or tenant) is not the actor's to see: answer exactly as for an id that does not exist."""


class AccessDenied(Exception):
    """The actor sees the task but may not do this to it; ``detail`` says why, for people."""

    def __init__(self, detail: str, *, scope: str | None = None):
        super().__init__(detail)
        self.detail, self.scope = detail, scope


@dataclass(frozen=True)
class Actor:
    """Who is asking, resolved once per request: ``name`` as the audit trail shows it (user:<name>,
    token:<prefix>), the tenant they act in (None with ``every_tenant``: staff without a tenant; None without it:
    nobody's), their permissions (``ALL`` for a superuser) and, for a token, its scopes."""

    name: str
    tenant: Tenant | None
    permissions: frozenset[str]
    scopes: frozenset[str] | None = None  # None: a session, not narrowed by scopes
    every_tenant: bool = False
    user: object = field(default=None, compare=False, repr=False)
    token_id: int | None = None

    @property
    def is_token(self) -> bool:
        return self.scopes is not None

    @property
    def agent_identity(self) -> str:
        """What a task this actor starts records as its agent identity: the token's prefix, "" for a person."""
        return self.name if self.is_token else ""


ALL = frozenset({"*"})
# The deployment itself (management commands run with shell access to it): every tenant, every permission.
SYSTEM = Actor(name="system:manage", tenant=None, permissions=ALL, every_tenant=True)


def permissions_of(user) -> frozenset[str]:
    """The user's permissions, "app_label.codename", in one statement (their own and their groups'); ALL for an
    active superuser, none for an inactive user."""
    if user is None or not user.is_active or not user.pk:
        return frozenset()
    if user.is_superuser:
        return ALL
    cached = getattr(user, "_access_permissions", None)
    if cached is None:
        from django.contrib.auth.models import Permission

        rows = (Permission.objects.filter(Q(user=user) | Q(group__user=user))
                .values_list("content_type__app_label", "codename").distinct())
        cached = user._access_permissions = frozenset(f"{app}.{codename}" for app, codename in rows)
    return cached


def _tenant_of(user) -> Tenant | None:
    membership = TenantMembership.objects.select_related("tenant").filter(user_id=user.pk).first()
    return membership.tenant if membership else None


def actor_for_user(user, *, tenant: Tenant | None = None) -> Actor:
    """A signed-in person: their membership's tenant (or ``tenant``, already read); every tenant for staff who
    belong to none (the operators' console) and for a superuser."""
    if tenant is None and user is not None and user.is_authenticated:
        tenant = _tenant_of(user)
    authenticated = user is not None and user.is_authenticated
    permissions = permissions_of(user) if authenticated else frozenset()
    # Every tenant: staff who belong to none (the operators' console), and a superuser, who holds every permission
    # (the development login is one, and a member of the default tenant).
    every = authenticated and ((tenant is None and user.is_staff) or permissions is ALL)
    return Actor(name=actor_name(user=user) if authenticated else "anonymous", tenant=tenant,
                 permissions=permissions, every_tenant=every, user=user)


def actor_for_token(token) -> Actor:
    """A bearer token (an ApiToken as tasks_app.web.authentication.token_lookup found it, or another kind with a
    tenant, a user and scopes — an OAuth access token — naming itself by ``actor_name``): its tenant, its scopes,
    its user's role."""
    name = getattr(token, "actor_name", None) or actor_name(token=token)
    return Actor(name=name, tenant=token.tenant, permissions=permissions_of(token.user),
                 scopes=frozenset(token.scopes or ()), user=token.user,
                 token_id=token.id if isinstance(token, ApiToken) else None)


def actor_for_request(request) -> Actor:
    """The request's actor, resolved once and kept on the request: the bearer token DRF authenticated, else the
    session's user."""
    actor = getattr(request, "_access_actor", None)
    if actor is None:
        token = getattr(request, "auth", None)
        if token is not None and all(hasattr(token, name) for name in ("scopes", "tenant", "user")):
            actor = actor_for_token(token)
        elif token is not None:  # a credential this rule does not know: it may do nothing (fails closed)
            actor = Actor(name="token:unknown", tenant=None, permissions=frozenset(), scopes=frozenset())
        else:
            actor = actor_for_user(request.user, tenant=getattr(request, "_runtime_tenant", None))
        request._access_actor = actor
    return actor


def _role_allows(actor: Actor, action: Action) -> bool:
    rule = RULES[action]
    if actor.permissions is ALL:
        return True
    if not rule.permissions:  # a tenant's members read its tasks; every tenant's, staff who may view tasks
        return actor.tenant is not None or "tasks_app.view_task" in actor.permissions
    if actor.tenant is not None and not (actor.permissions & _ROLE_PERMISSIONS):  # a member in no role
        if action is Action.KILL:  # (the kill permission is granted per person, on top of what they may do)
            return actor.is_token and KILL_PERMISSION in actor.permissions
        return action in (MEMBER_TOKEN if actor.is_token else MEMBER_SESSION)
    return all(permission in actor.permissions for permission in rule.permissions)


def allows(actor: Actor, action: Action, *, tenant: Tenant | None = None) -> bool:
    """Whether the actor's role (narrowed by its token's scopes) allows ``action`` at all, in its own tenant — and,
    given ``tenant`` (the tenant of a row: a token, a member, a tool server, a policy), in that one (rule 1)."""
    rule = RULES[action]
    if actor.tenant is None and not actor.every_tenant:
        return False
    if tenant is not None and not actor.every_tenant and actor.tenant.id != tenant.id:
        return False
    if actor.is_token and (rule.scope is None or rule.scope not in actor.scopes):
        return False
    return _role_allows(actor, action)


def allowed_actions(actor: Actor) -> list[Action]:
    return [action for action in Action if allows(actor, action)]


def refusal(actor: Actor, action: Action) -> str:
    """Why ``action`` is refused, for people: the scope a token lacks, or what the role allows."""
    rule = RULES[action]
    if actor.tenant is None and not actor.every_tenant:
        return "Your account belongs to no tenant; ask an operator to add it to one."
    if actor.is_token and rule.scope is None:
        return "A token cannot do this; sign in to the admin."
    if actor.is_token and rule.scope not in actor.scopes:
        return f"This token lacks the `{rule.scope}` scope; ask for a token that has it."
    if action in (Action.STEER, Action.CANCEL, Action.ANSWER):
        return "Your account may read tasks but not steer them."
    if action is Action.KILL:
        return "Killing a task needs the kill permission (steering_app.kill_task), granted per person."
    if action is Action.READ_AUDIT:
        return "The audit trail is read by auditors and tenant admins; your role does not include it."
    if action is Action.EXPORT:
        return "Exporting the audit trail needs the auditor role (tasks_app.export_task)."
    return f"Your role does not allow this ({action.value})."


def visible(actor: Actor, queryset):
    """``queryset`` (of tasks, or of rows with a ``tenant``) narrowed to what the actor may see."""
    if actor.every_tenant:
        return queryset
    if actor.tenant is None:
        return queryset.none()
    return queryset.filter(tenant_id=actor.tenant.id)


def access_check(actor: Actor, action: Action, *, tenant: Tenant | None = None, task: Task | None = None) -> None:
    """Raise unless ``actor`` may do ``action`` (to ``task``, or in ``tenant``): AccessNotFound for another tenant's
    task or tenant — checked first, so a refusal never tells that it exists — else AccessDenied saying why."""
    tenant_id = task.tenant_id if task is not None else (tenant.id if tenant is not None else None)
    if tenant_id is not None and not actor.every_tenant and (actor.tenant is None or actor.tenant.id != tenant_id):
        raise AccessNotFound(f"{action.value}: not found")
    if not allows(actor, action):
        rule = RULES[action]
        raise AccessDenied(refusal(actor, action), scope=rule.scope if actor.is_token else None)


def task_visible(actor: Actor, task_id) -> Task:
    """The task ``task_id`` if it is in a tenant the actor sees (rule 1 only), else AccessNotFound — for an unknown
    id and another tenant's alike: one read, scoped by tenant."""
    task = visible(actor, Task.objects.filter(id=task_id)).first()
    if task is None:
        raise AccessNotFound(f"No task {task_id}.")
    return task


def task_for(actor: Actor, action: Action, task_id) -> Task:
    """The task ``task_id`` if the actor may see it and do ``action`` to it: AccessNotFound as task_visible, then
    AccessDenied for a role or scope that does not allow it."""
    task = task_visible(actor, task_id)
    access_check(actor, action, task=task)
    return task
