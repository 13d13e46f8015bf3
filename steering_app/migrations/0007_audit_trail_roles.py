"""Who reads the audit trail (issue 24): an auditor and a tenant admin (of its tenant), not an operator.

- `operator` loses tasks_app.view_taskevent and view_adminaction: the audit pages (steering_app.audit) are not an
  operator's; it still reads each task's own history (events, steps, effects) on the task's page, which needs only
  view_task, and the steering commands (view_steeringcommand).
- `tenant-admin` gains view_taskevent, view_adminaction and steering_app.view_steeringcommand: its tenant's audit
  trail (tasks_app.access.Action.READ_AUDIT). Not export_task: exporting is an auditor's.

A frozen copy of tasks_app.access.ROLES as of this migration (tests/test_access_matrix.py checks the latest copy
agrees); 0006's create_roles does the rest (permissions set to exactly the role's, safe to run again). Reversing
sets 0006's table back.
"""

import importlib

from django.db import migrations

roles_0006 = importlib.import_module("steering_app.migrations.0006_roles")

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
        "tasks_app": ["view_task", "view_step", "view_tenant", "add_task"],
        "checkpoints_app": ["view_checkpoint", "view_sideeffect"],
        "steering_app": ["view_steeringcommand", "add_steeringcommand"],
    },
    "tenant-admin": {
        "tasks_app": ["view_task", "view_step", "view_taskevent", "view_tenant", "view_tenantmembership",
                      "add_tenantmembership", "change_tenantmembership", "delete_tenantmembership", "view_apitoken",
                      "change_apitoken", "view_adminaction"],
        "steering_app": ["view_steeringcommand"],
        "agents_app": ["view_toolserver", "add_toolserver", "change_toolserver", "delete_toolserver",
                       "view_tenanttoolpolicy", "add_tenanttoolpolicy", "change_tenanttoolpolicy",
                       "view_tenantmodel", "add_tenantmodel", "change_tenantmodel"],
    },
}


def _set_roles(apps, roles: dict) -> None:
    Group = apps.get_model("auth", "Group")
    for name, wanted in roles.items():
        group, _ = Group.objects.get_or_create(name=name)
        group.permissions.set(roles_0006._permissions(apps, wanted))


def create_roles(apps, schema_editor):
    """0006's groups (and its legacy members' mapping), then this table."""
    roles_0006.create_roles(apps, schema_editor)
    _set_roles(apps, ROLES)


def back_to_0006(apps, schema_editor):
    _set_roles(apps, roles_0006.ROLES)


class Migration(migrations.Migration):
    dependencies = [("steering_app", "0006_roles")]
    operations = [migrations.RunPython(create_roles, back_to_0006)]
