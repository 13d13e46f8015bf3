"""Staff accounts for the console (the Django admin) and the groups and roles the steering_app migrations make.

Functions: ``signed_in``, ``staff_user``, ``staff_with``, ``staff_in``, ``groups_create``. Fixtures (a plugin module:
``pytest_plugins`` in tests/conftest.py): ``groups``, ``auditor``, ``operator``. A module whose ``auditor`` or
``operator`` is someone else (the legacy ``auditors`` group, a superuser) defines its own, which wins there."""

import importlib
from types import SimpleNamespace

import pytest
from django.apps import apps as global_apps
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, Permission
from django.db import connection
from django.test import Client


def signed_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def staff_user(username: str, *codenames: str):
    """A staff user holding exactly the permissions ``codenames`` (``"view_task"``, ``"add_steeringcommand"`` …)."""
    user = get_user_model().objects.create_user(username, is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(codename__in=codenames))
    return user


def staff_with(username: str, *codenames: str) -> Client:
    """A client signed in as ``staff_user(username, *codenames)``."""
    return signed_in(staff_user(username, *codenames))


def staff_in(group: str, username: str) -> Client:
    """A client signed in as a staff user in ``group`` (it must exist: ``groups``, or ``auditor`` for the roles)."""
    user = get_user_model().objects.create_user(username, is_staff=True)
    user.groups.add(Group.objects.get(name=group))
    return signed_in(user)


def groups_create() -> None:
    """The console groups (``auditors``, ``operators``) as steering_app migrations 0003 and 0004 make them, by their
    own functions — run again after a transactional test's flush emptied auth_group, which also shows they are safe
    to run twice."""
    editor = SimpleNamespace(connection=connection)
    importlib.import_module("steering_app.migrations.0003_auditors_and_operators_groups").create_groups(
        global_apps, editor)
    importlib.import_module("steering_app.migrations.0004_groups_read_admin_actions").grant(global_apps, editor)


@pytest.fixture
def groups(db):
    """The console groups; a module wanting them for every test says ``pytest.mark.usefixtures("groups")``."""
    groups_create()


@pytest.fixture
def auditor(db):
    """An auditor as the roles make them (steering_app 0006, 0007): reads the audit trail and exports it (the legacy
    ``auditors`` group reads it but has no export_task)."""
    importlib.import_module("steering_app.migrations.0007_audit_trail_roles").create_roles(
        global_apps, SimpleNamespace(connection=connection))
    return staff_in("auditor", "audrey")


@pytest.fixture
def operator(groups):
    """A member of the ``operators`` group: steers, retries and abandons."""
    return staff_in("operators", "oscar")
