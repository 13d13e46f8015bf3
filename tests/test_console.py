"""The operators' console in the admin, as the server renders it: the live list's cells, the task page (progress,
event tail, steps, checkpoints, the ledger, artifacts, the steering buttons), the overview and the dead letters.
What a page shows is redacted and escaped. The live updates themselves are checked in a real browser by
tests/test_console_browser.py."""

import re
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.contrib.staticfiles import finders
from django.db import connection, transaction
from django.test import Client
from django.utils import timezone

from checkpoints_app.models import SideEffect
from steering_app.models import SteeringCommand
from tasks_app import access
from tasks_app.audit.retention import purge_allowed
from tasks_app.engine import reaper
from tasks_app.engine.checks import REAPER_NAME
from tasks_app.models import Task, TaskEvent
from tasks_app.services import task_create
from tasks_app.web import console
from tests import workflows
from tests.engine_support import drive
from tests.support.console import staff_with

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("external_root")]

ROOT = Path(__file__).resolve().parent.parent


def task_page(client, task) -> str:
    response = client.get(f"/admin/tasks_app/task/{task.id}/change/")
    assert response.status_code == 200
    return response.content.decode()


def dead_letter(tenant, **error) -> Task:
    task = task_create(tenant=tenant, owner=None, workflow="demo_steps", input={"steps": 2}).task
    Task.objects.filter(id=task.id).update(status="dead_lettered", status_message="Dead-lettered (test)",
                                           error={"reason": "effect_outcome_unknown", **error})
    return task


@pytest.fixture
def scripted(new_task):
    name = uuid.uuid4().hex

    def make(script, *, steps):
        workflows.SCRIPTS[name] = script
        return new_task("scripted", script=name, steps=steps)

    yield make
    workflows.SCRIPTS.pop(name, None)


# -- the list ---------------------------------------------------------------------------------------------------------
def test_it_marks_each_rows_status_progress_and_phase_for_the_live_list(new_task, admin_client):
    task = new_task(steps=3)
    Task.objects.filter(id=task.id).update(progress=0.25, phase="<b>reading</b>")

    page = admin_client.get("/admin/tasks_app/task/").content.decode()

    assert f'<span class="console-status" data-task-id="{task.id}"' in page
    assert re.search(rf'data-task-id="{task.id}"><progress max="1" value="0.25"></progress>', page)
    assert f'<span class="console-phase" data-task-id="{task.id}">&lt;b&gt;reading&lt;/b&gt;</span>' in page
    assert '<script src="/static/console/list.js" defer></script>' in page
    assert "/admin/tasks_app/task/overview/" in page and "/admin/tasks_app/task/dead-letters/" in page


def test_it_filters_the_list_by_the_status_clients_see_and_by_internal_status_and_owner(new_task, admin_client,
                                                                                       tenant):
    paused, completed = new_task(steps=1), new_task(steps=1)
    Task.objects.filter(id=paused.id).update(status="paused")
    Task.objects.filter(id=completed.id).update(status="completed")
    owner = get_user_model().objects.create_user("owner-of-one")
    owned = task_create(tenant=tenant, owner=owner, workflow="demo_steps", input={"steps": 1}).task

    working = admin_client.get("/admin/tasks_app/task/", {"status": "working"}).content.decode()
    internal = admin_client.get("/admin/tasks_app/task/", {"status__exact": "paused"}).content.decode()
    by_owner = admin_client.get("/admin/tasks_app/task/", {"owner__id__exact": owner.id}).content.decode()
    searched = admin_client.get("/admin/tasks_app/task/", {"q": "owner-of-one"}).content.decode()

    assert str(paused.id) in working and str(completed.id) not in working  # paused is "working" to clients
    assert str(paused.id) in internal and str(owned.id) not in internal
    assert str(owned.id) in by_owner and str(paused.id) not in by_owner
    assert str(owned.id) in searched and str(paused.id) not in searched


# -- the task page ----------------------------------------------------------------------------------------------------
def test_it_serves_the_console_snapshot_to_staff_of_no_tenant_who_may_view_tasks_and_to_no_one_else(new_task):
    task = new_task(steps=3)
    url = f"/admin/tasks_app/task/{task.id}/snapshot/"
    viewer = get_user_model().objects.create_user("no-tenant-viewer", is_staff=True)  # a member of no tenant
    viewer.user_permissions.add(Permission.objects.get(codename="view_task"))
    staff_without = get_user_model().objects.create_user("staff-without", is_staff=True)
    clients = {}
    for name, user in (("viewer", viewer), ("staff", staff_without)):
        clients[name] = Client()
        clients[name].force_login(user)

    seen = clients["viewer"].get(url)

    assert seen.status_code == 200 and seen.json()["taskId"] == str(task.id)
    assert seen.json()["stateVersion"] == task.state_version and seen.json()["internalStatus"] == "queued"
    assert clients["staff"].get(url).status_code == 404  # may not view tasks: no such page for them
    assert Client().get(url).status_code == 302  # signed out: to the sign-in page


def test_it_shows_progress_the_event_tail_steps_checkpoints_effects_and_the_stream_to_follow(new_task, admin_client):
    task = new_task(steps=3)
    drive(task.id)
    task.refresh_from_db()

    page = task_page(admin_client, task)

    # (from the seq the page was rendered at: the events between rendering and connecting are replayed, no gap)
    assert f'data-stream-url="/runtime/tasks/{task.id}/events?lastEventId={task.event_seq}"' in page
    # The console's own snapshot (staff of any tenant), not the REST one (a tenant's members only).
    assert f'data-snapshot-url="/admin/tasks_app/task/{task.id}/snapshot/"' in page
    assert f'data-seq="{task.event_seq}"' in page
    assert 'data-field="progress" max="1" value="1.0"' in page and 'data-field="status">completed<' in page
    assert "<td>terminal</td>" in page and f"<td>{task.event_seq}</td>" in page
    steps = re.search(r'id="console-steps">.*?</table>', page, re.S).group(0)
    assert steps.count("<td>committed</td>") == 3
    assert f"{task.id}:1:" in page  # an effect's key, from the ledger
    assert '<script src="/static/console/task.js" defer></script>' in page


def test_it_tails_only_the_newest_events_of_a_task(new_task):
    task = new_task(steps=5)
    drive(task.id)
    task.refresh_from_db()

    tail = console.task_event_tail(task=task, limit=3)

    assert task.event_seq > 3
    assert [event["seq"] for event in tail] == [task.event_seq, task.event_seq - 1, task.event_seq - 2]
    assert tail[0]["type"] == "terminal" and tail[0]["summary"] == "completed"


def test_it_links_the_artifacts_a_task_wrote(scripted, admin_client):
    task = scripted({0: [{"do": "artifact", "name": "report.md", "content": "# hello"}]}, steps=1)
    drive(task.id)

    page = task_page(admin_client, task)
    download = admin_client.get(f"/admin/tasks_app/task/{task.id}/artifacts/report.md")

    assert f'<a href="/admin/tasks_app/task/{task.id}/artifacts/report.md">report.md</a>' in page
    assert download.status_code == 200 and b"".join(download.streaming_content) == b"# hello"


def test_it_redacts_and_escapes_effect_results_the_input_and_event_text(tenant, admin_client):
    task = task_create(tenant=tenant, owner=None, workflow="demo_steps", input={"steps": 1}).task
    Task.objects.filter(id=task.id).update(input={"steps": 1, "api_key": "sk-live-0123456789abcdefghij"},
                                           status_message="contact ops@example.com")
    SideEffect.objects.create(key=f"{task.id}:1:send", task_id=task.id, step_seq=1, name="send", status="succeeded",
                              lease_epoch=1, result={"token": "hunter2hunter2", "note": "<script>alert(1)</script>",
                                                     "auth": "Bearer abcdefghijklmnop"})
    with purge_allowed():  # (the chain is not what this test looks at)
        TaskEvent.objects.filter(task_id=task.id).delete()
    TaskEvent.objects.create(task_id=task.id, seq=1, type="log", hash="x",
                             data={"step": 1, "message": "password=swordfish <i>x</i>"})
    Task.objects.filter(id=task.id).update(event_seq=1)

    page = task_page(admin_client, task)

    for secret in ("sk-live-0123456789abcdefghij", "hunter2hunter2", "abcdefghijklmnop", "swordfish",
                   "ops@example.com"):
        assert secret not in page
    assert "<script>alert(1)</script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "<i>x</i>" not in page and "&lt;i&gt;x&lt;/i&gt;" in page
    assert "[redacted]" in page


def test_it_offers_pause_to_a_working_task_and_resume_to_a_paused_one(new_task, admin_client):
    task = new_task(steps=2)

    def buttons(page):
        return dict(re.findall(r'<button type="submit" name="type" value="(\w+)" data-when="[^"]*"( hidden)?>', page))

    working = buttons(task_page(admin_client, task))
    Task.objects.filter(id=task.id).update(status="paused")
    paused = buttons(task_page(admin_client, task))

    assert working == {"pause": "", "resume": " hidden", "cancel": ""}
    assert paused == {"pause": " hidden", "resume": "", "cancel": ""}
    Task.objects.filter(id=task.id).update(status="completed")
    finished = task_page(admin_client, task)
    assert 'id="console-steer"' not in finished and "/steer/" not in finished  # nothing applies any more
    assert "The task is completed: a finished task takes no more commands." in finished


def test_it_pauses_a_task_from_its_page_with_the_reason_given(new_task, admin_client):
    task = new_task(steps=2)
    page = task_page(admin_client, task)
    action = re.search(r'<form method="post" action="([^"]+)" id="console-steer">', page).group(1)

    response = admin_client.post(action, {"type": "pause", "reason": "checking the output",
                                          "expected_version": task.state_version})

    assert response.status_code == 302 and response["Location"] == f"/admin/tasks_app/task/{task.id}/change/"
    command = SteeringCommand.objects.get(task=task)
    assert (command.type, command.reason) == ("pause", "checking the output")
    assert "checking the output" in task_page(admin_client, task)  # in the page's steering history


def test_it_gives_an_auditor_the_console_but_no_steering_or_dead_letter_controls(tenant):
    auditor = staff_with("auditor", "view_task")
    task = dead_letter(tenant)

    page = task_page(auditor, task)
    retry = auditor.post(f"/admin/tasks_app/task/{task.id}/retry/")
    abandon = auditor.post(f"/admin/tasks_app/task/{task.id}/abandon/")
    dead_letters = auditor.get("/admin/tasks_app/task/dead-letters/").content.decode()

    assert 'id="console-steer"' not in page and "may read this task but not steer it" in page
    assert "Retry from the last good checkpoint" not in page + dead_letters
    assert str(task.id) in dead_letters
    assert retry.status_code == abandon.status_code == 403
    assert Task.objects.get(id=task.id).status == "dead_lettered"


# -- dead letters -----------------------------------------------------------------------------------------------------
def test_it_lists_dead_letters_with_their_reason_and_the_effects_of_unknown_outcome(tenant, admin_client):
    task = dead_letter(tenant, message="charge <b>timed out</b> for ops@example.com")
    SideEffect.objects.create(key=f"{task.id}:1:charge", task_id=task.id, step_seq=1, name="charge", status="unknown",
                              lease_epoch=1)
    quiet = dead_letter(tenant)
    done = task_create(tenant=tenant, owner=None, workflow="demo_steps", input={"steps": 1}).task

    page = admin_client.get("/admin/tasks_app/task/dead-letters/").content.decode()

    assert "effect_outcome_unknown: charge &lt;b&gt;timed out&lt;/b&gt; for [redacted-email]" in page
    assert f"{task.id}:1:charge" in page and f'href="/admin/tasks_app/task/{task.id}/retry/"' in page
    assert f'action="/admin/tasks_app/task/{quiet.id}/retry/"' in page  # nothing to answer: one button
    assert str(done.id) not in page


def test_it_retries_a_dead_letter_without_open_effects_from_the_dead_letter_page(tenant, admin_client):
    task = dead_letter(tenant)

    response = admin_client.post(f"/admin/tasks_app/task/{task.id}/retry/")

    assert response.status_code == 302 and Task.objects.get(id=task.id).status == "recovering"


def test_it_abandons_a_dead_letter_only_after_a_confirmation(tenant, admin_client):
    task = dead_letter(tenant)

    confirm = admin_client.get(f"/admin/tasks_app/task/{task.id}/abandon/")
    still = Task.objects.get(id=task.id).status
    without_reason = admin_client.post(f"/admin/tasks_app/task/{task.id}/abandon/", follow=True)
    still_without_reason = Task.objects.get(id=task.id).status
    done = admin_client.post(f"/admin/tasks_app/task/{task.id}/abandon/", {"reason": "the vendor refunded it"},
                             follow=True)

    assert confirm.status_code == 200 and "Abandon: mark it failed" in confirm.content.decode()
    assert still == still_without_reason == "dead_lettered"
    assert "Say why you abandon it" in without_reason.content.decode()
    task.refresh_from_db()
    assert task.status == "failed" and task.error["abandonedBy"] == "user:admin"
    assert task.error["abandonReason"] == "the vendor refunded it"
    assert f"Abandoned {task.id}" in done.content.decode()
    # In the audit trail under the actor naming every other decision uses.
    abandoned = TaskEvent.objects.filter(task_id=task.id, type="status").order_by("-seq").first()
    assert abandoned.data["requestedBy"] == "user:admin" and abandoned.data["reason"] == "the vendor refunded it"


# -- the overview -----------------------------------------------------------------------------------------------------
def test_it_counts_tasks_per_status_on_the_overview(new_task, admin_client):
    for status in ("queued", "paused", "paused", "dead_lettered"):
        Task.objects.filter(id=new_task(steps=1).id).update(status=status)

    counts = console.task_counts_by_status(actor=access.SYSTEM)
    page = admin_client.get("/admin/tasks_app/task/overview/").content.decode()

    assert (counts["queued"], counts["paused"], counts["dead_lettered"], counts["completed"]) == (1, 2, 1, 0)
    assert re.search(r'<tr data-status="paused">.*?<td class="console-count">2</td>', page, re.S)
    assert re.search(r'<span id="console-dead-letter-count">1</span> dead-lettered task\b', page)


def test_it_shows_the_open_waits_and_the_hint_queue_on_the_overview_as_metrics_read_them(new_task, admin_client):
    waiting = [new_task(steps=1) for _ in range(3)]
    Task.objects.filter(id__in=[t.id for t in waiting]).update(status="input_required", wait={"kind": "approval"})
    Task.objects.filter(id=waiting[0].id).update(wait={"kind": "input"})
    # One of them entered its wait a minute ago (its newest status event; one clock: the database's). Events are
    # append-only: the trigger is skipped for this move of time, as a superuser could.
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL session_replication_role = replica")
        cursor.execute("UPDATE tasks_app_taskevent SET at = now() - interval '60 seconds' "
                       "WHERE task_id = %s AND type = 'status'", [waiting[1].id])

    waits = console.waits_open(actor=access.SYSTEM)
    page = admin_client.get("/admin/tasks_app/task/overview/").content.decode()

    assert waits.by_kind == {"input": 1, "approval": 2, "budget": 0} and waits.total == 3
    assert 60 <= waits.oldest_seconds < 90
    assert '<span id="console-waits-open">3</span> tasks waiting' in page
    assert re.search(r'<span id="console-wait-oldest">(6\d|7\d|8\d)</span> s', page)
    assert re.search(r'<span id="console-queue-depth">\d+</span> run_step hint', page)
    state = console.runtime_state()  # what /metrics reads: the same numbers
    assert (state.waits_open, state.oldest_wait_seconds >= 60, state.tasks_by_status["input_required"]) == \
        (waits.by_kind, True, 3)


def test_it_charts_steps_per_second_per_minute_from_the_reapers_samples(admin_client):
    from tasks_app.models import ThroughputSample

    with connection.cursor() as cursor:
        cursor.execute("SELECT date_trunc('minute', now())")
        minute = cursor.fetchone()[0]
    # Sweeps every 20 s: 2 steps in the minute 3 minutes ago, 3 in this one; a statistics reset counts nothing.
    for at, count in [(-3 * 60 - 10, 100), (-3 * 60 + 10, 101), (-3 * 60 + 30, 102), (-2 * 60 + 10, 102),
                      (-60 + 10, 5), (1, 6), (2, 8)]:
        ThroughputSample.objects.create(at=minute + timedelta(seconds=at), steps_inserted=count)

    throughput = console.steps_throughput(minutes=10)
    page = admin_client.get("/admin/tasks_app/task/overview/").content.decode()

    assert throughput.steps[-1] == 3 and throughput.steps[-4] == 2 and sum(throughput.steps) == 5
    assert throughput.per_second[-1] == pytest.approx(3 / 60)
    chart = re.search(r'<svg id="console-throughput".*?</svg>', page, re.S).group(0)
    assert chart.count("<rect ") == console.THROUGHPUT_MINUTES
    assert ": 3 steps, 0.05/s</title>" in chart and ": 2 steps, 0.03/s</title>" in chart
    assert "<script" not in chart


def test_it_samples_the_step_counter_at_each_sweep_and_keeps_an_hour(new_task):
    from tasks_app.models import ThroughputSample

    ThroughputSample.objects.create(at=timezone.now() - timedelta(hours=2), steps_inserted=1)
    drive(new_task(steps=4).id)
    with connection.cursor() as cursor:  # this backend's counts reach the statistics at its next transaction end
        cursor.execute("SELECT pg_stat_force_next_flush()")

    reaper.reaper_sweep()

    (sample,) = ThroughputSample.objects.all()
    assert sample.steps_inserted >= 4


def reaper_schedule():
    """The migration's row (tests with transaction=True empty every table after them, so make it again)."""
    from django_celery_beat.models import IntervalSchedule, PeriodicTask

    interval, _ = IntervalSchedule.objects.get_or_create(every=5, period="seconds")
    return PeriodicTask.objects.get_or_create(name=REAPER_NAME, defaults={"task": "runtime.reap",
                                                                          "interval": interval})[0]


def test_it_lists_recent_recoveries_and_links_the_lease_reapers_schedule(new_task, admin_client):
    recovered, untouched = new_task(steps=1), new_task(steps=1)
    Task.objects.filter(id=recovered.id).update(recoveries=2, status_message="Recovering: <worker> lost")
    reaper = reaper_schedule()

    page = admin_client.get("/admin/tasks_app/task/overview/").content.decode()

    recoveries = re.search(r'id="console-recoveries">.*?</table>', page, re.S).group(0)
    assert str(recovered.id) in recoveries and str(untouched.id) not in recoveries
    assert "Recovering: &lt;worker&gt; lost" in recoveries
    assert f'href="/admin/django_celery_beat/periodictask/{reaper.pk}/change/" id="console-reaper"' in page
    # (the schedule the migration made, or the one made above after a flush: whichever, as it is)
    assert f"enabled, every {reaper.interval.every} seconds" in page


def test_it_says_so_when_the_lease_reapers_schedule_is_missing(admin_client):
    reaper_schedule().delete()

    page = admin_client.get("/admin/tasks_app/task/overview/").content.decode()

    assert 'The periodic task "runtime: lease reaper" is missing' in page


# -- assets -----------------------------------------------------------------------------------------------------------
def test_it_serves_every_console_asset_from_the_app_and_loads_nothing_from_elsewhere():
    assets = ["console/task.js", "console/list.js", "console/overview.js", "console/clock.js", "console/console.css"]
    texts = [Path(finders.find(asset)).read_text() for asset in assets]
    templates = [path.read_text() for path in (ROOT / "templates").rglob("*.html")
                 if "console" in path.parts or path.name in ("change_form.html", "change_list.html", "overview.html",
                                                               "dead_letters.html")]

    for text in texts + templates:
        assert not re.search(r"""(src|href)=["']?(https?:)?//""", text)  # no CDN, no other host
        assert "import(" not in text and "@import" not in text
    for script in texts[:4]:
        # Event data is written as text, never parsed as HTML; the only HTML parsed is the server's own rendering of
        # a console page (the task panel's live parts, the list), fetched from this origin with the session.
        assert "innerHTML" not in script and "insertAdjacentHTML" not in script and "document.write" not in script
        for parsed in re.findall(r"parseFromString\((\w+)", script):
            assert parsed == "html" and "response.text()" in script


def test_it_links_the_console_and_the_audit_trail_from_the_admin_start_page(admin_client):
    page = admin_client.get("/admin/").content.decode()

    for url in ("/admin/tasks_app/task/overview/", "/admin/tasks_app/task/dead-letters/", "/admin/audit/"):
        assert f'href="{url}"' in page
