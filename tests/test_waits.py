"""Waits: a step asks for input, an effect waits for approval; answered through steering, resumed without replay."""

import base64
import json

import pytest
from django.core.management import call_command
from django.db import connection

from checkpoints_app.models import Checkpoint
from steering_app.models import SteeringCommand
from tasks_app.examples import document_review, external
from tasks_app.models import Step, Task, TaskEvent
from tasks_app.selectors import task_events_verify
from tests.engine_support import configure, drive, effects, executions
from tests.support.tasks import create_row, snapshot, steer

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("external_root")]


def answer(api, task, value, **extra):
    wait = snapshot(api, task)["wait"]
    return steer(api, task, "provide_input", payload={"waitId": wait["waitId"], "value": value, **extra})


def test_it_waits_for_input_after_the_step_that_asked_and_never_runs_that_step_again(api):
    task = create_row(api, input={"steps": 4, "ask_at": 1})

    drive(task.id)

    waiting = snapshot(api, task)
    assert waiting["status"] == "input_required" and waiting["wait"]["kind"] == "input"
    assert waiting["wait"]["schema"]["required"] == ["note"] and "step 2" in waiting["wait"]["prompt"]
    row = Task.objects.get(id=task.id)
    assert (row.lease_owner, row.hint_at) == (None, None)  # no worker holds it and none is asked to come
    assert executions(task.id) == {1: 1, 2: 1}

    refused = answer(api, task, {"note": ""})
    assert refused.status_code == 422 and refused.json()["errors"][0]["field"] == "payload.value.note"
    assert Task.objects.get(id=task.id).status == "input_required" and Task.objects.get(id=task.id).answers is None

    assert answer(api, task, {"note": "looks good"}).status_code == 202
    assert Task.objects.get(id=task.id).status == "working"
    drive(task.id)

    done = Task.objects.get(id=task.id)
    assert done.status == "completed" and done.result == {"steps": 4, "note": "looks good"}
    assert executions(task.id) == {1: 1, 2: 1, 3: 1, 4: 1}  # the step that asked did not run again
    assert effects(task.id) == {f"{task.id}:{seq}:record": 1 for seq in (1, 2, 3, 4)}
    assert task_events_verify(task_id=task.id) is None


def test_it_stops_before_an_effect_that_needs_approval_and_calls_it_once_approved(api):
    task = create_row(api, input={"steps": 3, "approve_at": 1})

    drive(task.id)

    wait = snapshot(api, task)["wait"]
    assert wait["kind"] == "approval" and wait["effect"]["key"] == f"{task.id}:2:record"
    assert wait["effect"]["arguments"] == {"step": 1, "count": 2}
    assert effects(task.id) == {f"{task.id}:1:record": 1}  # not called before the approval
    assert steer(api, task, "approve", payload={"waitId": wait["waitId"]}, reason="ok").status_code == 202
    drive(task.id)

    assert Task.objects.get(id=task.id).status == "completed"
    assert effects(task.id) == {f"{task.id}:{seq}:record": 1 for seq in (1, 2, 3)}


def test_it_fails_a_step_whose_effect_was_rejected_without_calling_it(api):
    task = create_row(api, input={"steps": 2, "approve_at": 0})
    drive(task.id)
    wait = snapshot(api, task)["wait"]

    assert steer(api, task, "reject", payload={"waitId": wait["waitId"]}, reason="wrong recipient").status_code == 202
    drive(task.id)

    failed = Task.objects.get(id=task.id)
    assert failed.status == "failed" and failed.error["type"] == "EffectRejected"
    assert "wrong recipient" in failed.error["message"] and effects(task.id) == {}


def test_it_waits_for_approval_of_the_effects_a_task_s_approval_policy_names(api):
    plain = create_row(api, input={"steps": 2})
    gated = create_row(api, input={"steps": 2}, approvalPolicy={"before": ["record"]})

    drive(plain.id)
    drive(gated.id)

    assert Task.objects.get(id=plain.id).status == "completed"
    shown = snapshot(api, gated)
    assert shown["status"] == "input_required" and shown["approvalPolicy"] == {"before": ["record"]}
    assert shown["wait"]["effect"]["name"] == "record" and effects(gated.id) == {}


def test_it_checkpoints_as_often_as_the_task_s_checkpoint_policy_says_within_the_bounds(api, settings):
    configure(settings, checkpoint={"every_steps": 100})
    task = create_row(api, input={"steps": 7, "effect": False}, checkpointPolicy={"everySteps": 2})

    drive(task.id)

    through = sorted(json.loads(payload)["completed"]["through_seq"]
                     for payload in Checkpoint.objects.filter(task=task).values_list("payload", flat=True))
    assert through == [2, 4, 6]  # (the last step completes the task: no checkpoint after it)
    assert snapshot(api, task)["checkpointPolicy"] == {"everySteps": 2}
    too_often = api.post("/runtime/tasks", {"workflow": "demo_steps", "input": {"steps": 1},
                                            "checkpointPolicy": {"everySteps": 0, "maxSeconds": 99999}}, format="json")
    assert too_often.status_code == 400
    assert {e["field"] for e in too_often.json()["errors"]} == {"checkpointPolicy.everySteps",
                                                                "checkpointPolicy.maxSeconds"}


def test_it_keeps_a_wait_through_pause_and_resume_and_takes_an_answer_while_paused(api):
    task = create_row(api, input={"steps": 3, "ask_at": 0})
    drive(task.id)
    wait_id = snapshot(api, task)["wait"]["waitId"]

    assert steer(api, task, "pause", reason="lunch").status_code == 202
    assert snapshot(api, task)["internalStatus"] == "paused"
    assert steer(api, task, "resume").status_code == 202
    assert snapshot(api, task)["status"] == "input_required" and snapshot(api, task)["wait"]["waitId"] == wait_id

    assert steer(api, task, "pause", reason="again").status_code == 202
    assert answer(api, task, {"note": "while paused"}).status_code == 202
    assert snapshot(api, task)["internalStatus"] == "paused" and "wait" not in snapshot(api, task)
    assert steer(api, task, "resume").status_code == 202
    drive(task.id)

    assert Task.objects.get(id=task.id).result == {"steps": 3, "note": "while paused"}
    assert executions(task.id) == {1: 1, 2: 1, 3: 1}


def test_it_refuses_an_answer_for_another_wait_or_of_the_wrong_kind(api):
    task = create_row(api, input={"steps": 2, "ask_at": 0})
    drive(task.id)
    wait_id = snapshot(api, task)["wait"]["waitId"]

    other = steer(api, task, "provide_input", payload={"waitId": "0b5ad2d6-5d39-4d1c-9a55-0a4a4c8c1a11",
                                                       "value": {"note": "x"}})
    wrong_kind = steer(api, task, "approve", payload={"waitId": wait_id})

    assert other.status_code == 422 and wait_id in other.json()["detail"]
    assert wrong_kind.status_code == 422 and "provide_input" in wrong_kind.json()["detail"]
    assert not SteeringCommand.objects.filter(task=task).exists()


def test_it_refuses_secret_values_and_unknown_secret_names_and_keeps_credential_names(api, settings):
    configure(settings, credentials=("CRM_API_KEY",))
    task = create_row(api, input={"steps": 2, "ask_at": 0})
    drive(task.id)
    token = "ghp_" + "a1B2" * 10

    pasted = answer(api, task, {"note": "ok"}, credentials={"crm": token})
    unknown = answer(api, task, {"note": "ok"}, credentials={"crm": "OTHER_KEY"})
    in_value = answer(api, task, {"note": f"the key is {token}"})
    accepted = answer(api, task, {"note": "ok"}, credentials={"crm": "CRM_API_KEY"})

    assert pasted.status_code == 422 and token not in pasted.content.decode()
    assert unknown.status_code == 422 and "CRM_API_KEY" in unknown.json()["detail"]
    assert in_value.status_code == 422 and token not in in_value.content.decode()
    assert accepted.status_code == 202
    stored = next(iter(Task.objects.get(id=task.id).answers.values()))
    assert stored["credentials"] == {"crm": "CRM_API_KEY"}
    with connection.cursor() as cursor:  # the secret is nowhere in the database
        for table in ("tasks_app_task", "tasks_app_taskevent", "steering_app_steeringcommand"):
            cursor.execute(f"SELECT count(*) FROM {table} t WHERE t::text LIKE %s", [f"%{token}%"])
            assert cursor.fetchone()[0] == 0, table


def test_it_stores_uploaded_files_as_the_task_s_artifacts_and_caps_their_size(api, settings):
    configure(settings, input_files={"max_bytes": 64, "max_files": 2})
    task = create_row(api, input={"steps": 2, "ask_at": 0})
    drive(task.id)
    small = {"name": "notes.txt", "contentBase64": base64.b64encode(b"hello").decode(), "contentType": "text/plain"}
    large = {"name": "big.bin", "contentBase64": base64.b64encode(b"x" * 65).decode()}

    too_large = answer(api, task, {"note": "ok"}, files=[large])
    accepted = answer(api, task, {"note": "ok"}, files=[small])

    assert too_large.status_code == 422 and "64 bytes" in too_large.json()["detail"]
    assert accepted.status_code == 202
    listed = api.get(f"/runtime/tasks/{task.id}/artifacts").json()
    assert [a["name"] for a in listed["artifacts"]] == ["input.notes.txt"]
    assert api.get(f"/runtime/tasks/{task.id}/artifacts/input.notes.txt").getvalue() == b"hello"
    command = SteeringCommand.objects.get(task=task)
    assert "contentBase64" not in str(command.payload)  # the command keeps the reference, not the bytes


@pytest.fixture
def corpus(settings, tmp_path):
    settings.CORPUS_ROOT = tmp_path / "corpus"
    call_command("generate_corpus", "--count", "40", "--name", "c40")
    return json.loads((settings.CORPUS_ROOT / "c40" / "answers.json").read_text())


def report_text(task, kind="markdown") -> str:
    from django.core.files.storage import default_storage
    return default_storage.open(Task.objects.get(id=task.id).result["report"][kind]).read().decode()


def approve_publication(api, task):
    wait = snapshot(api, task)["wait"]
    assert wait["kind"] == "approval" and wait["effect"]["name"] == "publish_report"
    assert steer(api, task, "approve", payload={"waitId": wait["waitId"]}, reason="checked").status_code == 202
    return wait


def test_it_re_plans_document_review_from_the_cursor_when_the_goal_is_adjusted_mid_run(api, corpus):
    task = create_row(api, "document_review", input={"corpus": "c40", "batch_size": 10})
    drive(task.id, max_steps=3, calls=1, until_done=False)  # load_manifest and two of four batches
    assert Task.objects.get(id=task.id).steps_completed == 3

    adjusted = steer(api, task, "adjust_goal", reason="expired ones are handled elsewhere",
                     payload={"parameters": {"excludeCategories": ["expiring_or_expired"], "reportFirst": "medium"}})
    assert adjusted.status_code == 202
    drive(task.id)
    approve_publication(api, task)
    drive(task.id)

    done = Task.objects.get(id=task.id)
    assert done.status == "completed" and done.plan_version == 2
    (event,) = TaskEvent.objects.filter(task=task, type="plan.adjusted")
    assert event.data["fromStep"] == 3
    assert event.data["oldPlan"] == [["classify_batch", 2], ["aggregate", 1], ["report_high", 1],
                                     ["report_medium", 1], ["report_low", 1], ["write_report", 1],
                                     ["publish_report", 1]]
    assert event.data["newPlan"][:4] == [["classify_batch", 2], ["aggregate", 1], ["report_medium", 1],
                                         ["report_high", 1]]
    steps = list(Step.objects.filter(task=task).order_by("seq").values_list("plan_version", "name"))
    assert steps[:3] == [(1, "load_manifest"), (1, "classify_batch"), (1, "classify_batch")]
    assert [name for version, name in steps[3:]] == ["classify_batch", "classify_batch", "aggregate", "report_medium",
                                                     "report_high", "report_low", "write_report", "publish_report"]
    assert {version for version, _ in steps[3:]} == {2}
    kept = {d: a for d, a in corpus["documents"].items() if "expiring_or_expired" not in a["reasons"]}
    assert done.result["totals"] == {level: sum(a["level"] == level for a in kept.values())
                                     for level in ("high", "medium", "low")}
    markdown = report_text(task)
    assert "Reported first: medium risk" in markdown
    assert f"Left out: expiring_or_expired ({len(corpus['documents']) - len(kept)} documents)" in markdown
    assert markdown.index("## Medium risk") < markdown.index("## High risk")
    assert task_events_verify(task_id=task.id) is None


def test_it_redoes_the_report_when_the_goal_changes_while_publication_waits_for_approval(api, corpus):
    task = create_row(api, "document_review", input={"corpus": "c40", "batch_size": 10})
    drive(task.id)
    first_wait = snapshot(api, task)["wait"]
    first_report = Task.objects.get(id=task.id).wait["effect"]["arguments"]["report"]

    assert steer(api, task, "adjust_goal", payload={"parameters": {"reportFirst": "low"}}).status_code == 202
    assert snapshot(api, task)["status"] == "working" and "wait" not in snapshot(api, task)
    drive(task.id)

    second_wait = approve_publication(api, task)
    assert second_wait["waitId"] != first_wait["waitId"]  # an approval of the old plan does not carry over
    assert second_wait["effect"]["arguments"]["report"] != first_report  # a new report, the first one kept as is
    drive(task.id)
    assert Task.objects.get(id=task.id).status == "completed"
    assert report_text(task).index("## Low risk") < report_text(task).index("## High risk")
    published = [json.loads(line) for line in external.lines(document_review.OUTBOX)]
    assert [p["report"] for p in published] == [second_wait["effect"]["arguments"]["report"]]


def test_it_refuses_goal_parameters_the_workflow_does_not_define(api, corpus):
    task = create_row(api, "document_review", input={"corpus": "c40", "batch_size": 10})

    refused = steer(api, task, "adjust_goal", payload={"parameters": {"reportFirst": "urgent"}})

    assert refused.status_code == 422 and refused.json()["errors"][0]["field"] == "payload.parameters.reportFirst"


def test_it_publishes_nothing_when_the_publication_is_rejected(api, corpus):
    task = create_row(api, "document_review", input={"corpus": "c40", "batch_size": 10})
    drive(task.id)
    wait = snapshot(api, task)["wait"]

    assert steer(api, task, "reject", payload={"waitId": wait["waitId"]}, reason="numbers look off").status_code == 202
    drive(task.id)

    done = Task.objects.get(id=task.id)
    assert done.status == "completed" and done.result["published"] == {"published": False,
                                                                      "rejected": "numbers look off"}
    assert external.lines(document_review.OUTBOX) == []


def test_it_enters_the_same_wait_after_a_crash_between_the_asking_step_s_commit_and_the_wait(api):
    from tasks_app.engine import faults, reaper
    from tasks_app.engine import slice as engine
    from tests.engine_support import expire_lease

    task = create_row(api, input={"steps": 3, "ask_at": 1})
    with faults.armed("after_commit_before_chain:raise@step_seq=2"), pytest.raises(faults.InjectedFault):
        engine.run_step(task.id, owner="crashing")  # step 2 asked and committed; the worker died before waiting
    assert Task.objects.get(id=task.id).status == "working" and Task.objects.get(id=task.id).wait is None
    expire_lease(task.id)
    reaper.reaper_sweep()

    drive(task.id)

    waiting = Task.objects.get(id=task.id)
    assert waiting.status == "input_required" and waiting.steps_completed == 2
    assert executions(task.id) == {1: 1, 2: 1}  # recovery found the question in step 2's delta: nothing re-ran
    assert answer(api, task, {"note": "after the crash"}).status_code == 202
    drive(task.id)
    assert Task.objects.get(id=task.id).result == {"steps": 3, "note": "after the crash"}


def test_it_applies_an_adjust_goal_queued_for_a_paused_task_once_when_it_resumes(api, corpus):
    task = create_row(api, "document_review", input={"corpus": "c40", "batch_size": 10})
    drive(task.id, max_steps=2, calls=1, until_done=False)
    assert steer(api, task, "pause").status_code == 202
    drive(task.id)
    assert Task.objects.get(id=task.id).status == "paused"

    assert steer(api, task, "adjust_goal", payload={"goal": "only what matters",
                                                    "parameters": {"reportFirst": "medium"}}).status_code == 202
    assert steer(api, task, "resume").status_code == 202  # decided at once; the adjust is left to the worker
    drive(task.id)

    resumed = Task.objects.get(id=task.id)
    assert resumed.status == "input_required" and resumed.plan_version == 2
    assert resumed.goal == {"text": "only what matters", "parameters": {"reportFirst": "medium"}}
    assert [(e.data["type"]) for e in TaskEvent.objects.filter(task=task, type="steering.applied").order_by("seq")] \
        == ["pause", "resume", "adjust_goal"]
    assert resumed.steering_cursor == resumed.state_version
    assert TaskEvent.objects.filter(task=task, type="plan.adjusted").count() == 1


def test_it_waits_until_every_part_of_a_wait_is_answered_one_at_a_time(api):
    task = create_row(api, input={"steps": 3, "ask_parts_at": 0})
    drive(task.id)
    wait = snapshot(api, task)["wait"]
    assert set(wait["parts"]) == {"colour", "size"} and "Which size" in wait["parts"]["size"]["prompt"]

    def part(name, value):
        return steer(api, task, "provide_input", payload={"waitId": wait["waitId"], "part": name, "value": value})

    assert part("colour", "green").status_code == 202
    waiting = snapshot(api, task)
    assert waiting["status"] == "input_required" and waiting["wait"]["answeredParts"] == ["colour"]
    assert Task.objects.get(id=task.id).hint_at is None  # nobody is asked to come for half an answer
    again = part("colour", "red")
    unknown = part("shape", "round")
    bad = part("size", 11)
    assert again.status_code == unknown.status_code == bad.status_code == 422
    assert "already answered" in again.json()["detail"] and bad.json()["errors"][0]["field"] == "payload.value"
    assert part("size", 4).status_code == 202
    assert snapshot(api, task)["status"] == "working"
    drive(task.id)

    done = Task.objects.get(id=task.id)
    assert done.status == "completed" and done.result["survey"] == {"colour": "green", "size": 4}
    assert executions(task.id) == {1: 1, 2: 1, 3: 1}


def test_it_takes_every_part_of_a_wait_in_one_answer_checked_against_them_all(api):
    task = create_row(api, input={"steps": 2, "ask_parts_at": 0})
    drive(task.id)

    missing = answer(api, task, {"colour": "blue"})
    whole = answer(api, task, {"colour": "blue", "size": 2})

    assert missing.status_code == 422 and whole.status_code == 202
    drive(task.id)
    assert Task.objects.get(id=task.id).result["survey"] == {"colour": "blue", "size": 2}


def test_it_keeps_what_an_attempt_spent_before_an_approval_gate_when_a_pause_comes_first(api, tenant):
    from tasks_app.services import task_create
    from tests import workflows

    workflows.SCRIPTS["spend-then-gate"] = {0: [{"do": "spend", "amount": "2.5"}, {"do": "pause_self"},
                                                {"do": "leak", "secret": "x"}]}
    task = task_create(tenant=tenant, owner=None, workflow="scripted",
                       input={"script": "spend-then-gate", "steps": 1}).task

    drive(task.id)

    paused = Task.objects.get(id=task.id)
    assert paused.status == "paused" and paused.steps_completed == 0
    assert paused.cost_spent == 2.5  # the suspended attempt's spending, kept by the write that let the task go
