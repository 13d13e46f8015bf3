"""The bad-input matrix: each case gets a 4xx problem-details body, never a 500, never a row written."""

import json

import pytest
from rest_framework.test import APIClient

from tasks_app.models import Task, TaskEvent
from tests.asgi_support import asgi_request
from tests.helpers import create_task

VALID = {"workflow": "demo_steps", "input": {"steps": 3}}

CASES = [
    # (id, raw body or dict, content type, extra headers, status, problem type slug, field expected in errors)
    ("invalid-json", b'{"workflow": "demo_steps", "input": {', "application/json", {}, 400, "malformed-json", None),
    ("nan-is-not-json", b'{"workflow": "demo_steps", "input": {"steps": NaN}}', "application/json", {}, 400,
     "malformed-json", None),
    ("body-is-a-list", [VALID], "application/json", {}, 400, "invalid-request", None),
    ("missing-workflow", {"input": {"steps": 3}}, "application/json", {}, 400, "invalid-request", "workflow"),
    ("workflow-wrong-type", {"workflow": ["demo_steps"], "input": {"steps": 3}}, "application/json", {}, 400,
     "invalid-request", "workflow"),
    ("input-not-an-object", {"workflow": "demo_steps", "input": [1, 2]}, "application/json", {}, 400,
     "invalid-request", "input"),
    ("priority-out-of-range", {**VALID, "priority": 12}, "application/json", {}, 400, "invalid-request", "priority"),
    ("priority-wrong-type", {**VALID, "priority": "high"}, "application/json", {}, 400, "invalid-request", "priority"),
    ("deadline-not-a-date", {**VALID, "deadline": "tomorrow"}, "application/json", {}, 400, "invalid-request",
     "deadline"),
    ("unknown-top-level-field", {**VALID, "inptu": {}}, "application/json", {}, 400, "invalid-request", "inptu"),
    ("unknown-budget-field", {**VALID, "budget": {"maxStep": 3}}, "application/json", {}, 400, "invalid-request",
     "budget.maxStep"),
    ("budget-steps-too-large", {**VALID, "budget": {"maxSteps": 10**30}}, "application/json", {}, 400,
     "invalid-request", "budget.maxSteps"),
    ("unknown-workflow", {"workflow": "no_such_flow", "input": {}}, "application/json", {}, 422, "unknown-workflow",
     "workflow"),
    ("schema-missing-required", {"workflow": "demo_steps", "input": {}}, "application/json", {}, 422,
     "input-schema-violation", "input.steps"),
    ("schema-wrong-type", {"workflow": "demo_steps", "input": {"steps": "three"}}, "application/json", {}, 422,
     "input-schema-violation", "input.steps"),
    ("schema-below-minimum", {"workflow": "demo_steps", "input": {"steps": 0}}, "application/json", {}, 422,
     "input-schema-violation", "input.steps"),
    ("schema-extra-property", {"workflow": "demo_steps", "input": {"steps": 1, "bogus": True}}, "application/json",
     {}, 422, "input-schema-violation", "input"),
    ("nul-in-input", {"workflow": "demo_steps", "input": {"steps": 1, "x\u0000": 1}}, "application/json", {},
     400, "invalid-request", "input.x\u0000"),
    ("nul-in-goal", {**VALID, "goal": {"text": "a\u0000b"}}, "application/json", {}, 400, "invalid-request",
     "goal.text"),
    ("not-json-content-type", b"workflow=demo_steps", "text/plain", {}, 415, "unsupported-media-type", None),
    ("key-with-space", VALID, "application/json", {"HTTP_IDEMPOTENCY_KEY": "a key"}, 400, "invalid-idempotency-key",
     "Idempotency-Key"),
    ("key-too-long", VALID, "application/json", {"HTTP_IDEMPOTENCY_KEY": "k" * 256}, 400, "invalid-idempotency-key",
     "Idempotency-Key"),
    ("key-empty", VALID, "application/json", {"HTTP_IDEMPOTENCY_KEY": ""}, 400, "invalid-idempotency-key",
     "Idempotency-Key"),
]


def _post(client, body, content_type, headers):
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return client.post("/runtime/tasks", data=raw, content_type=content_type, **headers)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_it_answers_bad_input_with_a_problem_and_writes_nothing(api, case):
    _, body, content_type, headers, status, slug, field = case

    response = _post(api, body, content_type, headers)

    assert response.status_code == status, response.content
    assert response["Content-Type"] == "application/problem+json"
    problem = response.json()
    assert problem["type"] == f"/runtime/problems/{slug}"
    assert problem["status"] == status and problem["title"] and problem["detail"]
    if field is not None:
        assert field in [error["field"] for error in problem["errors"]], problem
    assert Task.objects.count() == 0 and TaskEvent.objects.count() == 0


def test_it_refuses_a_body_over_the_size_limit_with_413(api, settings):
    settings.RUNTIME_MAX_REQUEST_BYTES = 1000
    body = {"workflow": "demo_steps", "input": {"steps": 1}, "goal": "x" * 2000}

    response = _post(api, body, "application/json", {})

    assert response.status_code == 413
    assert response.json()["type"] == "/runtime/problems/payload-too-large"
    assert response.json()["limit"] == 1000
    assert Task.objects.count() == 0


def test_it_lists_every_schema_violation_at_once(api):
    response = _post(api, {"workflow": "demo_steps", "input": {"steps": -1, "sleep_ms": "slow"}}, "application/json",
                     {})

    assert response.status_code == 422
    fields = sorted(error["field"] for error in response.json()["errors"])
    assert fields == ["input.sleep_ms", "input.steps"]


def test_it_names_the_available_workflows_when_one_is_unknown(api):
    response = _post(api, {"workflow": "demo_step", "input": {}}, "application/json", {})

    assert "demo_steps" in response.json()["detail"]


@pytest.mark.parametrize("header", [None, "Bearer", "Bearer not-a-token", "Basic dXNlcjpwYXNz", "Bearer a b"])
def test_it_answers_missing_or_bad_credentials_with_401(db, header):
    client = APIClient()
    if header:
        client.credentials(HTTP_AUTHORIZATION=header)

    response = client.post("/runtime/tasks", VALID, format="json")

    assert response.status_code == 401
    assert response["Content-Type"] == "application/problem+json"
    assert response["WWW-Authenticate"].startswith("Bearer")
    assert Task.objects.count() == 0


def test_it_answers_unknown_paths_and_ids_with_problem_404(api):
    for path in ("/runtime/nope", "/runtime/tasks/not-a-uuid", "/runtime/tasks/00000000-0000-0000-0000-000000000000"):
        response = api.get(path)
        assert response.status_code == 404, path
        assert response["Content-Type"] == "application/problem+json"


def test_it_answers_a_wrong_method_with_405(api):
    response = api.delete("/runtime/tasks")

    assert response.status_code == 405
    assert response.json()["type"] == "/runtime/problems/method-not-allowed"


# Paths: every path under /runtime/ and /mcp answers problem+json, with a detail that says what to send instead,
# also with DEBUG on (Django's HTML 404 page would list every URL pattern). Sent through the ASGI entry point.

TASK_ID = "0192f0c1-7e4a-7b3c-9d2e-5f6a7b8c9d0e"
PATH_CASES = [
    # (method, path, words the detail must contain)
    ("GET", "/runtime/tasks/123", "`123` is not a task id: task ids are UUIDs like"),
    ("GET", f"/runtime/tasks/{TASK_ID.replace('-', '')}", f"did you mean /runtime/tasks/{TASK_ID}?"),
    ("POST", f"/runtime/tasks/{TASK_ID.replace('-', '')}/cancel", f"did you mean /runtime/tasks/{TASK_ID}/cancel?"),
    ("POST", "/runtime/tasks/abc/cancel", "`abc` is not a task id"),
    ("GET", "/runtime/tasks/", "No resource at /runtime/tasks/; did you mean /runtime/tasks?"),
    ("GET", f"/runtime/tasks/{TASK_ID}/", f"did you mean /runtime/tasks/{TASK_ID}?"),
    ("GET", "/runtime/Workflows", "did you mean /runtime/workflows?"),
    ("GET", "/runtime/", "/runtime/tasks/{task_id}/cancel"),
    ("GET", "/runtime", "/runtime/workflows"),
    ("POST", "/runtime/nope", "No resource at /runtime/nope. The API has: "),
    ("GET", f"/runtime/tasks/{TASK_ID}/steer", "No resource at"),
    ("GET", "/runtime/problems/not a slug", "No resource at"),
    ("GET", "/runtime/a\nb", "No resource at"),
    ("POST", "/mcp/sse", "No resource at /mcp/sse"),  # (/mcp itself is the MCP endpoint: tests/test_mcp_bridge.py)
]


@pytest.mark.parametrize("method,path,hint", PATH_CASES, ids=[f"{c[0]} {c[1]!r}" for c in PATH_CASES])
def test_it_answers_every_unknown_api_path_with_a_problem_that_helps_even_with_debug(api, settings, method, path,
                                                                                   hint):
    settings.DEBUG = True

    response = asgi_request(method, path, headers={"Authorization": f"Bearer {api.raw_token}"})

    assert response.status == 404, response.body[:300]
    assert response.headers["content-type"] == "application/problem+json"
    problem = response.json()
    assert problem["type"] == "/runtime/problems/not-found" and problem["status"] == 404
    assert hint in problem["detail"], problem["detail"]


def test_it_answers_an_unknown_path_with_a_problem_without_credentials(db, settings):
    settings.DEBUG = True

    response = asgi_request("GET", "/runtime/tasks/123")

    assert response.status == 404 and response.json()["type"] == "/runtime/problems/not-found"


def test_it_finds_a_task_by_its_id_in_upper_case(api):
    task_id = create_task(api).json()["taskId"]

    found = api.get(f"/runtime/tasks/{task_id.upper()}")
    cancelled = api.post(f"/runtime/tasks/{task_id.upper()}/cancel")

    assert found.status_code == 200 and found.json()["taskId"] == task_id
    assert cancelled.status_code == 202 and cancelled.json()["status"] == "cancelled"


def test_it_says_an_unknown_task_id_is_unknown(api):
    response = api.get(f"/runtime/tasks/{TASK_ID}")

    assert response.status_code == 404
    assert response.json()["detail"] == f"No task {TASK_ID}."


# Accept, credentials, query parameters, summaries.

@pytest.mark.parametrize("accept", ["text/html", "text/html,application/xhtml+xml,application/xml;q=0.9",
                                    "application/xml"])
def test_it_answers_json_to_a_client_that_asks_for_html(api, accept):
    listed = api.get("/runtime/tasks", HTTP_ACCEPT=accept)
    refused = api.post("/runtime/tasks", {"workflow": "demo_steps"}, format="json", HTTP_ACCEPT=accept)

    assert listed.status_code == 200 and listed["Content-Type"] == "application/json"
    assert listed.json()["results"] == []
    assert refused.status_code == 400 and refused["Content-Type"] == "application/problem+json"
    assert refused.json()["errors"] == [{"field": "input", "message": "This field is required."}]


def test_it_tells_a_client_that_sent_a_bare_token_to_add_the_bearer_prefix(api):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=api.raw_token)

    response = client.get("/runtime/tasks")

    assert response.status_code == 401 and response["WWW-Authenticate"].startswith("Bearer")
    assert response.json()["detail"] == ("The Authorization header needs the `Bearer ` prefix: send "
                                         "`Authorization: Bearer <token>`.")


@pytest.mark.parametrize("content_type, says", [("", "The request has no Content-Type"),
                                                ("text/plain", "Content-Type 'text/plain' is not accepted")])
def test_it_tells_a_client_to_send_json_when_the_content_type_is_missing_or_another(api, content_type, says):
    response = api.generic("POST", "/runtime/tasks", data=json.dumps(VALID).encode(), content_type=content_type)

    assert response.status_code == 415 and response["Content-Type"] == "application/problem+json"
    assert response.json()["detail"] == f"{says}: send the body as JSON with `Content-Type: application/json`."
    assert Task.objects.count() == 0


def test_it_tells_a_client_using_the_token_scheme_to_send_a_bearer_token(api):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {api.raw_token}")

    response = client.get("/runtime/tasks")

    assert response.status_code == 401
    assert response["Content-Type"] == "application/problem+json"
    assert "Authorization: Bearer <token>" in response.json()["detail"]


@pytest.mark.parametrize("limit", ["0", "-1", "201", "1000000", "abc", "1.5", "9" * 2000])
def test_it_refuses_a_limit_outside_1_to_200_naming_the_range(api, limit):
    response = api.get("/runtime/tasks", {"limit": limit})

    assert response.status_code == 400
    assert response["Content-Type"] == "application/problem+json"
    assert response.json()["errors"] == [{"field": "limit", "message": "Must be an integer from 1 to 200."}]


@pytest.mark.parametrize("limit", [1, 200])
def test_it_pages_by_any_limit_in_range(api, limit):
    create_task(api)
    create_task(api, key="second")

    page = api.get("/runtime/tasks", {"limit": limit}).json()

    assert len(page["results"]) == min(limit, 2)
    assert (page["next"] is not None) == (limit == 1)


def test_it_summarises_several_errors_in_one_sentence(api):
    response = _post(api, {}, "application/json", {})

    assert response.json()["detail"] == "workflow: This field is required; input: This field is required."


def test_it_says_how_many_errors_the_summary_leaves_out(api):
    response = _post(api, {**VALID, **{f"extra{i}": 1 for i in range(7)}}, "application/json", {})

    detail = response.json()["detail"]
    assert len(response.json()["errors"]) == 7
    assert detail.endswith(" (and 2 more in `errors`).") and ".;" not in detail and ".." not in detail
