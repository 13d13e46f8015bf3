"""`manage.py check --deploy` (issue 37, finding 12): it flags a production configuration that lets tenants' tool
servers reach this machine's loopback (agents_app.W021) and a database role that is a superuser (tasks_app.W004), each
with a hint saying what to do — and only under --deploy: development runs both on purpose."""

from __future__ import annotations

import uuid

import pytest
from django.core.checks import Tags, run_checks
from django.db import connection

from tests.engine_support import configure

MINE = ("agents_app.W021", "tasks_app.W004")


def _ours(**kwargs):
    return [message for message in run_checks(**kwargs) if message.id in MINE]


@pytest.mark.parametrize("hosts, flagged", [
    (["127.0.0.1", "::1", "localhost"], "127.0.0.1, ::1, localhost"),  # the shipped (development) list
    (["mcp.example.com", "127.0.0.2"], "127.0.0.2"),
    (["*.localhost", "10.0.0.0/8"], "*.localhost"),
    (["0.0.0.0/0"], "0.0.0.0/0"),  # every IPv4 address: loopback among them
    (["::ffff:127.0.0.1"], "::ffff:127.0.0.1"),  # IPv4-mapped loopback
    (["mcp.example.com", "*.example.com", "10.0.0.0/8", "2001:db8::/32"], None),
])
def test_it_flags_loopback_in_the_tool_hosts_under_deploy_only(settings, hosts, flagged):
    configure(settings, tools={"allowed_hosts": tuple(hosts)})

    found = _ours(include_deployment_checks=True)

    if flagged is None:
        assert found == []
        return
    assert [message.id for message in found] == ["agents_app.W021"]
    assert f"reach loopback: {flagged}." in found[0].msg
    assert "tools.allowed_hosts" in found[0].hint and "real tool servers" in found[0].hint
    assert _ours(include_deployment_checks=False) == []  # development: loopback is the point (the example server)


@pytest.mark.django_db
def test_it_flags_a_superuser_database_role_with_the_database_checks_under_deploy(settings):
    configure(settings, tools={"allowed_hosts": ("mcp.example.com",)})
    with connection.cursor() as cursor:
        cursor.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user")
        assert cursor.fetchone()[0], "the test database's role is expected to be a superuser (postgres)"

    found = _ours(include_deployment_checks=True, databases=["default"])

    assert [message.id for message in found] == ["tasks_app.W004"]
    assert "superuser" in found[0].msg and "NOSUPERUSER" in found[0].hint and "DATABASE_URL" in found[0].hint
    assert _ours(include_deployment_checks=True) == []  # (reads the database only when asked to: --database)
    assert _ours(include_deployment_checks=False, databases=["default"]) == []

    # The same check as a plain role (created in this test's transaction, gone with it); called alone, as the other
    # database checks read tables such a role has no grant on.
    from tasks_app.engine.checks import database_role_not_superuser

    role = f"runtime_plain_{uuid.uuid4().hex[:8]}"
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE ROLE {role} NOLOGIN NOSUPERUSER")
        cursor.execute(f"SET LOCAL ROLE {role}")
    try:
        assert database_role_not_superuser(None, databases=["default"]) == []
    finally:
        with connection.cursor() as cursor:
            cursor.execute("RESET ROLE")


def test_it_tags_both_as_security_checks():
    """`security`, as Django's own deployment checks: the development run checks the `runtime` tag (loopback tool
    servers and a superuser role are what development is), a production `check --deploy` every tag."""
    assert _ours(tags=["runtime"], include_deployment_checks=True) == []
    assert {message.id for message in _ours(tags=[Tags.security], include_deployment_checks=True)} == {
        "agents_app.W021"}
