"""The bad-input matrix: each case gets a 4xx problem-details body, never a 500, never a row written."""

import json

import pytest
from rest_framework.test import APIClient

from tasks_app.models import Task, TaskEvent

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
