"""Every human decision is in the audit trail under one actor naming (`user:<name>`), and the audit pages' actor filter
finds it: admin writes (tasks_app.models.AdminAction, recorded by tasks_app.web.admin_audit), dead-letter retries and
abandons (status events with requestedBy), steering commands. Nothing secret is recorded."""

import csv
import html
import io
import re
from datetime import timedelta

import pytest
from django.contrib import admin
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, Permission
from django.db import DatabaseError, connection, transaction
from django.utils import timezone
from django_celery_beat.models import IntervalSchedule, PeriodicTask

from config.base.admin_base import ReadOnlyAdmin
from steering_app import audit_selectors
from steering_app.services import steering_submit
from tasks_app.models import AdminAction, ApiToken, Task, TaskEvent, Tenant, TenantMembership
from tasks_app.services import api_token_create, task_create
from tasks_app.web.admin_audit import AuditedAdmin
from tests.support.console import signed_in, staff_in

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("external_root", "groups")]


@pytest.fixture
def carol():
    """A superuser who administers tenants, tokens, accounts and schedules."""
    return signed_in(get_user_model().objects.create_superuser("carol", password=None))


def window_start() -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT now() - interval '1 hour'")
        return cursor.fetchone()[0].isoformat()


def admin_actions(client, **query) -> list[dict]:
    response = client.get("/admin/audit/admin-actions/", {"from": window_start(), **query})
    assert response.status_code == 200, response.content[:500]
    return response.context["rows"]


def test_it_records_a_token_revoke_that_an_auditor_finds_by_actor_without_the_token(tenant, carol, auditor):
    user = get_user_model().objects.create_user("alice")
    token, raw = api_token_create(tenant=tenant, user=user, name="ci")
    other, _ = api_token_create(tenant=tenant, user=get_user_model().objects.create_user("bob"), name="bob's")

    revoked = carol.post("/admin/tasks_app/apitoken/", {"action": "revoke", "_selected_action": [token.id]},
                         follow=True)
    again = carol.post("/admin/tasks_app/apitoken/", {"action": "revoke", "_selected_action": [token.id]},
                       follow=True)

    assert "Revoked 1 token(s)" in revoked.content.decode()
    assert "1 had been revoked already" in again.content.decode()
    (record,) = AdminAction.objects.all()  # the second revoke changed nothing: no second record
    assert (record.actor, record.action, record.model, record.object_id, record.tenant_id) == (
        "user:carol", "revoke", "tasks_app.apitoken", str(token.id), tenant.id)
    rows = admin_actions(auditor, actor="user:carol")
    page = auditor.get("/admin/audit/admin-actions/", {"from": window_start(), "actor": "user:carol"}).content.decode()
    exported = b"".join(auditor.get("/admin/audit/admin-actions.csv", {"from": window_start(),
                                                                      "actor": "user:carol"}).streaming_content)
    assert [row["said"] for row in rows] == [f"user:carol revoked api token “{token.prefix}… (alice, acme)”"]
    assert rows[0]["tenant"] == "acme"
    assert admin_actions(auditor, actor="user:alice") == []
    (line,) = csv.DictReader(io.StringIO(exported.decode()))
    assert (line["actor"], line["action"], line["tenant"]) == ("user:carol", "revoke", "acme")
    for text in (page, exported.decode(), str(list(AdminAction.objects.values()))):
        assert raw not in text and token.token_hash not in text and other.token_hash not in text
    # The token's page shows neither its hash nor a field that could bring it back.
    token_page = carol.get(f"/admin/tasks_app/apitoken/{token.id}/change/").content.decode()
    assert token.token_hash not in token_page and 'name="revoked_at' not in token_page


def test_it_records_tenant_and_membership_adds_changes_and_deletes_with_field_names_only(carol, auditor):
    member = get_user_model().objects.create_user("dana")

    carol.post("/admin/tasks_app/tenant/add/", {"slug": "initech", "name": "Initech", "workflows": ""})
    initech = Tenant.objects.get(slug="initech")
    carol.post(f"/admin/tasks_app/tenant/{initech.id}/change/", {"slug": "initech", "name": "Initech Corp",
                                                                 "workflows": '["demo_steps"]'})
    added = carol.post("/admin/tasks_app/tenantmembership/add/", {"user": member.id, "tenant": initech.id})
    assert added.status_code == 302, added.content.decode()[-3000:]
    membership = TenantMembership.objects.get(user=member)
    carol.post(f"/admin/tasks_app/tenantmembership/{membership.id}/delete/", {"post": "yes"})
    carol.post("/admin/tasks_app/tenant/", {"action": "delete_selected", "_selected_action": [initech.id],
                                            "post": "yes"})

    assert not Tenant.objects.filter(slug="initech").exists()
    rows = admin_actions(auditor, actor="user:carol")
    assert [(row["action"], row["model"]) for row in reversed(rows)] == [
        ("add", "tasks_app.tenant"), ("change", "tasks_app.tenant"), ("add", "tasks_app.tenantmembership"),
        ("delete", "tasks_app.tenantmembership"), ("delete", "tasks_app.tenant")]
    assert rows[3]["message"] == "Changed Name and Workflows."  # the field names, never "Initech Corp"
    assert rows[0]["said"] == "user:carol deleted tenant “initech”"
    # The tenant filter finds a deleted tenant's records only while it exists; the rows say which one it was.
    assert {row["tenant"] for row in rows} == {f"(deleted tenant {initech.id})"}
    assert [row["action"] for row in admin_actions(auditor, actor="user:carol", type="delete")] == ["delete"] * 2


def test_it_records_writes_to_groups_and_the_beat_schedules(carol, auditor):
    interval = IntervalSchedule.objects.create(every=5, period="seconds")
    reaper = PeriodicTask.objects.create(name="runtime: lease reaper", task="runtime.reap", interval=interval)
    view_task = Permission.objects.get(codename="view_task")

    carol.post("/admin/auth/group/add/", {"name": "reviewers", "permissions": [view_task.id]})
    carol.post("/admin/django_celery_beat/periodictask/", {"action": "disable_tasks",
                                                           "_selected_action": [reaper.id]})

    reaper.refresh_from_db()
    assert not reaper.enabled and Group.objects.filter(name="reviewers").exists()
    said = [row["said"] for row in admin_actions(auditor, actor="user:carol")]
    assert said == ["user:carol ran “disable_tasks” on periodic task “runtime: lease reaper: every 5 seconds”",
                    "user:carol added group “reviewers”"]


def test_it_offers_the_schedules_bulk_actions_only_to_an_account_that_may_change_them():
    interval = IntervalSchedule.objects.create(every=5, period="seconds")
    reaper = PeriodicTask.objects.create(name="runtime: lease reaper", task="runtime.reap", interval=interval)
    reader = get_user_model().objects.create_user("reader", is_staff=True)
    reader.user_permissions.add(Permission.objects.get(codename="view_periodictask"))
    client = signed_in(reader)

    listing = client.get("/admin/django_celery_beat/periodictask/").content.decode()
    posted = client.post("/admin/django_celery_beat/periodictask/", {"action": "disable_tasks",
                                                                     "_selected_action": [reaper.id]})

    assert 'value="disable_tasks"' not in listing and 'value="run_tasks"' not in listing
    assert posted.status_code == 403
    assert "Your account may read periodic tasks but not change them." in posted.content.decode()
    reaper.refresh_from_db()
    assert reaper.enabled and not AdminAction.objects.exists()


def test_it_leaves_no_writing_admin_of_the_site_unaudited():
    unaudited, unrecorded = [], []
    for model, model_admin in admin.site._registry.items():
        if isinstance(model_admin, ReadOnlyAdmin):
            continue  # writes nothing (the task list's actions go through services that record them)
        if not isinstance(model_admin, AuditedAdmin):
            unaudited.append(model._meta.label)
            continue
        for _, name, _ in model_admin._get_base_actions():
            if name != "delete_selected" and name not in (*model_admin.audited_actions,
                                                          *model_admin.actions_recorded_by_services):
                unrecorded.append(f"{model._meta.label}.{name}")

    assert unaudited == [] and unrecorded == []
    assert {"auth.User", "auth.Group", "django_celery_beat.PeriodicTask", "tasks_app.ApiToken"} <= {
        model._meta.label for model, model_admin in admin.site._registry.items()
        if isinstance(model_admin, AuditedAdmin)}


def test_it_keeps_admin_actions_append_only(tenant, carol):
    carol.post("/admin/tasks_app/tenant/add/", {"slug": "hooli", "name": "Hooli", "workflows": ""})

    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        AdminAction.objects.update(actor="user:someone-else")

    assert list(AdminAction.objects.values_list("actor", flat=True)) == ["user:carol"]


def test_it_finds_a_persons_dead_letter_decisions_and_steering_by_actor_on_the_events_page(tenant, auditor):
    oscar = staff_in("operators", "oscar")
    abandoned, retried, steered = (task_create(tenant=tenant, owner=None, workflow="demo_steps",
                                               input={"steps": 2}).task for _ in range(3))
    Task.objects.filter(id__in=[abandoned.id, retried.id]).update(status="dead_lettered",
                                                                  error={"reason": "effect_outcome_unknown"})
    oscar.post(f"/admin/tasks_app/task/{abandoned.id}/abandon/", {"reason": "refunded by hand"})
    oscar.post(f"/admin/tasks_app/task/{retried.id}/retry/", {"reason": "the vendor is back"})
    steering_submit(task=steered, command_type="set_priority", payload={"priority": 9}, expected_version=None,
                    reason="urgent", requested_by="user:oscar")

    page = auditor.get("/admin/audit/events/", {"from": window_start(), "actor": "user:oscar"})

    found = {(str(row["task_id"]), row["type"]) for row in page.context["rows"]}
    assert found == {(str(abandoned.id), "status"), (str(retried.id), "status"), (str(steered.id), "steering.applied")}
    # The same filter on the other pages (without the type: an event type is no command or admin action type).
    typed = auditor.get("/admin/audit/events/", {"from": window_start(), "actor": "user:oscar", "type": "status"})
    links = re.search(r'id="audit-same-filter">(.*?)</p>', typed.content.decode(), re.S).group(1)
    assert 'href="/admin/audit/commands/?' in links and 'href="/admin/audit/admin-actions/?' in links
    assert "actor=user%3Aoscar" in links and "type=" not in links
    assert auditor.get("/admin/audit/commands/?" + html.unescape(
        re.search(r'href="/admin/audit/commands/\?([^"]+)"', links).group(1))).status_code == 200
    reasons = {row["data"] for row in page.context["rows"]}
    assert any("refunded by hand" in data for data in reasons) and any("the vendor is back" in data for data in reasons)


def test_it_serves_the_actor_filter_over_every_task_from_the_two_partial_indexes(tenant):
    now = timezone.now()
    query = audit_selectors._events(audit_selectors.AuditFilter(actor="user:oscar", since=now - timedelta(days=30),
                                                                until=now))
    sql, params = query.values_list("task_id", "seq").query.sql_with_params()
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute("EXPLAIN " + sql, params)
        plan = "\n".join(row[0] for row in cursor.fetchall())

    # Status events: the decisions' own index, or — the planner's choice on the table's statistics, which depend on
    # what earlier tests of the same database wrote and deleted — the status events' (a superset, still partial).
    assert "taskevent_steering_idx" in plan, plan
    assert "taskevent_decision_idx" in plan or "taskevent_status_idx" in plan, plan
    assert "Seq Scan" not in plan and "taskevent_pkey" not in plan, plan
    assert TaskEvent.objects.count() == 0  # (the plan, not the data: an empty table)


def test_it_refuses_the_admin_actions_to_staff_without_the_permission_saying_why(tenant):
    reader = get_user_model().objects.create_user("reader", is_staff=True)
    reader.user_permissions.add(Permission.objects.get(codename="view_task"))

    response = signed_in(reader).get("/admin/audit/admin-actions/")

    assert response.status_code == 403
    assert "Your account may not read the admin actions of the audit trail" in response.content.decode()


def test_it_records_nothing_for_a_write_that_did_not_happen(carol):
    refused = carol.post("/admin/tasks_app/tenant/add/", {"slug": "not a slug!", "name": "x", "workflows": ""})

    assert refused.status_code == 200 and "errornote" in refused.content.decode()
    assert not AdminAction.objects.exists()
    assert ApiToken.objects.count() == 0
