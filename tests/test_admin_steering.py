"""The operators' console steers tasks through the same services as the API: answers to waits, approvals and
adjust_goal from forms built from JSON Schemas; a refusal (409, 422) is a message on the page, never a 500."""

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.management import call_command

from steering_app.models import SteeringCommand
from tasks_app.models import Task
from tasks_app.services import task_create
from tests.engine_support import drive
from tests.support.console import staff_user

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("external_root")]


def waiting_task(tenant, **input_) -> Task:
    """A demo_steps task driven in-process until it waits (ask_at: for input; approve_at: for an approval)."""
    task = task_create(tenant=tenant, owner=None, workflow="demo_steps", input={"steps": 3, **input_}).task
    drive(task.id)
    task.refresh_from_db()
    assert task.status == "input_required" and task.wait is not None
    return task


def wait_url(task) -> str:
    return f"/admin/tasks_app/task/{task.id}/steer/wait/"


def goal_url(task) -> str:
    return f"/admin/tasks_app/task/{task.id}/steer/goal/"


@pytest.fixture
def review_task(tenant, settings, tmp_path):
    settings.CORPUS_ROOT = tmp_path / "corpus"
    call_command("generate_corpus", "--count", "20", "--name", "c")
    return task_create(tenant=tenant, owner=None, workflow="document_review",
                       input={"corpus": "c", "batch_size": 10}).task


def test_it_shows_the_open_wait_on_the_task_page_with_a_link_to_answer_it(tenant, admin_client):
    task = waiting_task(tenant, ask_at=0)

    page = admin_client.get(f"/admin/tasks_app/task/{task.id}/change/").content.decode()

    assert "A note for step 1, please" in page and "<strong>note</strong>" in page
    assert wait_url(task) in page and f"/admin/tasks_app/task/{task.id}/steer/" in page


def test_it_builds_the_input_form_from_the_waits_schema(tenant, admin_client):
    task = waiting_task(tenant, ask_at=0)

    page = admin_client.get(wait_url(task)).content.decode()

    assert 'name="value-note"' in page and 'maxlength="200"' in page
    assert "A note for step 1, please" in page
    assert f'value="{task.wait["waitId"]}"' in page and f'name="expected_version" value="{task.state_version}"' in page


def test_it_shows_a_value_the_schema_refuses_as_the_422_message_and_the_task_still_waits(tenant, admin_client):
    task = waiting_task(tenant, ask_at=0)

    refused = admin_client.post(wait_url(task), {"wait_id": task.wait["waitId"], "expected_version": task.state_version,
                                                 "value-note": "", "reason": ""})

    page = refused.content.decode()
    assert refused.status_code == 200
    assert "does not match the schema of wait" in page and "the task still waits" in page
    assert "should be non-empty" in page or "is too short" in page  # the schema's error, on the note field
    after = Task.objects.get(id=task.id)
    assert after.status == "input_required" and after.wait == task.wait and not after.answers
    assert not SteeringCommand.objects.filter(task=task).exists()


def test_it_answers_an_input_wait_with_a_file_and_the_task_goes_back_to_work(tenant, admin_client):
    task = waiting_task(tenant, ask_at=0)
    wait_id = task.wait["waitId"]

    sent = admin_client.post(wait_url(task), {
        "wait_id": wait_id, "expected_version": task.state_version, "value-note": "ship it", "reason": "reviewed",
        "file": SimpleUploadedFile("notes for you.txt", b"hello", content_type="text/plain")}, follow=True)

    assert sent.status_code == 200 and "Command provide_input accepted" in sent.content.decode()
    after = Task.objects.get(id=task.id)
    assert after.status == "working" and after.wait is None
    assert after.answers[wait_id]["value"] == {"note": "ship it"}
    assert list(after.answers[wait_id]["files"]) == ["notes_for_you.txt"]
    drive(task.id)
    assert Task.objects.get(id=task.id).result["note"] == "ship it"


def test_it_shows_the_effect_its_key_and_arguments_on_the_approval_page(tenant, admin_client):
    task = waiting_task(tenant, approve_at=0)
    effect = task.wait["effect"]

    page = admin_client.get(wait_url(task)).content.decode()

    assert effect["name"] == "record" and effect["key"] in page
    assert "&quot;step&quot;: 0" in page  # the arguments as pretty JSON, escaped
    assert 'value="approve"' in page and 'value="reject"' in page


def test_it_escapes_what_a_wait_shows(tenant, admin_client):
    task = waiting_task(tenant, approve_at=0)
    wait = {**task.wait, "prompt": "<b>prompt</b>",
            "effect": {**task.wait["effect"], "arguments": {"to": "<script>alert(1)</script>"}}}
    Task.objects.filter(id=task.id).update(wait=wait)

    page = admin_client.get(wait_url(task)).content.decode()
    task_page = admin_client.get(f"/admin/tasks_app/task/{task.id}/change/").content.decode()

    assert "<script>alert(1)</script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "<b>prompt</b>" not in page + task_page and "&lt;b&gt;prompt&lt;/b&gt;" in task_page


def test_it_approves_an_effect_and_the_task_goes_back_to_work(tenant, admin_client):
    task = waiting_task(tenant, approve_at=0)
    wait_id = task.wait["waitId"]

    sent = admin_client.post(wait_url(task), {"wait_id": wait_id, "expected_version": task.state_version,
                                              "reason": "looks right", "decision": "approve"}, follow=True)

    assert "Command approve accepted" in sent.content.decode()
    after = Task.objects.get(id=task.id)
    assert after.status == "working" and after.answers[wait_id]["decision"] == "approved"


def test_it_rejects_an_effect_keeping_the_reason(tenant, admin_client):
    task = waiting_task(tenant, approve_at=0)
    wait_id = task.wait["waitId"]

    admin_client.post(wait_url(task), {"wait_id": wait_id, "expected_version": task.state_version,
                                       "reason": "wrong account", "decision": "reject"})

    answer = Task.objects.get(id=task.id).answers[wait_id]
    assert (answer["decision"], answer["reason"]) == ("rejected", "wrong account")
    assert SteeringCommand.objects.get(task=task).type == "reject"


def test_it_says_so_when_a_page_answers_a_wait_that_was_answered_meanwhile(tenant, admin_client):
    task = waiting_task(tenant, approve_at=0)
    form = {"wait_id": task.wait["waitId"], "expected_version": task.state_version, "reason": "", "decision": "approve"}

    admin_client.post(wait_url(task), form)
    second = admin_client.post(wait_url(task), form, follow=True)

    assert second.status_code == 200 and "waits for nothing" in second.content.decode()
    assert SteeringCommand.objects.filter(task=task).count() == 1


def test_it_adjusts_the_goal_parameters_from_a_form_built_from_the_workflows_schema(review_task, admin_client):
    page = admin_client.get(goal_url(review_task)).content.decode()

    sent = admin_client.post(goal_url(review_task), {
        "goal": "", "parameters-excludeCategories": ["expiring_or_expired"], "parameters-reportFirst": "",
        "reason": "expired ones are handled elsewhere", "expected_version": review_task.state_version}, follow=True)

    assert 'name="parameters-excludeCategories" value="expiring_or_expired"' in page
    assert 'name="parameters-reportFirst"' in page and '<option value="medium">' in page
    assert "Command adjust_goal accepted" in sent.content.decode()
    command = SteeringCommand.objects.get(task=review_task)
    assert (command.type, command.payload) == ("adjust_goal", {"parameters": {"excludeCategories":
                                                                              ["expiring_or_expired"]}})


def test_it_sends_a_new_goal_as_text_or_json_with_the_parameters_shown(review_task, admin_client):
    Task.objects.filter(id=review_task.id).update(goal={"text": "old", "parameters": {"reportFirst": "low"}})

    admin_client.post(goal_url(review_task), {
        "goal": '{"text": "only contracts"}', "parameters-reportFirst": "low", "reason": "narrower",
        "expected_version": review_task.state_version})

    command = SteeringCommand.objects.get(task=review_task)
    assert command.payload == {"goal": {"text": "only contracts"}, "parameters": {"reportFirst": "low"}}


def test_it_shows_a_stale_version_on_the_goal_form_as_the_409_message(review_task, admin_client):
    form = {"parameters-reportFirst": "low", "reason": "x", "expected_version": review_task.state_version}

    admin_client.post(goal_url(review_task), form)
    stale = admin_client.post(goal_url(review_task), {**form, "parameters-reportFirst": "medium"}, follow=True)

    page = stale.content.decode()
    seen = review_task.state_version
    assert stale.status_code == 200 and f"Not done: the task changed since you looked at it (version {seen}, now " \
        f"{seen + 1}): adjust goal by user:admin at " in page
    assert SteeringCommand.objects.filter(task=review_task).count() == 1


def test_it_tells_a_person_what_changed_and_by_whom_when_a_stale_form_is_refused_and_offers_the_action_again(
        tenant, admin_client):
    task = task_create(tenant=tenant, owner=None, workflow="demo_steps", input={"steps": 3}).task  # no worker: queued
    steer_url, seen = f"/admin/tasks_app/task/{task.id}/steer/", task.state_version
    admin_client.post(steer_url, {"type": "pause", "reason": "tab A", "expected_version": seen})  # tab A

    stale = admin_client.post(steer_url, {"type": "cancel", "reason": "tab B, on the old view",
                                          "expected_version": seen}, follow=True)

    page = stale.content.decode()
    assert (f"Not done: the task changed since you looked at it (version {seen}, now {seen + 1}): pause by "
            f"user:admin at ") in page
    now = Task.objects.get(id=task.id).status  # (queued: no worker came yet; the pause is applied before a step)
    assert f"It is {now} now. If you still want to cancel it, check the page and send it again." in page
    # The page it lands on offers the same action again, at the current version.
    assert stale.redirect_chain[-1][0].startswith(f"{steer_url}?type=cancel&reason=tab+B")
    assert '<option value="cancel" selected>' in page and 'value="tab B, on the old view"' in page
    assert f'name="expected_version" value="{seen + 1}"' in page
    assert list(SteeringCommand.objects.filter(task=task).values_list("type", flat=True)) == ["pause"]


def test_it_shows_parameters_the_service_refuses_as_a_message_not_an_error(review_task, admin_client):
    Task.objects.filter(id=review_task.id).update(status="completed")

    refused = admin_client.post(goal_url(review_task), {"parameters-reportFirst": "low", "reason": "x",
                                                        "expected_version": review_task.state_version})

    assert refused.status_code == 200 and "a finished task takes no more commands" in refused.content.decode()
    assert not SteeringCommand.objects.filter(task=review_task).exists()


def test_it_refuses_to_send_an_adjust_goal_that_changes_nothing(review_task, admin_client):
    refused = admin_client.post(goal_url(review_task), {"goal": "  ", "reason": "x",
                                                        "expected_version": review_task.state_version})

    assert "Nothing to send" in refused.content.decode()
    assert not SteeringCommand.objects.filter(task=review_task).exists()


def test_it_offers_only_the_generic_commands_on_the_steer_page(tenant, admin_client):
    task = waiting_task(tenant, ask_at=0)

    page = admin_client.get(f"/admin/tasks_app/task/{task.id}/steer/").content.decode()

    for offered in ("pause", "resume", "cancel", "set_priority", "kill"):
        assert f'value="{offered}"' in page
    for answer in ("adjust_goal", "provide_input", "approve", "reject"):
        assert f'value="{answer}"' not in page
    assert wait_url(task) in page and goal_url(task) in page


def test_it_gives_no_steering_form_to_an_account_without_the_steering_permission(tenant, client):
    task = waiting_task(tenant, ask_at=0)
    client.force_login(staff_user("reader", "view_task"))

    pages = [client.get(url) for url in (wait_url(task), goal_url(task), f"/admin/tasks_app/task/{task.id}/steer/")]
    posted = client.post(wait_url(task), {"wait_id": task.wait["waitId"], "expected_version": task.state_version,
                                          "value-note": "hi"})
    listed = client.post("/admin/tasks_app/task/", {"_selected_action": [str(task.id)], "action": "cancel_tasks",
                                                    "reason": "no"})

    for page in [*pages, posted, listed]:
        assert page.status_code == 403 and 'name="value-note"' not in page.content.decode()
    assert Task.objects.get(id=task.id).status == "input_required"
    assert not SteeringCommand.objects.filter(task=task).exists()


def test_it_offers_kill_only_with_the_kill_permission(tenant, client):
    task = task_create(tenant=tenant, owner=None, workflow="demo_steps", input={"steps": 1}).task
    steer_url = f"/admin/tasks_app/task/{task.id}/steer/"
    client.force_login(staff_user("steerer", "view_task", "add_steeringcommand"))
    without = client.get(steer_url).content.decode()
    client.force_login(staff_user("operator", "view_task", "add_steeringcommand", "kill_task"))
    with_kill = client.get(steer_url).content.decode()

    assert 'value="pause"' in without and 'value="kill"' not in without
    assert 'value="kill"' in with_kill


def test_it_maps_numbers_booleans_enums_and_other_properties_to_their_fields(tenant, admin_client):
    task = waiting_task(tenant, ask_at=0)
    schema = {"type": "object", "required": ["count"], "additionalProperties": False, "properties": {
        "count": {"type": "integer", "minimum": 1, "maximum": 5}, "share": {"type": "number"},
        "urgent": {"type": "boolean"}, "level": {"enum": ["a", 2]}, "meta": {"type": "object"}}}
    Task.objects.filter(id=task.id).update(wait={**task.wait, "schema": schema})
    form = {"wait_id": task.wait["waitId"], "expected_version": task.state_version}

    page = admin_client.get(wait_url(task)).content.decode()
    too_many = admin_client.post(wait_url(task), {**form, "value-count": "6"})
    admin_client.post(wait_url(task), {**form, "value-count": "3", "value-share": "0.5", "value-urgent": "on",
                                       "value-level": "2", "value-meta": '{"x": [1]}'})

    assert 'type="number" name="value-count"' in page and 'min="1"' in page and 'type="checkbox"' in page
    assert '<option value="2">' in page and '<textarea name="value-meta"' in page
    assert "less than or equal to 5" in too_many.content.decode()
    assert Task.objects.get(id=task.id).answers[task.wait["waitId"]]["value"] == {
        "count": 3, "share": 0.5, "urgent": True, "level": 2, "meta": {"x": [1]}}


def test_it_falls_back_to_one_json_textarea_for_a_schema_it_cannot_map(tenant, admin_client):
    task = waiting_task(tenant, ask_at=0)
    integers = {"type": "array", "items": {"type": "integer"}}
    Task.objects.filter(id=task.id).update(wait={**task.wait, "schema": integers})
    form = {"wait_id": task.wait["waitId"], "expected_version": task.state_version}

    page = admin_client.get(wait_url(task)).content.decode()
    not_json = admin_client.post(wait_url(task), {**form, "value-value": "[1,"})
    wrong = admin_client.post(wait_url(task), {**form, "value-value": '["x"]'})
    admin_client.post(wait_url(task), {**form, "value-value": "[1, 2]"})

    assert '<textarea name="value-value"' in page
    assert "Enter a valid JSON" in not_json.content.decode()
    assert "does not match the schema" in wrong.content.decode() and "is not of type" in wrong.content.decode()
    assert Task.objects.get(id=task.id).answers[task.wait["waitId"]]["value"] == [1, 2]


def test_it_sends_a_plain_text_goal_for_a_workflow_without_goal_parameters(tenant, admin_client):
    task = waiting_task(tenant, ask_at=0)

    page = admin_client.get(goal_url(task)).content.decode()
    admin_client.post(goal_url(task), {"goal": "only the summary, 42", "reason": "scope cut",
                                       "expected_version": task.state_version})

    assert "This workflow has no goal parameters." in page and 'name="parameters-' not in page
    assert SteeringCommand.objects.get(task=task).payload == {"goal": "only the summary, 42"}
    after = Task.objects.get(id=task.id)
    assert after.status == "working" and after.wait is None  # the open wait belonged to the old plan
