import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from tests.helpers import create_task


@pytest.fixture
def operator(db):
    client = Client()
    client.force_login(get_user_model().objects.create_superuser("op", password=None))
    return client


def test_it_lists_tasks_steps_and_events_with_filters_and_search(api, operator):
    task_id = create_task(api).json()["taskId"]

    tasks = operator.get("/admin/tasks_app/task/", {"status__exact": "queued", "q": task_id})
    events = operator.get("/admin/tasks_app/taskevent/", {"type__exact": "status", "q": task_id})
    steps = operator.get("/admin/tasks_app/step/", {"status__exact": "committed"})

    assert tasks.status_code == events.status_code == steps.status_code == 200
    assert task_id in tasks.content.decode() and task_id in events.content.decode()


def test_it_keeps_tasks_read_only_in_admin(api, operator):
    task_id = create_task(api).json()["taskId"]

    assert operator.get("/admin/tasks_app/task/add/").status_code == 403
    assert operator.post(f"/admin/tasks_app/task/{task_id}/delete/", {"post": "yes"}).status_code == 403
    detail = operator.get(f"/admin/tasks_app/task/{task_id}/change/")
    assert detail.status_code == 200 and b'name="_save"' not in detail.content


def test_it_shows_checkpoints_and_the_side_effect_ledger_read_only(operator):
    for path in ("/admin/checkpoints_app/checkpoint/", "/admin/checkpoints_app/sideeffect/?status__exact=unknown"):
        assert operator.get(path).status_code == 200
    assert operator.get("/admin/checkpoints_app/sideeffect/add/").status_code == 403


def test_it_links_a_task_to_its_steps_events_checkpoints_and_effects(api, operator):
    task_id = create_task(api).json()["taskId"]
    other_id = create_task(api, key="other").json()["taskId"]

    page = operator.get(f"/admin/tasks_app/task/{task_id}/change/").content.decode()
    events = operator.get(f"/admin/tasks_app/taskevent/?task__id__exact={task_id}")

    assert f"/admin/tasks_app/step/?task__id__exact={task_id}" in page
    assert f"/admin/checkpoints_app/sideeffect/?task__id__exact={task_id}" in page
    assert events.status_code == 200
    assert task_id in events.content.decode() and other_id not in events.content.decode()
