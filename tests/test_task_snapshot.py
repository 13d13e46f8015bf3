from django.db import connection
from django.test.utils import CaptureQueriesContext

from tasks_app.events import chain_events
from tasks_app.models import Step, Task, TaskEvent
from tests.helpers import create_task

SNAPSHOT_FIELDS = {
    "taskId", "workflow", "workflowVersion", "status", "statusMessage", "internalStatus", "progress", "phase",
    "priority", "stateVersion", "planVersion", "stepsCompleted", "recoveries", "lastCheckpoint", "deadline",
    "createdAt", "updatedAt", "completedAt", "statusUrl", "streamUrl",
}


def _grow(task: Task, steps: int) -> None:
    """Give a task `steps` committed steps and events, as a long run would leave them."""
    Step.objects.bulk_create(
        Step(task=task, seq=i, step_index=i - 1, name=f"step-{i}", status="committed", lease_epoch=1,
             state_delta={"i": i}) for i in range(1, steps + 1)
    )
    events, seq, head = chain_events(task.id, [("progress", {"i": i}) for i in range(steps)],
                                      seq=task.event_seq, head=task.event_head_hash)
    TaskEvent.objects.bulk_create(events)
    Task.objects.filter(id=task.id).update(event_seq=seq, event_head_hash=head, steps_completed=steps,
                                           checkpoint_sequence=steps // 10)


def test_it_returns_every_snapshot_field(api):
    created = create_task(api, {"workflow": "demo_steps", "input": {"steps": 2}, "priority": 7,
                                "deadline": "2030-01-01T00:00:00Z", "budget": {"maxSteps": 10}}).json()

    snapshot = api.get(f"/runtime/tasks/{created['taskId']}").json()

    assert SNAPSHOT_FIELDS <= set(snapshot)
    assert snapshot["priority"] == 7 and snapshot["deadline"] == "2030-01-01T00:00:00Z"
    assert snapshot["lastCheckpoint"] is None and "result" not in snapshot and "error" not in snapshot
    assert Task.objects.get(id=created["taskId"]).budget_steps == 10


def test_it_inlines_result_when_completed_and_error_when_failed(api):
    done = Task.objects.get(id=create_task(api).json()["taskId"])
    Task.objects.filter(id=done.id).update(status="completed", result={"answer": 42}, checkpoint_sequence=3)
    failed = Task.objects.get(id=create_task(api, key="f").json()["taskId"])
    error = {"type": "ValueError", "message": "boom", "step": "s1", "attempt": 3}
    Task.objects.filter(id=failed.id).update(status="dead_lettered", error=error)

    done_snapshot = api.get(f"/runtime/tasks/{done.id}").json()
    failed_snapshot = api.get(f"/runtime/tasks/{failed.id}").json()

    assert done_snapshot["status"] == "completed" and done_snapshot["result"] == {"answer": 42}
    assert done_snapshot["lastCheckpoint"]["sequence"] == 3
    assert failed_snapshot["status"] == "failed" and failed_snapshot["internalStatus"] == "dead_lettered"
    assert failed_snapshot["error"] == error


def test_it_reads_the_snapshot_in_the_same_number_of_queries_however_long_the_task(api):
    short = Task.objects.get(id=create_task(api, key="short").json()["taskId"])
    long = Task.objects.get(id=create_task(api, key="long").json()["taskId"])
    _grow(short, 2)
    _grow(long, 2000)

    counts = []
    for task in (short, long):
        with CaptureQueriesContext(connection) as queries:
            assert api.get(f"/runtime/tasks/{task.id}").status_code == 200
        counts.append(len(queries))

    assert counts[0] == counts[1]
    assert counts[0] <= 2  # token lookup (with user and tenant) + the task row
