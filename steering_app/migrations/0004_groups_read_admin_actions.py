"""Both console roles read the audit trail of admin actions (tasks_app.AdminAction, tasks_app migration 0021):
`auditors` and `operators` get tasks_app.view_adminaction, as they read events and steering commands.

Safe to run again; reversing takes back only this permission. The permission may not exist yet on a fresh database
(Django creates permissions after all migrations): it is created here first, as migration 0003 does.
"""

from django.contrib.auth.management import create_permissions
from django.db import migrations

GROUPS = ("auditors", "operators")


def _permission(apps, schema_editor):
    app_config = apps.get_app_config("tasks_app")
    original = getattr(app_config, "models_module", None)
    app_config.models_module = original or True  # (a historical app config has none: create_permissions skips it)
    try:
        create_permissions(app_config, apps=apps, verbosity=0, using=schema_editor.connection.alias)
    finally:
        app_config.models_module = original
    return apps.get_model("auth", "Permission").objects.get(content_type__app_label="tasks_app",
                                                            codename="view_adminaction")


def grant(apps, schema_editor):
    permission = _permission(apps, schema_editor)
    for group in apps.get_model("auth", "Group").objects.filter(name__in=GROUPS):
        group.permissions.add(permission)


def take_back(apps, schema_editor):
    Permission = apps.get_model("auth", "Permission")
    permission = Permission.objects.filter(content_type__app_label="tasks_app", codename="view_adminaction").first()
    if permission is None:
        return
    for group in apps.get_model("auth", "Group").objects.filter(name__in=GROUPS):
        group.permissions.remove(permission)


class Migration(migrations.Migration):
    dependencies = [
        ("steering_app", "0003_auditors_and_operators_groups"),
        ("tasks_app", "0022_admin_action_and_decision_index"),
    ]
    operations = [migrations.RunPython(grant, take_back)]
