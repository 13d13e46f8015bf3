import uuid

import pytest

from tasks_app.models import Task, TaskEvent
from tests.helpers import create_task
from tests.support.concurrency import at_once


def test_it_creates_a_queued_task_with_links_and_a_first_event(api):
    response = create_task(api, {"workflow": "demo_steps", "input": {"steps": 3, "sleep_ms": 5}})

    assert response.status_code == 201, response.content
    body = response.json()
    task_id = body["taskId"]
    assert body["status"] == "working" and body["internalStatus"] == "queued"
    assert body["statusUrl"] == f"http://testserver/runtime/tasks/{task_id}"
    assert body["streamUrl"] == f"http://testserver/runtime/tasks/{task_id}/events"
    assert response["Location"] == body["statusUrl"]
    task = Task.objects.get(id=task_id)
    assert task.workflow_name == "demo_steps" and task.workflow_version == "1"
    assert task.owner == api.user and task.input == {"steps": 3, "sleep_ms": 5}
    assert list(TaskEvent.objects.filter(task=task).values_list("seq", "type")) == [(1, "status")]


def test_it_returns_the_same_task_for_the_same_key_and_body(api):
    key = str(uuid.uuid4())
    first = create_task(api, key=key)
    second = create_task(api, key=key)

    assert (first.status_code, second.status_code) == (201, 200)
    assert first.json()["taskId"] == second.json()["taskId"]
    assert Task.objects.filter(idempotency_key=key).count() == 1
    assert TaskEvent.objects.count() == 1


def test_it_treats_the_same_json_in_another_key_order_as_the_same_body(api):
    key = "order-test"
    first = create_task(api, {"workflow": "demo_steps", "input": {"steps": 3, "sleep_ms": 1}}, key=key)
    second = create_task(api, {"input": {"sleep_ms": 1, "steps": 3}, "workflow": "demo_steps"}, key=key)

    assert (first.status_code, second.status_code) == (201, 200)


def test_it_refuses_a_reused_key_with_another_body(api):
    key = "reused-key"
    first = create_task(api, {"workflow": "demo_steps", "input": {"steps": 3}}, key=key)
    second = create_task(api, {"workflow": "demo_steps", "input": {"steps": 4}}, key=key)

    assert second.status_code == 409
    problem = second.json()
    assert problem["type"] == "/runtime/problems/idempotency-key-reused"
    assert problem["taskId"] == first.json()["taskId"]
    assert Task.objects.count() == 1


def test_it_scopes_idempotency_keys_to_the_tenant(api, other_api):
    first = create_task(api, key="shared-key")
    second = create_task(other_api, key="shared-key")

    assert (first.status_code, second.status_code) == (201, 201)
    assert first.json()["taskId"] != second.json()["taskId"]


@pytest.mark.django_db(transaction=True)
def test_it_creates_one_task_when_two_requests_race_with_one_key(tenant):
    """Two threads, two connections, one key: the second INSERT waits on the unique index, then reads the winner."""
    from tests.conftest import _client_for

    clients = [_client_for(tenant, "racer-1"), _client_for(tenant, "racer-2")]
    # The same owner is not required for idempotency; both users belong to the tenant.
    results = at_once(*[lambda client=client: create_task(client, key="race-key") for client in clients])

    codes = sorted(r.status_code for r in results)
    assert codes == [200, 201], [r.content for r in results]
    assert results[0].json()["taskId"] == results[1].json()["taskId"]
    assert Task.objects.filter(idempotency_key="race-key").count() == 1
    assert TaskEvent.objects.count() == 1


def test_it_hides_tasks_of_other_tenants_behind_404(api, other_api):
    task_id = create_task(api).json()["taskId"]

    for response in (other_api.get(f"/runtime/tasks/{task_id}"), other_api.post(f"/runtime/tasks/{task_id}/cancel")):
        assert response.status_code == 404
        assert response["Content-Type"] == "application/problem+json"
    assert other_api.get("/runtime/tasks").json()["results"] == []
    assert Task.objects.get(id=task_id).status == "queued"  # the foreign cancel changed nothing


def test_it_gives_tasks_time_ordered_ids(api):
    """Version 7 UUIDs: new tasks (and the rows keyed by them) go to the right edge of each index instead of a
    random page of it (tasks_app.ids)."""
    import uuid

    ids = [uuid.UUID(api.post("/runtime/tasks", {"workflow": "demo_steps", "input": {"steps": 1}},
                              format="json").json()["taskId"]) for _ in range(3)]

    assert {task_id.version for task_id in ids} == {7}
    assert ids == sorted(ids)  # created one after another: in creation order
    assert len(set(ids)) == 3
