"""The four roles of the one access rule (tasks_app.access), as groups with permissions:

- `viewer`: reads its tenant's tasks, nothing else;
- `auditor`: reads everything — tasks, events, steering commands, admin actions, checkpoints, effects, tool
  servers and policy — and exports (tasks_app.export_task); steers nothing;
- `operator`: reads tasks and the audit trail, starts and forks tasks, steers, answers and approves (the steering
  permission). Not the kill: kill_task is granted to a person by name, as before (migration 0003 says why);
- `tenant-admin`: its tenant's members, tokens (view and revoke), tool servers, tool policy and model endpoint;
  reads tasks. Which tenant: the admin shows a staff member of a tenant only that tenant's rows.

The legacy groups `operators` and `auditors` (0003, 0004) stay as they are, and still work (the rule reads
permissions, not group names); their members are added to `operator` and `auditor`, which give a little more
(starting and forking tasks; export).

A frozen copy of tasks_app.access.ROLES (tests/test_access_matrix.py checks they agree). Safe to run again
(get_or_create; permissions set to exactly the role's). The permissions may not exist yet on a fresh database
(Django makes them after all migrations): they are created here first, as 0003 does. Reversing deletes the four
groups (their memberships with them); the legacy groups and their members are untouched.
"""

from django.conf import settings
from django.contrib.auth.management import create_permissions
from django.db import migrations

APPS = ("tasks_app", "checkpoints_app", "steering_app", "agents_app")
_TASK_READS = {"tasks_app": ["view_task", "view_step", "view_tenant"], "checkpoints_app": ["view_checkpoint"]}
ROLES = {
    "viewer": _TASK_READS,
    "auditor": {
        "tasks_app": ["view_task", "view_step", "view_taskevent", "view_tenant", "view_tenantmembership",
                      "view_adminaction", "export_task"],
        "checkpoints_app": ["view_checkpoint", "view_sideeffect"],
        "steering_app": ["view_steeringcommand"],
        "agents_app": ["view_toolserver", "view_tenanttoolpolicy", "view_tenantmodel"],
    },
    "operator": {
        "tasks_app": ["view_task", "view_step", "view_taskevent", "view_tenant", "view_adminaction", "add_task"],
        "checkpoints_app": ["view_checkpoint", "view_sideeffect"],
        "steering_app": ["view_steeringcommand", "add_steeringcommand"],
    },
    "tenant-admin": {
        "tasks_app": ["view_task", "view_step", "view_tenant", "view_tenantmembership", "add_tenantmembership",
                      "change_tenantmembership", "delete_tenantmembership", "view_apitoken", "change_apitoken"],
        "agents_app": ["view_toolserver", "add_toolserver", "change_toolserver", "delete_toolserver",
                       "view_tenanttoolpolicy", "add_tenanttoolpolicy", "change_tenanttoolpolicy",
                       "view_tenantmodel", "add_tenantmodel", "change_tenantmodel"],
    },
}
LEGACY = {"operators": "operator", "auditors": "auditor"}


def _permissions(apps, wanted: dict[str, list[str]]) -> list:
    Permission = apps.get_model("auth", "Permission")
    found = []
    for app_label, codenames in wanted.items():
        rows = list(Permission.objects.filter(content_type__app_label=app_label, codename__in=codenames))
        missing = set(codenames) - {row.codename for row in rows}
        if missing:
            raise RuntimeError(f"Permissions {sorted(missing)} of {app_label} do not exist: a model was renamed?")
        found += rows
    return found


def create_roles(apps, schema_editor):
    using = schema_editor.connection.alias
    for label in APPS:
        app_config = apps.get_app_config(label)
        original = getattr(app_config, "models_module", None)
        app_config.models_module = original or True  # (historical app configs have none: create_permissions
        try:                                           # would skip them)
            create_permissions(app_config, apps=apps, verbosity=0, using=using)
        finally:
            app_config.models_module = original
    Group = apps.get_model("auth", "Group")
    User = apps.get_model(settings.AUTH_USER_MODEL)
    for name, wanted in ROLES.items():
        group, _ = Group.objects.get_or_create(name=name)
        group.permissions.set(_permissions(apps, wanted))
    for legacy, role in LEGACY.items():
        members = User.objects.filter(groups__name=legacy)
        Group.objects.get(name=role).user_set.add(*members)


def remove_roles(apps, schema_editor):
    apps.get_model("auth", "Group").objects.filter(name__in=ROLES).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("steering_app", "0005_set_budget_command"),
        ("tasks_app", "0030_task_agent_identity"),
        ("agents_app", "0007_tenant_model"),
        ("checkpoints_app", "0003_natural_primary_key"),
        ("auth", "0012_alter_user_first_name_max_length"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]
    operations = [migrations.RunPython(create_roles, remove_roles)]
