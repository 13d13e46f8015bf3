"""A task's artifacts through the API: listed from what its steps committed, served streamed, tenant-scoped."""

import uuid

import pytest

from tests import workflows
from tests.engine_support import configure, drive


@pytest.fixture
def artifact_task(new_task, settings):
    """A finished task whose steps wrote report.md, data.json (twice) and, in an attempt that failed, draft.txt."""
    name = uuid.uuid4().hex
    workflows.SCRIPTS[name] = {
        0: [{"do": "artifact", "name": "report.md", "content": "# Findings\n"}],
        1: [{"do": "artifact", "name": "data.json", "content": '{"v": 1}'},
            {"do": "artifact", "name": "draft.txt", "content": "never committed", "attempts": [1]},
            {"do": "raise", "attempts": [1]}],
        2: [{"do": "artifact", "name": "data.json", "content": '{"v": 2}'}],
    }
    configure(settings, step_retry={"backoff_seconds": 0})
    task = new_task("scripted", script=name, steps=3)
    assert drive(task.id) == ["completed"]
    yield task
    workflows.SCRIPTS.pop(name, None)


def download(api, url):
    response = api.get(url.removeprefix("http://testserver"))
    return response, b"".join(response.streaming_content) if response.status_code == 200 else response.content


def test_it_lists_the_artifacts_the_tasks_steps_committed(api, artifact_task):
    snapshot = api.get(f"/runtime/tasks/{artifact_task.id}").json()
    listed = api.get(snapshot["artifactsUrl"].removeprefix("http://testserver"))

    assert listed.status_code == 200
    artifacts = listed.json()["artifacts"]
    assert [(a["name"], a["bytes"], a["contentType"]) for a in artifacts] == [
        ("report.md", 11, "text/markdown"), ("data.json", 8, "application/json")]  # not the failed attempt's
    assert artifacts[0]["url"] == f"http://testserver/runtime/tasks/{artifact_task.id}/artifacts/report.md"


def test_it_serves_an_artifact_streamed_with_its_type_and_length_as_a_sandboxed_attachment(api, artifact_task):
    artifacts = {a["name"]: a for a in api.get(f"/runtime/tasks/{artifact_task.id}/artifacts").json()["artifacts"]}

    report, report_body = download(api, artifacts["report.md"]["url"])
    data, data_body = download(api, artifacts["data.json"]["url"])

    assert report.status_code == 200 and report_body == b"# Findings\n"
    assert report["Content-Type"] == "text/markdown" and report["Content-Length"] == "11"
    assert report["Content-Disposition"] == 'attachment; filename="report.md"'
    assert report["Content-Security-Policy"].startswith("sandbox")
    assert data_body == b'{"v": 2}'  # written again by a later step: the newest


def test_it_answers_an_unknown_or_uncommitted_artifact_with_a_problem(api, artifact_task):
    for name in ("draft.txt", "nothing.md"):
        response = api.get(f"/runtime/tasks/{artifact_task.id}/artifacts/{name}")

        assert response.status_code == 404 and response["Content-Type"] == "application/problem+json"
        assert f"/runtime/tasks/{artifact_task.id}/artifacts lists them" in response.json()["detail"]


def test_it_hides_a_tasks_artifacts_from_another_tenant(other_api, artifact_task):
    assert other_api.get(f"/runtime/tasks/{artifact_task.id}/artifacts").status_code == 404
    assert other_api.get(f"/runtime/tasks/{artifact_task.id}/artifacts/report.md").status_code == 404


def test_it_says_when_a_listed_artifacts_file_is_missing_from_storage(api, artifact_task, settings):
    url = api.get(f"/runtime/tasks/{artifact_task.id}/artifacts").json()["artifacts"][0]["url"]
    for path in (settings.MEDIA_ROOT / "tasks" / str(artifact_task.id)).rglob("*-report.md"):
        path.unlink()

    response = api.get(url.removeprefix("http://testserver"))

    assert response.status_code == 404 and "missing from storage" in response.json()["detail"]


def test_it_links_and_serves_a_tasks_artifacts_from_its_admin_page(artifact_task, admin_client):
    page = admin_client.get(f"/admin/tasks_app/task/{artifact_task.id}/change/").content.decode()
    listing = admin_client.get(f"/admin/tasks_app/task/{artifact_task.id}/artifacts/").content.decode()

    assert f"/admin/tasks_app/task/{artifact_task.id}/artifacts/" in page
    download = admin_client.get(f"/admin/tasks_app/task/{artifact_task.id}/artifacts/report.md")

    assert f'href="/admin/tasks_app/task/{artifact_task.id}/artifacts/report.md"' in listing
    assert "draft.txt" not in listing
    assert download.status_code == 200 and b"".join(download.streaming_content) == b"# Findings\n"
