"""The console by role: what an auditor is offered (nothing it cannot do), refusals as a styled page saying why, no
steering for a finished task, the approval page's artifacts, and the times on the audit, dead-letter and steering
pages written by the one clock (tasks_app/templatetags/console_time.py)."""

import html
import re

import pytest
from django.contrib.auth import get_user_model

from steering_app.models import SteeringCommand
from steering_app.services import steering_submit
from tasks_app.engine import waits
from tasks_app.models import Task
from tasks_app.selectors import task_artifacts
from tasks_app.services import api_token_create, task_create
from tests import workflows
from tests.engine_support import drive
from tests.support.console import staff_in, staff_with

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("external_root", "groups")]

STYLED = "<h1>Not allowed</h1>"  # templates/403.html, in the admin's frame
NOT_STEER = "Your account may read tasks but not steer them."
NOT_OPERATE = "Your account may read tasks but not retry or abandon them."


@pytest.fixture
def auditor():  # the legacy `auditors` group (tests.support.console's is the audit trail role)
    return staff_in("auditors", "audrey")


def queued(tenant) -> Task:
    return task_create(tenant=tenant, owner=None, workflow="demo_steps", input={"steps": 3}).task


def waiting(tenant, **input_) -> Task:
    task = task_create(tenant=tenant, owner=None, workflow="demo_steps", input={"steps": 3, **input_}).task
    drive(task.id)
    task.refresh_from_db()
    assert task.status == "input_required"
    return task


def dead_letter(tenant) -> Task:
    task = queued(tenant)
    Task.objects.filter(id=task.id).update(status="dead_lettered", status_message="Dead-lettered (test)",
                                           error={"reason": "effect_outcome_unknown"})
    return task


def page_of(client, url: str) -> str:
    response = client.get(url)
    assert response.status_code == 200, (url, response.status_code)
    return response.content.decode()


def refused(response, why: str) -> bool:
    page = html.unescape(response.content.decode())
    return response.status_code == 403 and STYLED in page and why in page


# -- b. what an auditor is offered ------------------------------------------------------------------------------------
def test_it_offers_an_auditor_no_action_control_or_link_it_cannot_use_on_any_page(tenant, auditor, operator):
    running, asking, stuck = queued(tenant), waiting(tenant, ask_at=0), dead_letter(tenant)
    pages = {
        "list": "/admin/tasks_app/task/", "task": f"/admin/tasks_app/task/{running.id}/change/",
        "asking": f"/admin/tasks_app/task/{asking.id}/change/", "stuck": f"/admin/tasks_app/task/{stuck.id}/change/",
        "dead letters": "/admin/tasks_app/task/dead-letters/", "overview": "/admin/tasks_app/task/overview/",
        "tenants": "/admin/tasks_app/tenant/", "tenant": f"/admin/tasks_app/tenant/{tenant.id}/change/",
        "index": "/admin/", "audit": "/admin/audit/",
    }
    offered_to_steerers = ('name="action"', 'id="console-steer"', "/steer/", "/retry/", "/abandon/")

    for name, url in pages.items():
        page = page_of(auditor, url)
        for control in (*offered_to_steerers, 'name="_save"', 'value="delete_selected"', 'class="addlink"',
                        'value="revoke"'):
            assert control not in page, (name, control)
    # The same pages offer them to an operator: the check above can fail.
    assert 'value="pause_tasks"' in page_of(operator, pages["list"])
    assert 'value="retry_dead_letters"' in page_of(operator, pages["list"])
    assert 'id="console-steer"' in page_of(operator, pages["task"])
    assert f"/admin/tasks_app/task/{asking.id}/steer/wait/" in page_of(operator, pages["asking"])
    assert f"/admin/tasks_app/task/{stuck.id}/abandon/" in page_of(operator, pages["dead letters"])
    # What an auditor is told instead.
    assert "Your account may read this task but not steer it." in page_of(auditor, pages["task"])
    assert auditor.get("/admin/tasks_app/apitoken/").status_code == 403  # tokens: not even listed


# -- e. refusals ------------------------------------------------------------------------------------------------------
def test_it_refuses_each_role_with_the_styled_page_saying_why(tenant, auditor, operator):
    task, stuck = queued(tenant), dead_letter(tenant)
    api_token_create(tenant=tenant, user=get_user_model().objects.create_user("alice"), name="ci")
    base = f"/admin/tasks_app/task/{task.id}"
    viewer = staff_with("vera", "view_apitoken")
    stranger = staff_with("sam")

    steer_form = {"type": "pause", "reason": "why not", "expected_version": task.state_version}
    assert refused(auditor.post(f"{base}/steer/", steer_form), NOT_STEER)
    assert refused(auditor.get(f"{base}/steer/goal/"), NOT_STEER)
    for action in ("pause_tasks", "resume_tasks", "cancel_tasks"):
        assert refused(auditor.post("/admin/tasks_app/task/", {"action": action, "_selected_action": [task.id]}),
                       NOT_STEER), action
    assert refused(auditor.post(f"/admin/tasks_app/task/{stuck.id}/retry/"), NOT_OPERATE)
    assert refused(auditor.get(f"/admin/tasks_app/task/{stuck.id}/abandon/"), NOT_OPERATE)
    assert refused(auditor.post("/admin/tasks_app/task/", {"action": "abandon_dead_letters",
                                                           "_selected_action": [stuck.id]}), NOT_OPERATE)
    assert refused(auditor.post("/admin/tasks_app/task/", {"action": "delete_selected", "_selected_action": [task.id],
                                                           "post": "yes"}),
                   "Tasks are written by the runtime's services only")
    assert refused(operator.get("/admin/tasks_app/task/add/"), "Tasks are written by the runtime's services only")
    assert refused(auditor.post(f"/admin/tasks_app/tenant/{tenant.id}/change/", {"slug": "acme", "name": "Evil"}),
                   "Your account may read tenants but not change them.")
    assert refused(auditor.get("/admin/tasks_app/tenant/add/"), "Your account may read tenants but not add them.")
    assert refused(auditor.get("/admin/tasks_app/apitoken/"), "Your account may not read api tokens.")
    assert refused(viewer.post("/admin/tasks_app/apitoken/", {"action": "revoke", "_selected_action": ["1"]}),
                   "Your account may read api tokens but not change them.")
    assert refused(stranger.get("/admin/tasks_app/task/overview/"), "Your account may not read tasks.")
    assert refused(stranger.get("/admin/tasks_app/task/dead-letters/"), "Your account may not read tasks.")
    assert refused(stranger.post(f"/admin/tasks_app/task/{stuck.id}/retry/"), "Your account may not read tasks.")
    assert refused(stranger.get("/admin/audit/events/"), "Your account may not read the events of the audit trail")
    # Nothing was done.
    assert not SteeringCommand.objects.exists()
    assert Task.objects.get(id=stuck.id).status == "dead_lettered" and Task.objects.filter(id=task.id).exists()
    assert tenant.__class__.objects.get(id=tenant.id).name == "Acme"


# -- c. finished tasks ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("status", ["completed", "failed", "cancelled"])
def test_it_offers_no_steering_for_a_finished_task(tenant, operator, status):
    task = queued(tenant)
    Task.objects.filter(id=task.id).update(status=status)
    base = f"/admin/tasks_app/task/{task.id}"
    said = f"The task is {status}: a finished task takes no more commands."

    for page in (page_of(operator, f"{base}/change/"), page_of(operator, f"{base}/steer/"),
                 page_of(operator, f"{base}/steer/goal/")):
        assert said in page
        assert 'name="reason"' not in page and 'id="console-steer"' not in page
        assert f"{base}/steer/goal/" not in page and 'value="Send the command"' not in page


def test_it_answers_a_bulk_steering_action_on_finished_tasks_with_what_it_left_out(tenant, operator):
    done, running = queued(tenant), queued(tenant)
    Task.objects.filter(id=done.id).update(status="completed")

    only_done = operator.post("/admin/tasks_app/task/", {"action": "pause_tasks", "_selected_action": [done.id]},
                              follow=True)
    both = operator.post("/admin/tasks_app/task/", {"action": "pause_tasks",
                                                    "_selected_action": [done.id, running.id]})
    sent = operator.post("/admin/tasks_app/task/", {"action": "pause_tasks", "_selected_action": [running.id],
                                                    "reason": "maintenance"})

    assert f"Nothing to pause: {done.id}: The task is completed: a finished task takes no more commands." in \
        only_done.content.decode()
    page = both.content.decode()
    assert both.status_code == 200 and "Left out: 1 selected task that pause does not apply to." in page
    asked = re.search(r'id="steer-many-tasks">(.*?)</ul>', page, re.S).group(1)
    assert str(running.id) in asked and str(done.id) not in asked
    assert f'value="{done.id}"' not in page  # not posted on: the form sends only what it applies to
    assert sent.status_code == 302
    assert list(SteeringCommand.objects.values_list("task_id", "type")) == [(running.id, "pause")]


# -- d. the approval page ---------------------------------------------------------------------------------------------
def test_it_links_the_artifacts_an_approval_is_about(new_task, operator):
    script = "approval-about"
    workflows.SCRIPTS[script] = {0: [{"do": "artifact", "name": "draft.md", "content": "# to publish"},
                                     {"do": "artifact", "name": "notes.txt", "content": "aside"}]}
    try:
        task = new_task("scripted", script=script, steps=1)
        drive(task.id)
    finally:
        workflows.SCRIPTS.pop(script)
    ref = task_artifacts(task_id=task.id)["notes.txt"]["ref"]  # what ctx.artifact() returned to the step
    # An approval that names one artifact by name and another by its storage reference, as a step would pass them.
    wait = waits.approval_wait(task_id=task.id, step_seq=2, plan_version=1, effect_name="content.publish",
                               effect_key=f"{task.id}:2:content.publish",
                               arguments={"attach": ["draft.md"], "channel": "blog", "body": {"ref": ref}})
    Task.objects.filter(id=task.id).update(status="input_required", wait=wait)
    plain = waits.approval_wait(task_id=task.id, step_seq=2, plan_version=1, effect_name="content.publish",
                                effect_key=f"{task.id}:2:content.publish", arguments={"channel": "blog"})

    page = page_of(operator, f"/admin/tasks_app/task/{task.id}/steer/wait/")
    Task.objects.filter(id=task.id).update(wait=plain)
    without = page_of(operator, f"/admin/tasks_app/task/{task.id}/steer/wait/")

    about = re.search(r'id="approval-artifacts">(.*?)</td>', page, re.S).group(1)
    assert f'href="/admin/tasks_app/task/{task.id}/artifacts/draft.md"' in about
    assert f'href="/admin/tasks_app/task/{task.id}/artifacts/notes.txt"' in about  # named by its reference
    assert f'href="/admin/tasks_app/task/{task.id}/artifacts/">All 2 artifacts of this task</a>' in about
    assert "The effect's arguments name none of the task's artifacts." in without
    assert f'href="/admin/tasks_app/task/{task.id}/artifacts/">All 2 artifacts' in without


# -- f. one clock -----------------------------------------------------------------------------------------------------
CLOCK = r'<time datetime="[^"]+" title="[^"]+">\d{4}-\d\d-\d\d \d\d:\d\d:\d\dFRACTION UTC</time>'
AGE = r'<time class="console-age" datetime="[^"]+" title="[^"]+ UTC" data-age data-suffix=" ago">\d+ (s|min)'


def test_it_writes_the_audit_dead_letter_and_steering_times_by_the_one_clock(tenant, auditor, operator):
    steered, stuck = queued(tenant), dead_letter(tenant)
    steering_submit(task=steered, command_type="set_priority", payload={"priority": 8}, expected_version=None,
                    reason="urgent", requested_by="user:oscar")
    precise, to_the_second = CLOCK.replace("FRACTION", r"\.\d{6}"), CLOCK.replace("FRACTION", "")

    events = page_of(auditor, f"/admin/audit/events/?task={steered.id}")
    commands = page_of(auditor, f"/admin/audit/commands/?task={steered.id}")
    dead_letters = page_of(operator, "/admin/tasks_app/task/dead-letters/")
    retry = page_of(operator, f"/admin/tasks_app/task/{stuck.id}/retry/")
    abandon = page_of(operator, f"/admin/tasks_app/task/{stuck.id}/abandon/")
    steer = page_of(operator, f"/admin/tasks_app/task/{steered.id}/steer/")

    assert re.search(precise, events) and re.search(precise, commands)  # rows of one second keep their order
    assert 'date:"' not in events and "Y-m-d" not in commands
    for page in (dead_letters, retry, abandon):
        assert re.search(r"since " + to_the_second + r" \(" + AGE, page), page[-3000:]
    assert len(re.findall(to_the_second, steer)) == 2  # the command's sent and applied times in its history
