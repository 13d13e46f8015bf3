"""The two console roles, as groups: `auditors` read tasks and the audit trail and cannot steer; `operators` also
steer (steering_app.add_steeringcommand: every steering page and action of the admin checks it).

- kill_task is not given to `operators`: a kill fences out the running worker mid-step and leaves its in-flight
  effect to be reconciled like a crash's. It is granted to a person (user permission), by name, so that adding
  someone to `operators` never confers it.
- Neither group gets tasks_app.view_apitoken: the token admin's "revoke" action is offered to anyone who may view
  the token list, so a viewer could revoke tokens.

Safe to run again (get_or_create, permissions added, not replaced). The permissions may not exist yet on a fresh
database (Django creates them after all migrations, in post_migrate): they are created here first, the usual way.
Reversing takes back what this migration gave, and deletes a group only when nothing else is left in it (no other
permission, no member): a rollback never silently drops anyone's membership.
"""

from django.conf import settings
from django.contrib.auth.management import create_permissions
from django.db import migrations

APPS = ("tasks_app", "checkpoints_app", "steering_app")
READ = {
    "tasks_app": ["view_task", "view_step", "view_taskevent", "view_tenant", "view_tenantmembership"],
    "checkpoints_app": ["view_checkpoint", "view_sideeffect"],
    "steering_app": ["view_steeringcommand"],
}
GROUPS = {
    "auditors": READ,
    "operators": {**READ, "steering_app": [*READ["steering_app"], "add_steeringcommand"]},
}


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


def create_groups(apps, schema_editor):
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
    Permission = apps.get_model("auth", "Permission")
    for name, wanted in GROUPS.items():
        group, _ = Group.objects.get_or_create(name=name)
        group.permissions.add(*_permissions(apps, wanted))
    # An auditor reads and never writes, also if the group was edited before: no add/change/delete, no kill.
    auditors = Group.objects.get(name="auditors")
    auditors.permissions.remove(*Permission.objects.filter(content_type__app_label__in=APPS)
                                .exclude(codename__startswith="view_"))


def remove_groups(apps, schema_editor):
    Group = apps.get_model("auth", "Group")
    User = apps.get_model(settings.AUTH_USER_MODEL)
    for name, wanted in GROUPS.items():
        group = Group.objects.filter(name=name).first()
        if group is None:
            continue
        group.permissions.remove(*_permissions(apps, wanted))
        if not group.permissions.exists() and not User.objects.filter(groups=group).exists():
            group.delete()


class Migration(migrations.Migration):
    dependencies = [
        ("steering_app", "0002_kill_command"),
        ("tasks_app", "0014_task_waits_and_policies"),
        ("checkpoints_app", "0003_natural_primary_key"),
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]
    operations = [migrations.RunPython(create_groups, remove_groups)]
