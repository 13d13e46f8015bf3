from datetime import timedelta

from django.utils import timezone

from tasks_app.models import Task
from tests.helpers import create_task


def _make(api, n, **body):
    return [create_task(api, {"workflow": "demo_steps", "input": {"steps": 1}, **body}).json()["taskId"]
            for _ in range(n)]


def test_it_pages_through_all_tasks_newest_first_with_a_cursor(api):
    ids = _make(api, 5)

    seen, url = [], "/runtime/tasks?limit=2"
    while url:
        page = api.get(url).json()
        assert len(page["results"]) <= 2
        seen += [item["taskId"] for item in page["results"]]
        url = page["next"]

    assert seen == list(reversed(ids))


def test_it_filters_by_external_and_internal_status(api):
    queued, cancelled = _make(api, 2)
    api.post(f"/runtime/tasks/{cancelled}/cancel")

    working = [t["taskId"] for t in api.get("/runtime/tasks?status=working").json()["results"]]
    done = [t["taskId"] for t in api.get("/runtime/tasks?internalStatus=cancelled").json()["results"]]

    assert working == [queued] and done == [cancelled]


def test_it_filters_by_workflow_and_creation_time(api):
    old, new = _make(api, 2)
    Task.objects.filter(id=old).update(created_at=timezone.now() - timedelta(days=3))
    since = (timezone.now() - timedelta(days=1)).isoformat().replace("+00:00", "Z")

    recent = api.get("/runtime/tasks", {"createdAfter": since}).json()["results"]
    older = api.get("/runtime/tasks", {"createdBefore": since}).json()["results"]
    other = api.get("/runtime/tasks?workflow=document_review").json()["results"]

    assert [t["taskId"] for t in recent] == [new]
    assert [t["taskId"] for t in older] == [old]
    assert other == []


def test_it_answers_bad_filters_and_cursors_with_400(api):
    for query in ("status=sleeping", "createdAfter=yesterday", "cursor=garbage"):
        response = api.get(f"/runtime/tasks?{query}")
        assert response.status_code == 400, query
        assert response["Content-Type"] == "application/problem+json"
