"""Waits, approvals and re-plans on real `celery worker` processes: what the issue's "must show" list asks for."""

import json
import time

import pytest
from django.core.management import call_command
from django.db import connection

from tasks_app.examples import document_review, external
from tasks_app.models import Task, TaskEvent
from tasks_app.selectors import task_events_verify
from tests.engine_support import effects, executions
from tests.support.tasks import create, snapshot, steer
from tests.worker_support import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("external_root"), pytest.mark.slow]


def statements_from(application_name: str, seconds: float) -> tuple[int, bool]:
    """(backends of that worker, whether any of them started a statement during the next ``seconds``)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement_timestamp()")
        since = cursor.fetchone()[0]
        time.sleep(seconds)
        cursor.execute("SELECT count(*), coalesce(max(query_start) >= %s, false) FROM pg_stat_activity "
                       "WHERE application_name = %s AND datname = current_database()", [since, application_name])
        return cursor.fetchone()


def test_it_waits_for_input_at_no_cost_and_continues_after_a_valid_answer_without_replay(api, workers):
    workers("asker", env={"PGAPPNAME": "asker-worker"})
    task_id = create(api, input={"steps": 4, "ask_at": 1, "sleep_ms": 100})["taskId"]

    waiting = wait_until(task_id, lambda t: t.status == "input_required")
    assert (waiting.lease_owner, waiting.hint_at, waiting.steps_completed) == (None, None, 2)
    backends, busy = statements_from("asker-worker", 3)
    assert backends >= 1 and not busy  # a waiting task costs nothing: no worker sends a statement for it

    wait = snapshot(api, task_id)["wait"]
    refused = steer(api, task_id, "provide_input", payload={"waitId": wait["waitId"], "value": {"note": 7}})
    assert refused.status_code == 422 and Task.objects.get(id=task_id).status == "input_required"
    accepted = steer(api, task_id, "provide_input", payload={"waitId": wait["waitId"], "value": {"note": "go"}})
    assert accepted.status_code == 202

    done = wait_until(task_id, lambda t: t.status == "completed")
    assert done.result == {"steps": 4, "note": "go"}
    assert executions(task_id) == {1: 1, 2: 1, 3: 1, 4: 1}  # the step that asked never ran again
    assert effects(task_id) == {f"{task_id}:{seq}:record": 1 for seq in (1, 2, 3, 4)}
    assert task_events_verify(task_id=task_id) is None


def test_it_never_crosses_an_approval_gate_while_paused_and_stops_at_it_after_resume(api, workers):
    workers("gatekeeper", env={"PGAPPNAME": "gate-worker"})
    task_id = create(api, input={"steps": 6, "approve_at": 4, "sleep_ms": 300})["taskId"]
    wait_until(task_id, lambda t: t.steps_completed >= 1)

    assert steer(api, task_id, "pause", reason="review first").status_code == 202
    paused = wait_until(task_id, lambda t: t.status == "paused")
    assert paused.steps_completed < 4
    backends, busy = statements_from("gate-worker", 2)
    assert backends >= 1 and not busy
    assert f"{task_id}:5:record" not in effects(task_id)

    assert steer(api, task_id, "resume").status_code == 202
    gated = wait_until(task_id, lambda t: t.status == "input_required")
    assert gated.steps_completed == 4 and gated.wait["effect"]["key"] == f"{task_id}:5:record"
    assert f"{task_id}:5:record" not in effects(task_id)  # resumed up to the gate, not across it
    assert steer(api, task_id, "approve", payload={"waitId": gated.wait["waitId"]}, reason="ok").status_code == 202

    wait_until(task_id, lambda t: t.status == "completed")
    assert effects(task_id) == {f"{task_id}:{seq}:record": 1 for seq in range(1, 7)}
    # Steps 1–4 and 6 ran once. Step 5 ran up to its gate, then again once approved: its code up to the gated call
    # runs again, its effects never (docs/steering.md, "Approvals").
    assert executions(task_id) == {1: 1, 2: 1, 3: 1, 4: 1, 5: 2, 6: 1}
    assert [e.data["type"] for e in TaskEvent.objects.filter(task_id=task_id, type="steering.applied")
            .order_by("seq")] == ["pause", "resume", "approve"]


@pytest.fixture
def corpus(settings, tmp_path):
    settings.CORPUS_ROOT = tmp_path / "corpus"
    call_command("generate_corpus", "--count", "2000", "--name", "big")
    return json.loads((settings.CORPUS_ROOT / "big" / "answers.json").read_text())


def test_it_re_plans_document_review_mid_run_and_the_published_report_reflects_the_new_goal(api, workers, corpus):
    workers("reviewer")
    task_id = create(api, "document_review", input={"corpus": "big", "batch_size": 50})["taskId"]  # 40 batches
    wait_until(task_id, lambda t: t.steps_completed >= 3)

    adjusted = steer(api, task_id, "adjust_goal", reason="expired contracts are renewed elsewhere",
                     payload={"parameters": {"excludeCategories": ["expiring_or_expired"], "reportFirst": "low"}})
    assert adjusted.status_code == 202
    gate = wait_until(task_id, lambda t: t.status == "input_required", seconds=120)
    assert steer(api, task_id, "approve", payload={"waitId": gate.wait["waitId"]}, reason="ok").status_code == 202
    done = wait_until(task_id, lambda t: t.status == "completed", seconds=60)

    assert done.plan_version == 2
    adjusted_event = TaskEvent.objects.get(task_id=task_id, type="plan.adjusted")
    assert adjusted_event.data["oldPlan"][-5:-2] == [["report_high", 1], ["report_medium", 1], ["report_low", 1]]
    assert adjusted_event.data["newPlan"][-5:-2] == [["report_low", 1], ["report_high", 1], ["report_medium", 1]]
    kept = [a for a in corpus["documents"].values() if "expiring_or_expired" not in a["reasons"]]
    expected = {level: sum(a["level"] == level for a in kept) for level in ("high", "medium", "low")}
    assert done.result["totals"] == expected
    (published,) = [json.loads(line) for line in external.lines(document_review.OUTBOX)]
    assert published["totals"] == expected
    from django.core.files.storage import default_storage
    markdown = default_storage.open(done.result["report"]["markdown"]).read().decode()
    assert f"Left out: expiring_or_expired ({2000 - len(kept)} documents)" in markdown
    assert markdown.index("## Low risk") < markdown.index("## High risk")
    assert task_events_verify(task_id=task_id) is None


def test_it_waits_before_publishing_when_the_task_s_approval_policy_names_the_effect(api, workers, corpus):
    workers("publisher")
    unguarded = create(api, "document_review", input={"corpus": "big", "batch_size": 500,
                                                      "approve_publication": False})["taskId"]
    guarded = create(api, "document_review", input={"corpus": "big", "batch_size": 500,
                                                    "approve_publication": False},
                     approvalPolicy={"before": ["publish_report"]})["taskId"]

    wait_until(unguarded, lambda t: t.status == "completed", seconds=120)
    gate = wait_until(guarded, lambda t: t.status == "input_required", seconds=120)

    assert gate.wait["effect"]["name"] == "publish_report"
    assert [json.loads(line)["task"] for line in external.lines(document_review.OUTBOX)] == [unguarded]
    assert steer(api, guarded, "approve", payload={"waitId": gate.wait["waitId"]}, reason="ok").status_code == 202
    wait_until(guarded, lambda t: t.status == "completed")
    assert [json.loads(line)["task"] for line in external.lines(document_review.OUTBOX)] == [unguarded, guarded]
