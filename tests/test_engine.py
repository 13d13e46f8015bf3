"""The step engine in-process, on real PostgreSQL: commit, fencing, recovery, dead letters, cost per step.

Worker-process versions of the crash and duplicate-delivery guarantees are in test_worker_processes.py.
"""

import threading
import time

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from checkpoints_app.models import Checkpoint, SideEffect
from tasks_app.engine import dead_letters, faults, reaper
from tasks_app.engine import slice as engine
from tasks_app.models import PlanChunk, Step, Task, TaskEvent
from tasks_app.selectors import task_events_verify
from tests.engine_support import configure, drive, effects, executions, expire_lease, new_task, park_until_deadlines_pass
from tests.helpers import metric_reader
from tests.support.concurrency import at_once

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("external_root")]


def crash_between_effect_and_commit(task_id, *, step_seq):
    """A worker dies after step `step_seq`'s effect went out and before its commit; its lease then runs out
    and the reaper hands the task on (an injected fault stands for the crash, moving time for the wait)."""
    with faults.armed(f"after_effect_before_commit:raise@step_seq={step_seq}"), pytest.raises(faults.InjectedFault):
        engine.run_step(task_id, owner="crashing")
    expire_lease(task_id)
    reaper.reaper_sweep()


def test_it_sweeps_a_fleet_with_nothing_due_in_one_statement(tenant):
    """The sweep asks first which of its parts have anything to look at (store.sweep_due): with a task waiting for a
    person and nothing leased, runnable, overdue or past retention, that one statement (and the layers' own sweeps)
    is all it sends — every ten seconds for the life of an idle fleet. Then a lease that ran out is recovered by the
    next sweep as before."""
    from tasks_app.registry import reaper_sweeps

    waiting = new_task(tenant, steps=3)
    Task.objects.filter(id=waiting.id).update(status="input_required", hint_at=None)
    with CaptureQueriesContext(connection) as idle:
        counts = reaper.reaper_sweep()
    assert len(idle) == 1 + len(reaper_sweeps()), [query["sql"][:80] for query in idle]
    assert not any(counts.values())

    crashed = new_task(tenant, steps=3)
    crash_between_effect_and_commit(crashed.id, step_seq=1)
    assert Task.objects.get(id=crashed.id).status == "recovering"


def test_it_runs_a_task_to_completion_with_steps_effects_checkpoints_and_an_intact_event_chain(tenant, settings):
    configure(settings, progress_event_seconds=0)  # one progress event per step
    task = new_task(tenant, steps=25)

    assert drive(task.id) == ["completed"]

    task.refresh_from_db()
    assert (task.status, task.result, task.progress, task.steps_completed) == ("completed", {"steps": 25}, 1.0, 25)
    assert list(Step.objects.filter(task=task).order_by("seq").values_list("seq", flat=True)) == list(range(1, 26))
    assert executions(task.id) == {seq: 1 for seq in range(1, 26)}
    assert effects(task.id) == {f"{task.id}:{seq}:record": 1 for seq in range(1, 26)}
    assert SideEffect.objects.filter(task=task, status="succeeded").count() == 25
    assert list(Checkpoint.objects.filter(task=task).values_list("sequence", flat=True).order_by("sequence")) == [1, 2]
    assert task.lease_owner is None and task.completed_at is not None
    types = list(TaskEvent.objects.filter(task=task).order_by("seq").values_list("type", flat=True))
    assert types[:2] == ["status", "status"] and types[-2:] == ["status", "terminal"]
    assert types.count("progress") == 25 and types.count("checkpoint") == 2
    assert task_events_verify(task_id=task.id) is None


@pytest.mark.parametrize("crash", [False, True], ids=["straight", "crash-right-after-the-ending-commit"])
def test_it_ends_the_plan_at_the_step_that_says_so_and_never_runs_a_step_past_it(tenant, settings, crash):
    """ctx.end_plan(): a plan of 50 steps ends at the 3rd (an agent that answered); the task completes, the plan's
    length is cut in the same commit — a worker that dies right after it leaves nothing past it to run."""
    from tests import workflows

    task = new_task(tenant, "ends_early", most=50, stop_at=3)
    if crash:
        with faults.armed("after_commit_before_chain:raise@step_seq=3"), pytest.raises(faults.InjectedFault):
            engine.run_step(task.id, owner="crashing")
        assert Task.objects.get(id=task.id).plan_length == 3  # committed with the step
        expire_lease(task.id)
        reaper.reaper_sweep()

    assert drive(task.id)[-1] == "completed"

    task.refresh_from_db()
    assert (task.status, task.result, task.progress, task.steps_completed) == ("completed", {"counted": 3}, 1.0, 3)
    assert task.plan_length == 3 and Step.objects.filter(task=task).count() == 3
    counted = [line for line in workflows.effect_calls(task.id)]
    assert sorted(counted) == [f"{task.id}:count:{n}" for n in (1, 2, 3)]  # each ran once, none past the end
    assert task_events_verify(task_id=task.id) is None


def _tamper_delta(task_id, seq):
    with connection.cursor() as cursor:
        cursor.execute("UPDATE tasks_app_step SET state_delta = '{\"set\": {\"count\": 999}}', "
                       "delta_sha256 = encode(sha256('{\"set\": {\"count\": 999}}'::bytea), 'hex') "
                       "WHERE task_id = %s AND seq = %s", [task_id, seq])


def test_it_covers_every_committed_step_with_one_progress_event_per_burst_and_binds_each_delta(tenant, settings):
    configure(settings, progress_event_seconds=3600, slice_seconds=3600)
    task = new_task(tenant, steps=25)
    assert drive(task.id, max_steps=10) == ["released", "released", "completed"]

    progress = [data for type_, data in TaskEvent.objects.filter(task=task).order_by("seq")
                .values_list("type", "data") if type_ == "progress"]
    # One per slice: the slice's steps, each delta bound, each effect named.
    assert [(p.get("firstStep"), p["stepsCompleted"]) for p in progress] == [(1, 10), (11, 20), (21, 25)]
    assert [e for p in progress for e in p["effects"]] == [f"{seq}:record" for seq in range(1, 26)]
    assert task_events_verify(task_id=task.id) is None

    _tamper_delta(task.id, 14)  # the step row's own checksum updated too: only the event can tell
    assert task_events_verify(task_id=task.id) == TaskEvent.objects.get(
        task=task, type="progress", data__stepsCompleted=20).seq


def test_it_binds_a_single_steps_delta_in_its_own_progress_event(tenant, settings):
    configure(settings, progress_event_seconds=0)
    task = new_task(tenant, steps=3)
    drive(task.id)

    _tamper_delta(task.id, 2)
    assert task_events_verify(task_id=task.id) == TaskEvent.objects.get(
        task=task, type="progress", data__stepsCompleted=2).seq


def test_it_hands_the_task_back_through_the_broker_between_time_slices(tenant, settings):
    configure(settings, slice_seconds=0)
    task = new_task(tenant, steps=3)

    assert drive(task.id) == ["released", "released", "completed"]
    assert executions(task.id) == {1: 1, 2: 1, 3: 1}


def test_it_fences_out_a_zombie_whose_lease_was_reaped(tenant):
    task = new_task(tenant, steps=3)
    outcome = []

    def zombie():  # sends step 1's effect, then stalls before committing it
        try:
            outcome.append(engine.run_step(task.id, owner="zombie"))
        finally:
            connection.close()

    with faults.armed("after_effect_before_commit:sleep=1.5@step_seq=1"):
        thread = threading.Thread(target=zombie)
        thread.start()
        while not effects(task.id):
            time.sleep(0.02)
        expire_lease(task.id)
        assert reaper.lease_reap_one(task.id) == "recovered"
        events_before = TaskEvent.objects.filter(task=task).count()
        thread.join()

    assert outcome == ["lease_lost"]
    assert Step.objects.filter(task=task).count() == 0
    assert TaskEvent.objects.filter(task=task).count() == events_before
    assert Task.objects.get(id=task.id).status == "recovering"
    # The next owner finishes; the zombie's effect is reconciled, not repeated.
    assert drive(task.id, owner="rescuer") == ["completed"]
    assert effects(task.id) == {f"{task.id}:{seq}:record": 1 for seq in (1, 2, 3)}
    assert executions(task.id) == {1: 2, 2: 1, 3: 1}


def test_it_runs_a_task_once_when_the_same_run_step_is_delivered_twice_at_once(tenant):
    task = new_task(tenant, steps=3, sleep_ms=100)

    outcomes = at_once(*[lambda owner=owner: engine.run_step(task.id, owner=owner) for owner in ("w0", "w1")])

    assert sorted(outcomes) == ["completed", "not_claimed"]
    assert executions(task.id) == {1: 1, 2: 1, 3: 1}
    assert effects(task.id) == {f"{task.id}:{seq}:record": 1 for seq in (1, 2, 3)}


def test_it_resumes_after_a_crash_between_effect_and_commit_without_repeating_the_effect(tenant):
    task = new_task(tenant, steps=4)
    crash_between_effect_and_commit(task.id, step_seq=3)

    assert drive(task.id, owner="rescuer") == ["completed"]
    task.refresh_from_db()
    assert task.recoveries == 1 and task.result == {"steps": 4}
    assert executions(task.id) == {1: 1, 2: 1, 3: 2, 4: 1}  # only the in-flight step re-ran
    assert effects(task.id) == {f"{task.id}:{seq}:record": 1 for seq in (1, 2, 3, 4)}
    assert TaskEvent.objects.filter(task=task, type="task.snapshot").count() == 1


def test_it_dead_letters_an_effect_with_unknown_outcome_and_no_reconcile_hook(tenant):
    task = new_task(tenant, steps=4, reconcile_effects=False)
    crash_between_effect_and_commit(task.id, step_seq=2)
    unknown = metric_reader("agent_runtime_effects_unknown_total")

    # Nobody is asked before the call's deadline (the step's time limit + the margin): the task waits without a worker.
    assert park_until_deadlines_pass(task.id, owner="rescuer") == ["parked", "dead_lettered"]
    assert unknown() == 1  # (the Prometheus counter: the started effect nobody could reconcile)
    task.refresh_from_db()
    assert task.status == "dead_lettered" and task.error["reason"] == "effect_outcome_unknown"
    assert effects(task.id)[f"{task.id}:2:record"] == 1  # never blindly retried
    assert SideEffect.objects.get(key=f"{task.id}:2:record").status == "unknown"

    # An operator checks the remote side, finds it applied, and retries: the task finishes without a repeat.
    dead_letters.dead_letter_retry(task_id=task.id, requested_by="op", answers={
        f"{task.id}:2:record": dead_letters.EffectAnswer(applied=True, result={"recorded": f"{task.id}:2:record"})})
    assert drive(task.id) == ["completed"]
    assert effects(task.id) == {f"{task.id}:{seq}:record": 1 for seq in (1, 2, 3, 4)}


def test_it_dead_letters_a_tampered_checkpoint_and_runs_nothing(tenant, settings):
    configure(settings, slice_seconds=0)
    task = new_task(tenant, steps=20)
    drive(task.id, calls=12, until_done=False)
    with connection.cursor() as cursor:  # flip one variable, leave the checksum
        cursor.execute("UPDATE checkpoints_app_checkpoint SET payload = replace(payload, '\"count\":10', "
                       "'\"count\":99') WHERE task_id = %s AND sequence = 1", [task.id])
    ran_before = sum(executions(task.id).values())

    assert drive(task.id) == ["dead_lettered"]

    task.refresh_from_db()
    assert task.error["reason"] == "checkpoint_corrupt" and "checksum" in task.error["message"]
    assert sum(executions(task.id).values()) == ran_before
    # Retried by an operator, it rebuilds from the step deltas instead and finishes with the right state.
    dead_letters.dead_letter_retry(task_id=task.id, requested_by="op")
    assert Checkpoint.objects.get(task=task, sequence=1).quarantined
    drive(task.id)
    task.refresh_from_db()
    assert task.status == "completed" and task.result == {"steps": 20}


def test_it_dead_letters_a_task_that_lost_its_worker_more_than_max_recoveries_times(tenant, settings):
    configure(settings, max_recoveries=2)
    task = new_task(tenant, steps=3)
    for expected in ("recovering", "recovering", "dead_lettered"):
        assert engine.lease_claim(task_id=task.id, owner="dies-every-time") is not None
        expire_lease(task.id)
        reaper.reaper_sweep()
        assert Task.objects.get(id=task.id).status == expected

    task.refresh_from_db()
    assert task.recoveries == 3 and task.error["reason"] == "max_recoveries_exceeded"
    assert engine.run_step(task.id, owner="anyone") == "not_claimed"
    reasons = list(TaskEvent.objects.filter(task=task, type="status").values_list("data__reason", flat=True))
    assert reasons.count("lease_expired") == 3


def test_it_dead_letters_a_resumed_task_whose_steps_the_code_no_longer_has(tenant, settings):
    configure(settings, slice_seconds=0)
    task = new_task(tenant, steps=5)
    drive(task.id, calls=2, until_done=False)
    # As if the task had been planned by an older release whose step was renamed since.
    PlanChunk.objects.filter(task=task).update(steps=[["tick", 2], ["tick_v0", 3]])

    assert drive(task.id) == ["dead_lettered"]
    task.refresh_from_db()
    assert task.error["reason"] == "plan_mismatch" and "tick_v0" in task.error["message"]
    assert sum(executions(task.id).values()) == 2


def test_it_dead_letters_a_task_started_on_an_incompatible_workflow_version(tenant):
    task = new_task(tenant, steps=2)
    Task.objects.filter(id=task.id).update(workflow_version="0")

    assert drive(task.id) == ["dead_lettered"]
    assert Task.objects.get(id=task.id).error["reason"] == "workflow_version_changed"


def test_it_retries_a_failing_step_with_backoff_and_then_fails_the_task_with_the_error(tenant, settings):
    configure(settings, step_retry={"backoff_seconds": 0.01, "max_attempts": 3})
    flaky = new_task(tenant, steps=3, fail_step=1, fail_times=2)
    broken = new_task(tenant, steps=3, fail_step=1)

    drive(flaky.id)
    drive(broken.id)

    assert Task.objects.get(id=flaky.id).status == "completed"
    assert executions(flaky.id) == {1: 1, 2: 3, 3: 1}
    broken.refresh_from_db()
    assert broken.status == "failed"
    assert {k: broken.error[k] for k in ("type", "step", "attempt")} == {"type": "RuntimeError", "step": "tick",
                                                                         "attempt": 3}
    assert [a["attempt"] for a in broken.error["attempts"]] == [1, 2, 3]
    assert Step.objects.get(task=broken, status="failed").seq == 2
    assert effects(broken.id) == {f"{broken.id}:1:record": 1}


def test_it_gives_a_tool_timeout_bounded_retries_and_keeps_each_attempts_diagnostics(tenant, settings):
    configure(settings, step_retry={"backoff_seconds": 0.01, "max_attempts": 5, "tool_timeout_attempts": 2})
    task = new_task(tenant, steps=2, timeout_step=0)

    drive(task.id)

    task.refresh_from_db()
    assert task.status == "failed" and task.error["type"] == "ToolTimeout" and task.error["attempt"] == 2
    assert all("did not answer within 30 s" in a["message"] for a in task.error["attempts"])
    assert all(a["duration_ms"] >= 0 and "ToolTimeout" in a["traceback"] for a in task.error["attempts"])


def test_it_costs_the_same_statements_per_step_at_step_10_and_step_1000(tenant, settings):
    configure(settings, slice_seconds=3600, checkpoint={"every_steps": 5})
    task = new_task(tenant, steps=1100)

    def statements_for_steps(count):
        with CaptureQueriesContext(connection) as captured:
            engine.run_step(task.id, owner="counter", max_steps=count)
        return [q["sql"].split()[0] for q in captured.captured_queries]

    engine.run_step(task.id, owner="counter", max_steps=9)
    early = statements_for_steps(10)  # steps 10–19
    engine.run_step(task.id, owner="counter", max_steps=980)
    late = statements_for_steps(10)  # steps 1000–1009

    assert Task.objects.get(id=task.id).steps_completed == 1009
    assert len(early) == len(late), (early, late)
    # Per slice: claim + checkpoint + deltas; per step: the effect's `started` row + the one commit statement.
    assert len(late) == 3 + 10 * 2


def test_it_fails_a_task_whose_plan_cannot_be_made_with_the_reason(tenant):
    task = new_task(tenant, "document_review", corpus="no-such-corpus")

    assert drive(task.id) == ["failed"]
    task.refresh_from_db()
    assert task.error["type"] == "FileNotFoundError" and task.error["step"] == "(plan)"
    assert task.lease_owner is None


def test_it_fails_a_step_whose_state_is_over_the_cap_saying_how_to_fix_it(tenant, settings):
    configure(settings, checkpoint={"max_bytes": 4096})
    task = new_task(tenant, steps=3, payload_bytes=8000)

    assert drive(task.id) == ["failed"]
    task.refresh_from_db()
    assert task.error["type"] == "StateTooLarge" and "ctx.artifact()" in task.error["message"]
    assert task.steps_completed == 0


def test_it_fails_a_task_whose_checkpoint_would_be_over_the_cap(tenant, settings):
    configure(settings, checkpoint={"max_bytes": 4100, "every_steps": 2})
    task = new_task(tenant, steps=4, payload_bytes=4000)

    drive(task.id)

    task.refresh_from_db()
    assert task.status == "failed" and task.error["type"] == "CheckpointTooLarge"
    assert "payload (4002 bytes)" in task.error["message"]


def test_it_defers_a_claim_while_the_fleet_runs_max_concurrent_tasks(tenant, settings):
    configure(settings, max_concurrent_tasks=1)
    busy, waiting = new_task(tenant, steps=2), new_task(tenant, steps=2)
    assert engine.lease_claim(task_id=busy.id, owner="holder") is not None

    assert engine.run_step(waiting.id, owner="second") == "deferred"
    assert Task.objects.get(id=waiting.id).lease_owner is None


def test_it_stops_a_worker_whose_lease_renewals_stalled_once_the_reaper_took_the_task(tenant, settings):
    configure(settings, lease_seconds=1, heartbeat_seconds=0.2)
    task = new_task(tenant, steps=2, sleep_ms=1500)
    outcome = []

    def stalled_worker():
        try:
            with faults.armed("during_lease_renewal:sleep=3"):
                outcome.append(engine.run_step(task.id, owner="stalled"))
        finally:
            connection.close()

    thread = threading.Thread(target=stalled_worker)
    thread.start()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not reaper.reaper_sweep()["recovered"]:
        time.sleep(0.1)  # the lease (1 s) runs out because no renewal lands
    thread.join()

    assert outcome == ["lease_lost"]
    assert Step.objects.filter(task=task).count() == 0 and effects(task.id) == {}
    configure(settings, lease_seconds=30, heartbeat_seconds=10)
    assert drive(task.id, owner="rescuer") == ["completed"]
    assert effects(task.id) == {f"{task.id}:{seq}:record": 1 for seq in (1, 2)}


def test_it_stops_a_task_at_its_step_or_cost_budget(tenant):
    from decimal import Decimal

    from tasks_app.services import task_create

    by_steps = task_create(tenant=tenant, owner=None, workflow="demo_steps", input={"steps": 10},
                           budget_steps=4).task
    by_cost = task_create(tenant=tenant, owner=None, workflow="demo_steps", input={"steps": 10, "cost_per_step": 0.5},
                          budget_cost=Decimal("1.5")).task

    drive(by_steps.id)
    drive(by_cost.id)

    for task, steps in ((by_steps, 4), (by_cost, 3)):
        task.refresh_from_db()
        assert (task.status, task.error["type"], task.steps_completed) == ("failed", "BudgetExhausted", steps)
    assert by_cost.cost_spent == Decimal("1.5")


def test_it_rebuilds_state_from_the_latest_checkpoint_plus_deltas_on_every_claim(tenant, settings):
    configure(settings, slice_seconds=0, checkpoint={"every_steps": 10})
    task = new_task(tenant, steps=25, payload_bytes=10)

    outcomes = drive(task.id)

    assert outcomes == ["released"] * 24 + ["completed"]  # 25 claims, each loading checkpoint + deltas
    task.refresh_from_db()
    assert task.result == {"steps": 25}  # the counter survived 24 reloads
    assert task.checkpoint_sequence == 2


def test_it_resumes_a_task_from_a_schema_version_1_checkpoint(tenant, settings):
    import hashlib
    import json

    configure(settings, slice_seconds=0)
    task = new_task(tenant, steps=6)
    drive(task.id, calls=4, until_done=False)
    # Replace what was written with a checkpoint in the old format, as a previous release left it.
    v1 = json.dumps({"schema_version": 1, "task_id": str(task.id), "sequence": 1, "plan_version": 1, "next_step": 4,
                     "completed_steps": [0, 1, 2, 3], "variables": {"count": 4}, "artifacts": [],
                     "effects": [f"{task.id}:{n}:record" for n in range(1, 5)]})
    Checkpoint.objects.filter(task=task).delete()
    Checkpoint.objects.create(task=task, sequence=1, schema_version=1, payload=v1, size_bytes=len(v1),
                              checksum=hashlib.sha256(v1.encode()).hexdigest())
    Task.objects.filter(id=task.id).update(checkpoint_sequence=1)

    drive(task.id)

    task.refresh_from_db()
    assert task.status == "completed" and task.result == {"steps": 6}  # count continued from the migrated state
    assert executions(task.id) == {seq: 1 for seq in range(1, 7)}


def test_it_hands_on_a_task_cancelled_between_claim_and_start_without_waiting_for_the_reaper(tenant, settings):
    import redis

    from tasks_app.db.transitions import task_transition
    from tasks_app.models import TaskStatus

    task = new_task(tenant, steps=3)
    Task.objects.filter(id=task.id).update(status="recovering")
    runner = engine.Slice(engine.lease_claim(task_id=task.id, owner="w1"))
    # The status moves under the claim, after it and before the first step. No service makes this move any more
    # (steering's cancel leaves a claimed task to its worker's next safe point: the test below), so it is made with
    # the guarded transition the old tasks_app cancel used; the engine must still let go of any such move at once.
    task_transition(task_id=task.id, to=TaskStatus.CANCELLING, sources=[TaskStatus.RECOVERING],
                    message="Cancelling at the next safe point", event_data={"reason": "stop", "requestedBy": None})

    broker = redis.Redis.from_url(settings.REDIS_URL)
    queued_before = broker.llen("celery:4")  # task priority 5 → Redis priority 4

    assert runner.run() == "status_moved"
    assert Task.objects.get(id=task.id).lease_owner is None
    assert broker.llen("celery:4") == queued_before + 1  # handed straight on, not left for the reaper
    assert drive(task.id) == ["cancelled"]
    assert executions(task.id) == {}



def test_it_stops_a_claimed_task_at_its_first_safe_point_when_a_cancel_lands_between_claim_and_start(tenant):
    """The same moment through the real cancel (steering): the command waits for the claiming worker, which stops
    the task itself at its first safe point after a commit (it learns of a command from its commits, never by
    polling), so nothing is left for the reaper or another claim."""
    from steering_app.services import steering_cancel

    task = new_task(tenant, steps=3)
    Task.objects.filter(id=task.id).update(status="recovering")
    runner = engine.Slice(engine.lease_claim(task_id=task.id, owner="w1"))
    assert steering_cancel(task=Task.objects.get(id=task.id), reason="stop", requested_by="user:op").status \
        == "recovering"  # a leased task is not cut off: the command is queued for its worker

    assert runner.run() == "cancelled"
    task.refresh_from_db()
    assert (task.status, task.lease_owner) == ("cancelled", None)
    assert executions(task.id) == {1: 1}  # the step the worker started with runs once, then the cancel applies
    types = list(TaskEvent.objects.filter(task_id=task.id).order_by("seq").values_list("type", flat=True))
    assert types[-4:] == ["steering.applied", "checkpoint", "status", "terminal"]
    assert task_events_verify(task_id=task.id) is None

def test_it_checkpoints_when_the_interval_passes_even_between_step_counts(tenant, settings):
    import json as _json

    configure(settings, checkpoint={"every_steps": 1000, "max_interval_seconds": 0.4}, slice_seconds=3600)
    task = new_task(tenant, steps=4, sleep_ms=250)

    drive(task.id)

    payloads = [_json.loads(p) for p in Checkpoint.objects.filter(task=task).values_list("payload", flat=True)]
    assert [p["completed"]["through_seq"] for p in payloads] == [2]  # 0.5 s in, not at step 1 (0.25 s)


def test_it_stores_a_large_result_in_storage_and_keeps_a_reference(tenant, settings):
    import json as _json

    task = new_task(tenant, steps=2, result_bytes=70_000)

    drive(task.id)

    task.refresh_from_db()
    assert task.status == "completed" and task.result_ref and task.result["ref"] == task.result_ref
    stored = _json.loads((settings.MEDIA_ROOT / task.result_ref).read_text())
    assert stored["steps"] == 2 and len(stored["padding"]) == 70_000


def test_it_plans_each_per_step_statement_once_per_connection(tenant):
    """The step commit and the effect's `started` row are prepared with a generic plan: planned once, not per step
    (Django turns psycopg's prepared statements off unless prepare_threshold is set; see settings)."""
    task = new_task(tenant, steps=12)
    drive(task.id)

    prepared = connection.connection.execute(
        "SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements").fetchall()
    commits = [row for row in prepared if "INSERT INTO tasks_app_step" in row[0] and "'committed'" in row[0]]
    effect_rows = [row for row in prepared if "INSERT INTO checkpoints_app_sideeffect" in row[0]]
    assert commits and effect_rows
    assert sum(generic for _, generic, _ in commits) >= 11 and sum(generic for _, generic, _ in effect_rows) >= 12
    assert all(custom == 0 for _, _, custom in commits + effect_rows)


def _effect_rows_read() -> int:
    """Rows of the ledger table read so far, by index or by scanning it (this backend's statistics, flushed
    first)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_force_next_flush()")
        cursor.execute("SELECT 1")  # ends a transaction: the flush happens
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute("SELECT coalesce(idx_tup_fetch, 0) + coalesce(seq_tup_read, 0) FROM pg_stat_user_tables "
                       "WHERE relname = 'checkpoints_app_sideeffect'")
        return cursor.fetchone()[0]


def test_it_reads_the_same_ledger_rows_per_step_at_step_10_and_step_2000(tenant, settings):
    """Recording a step's effect outcomes looks each one up by its unique key: a join that read every effect of
    the task made a step cost more the longer the task (found by `bench --scenario growth`), and one that scanned
    the whole ledger cost more the bigger the ledger (found with auto_explain). Figures: docs/performance.md,
    change 7."""
    configure(settings, slice_seconds=3600, checkpoint={"every_steps": 100})
    task = new_task(tenant, steps=2100)

    def rows_read_by_ten_steps():
        before = _effect_rows_read()
        engine.run_step(task.id, owner="counter", max_steps=10)
        return _effect_rows_read() - before

    engine.run_step(task.id, owner="counter", max_steps=9)
    early = rows_read_by_ten_steps()  # steps 10–19
    engine.run_step(task.id, owner="counter", max_steps=1980)
    late = rows_read_by_ten_steps()  # steps 2000–2009

    assert Task.objects.get(id=task.id).steps_completed == 2009
    assert late <= early + 10, (early, late)


def test_it_runs_demo_steps_without_effects_when_asked(tenant):
    task = new_task(tenant, steps=3, effect=False)

    assert drive(task.id) == ["completed"]
    assert not SideEffect.objects.filter(task=task).exists() and effects(task.id) == {}
    assert Task.objects.get(id=task.id).result == {"steps": 3}
