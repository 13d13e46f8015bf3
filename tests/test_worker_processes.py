"""The engine's guarantees with real `celery worker` processes, Redis and PostgreSQL: SIGKILL mid-step,
duplicate delivery through the broker, and the document_review example end to end."""

import json
import os

import pytest
from django.core.management import call_command

from checkpoints_app.models import Checkpoint, SideEffect
from config.celery import app
from steering_app.services import steering_submit
from tasks_app.examples import document_review, external
from tasks_app.models import Step, Task
from tests.engine_support import effects, executions, expire_lease, new_task
from tests.worker_support import wait_for_status

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("external_root"), pytest.mark.slow]


def test_it_resumes_on_another_worker_after_sigkill_between_effect_and_commit(tenant, workers):
    doomed = workers("doomed", pool="solo", faults="after_effect_before_commit:kill@step_seq=3")
    task = new_task(tenant, steps=6, sleep_ms=20)

    assert doomed.wait_exit() == -9  # SIGKILLed itself at the fault point, mid-step
    assert Task.objects.get(id=task.id).steps_completed == 2
    workers("rescuer")
    expire_lease(task.id)  # move time: the dead worker's lease runs out
    app.send_task("runtime.reap", priority=0)  # the reaper runs on the surviving worker, as beat would send it

    task = wait_for_status(task.id, {"completed", "failed", "dead_lettered"})
    assert task.status == "completed" and task.result == {"steps": 6} and task.recoveries == 1
    assert list(Step.objects.filter(task=task).order_by("seq").values_list("seq", flat=True)) == [1, 2, 3, 4, 5, 6]
    ran = executions(task.id)
    assert ran == {1: 1, 2: 1, 3: 2, 4: 1, 5: 1, 6: 1}  # committed steps once; only the in-flight one again
    assert effects(task.id) == {f"{task.id}:{seq}:record": 1 for seq in range(1, 7)}  # every effect exactly once
    pids = {line.split()[2] for line in external.lines("demo_executions.log") if line.split()[1] == "3"}
    assert len(pids) == 2  # step 3 ran in the killed process and again in the rescuer


def test_it_runs_steps_once_when_the_broker_delivers_run_step_twice(tenant, workers):
    workers("pair", concurrency=2)
    task = new_task(tenant, steps=4, sleep_ms=150)  # task_create already sent one run_step
    app.send_task("runtime.run_step", args=[str(task.id)])  # the duplicate, delivered at once

    task = wait_for_status(task.id, {"completed", "failed", "dead_lettered"})

    assert task.status == "completed"
    assert executions(task.id) == {1: 1, 2: 1, 3: 1, 4: 1}
    assert effects(task.id) == {f"{task.id}:{seq}:record": 1 for seq in (1, 2, 3, 4)}


def test_it_reviews_2000_documents_and_reports_what_the_corpus_generator_planted(tenant, workers, settings, tmp_path):
    settings.CORPUS_ROOT = tmp_path / "corpus"
    call_command("generate_corpus", "--count", "2000", "--name", "review")
    answers = json.loads((settings.CORPUS_ROOT / "review" / "answers.json").read_text())
    workers("reviewer", concurrency=1)

    task = new_task(tenant, "document_review", corpus="review", batch_size=100)
    gate = wait_for_status(task.id, {"input_required", "failed", "dead_lettered"}, seconds=120)
    assert gate.wait and gate.wait["effect"]["name"] == "publish_report", gate.error  # publishing waits for a person
    assert external.lines(document_review.OUTBOX) == []
    steering_submit(task=gate, command_type="approve", payload={"waitId": gate.wait["waitId"]},
                    expected_version=gate.state_version, reason="figures checked", requested_by="user:reviewer")
    task = wait_for_status(task.id, {"completed", "failed", "dead_lettered"}, seconds=120)

    assert task.status == "completed", task.error
    assert task.result["documents"] == 2000 and task.result["totals"] == answers["totals"]
    expected_high = sorted(d for d, a in answers["documents"].items() if a["level"] == "high")
    report = json.loads((settings.MEDIA_ROOT / task.result["report"]["json"]).read_text())
    assert report["high_risk"] == expected_high
    for doc_id in ("DOC-00001", "DOC-00017", "DOC-00500", "DOC-01234", "DOC-02000"):  # spot checks
        assert (doc_id in report["high_risk"]) == (answers["documents"][doc_id]["level"] == "high")
    markdown = (settings.MEDIA_ROOT / task.result["report"]["markdown"]).read_text()
    assert f"| high | {answers['totals']['high']} |" in markdown
    outbox = external.lines(document_review.OUTBOX)
    assert len(outbox) == 1 and json.loads(outbox[0])["totals"] == answers["totals"]
    assert SideEffect.objects.get(task=task, name="publish_report").status == "succeeded"
    # load, 20 batches, aggregate, a section per risk class, write, publish
    assert Step.objects.filter(task=task).count() == 1 + 20 + 1 + 3 + 2
    # every 10 steps, and right after the costly write_report (step 26), which the approval wait found current
    through = sorted(json.loads(p)["completed"]["through_seq"]
                     for p in Checkpoint.objects.filter(task=task).values_list("payload", flat=True))
    assert through == [10, 20, 26]
    assert os.path.exists(settings.MEDIA_ROOT / task.result["report"]["markdown"])


def test_it_runs_the_most_urgent_waiting_task_first(tenant, workers):
    from tasks_app.services import task_create

    def create(priority, steps=1, sleep_ms=0):
        return task_create(tenant=tenant, owner=None, workflow="demo_steps", priority=priority,
                           input={"steps": steps, "sleep_ms": sleep_ms}).task

    blocker = create(5, sleep_ms=1500)  # occupies the only worker slot while the others queue up
    routine = [create(0) for _ in range(4)]
    urgent = create(9)
    workers("single", pool="solo")

    for task in [blocker, *routine, urgent]:
        wait_for_status(task.id, {"completed"})
    finished = {t.id: Task.objects.get(id=t.id).completed_at for t in [*routine, urgent]}
    assert finished[urgent.id] < min(finished[t.id] for t in routine)


def test_it_opens_no_database_connection_per_time_slice(tenant, workers):
    from django.db import connection

    def sessions():
        with connection.cursor() as cursor:
            cursor.execute("SELECT sessions FROM pg_stat_database WHERE datname = current_database()")
            return cursor.fetchone()[0]

    # Connections kept for the process's life (the settings' default, not the tests' DB_CONN_MAX_AGE=0).
    workers("keeper", pool="prefork", concurrency=1,
            env={"DB_CONN_MAX_AGE": "600", "RUNTIME_SLICE_SECONDS": "0", "RUNTIME_HEARTBEAT_SECONDS": "0.2"})
    warm_up = new_task(tenant, steps=2, sleep_ms=300)  # the worker's and its lease renewer's first connections
    wait_for_status(warm_up.id, ["completed"])
    before = sessions()

    task = new_task(tenant, steps=20, sleep_ms=300)  # 20 slices, each renewed by the heartbeat at least once
    wait_for_status(task.id, ["completed"], seconds=90)

    assert sessions() - before <= 1  # not one per slice (20); at most a reconnect
