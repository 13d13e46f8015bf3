"""Regression tests for the defects an outside review of the step engine reproduced (issue 6), one or more each.

Every test here failed on the engine before the fix (commit 12f276e), each for the reason its name states.
Real PostgreSQL and Redis; crashes are injected at named fault points, time is moved by updating columns.
"""

import json
import threading
import time
import uuid
from decimal import Decimal

import psycopg
import pytest
from django.db import connection

from checkpoints_app.models import Checkpoint, SideEffect
from tasks_app.db.dispatch import RECOVERY_PRIORITY
from tasks_app.engine import dead_letters, faults, reaper
from tasks_app.engine import slice as engine
from tasks_app.engine.lease import lease_claim
from tasks_app.models import Step, Task, TaskEvent
from tasks_app.selectors import task_events_verify
from tests import workflows
from tests.engine_support import (
    configure,
    drive,
    effects,
    executions,
    expire_lease,
    hints_queued,
    park_until_deadlines_pass,
)
from tests.helpers import metric_reader
from tests.worker_support import test_database_url as database_url

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("external_root")]


@pytest.fixture
def scripted(new_task):
    """scripted({index: [actions]}, steps=N, **input) → a `scripted` task acting out that script."""
    name = uuid.uuid4().hex

    def make(script, *, steps, workflow="scripted", **input_):
        workflows.SCRIPTS[name] = script
        return new_task(workflow, script=name, steps=steps, **input_)

    yield make
    workflows.SCRIPTS.pop(name, None)


def crash_after_effect(task_id, *, step_seq):
    """A worker dies after step `step_seq`'s effect went out, before its commit; the reaper hands the task on."""
    with faults.armed(f"after_effect_before_commit:raise@step_seq={step_seq}"), pytest.raises(faults.InjectedFault):
        engine.run_step(task_id, owner="crashing")
    expire_lease(task_id)
    reaper.reaper_sweep()


def in_thread(function):
    """Run `function` in a thread with its own database connection; returns (thread, outcomes list)."""
    outcomes = []

    def body():
        try:
            outcomes.append(function())
        finally:
            connection.close()

    thread = threading.Thread(target=body)
    thread.start()
    return thread, outcomes


# -- 1. the heartbeat reconnects ----------------------------------------------------------------------------------
def test_it_keeps_renewing_the_lease_after_the_heartbeats_connection_is_killed(new_task, settings):
    configure(settings, lease_seconds=2, heartbeat_seconds=0.3)
    task = new_task(steps=1, sleep_ms=3500)  # one step longer than the lease
    thread, outcomes = in_thread(lambda: engine.run_step(task.id, owner="steady"))
    killed = 0
    with psycopg.connect(database_url(), autocommit=True) as admin:
        while thread.is_alive():
            if not killed:  # kill the heartbeat's session once it has renewed
                killed = admin.execute(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND query LIKE '%%SET lease_expires_at = now()%%' AND pid <> pg_backend_pid()"
                ).fetchone()[0]
            reaper.reaper_sweep()  # would take the task if the lease lapsed
            time.sleep(0.2)
    thread.join()

    assert killed == 1
    assert outcomes == ["completed"]
    assert Task.objects.get(id=task.id).recoveries == 0 and executions(task.id) == {1: 1}


# -- 2. artifacts are immutable once committed ----------------------------------------------------------------------
def test_it_never_lets_a_failed_attempt_change_a_committed_artifact(scripted, settings):
    task = scripted({0: [{"do": "artifact", "name": "report.md", "content": "v1"}],
                     1: [{"do": "artifact", "name": "report.md", "content": "v2 from a failing attempt",
                          "attempts": [1]},
                         {"do": "raise", "attempts": [1]}]}, steps=2)
    configure(settings, step_retry={"backoff_seconds": 0})

    assert drive(task.id) == ["completed"]

    first = json.loads(Step.objects.get(task=task, seq=1).state_delta)["artifacts"]["report.md"]
    assert (settings.MEDIA_ROOT / first).read_text() == "v1"
    assert "artifacts" not in json.loads(Step.objects.get(task=task, seq=2).state_delta)  # the failed write is not


def test_it_never_lets_a_zombie_change_a_committed_artifact(scripted, settings):
    workflows.GATES["z"], workflows.REACHED["z"] = threading.Event(), threading.Event()
    task = scripted({0: [{"do": "artifact", "name": "report.md", "content": "committed"}],
                     1: [{"do": "block", "gate": "z"}, {"do": "artifact", "name": "report.md", "content": "late"}]},
                    steps=2)
    thread, outcomes = in_thread(lambda: engine.run_step(task.id, owner="zombie"))
    workflows.REACHED["z"].wait(10)  # step 1 committed its artifact; step 2 is in flight
    expire_lease(task.id)
    assert reaper.lease_reap_one(task.id) == "recovered"
    workflows.GATES["z"].set()  # the zombie wakes up and writes its artifact
    thread.join()

    assert outcomes == ["lease_lost"]
    committed = json.loads(Step.objects.get(task=task, seq=1).state_delta)["artifacts"]["report.md"]
    assert (settings.MEDIA_ROOT / committed).read_text() == "committed"


# -- 3. a timed-out effect is reconciled, never called again blindly -------------------------------------------------
def test_it_reconciles_a_timed_out_effect_instead_of_calling_it_again(new_task, settings):
    configure(settings, step_retry={"backoff_seconds": 0.01})
    task = new_task(steps=2, effect_answer_ms=600, effect_timeout_ms=100)  # lands at once, answers too late

    assert drive(task.id) == ["completed"]
    time.sleep(0.7)  # let every timed-out call finish before counting

    assert effects(task.id) == {f"{task.id}:1:record": 1, f"{task.id}:2:record": 1}
    assert set(SideEffect.objects.filter(task=task).values_list("status", flat=True)) == {"succeeded"}


def test_it_dead_letters_a_timed_out_effect_nobody_can_reconcile(new_task, settings):
    configure(settings, step_retry={"backoff_seconds": 0.01})
    task = new_task(steps=1, effect_answer_ms=600, effect_timeout_ms=100, reconcile_effects=False)
    unknown = metric_reader("agent_runtime_effects_unknown_total")
    dead = metric_reader("agent_runtime_dead_letters_total", reason="effect_outcome_unknown")

    assert park_until_deadlines_pass(task.id) == ["parked", "dead_lettered"]
    time.sleep(0.7)

    task.refresh_from_db()
    assert task.error["reason"] == "effect_outcome_unknown" and f"{task.id}:1:record" in task.error["message"]
    assert effects(task.id) == {f"{task.id}:1:record": 1}
    # The Prometheus counters: the effect recorded unknown once (its retry found it so: no news), one dead letter.
    assert (unknown(), dead()) == (1, 1) == (SideEffect.objects.filter(task=task, status="unknown").count(), 1)


# -- 4. an operator answers per effect ---------------------------------------------------------------------------------
def test_it_asks_the_operator_for_an_answer_per_effect_and_calls_only_the_one_that_did_not_land(scripted):
    task = scripted({0: [{"do": "effect", "name": "a"}, {"do": "effect", "name": "b"}]}, steps=1)
    # The worker dies after `a` landed and `b` was recorded as started but never sent.
    with faults.armed("before_effect_call:raise@effect=b"), pytest.raises(faults.InjectedFault):
        engine.run_step(task.id, owner="crashing")
    expire_lease(task.id)
    reaper.reaper_sweep()
    assert park_until_deadlines_pass(task.id) == ["parked", "dead_lettered"]
    key_a, key_b = f"{task.id}:1:a", f"{task.id}:1:b"
    assert workflows.effect_calls(task.id) == {key_a: 1}

    with pytest.raises(dead_letters.DeadLetterError, match=key_b):  # one answer for both cannot be right
        dead_letters.dead_letter_retry(task_id=task.id, answers={key_a: dead_letters.EffectAnswer(applied=True)})
    dead_letters.dead_letter_retry(task_id=task.id, requested_by="op", answers={
        key_a: dead_letters.EffectAnswer(applied=True, result={"sent": key_a}),
        key_b: dead_letters.EffectAnswer(applied=False)})

    assert drive(task.id) == ["completed"]
    assert workflows.effect_calls(task.id) == {key_a: 1, key_b: 1}


def test_it_records_effects_that_succeeded_before_the_step_was_dead_lettered(scripted):
    task = scripted({0: [{"do": "effect", "name": "b"}]}, steps=1)
    crash_after_effect(task.id, step_seq=1)  # `b` landed; its outcome was never recorded
    workflows.SCRIPTS[Task.objects.get(id=task.id).input["script"]][0] = [{"do": "effect", "name": "a"},
                                                                        {"do": "effect", "name": "b"}]

    # `b` cannot be reconciled (after its deadline); `a` ran first and landed
    assert park_until_deadlines_pass(task.id) == ["parked", "dead_lettered"]

    statuses = dict(SideEffect.objects.filter(task=task).values_list("name", "status"))
    assert statuses == {"a": "succeeded", "b": "unknown"}


def test_it_gives_the_step_the_result_the_operator_supplied(new_task):
    task = new_task(steps=2, reconcile_effects=False)
    crash_after_effect(task.id, step_seq=1)
    assert park_until_deadlines_pass(task.id) == ["parked", "dead_lettered"]

    dead_letters.dead_letter_retry(task_id=task.id, answers={
        f"{task.id}:1:record": dead_letters.EffectAnswer(applied=True, result={"recorded": "by the operator"})})
    assert drive(task.id) == ["completed"]

    assert SideEffect.objects.get(key=f"{task.id}:1:record").result == {"recorded": "by the operator"}
    assert effects(task.id) == {f"{task.id}:1:record": 1, f"{task.id}:2:record": 1}


# -- 5. no exception leaves a slice without a durable decision ---------------------------------------------------------
@pytest.mark.parametrize("action", [
    {"do": "set_odd", "key": "total", "value": "decimal"}, {"do": "set_odd", "key": "ids", "value": "set"},
    {"do": "set_odd", "key": "ratio", "value": "nan"}, {"do": "mutate_odd", "key": "list", "value": "decimal"},
    {"do": "mutate_odd", "key": "pairs", "value": "tuple"}, {"do": "return_odd", "value": "nan"},
    {"do": "return_odd", "value": "int_key"},
])
def test_it_fails_the_task_with_a_message_when_a_step_keeps_a_value_json_cannot(scripted, settings, action):
    configure(settings, step_retry={"backoff_seconds": 0})
    task = scripted({0: [{"do": "effect", "name": "sent_first", "reconcile": True}, action]}, steps=2)

    assert drive(task.id) == ["failed"]  # returned, not raised: the decision is written

    task.refresh_from_db()
    assert task.error["type"] in ("InvalidState", "NotJson") and task.lease_owner is None
    assert "JSON" in task.error["message"]
    assert SideEffect.objects.get(task=task).status == "succeeded"  # the effect that landed is on record


@pytest.mark.parametrize("mode, kind", [("raise", "ValueError"), ("odd", "InvalidResult")])
def test_it_fails_the_task_with_a_message_when_its_result_cannot_be_made(scripted, mode, kind):
    task = scripted({0: [{"do": "set", "key": "result_mode", "value": mode}]}, steps=1, workflow="odd_result")

    assert drive(task.id) == ["failed"]

    task.refresh_from_db()
    assert task.error["type"] == kind and task.error["step"] == "(result)" and task.lease_owner is None


def test_it_cancels_a_task_whose_state_is_too_large_for_a_checkpoint(scripted, settings):
    configure(settings, checkpoint={"max_bytes": 4096, "every_steps": 1000})
    task = scripted({i: [{"do": "set", "key": f"part{i}", "value": "x" * 1500}] for i in range(4)}, steps=6)
    drive(task.id, max_steps=3, calls=1, until_done=False)
    Task.objects.filter(id=task.id).update(status="cancelling")

    assert drive(task.id) == ["cancelled"]
    assert Task.objects.get(id=task.id).lease_owner is None


# -- 6. every started effect is resolved, whatever path the task takes ------------------------------------------------
@pytest.mark.parametrize("workflow_reconcile, outcome", [(True, "completed"), (False, "dead_lettered")])
def test_it_resolves_an_effect_the_rerun_step_no_longer_calls(scripted, workflow_reconcile, outcome):
    task = scripted({0: [{"do": "effect", "name": "search_web"}]}, steps=1, workflow_reconcile=workflow_reconcile)
    crash_after_effect(task.id, step_seq=1)
    workflows.SCRIPTS[Task.objects.get(id=task.id).input["script"]][0] = [{"do": "effect", "name": "ask_human"}]

    # Going past it without a hook: the task waits (no worker) until the call can no longer land, then a person.
    assert (park_until_deadlines_pass(task.id) if outcome == "dead_lettered" else drive(task.id)) == \
        (["parked", outcome] if outcome == "dead_lettered" else [outcome])

    web = SideEffect.objects.get(key=f"{task.id}:1:search_web")
    if workflow_reconcile:
        assert web.status == "succeeded" and web.result == {"sent": web.key}
    else:
        assert web.status == "unknown" and web.key in Task.objects.get(id=task.id).error["message"]


def test_it_resolves_open_effects_before_cancelling_a_recovered_task(scripted):
    task = scripted({0: [{"do": "effect", "name": "charge"}]}, steps=2, workflow_reconcile=True)
    crash_after_effect(task.id, step_seq=1)
    Task.objects.filter(id=task.id).update(status="cancelling")

    assert drive(task.id) == ["cancelled"]
    assert SideEffect.objects.get(key=f"{task.id}:1:charge").status == "succeeded"


def test_it_leaves_a_task_past_its_deadline_with_open_effects_to_a_worker_that_resolves_them(scripted):
    task = scripted({0: [{"do": "effect", "name": "charge"}]}, steps=2, workflow_reconcile=True)
    crash_after_effect(task.id, step_seq=1)
    Task.objects.filter(id=task.id).update(deadline_at="2000-01-01T00:00:00Z")

    assert reaper.deadlines_enforce() == 0  # not failed behind the effect's back
    assert drive(task.id) == ["failed"]
    task.refresh_from_db()
    assert task.error["type"] == "DeadlineExceeded"
    assert SideEffect.objects.get(key=f"{task.id}:1:charge").status == "succeeded"


def test_it_records_an_effect_that_landed_before_the_state_was_too_large(new_task, settings):
    configure(settings, checkpoint={"max_bytes": 4096})
    task = new_task(steps=2, payload_bytes=8000)

    assert drive(task.id) == ["failed"]
    assert Task.objects.get(id=task.id).error["type"] == "StateTooLarge"
    assert SideEffect.objects.get(key=f"{task.id}:1:record").status == "succeeded"


# -- 7. one pending hint per task -------------------------------------------------------------------------------------
def test_it_keeps_at_most_one_hint_pending_while_the_fleet_is_full(new_task, settings):
    configure(settings, max_concurrent_tasks=1, redispatch_after_seconds=1)
    busy, waiting = new_task(steps=2), new_task(steps=2)
    assert lease_claim(task_id=busy.id, owner="holder") is not None
    for _ in range(4):
        assert engine.run_step(waiting.id, owner="second") == "deferred"
        Task.objects.filter(id=waiting.id).update(updated_at="2000-01-01T00:00:00Z")  # move time
        reaper.reaper_sweep()

    assert hints_queued(waiting.id) <= 1
    assert Task.objects.get(id=waiting.id).hint_at is None  # waiting for a slot, not for a message


def test_it_hands_a_released_slot_to_the_most_urgent_waiting_task(tenant, settings):
    from tasks_app.services import task_create

    configure(settings, max_concurrent_tasks=1)
    busy = task_create(tenant=tenant, owner=None, workflow="demo_steps", input={"steps": 1}).task
    low = task_create(tenant=tenant, owner=None, workflow="demo_steps", input={"steps": 1}, priority=1).task
    high = task_create(tenant=tenant, owner=None, workflow="demo_steps", input={"steps": 1}, priority=8).task
    claim = lease_claim(task_id=busy.id, owner="holder")
    for task in (low, high):
        assert engine.run_step(task.id, owner="other") == "deferred"
    before = hints_queued(high.id), hints_queued(low.id)

    assert engine.Slice(claim).run() == "completed"  # frees the slot

    assert (hints_queued(high.id) - before[0], hints_queued(low.id) - before[1]) == (1, 0)


# -- 8. retention purge: an index, and batches -------------------------------------------------------------------------
def test_it_purges_expired_tasks_in_batches_through_the_retention_index(new_task, settings, monkeypatch):
    from tasks_app.audit import retention

    monkeypatch.setattr(retention, "PURGE_BATCH", 3)
    tasks = [new_task(steps=1) for _ in range(7)]
    Task.objects.filter(id__in=[t.id for t in tasks]).update(status="completed",
                                                             completed_at="2000-01-01T00:00:00Z")
    with connection.cursor() as cursor:
        cursor.execute("SET enable_seqscan = off")
        cursor.execute("EXPLAIN SELECT id FROM tasks_app_task WHERE status IN ('cancelled', 'completed', 'failed') "
                       "AND completed_at < now() - interval '30 days' ORDER BY completed_at LIMIT 3")
        plan = " ".join(row[0] for row in cursor.fetchall())
        cursor.execute("RESET enable_seqscan")

    assert "task_retention_idx" in plan
    assert reaper.terminal_tasks_purge() == 7
    assert not Task.objects.exists()


# -- 9. CPU per step does not grow with the plan: a measurement, so bench/plan_length.py (dev.py bench --plan-length)


# -- 10. spending in failed attempts counts ----------------------------------------------------------------------------
def test_it_counts_spending_in_failed_attempts_against_the_budget(new_task, settings):
    configure(settings, step_retry={"backoff_seconds": 0, "max_attempts": 3})
    task = new_task(steps=1, cost_per_step=1.0, fail_step=0, fail_times=2)

    assert drive(task.id) == ["completed"]
    assert Task.objects.get(id=task.id).cost_spent == Decimal(3)


# -- 11. a step has a time limit ---------------------------------------------------------------------------------------
def test_it_abandons_a_step_attempt_past_its_time_limit_and_counts_it(scripted, settings):
    configure(settings, step_timeout_seconds=0.3, step_retry={"backoff_seconds": 0})
    task = scripted({0: [{"do": "sleep", "seconds": 5}]}, steps=1)
    started = time.monotonic()

    assert drive(task.id) == ["failed"]

    assert time.monotonic() - started < 3
    task.refresh_from_db()
    assert task.error["type"] == "StepTimeLimitExceeded" and task.error["attempt"] == 2


def test_it_stops_renewing_the_lease_of_a_step_past_its_time_limit(scripted, settings):
    # Off the main thread the step cannot be interrupted: the heartbeat must let the lease run out instead.
    configure(settings, step_timeout_seconds=0.5, lease_seconds=1, heartbeat_seconds=0.2)
    task = scripted({0: [{"do": "sleep", "seconds": 3}]}, steps=1)
    thread, outcomes = in_thread(lambda: engine.run_step(task.id, owner="hung"))
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not reaper.reaper_sweep()["recovered"]:
        time.sleep(0.1)
    thread.join()

    assert Task.objects.get(id=task.id).status == "recovering"
    assert outcomes == ["lease_lost"]


# -- 12. a database blip at the claim ---------------------------------------------------------------------------------
def test_it_claims_after_its_database_connection_was_killed(new_task):
    task = new_task(steps=2)
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        pid = cursor.fetchone()[0]
    with psycopg.connect(database_url(), autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", [pid])

    assert engine.run_step(task.id, owner="w") == "completed"


# -- 13. a broker blip at the end of a slice -------------------------------------------------------------------------
def test_it_hands_a_task_whose_hint_could_not_be_sent_on_at_the_next_sweep(new_task, settings, broker_down):
    configure(settings, slice_seconds=0)
    task = new_task(steps=3)
    assert engine.run_step(task.id, owner="w") == "released"  # the hint for the next slice could not be sent
    broker_down(settings.CELERY_BROKER_URL)  # the broker is back

    reaper.reaper_sweep()  # the next sweep, not the lost-message horizon

    assert hints_queued(task.id) == 1


# -- 14. step deltas are integrity-checked ----------------------------------------------------------------------------
def test_it_dead_letters_a_task_whose_committed_step_delta_was_edited(new_task, settings):
    configure(settings, slice_seconds=0)
    task = new_task(steps=6)
    drive(task.id, calls=3, until_done=False)
    Step.objects.filter(task=task, seq=2).update(state_delta='{"set":{"count":9047}}')

    assert drive(task.id) == ["dead_lettered"]

    task.refresh_from_db()
    assert task.error["reason"] == "step_delta_corrupt" and "step 2" in task.error["message"]
    assert task_events_verify(task_id=task.id) is not None  # the auditors' check names it too


# -- 15. quarantined checkpoints are kept ----------------------------------------------------------------------------
def test_it_keeps_quarantined_checkpoints_for_forensics(new_task, settings):
    configure(settings, slice_seconds=0, checkpoint={"every_steps": 2, "keep": 1})
    task = new_task(steps=12)
    drive(task.id, calls=3, until_done=False)
    Checkpoint.objects.filter(task=task, sequence=1).update(checksum="0" * 64)
    assert drive(task.id) == ["dead_lettered"]
    dead_letters.dead_letter_retry(task_id=task.id, requested_by="op")

    assert drive(task.id)[-1] == "completed"  # writing checkpoints 2…5, each pruning the older good ones
    assert Checkpoint.objects.filter(task=task, sequence=1, quarantined=True).exists()


# -- 16. recoveries without progress; a recovered task's hint goes first ----------------------------------------------
def test_it_dead_letters_only_for_recoveries_without_progress(new_task, settings):
    configure(settings, max_recoveries=2, slice_seconds=3600)
    task = new_task(steps=10)
    for _ in range(4):  # crash after each committed step: progress between every crash
        assert engine.run_step(task.id, owner="preempted", max_steps=1) == "released"
        assert lease_claim(task_id=task.id, owner="dies") is not None
        expire_lease(task.id)
        reaper.reaper_sweep()

    task.refresh_from_db()
    assert task.status == "recovering" and task.recoveries == 4 and task.recoveries_since_progress == 1


def test_it_sends_a_recovered_tasks_hint_ahead_of_the_backlog(new_task):
    import redis
    from django.conf import settings as django_settings

    task = new_task(steps=2)
    assert lease_claim(task_id=task.id, owner="dies") is not None
    expire_lease(task.id)
    broker = redis.Redis.from_url(django_settings.REDIS_URL)
    urgent_queue = "celery" if RECOVERY_PRIORITY == 9 else f"celery:{9 - RECOVERY_PRIORITY}"
    before = broker.llen(urgent_queue)

    assert reaper.lease_reap_one(task.id) == "recovered"
    assert broker.llen(urgent_queue) == before + 1


# -- found by reading --------------------------------------------------------------------------------------------------
def test_it_orders_an_effects_start_after_a_concurrent_reap(step_context):
    ctx = step_context()
    with psycopg.connect(database_url()) as reaper:  # a reaper's transaction that took the lease away
        reaper.execute("UPDATE tasks_app_task SET lease_owner = NULL WHERE id = %s", [ctx.task_id])
        thread, outcomes = in_thread(lambda: _effect_or_lease_lost(ctx))
        time.sleep(0.5)  # the zombie's effect start is now waiting on the row lock
        reaper.commit()
    thread.join()

    assert outcomes == ["lease_lost"]
    assert not SideEffect.objects.filter(task_id=ctx.task_id).exists()


def _effect_or_lease_lost(ctx):
    try:
        ctx.effect("charge", lambda key: "charged")
        return "started"
    except engine.LeaseLost:
        return "lease_lost"


def test_it_never_lets_concurrent_claims_exceed_max_concurrent_tasks(new_task, settings):
    configure(settings, max_concurrent_tasks=2)
    tasks = [new_task(steps=1) for _ in range(6)]
    for _ in range(3):
        barrier = threading.Barrier(len(tasks))

        def claim(task_id, barrier=barrier):
            barrier.wait()
            return lease_claim(task_id=task_id, owner=f"w-{task_id}") is not None

        threads = [in_thread(lambda t=t: claim(t.id)) for t in tasks]
        for thread, _ in threads:
            thread.join()
        assert sum(outcome[0] for _, outcome in threads) == 2
        Task.objects.update(lease_owner=None, lease_expires_at=None)


def test_it_compares_with_the_databases_clock_not_the_workers(new_task, monkeypatch):
    from datetime import timedelta

    from django.utils import timezone

    task = new_task(steps=1)
    drive(task.id)
    real_now = timezone.now
    monkeypatch.setattr(timezone, "now", lambda: real_now() + timedelta(days=40))  # a worker with a wrong clock

    assert reaper.reaper_sweep()["purged"] == 0
    assert Task.objects.filter(id=task.id).exists()


def test_it_stops_with_lease_lost_when_its_task_row_is_deleted(scripted):
    task = scripted({0: [{"do": "delete_task"}]}, steps=1)

    assert engine.run_step(task.id, owner="w") == "lease_lost"


# -- the safe-point hook --------------------------------------------------------------------------------------------
def test_it_writes_a_safe_point_handlers_decision_with_the_fence(new_task):
    from tasks_app.engine.safepoints import (
        SafePointDecision,
        SafePointKind,
        safe_point_handler_register,
        safe_point_handler_unregister,
    )

    seen = []

    def pause_after_two_steps(point):
        seen.append((point.kind, point.steps_completed))
        if point.kind is SafePointKind.AFTER_COMMIT and point.steps_completed == 2:
            return SafePointDecision(events=[("steering.applied", {"command": 7})], steering_cursor=7, stop="paused")
        return None

    task = new_task(steps=4)
    safe_point_handler_register(pause_after_two_steps)
    try:
        assert drive(task.id) == ["paused"]
    finally:
        safe_point_handler_unregister(pause_after_two_steps)

    task.refresh_from_db()
    assert (task.status, task.steps_completed, task.steering_cursor) == ("paused", 2, 7)
    assert seen == [(SafePointKind.BEFORE_STEP, 0), (SafePointKind.AFTER_COMMIT, 1), (SafePointKind.BEFORE_STEP, 1),
                    (SafePointKind.AFTER_COMMIT, 2)]
    types = list(TaskEvent.objects.filter(task=task).order_by("seq").values_list("type", flat=True))
    assert types[-3:] == ["steering.applied", "checkpoint", "status"]
    assert task_events_verify(task_id=task.id) is None


def test_it_dead_letters_a_task_whose_safe_point_handler_raises(new_task):
    from tasks_app.engine.safepoints import safe_point_handler_register, safe_point_handler_unregister

    def broken(point):
        raise KeyError("oops")

    task = new_task(steps=2)
    safe_point_handler_register(broken)
    try:
        assert drive(task.id) == ["dead_lettered"]
    finally:
        safe_point_handler_unregister(broken)
    assert Task.objects.get(id=task.id).error["reason"] == "safe_point_failed"
