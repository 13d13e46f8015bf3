import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from checkpoints_app.models import SideEffect
from tests.helpers import create_task


@pytest.fixture
def operator(db):
    client = Client()
    client.force_login(get_user_model().objects.create_superuser("op", password=None))
    return client


def test_it_lists_tasks_steps_and_events_with_filters_and_search(api, operator):
    task_id = create_task(api).json()["taskId"]

    tasks = operator.get("/admin/tasks_app/task/", {"status__exact": "queued", "q": task_id})
    events = operator.get(f"/admin/tasks_app/task/{task_id}/history/events/", {"type": "status"})
    steps = operator.get(f"/admin/tasks_app/task/{task_id}/history/steps/", {"status": "committed"})

    assert tasks.status_code == events.status_code == steps.status_code == 200
    assert task_id in tasks.content.decode()
    assert "<td>status</td>" in events.content.decode() and "<td>1</td>" in events.content.decode()
    assert "None." in steps.content.decode()  # queued: no step yet


def test_it_keeps_tasks_read_only_in_admin(api, operator):
    task_id = create_task(api).json()["taskId"]

    assert operator.get("/admin/tasks_app/task/add/").status_code == 403
    assert operator.post(f"/admin/tasks_app/task/{task_id}/delete/", {"post": "yes"}).status_code == 403
    detail = operator.get(f"/admin/tasks_app/task/{task_id}/change/")
    assert detail.status_code == 200 and b'name="_save"' not in detail.content


def test_it_shows_checkpoints_and_the_side_effect_ledger_read_only(api, operator):
    task_id = create_task(api).json()["taskId"]
    SideEffect.objects.create(key=f"{task_id}:1:charge", task_id=task_id, step_seq=1, name="charge",
                              status="unknown", lease_epoch=1)

    unknown = operator.get(f"/admin/tasks_app/task/{task_id}/history/effects/", {"status": "unknown"})
    succeeded = operator.get(f"/admin/tasks_app/task/{task_id}/history/effects/", {"status": "succeeded"})

    assert operator.get("/admin/checkpoints_app/checkpoint/").status_code == 200
    assert f"{task_id}:1:charge" in unknown.content.decode()
    assert f"{task_id}:1:charge" not in succeeded.content.decode()
    assert operator.get("/admin/checkpoints_app/checkpoint/add/").status_code == 403


def test_it_links_a_task_to_its_steps_events_checkpoints_and_effects(api, operator):
    task_id = create_task(api).json()["taskId"]
    other_id = create_task(api, key="other").json()["taskId"]

    page = operator.get(f"/admin/tasks_app/task/{task_id}/change/").content.decode()
    events = operator.get(f"/admin/tasks_app/task/{task_id}/history/events/")

    for kind in ("steps", "events", "effects"):
        assert f"/admin/tasks_app/task/{task_id}/history/{kind}/" in page
    assert f"/admin/checkpoints_app/checkpoint/?task__id__exact={task_id}" in page
    assert events.status_code == 200
    assert task_id in events.content.decode() and other_id not in events.content.decode()


def test_it_refuses_an_unknown_history_table_and_a_viewer_without_permission(api, operator):
    task_id = create_task(api).json()["taskId"]
    visitor = Client()
    visitor.force_login(get_user_model().objects.create_user("visitor", is_staff=True))

    assert operator.get(f"/admin/tasks_app/task/{task_id}/history/secrets/").status_code == 404
    assert visitor.get(f"/admin/tasks_app/task/{task_id}/history/steps/").status_code == 404


def test_it_lets_only_an_account_with_the_change_permission_revoke_tokens(api):
    from django.contrib.admin.models import LogEntry
    from django.contrib.auth.models import Permission

    from tasks_app.models import ApiToken

    token = ApiToken.objects.get(user=api.user)

    def revoke_as(*codenames):
        user = get_user_model().objects.create_user(f"staff-{len(codenames)}", is_staff=True)
        user.user_permissions.add(*Permission.objects.filter(codename__in=codenames))
        client = Client()
        client.force_login(user)
        listing = client.get("/admin/tasks_app/apitoken/")
        client.post("/admin/tasks_app/apitoken/", {"action": "revoke", "_selected_action": [token.id]})
        token.refresh_from_db()
        return b'value="revoke"' in listing.content, token.revoked_at

    assert revoke_as("view_apitoken") == (False, None)
    offered, revoked_at = revoke_as("view_apitoken", "change_apitoken")
    assert offered and revoked_at is not None
    assert create_task(api).status_code == 401
    assert LogEntry.objects.get(object_id=str(token.id)).change_message == "Revoked"


def test_it_names_the_apps_in_words_and_serves_its_own_favicon(operator):
    page = operator.get("/admin/").content.decode()

    for label in ("Tasks", "Checkpoints and the effect ledger"):  # (steering_app adds pages, no model list)
        assert f">{label}</a>" in page, label
    assert "Tasks_App" not in page and "Steering_App" not in page
    assert '<link rel="icon" type="image/svg+xml" href="/static/console/favicon.svg">' in page
