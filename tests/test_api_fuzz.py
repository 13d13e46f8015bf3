"""Fuzz the REST API from its own OpenAPI schema: whatever a client sends, never a 500, and every answer
matches the documented status codes and bodies (schemathesis, in-process through Django's WSGI handler).
Then what the schema cannot describe: bodies sent chunked (through the ASGI entry point) and arbitrary paths."""

import json
import os
import uuid

import pytest
import schemathesis
from django.conf import settings as django_settings
from django.core.wsgi import get_wsgi_application
from django.test import override_settings
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import response_schema_conformance, status_code_conformance

from tests.asgi_support import asgi_request, keeping_test_connection


@pytest.fixture
def api_schema(api, settings):
    settings.ALLOWED_HOSTS = ["localhost", "testserver"]  # the WSGI test client's host
    with keeping_test_connection():
        yield schemathesis.openapi.from_wsgi("/runtime/schema?format=json", get_wsgi_application(),
                                             headers={"Authorization": f"Bearer {api.raw_token}"})


# Derandomized so CI is repeatable; FUZZ_RANDOM=1 explores new examples (how the NUL-character and the
# integer-overflow 500s were found).
DERANDOMIZE = os.environ.get("FUZZ_RANDOM") != "1"


def test_it_never_answers_a_fuzzed_request_with_a_server_error(api_schema, api):
    headers = {"Authorization": f"Bearer {api.raw_token}"}
    operations = [result.ok() for result in api_schema.get_all_operations()]
    assert len(operations) >= 5

    for operation in operations:
        @given(case=operation.as_strategy())
        @settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), database=None,
                  derandomize=DERANDOMIZE)
        def fuzz(case):
            case.call_and_validate(headers=headers, checks=[not_a_server_error, status_code_conformance,
                                                            response_schema_conformance])

        fuzz()


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


def _task_body(steps, goal) -> bytes:
    return json.dumps({"workflow": "demo_steps", "input": {"steps": steps}, "goal": goal}).encode()


def _body_near_the_limit(offset: int) -> bytes:
    """A valid task body `offset` bytes longer than the request size limit (negative: shorter)."""
    padding = django_settings.RUNTIME_MAX_REQUEST_BYTES + offset - len(_task_body(1, ""))
    return _task_body(1, "x" * padding)


def _nested(levels: int) -> bytes:
    return b'{"a": ' * (levels // 2) + b"[" * (levels - levels // 2) + b"]" * (levels - levels // 2) + \
        b"}" * (levels // 2)


# What an attacker puts in a JSON value (issue 37, finding 8): nesting to 12,000 levels (RUNTIME_MAX_JSON_DEPTH is
# 64; Python's parser gave up near 1,000 with a RecursionError, a 500), lone surrogates escaped in JSON (valid JSON,
# no UTF-8 can carry them) beside a proper pair, and bytes that are not UTF-8 (raw surrogates, a cut sequence).
HOSTILE_VALUES = st.one_of(
    st.one_of(st.integers(1, 80), st.integers(80, 12_000)).map(_nested),
    st.sampled_from([b'"\\ud800"', b'"x \\udfff"', b'{"\\udc00": 1}', b'"\\ud83d\\ude00"', b'["\\ud83d", "\\ude00"]']),
    st.sampled_from([b'"\xed\xa0\x80"', b'"\xff"', b'"a \xc3"', b'"\xe2\x82"', b'{"\xfe": 1}']),
)


def _task_body_with(value: bytes, where: str) -> bytes:
    if where == "input":
        return b'{"workflow": "demo_steps", "input": {"steps": 1, "x": ' + value + b"}}"
    return b'{"workflow": "demo_steps", "input": {"steps": 1}, "' + where.encode() + b'": ' + value + b"}"


BODIES = st.one_of(
    st.builds(_task_body, st.integers(-1, 6), st.text(max_size=300)),  # valid and schema-violating tasks
    JSON_VALUES.map(lambda value: json.dumps(value).encode()),  # any JSON document
    st.binary(max_size=600),  # not JSON
    st.sampled_from([0, 1, -1, 2]).map(_body_near_the_limit),  # at the size limit, by a byte or two either side
    st.builds(_task_body_with, HOSTILE_VALUES, st.sampled_from(["goal", "input", "approvalPolicy"])),
)


def test_it_reads_any_generated_body_alike_chunked_or_with_a_length(api):
    """A chunked body, cut anywhere, gets the answer the same bytes get with a Content-Length: the same problem,
    or (under one Idempotency-Key) the same task, which the server only returns for an identical body."""
    auth = {"Content-Type": "application/json", "Authorization": f"Bearer {api.raw_token}"}

    @given(body=BODIES, data=st.data())
    @settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck), database=None,
              derandomize=DERANDOMIZE)
    def fuzz(body, data):
        cuts = sorted(data.draw(st.lists(st.integers(0, len(body)), max_size=6), label="cuts"))
        chunks = [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True)] + [b""]
        key = {"Idempotency-Key": str(uuid.uuid4())}

        chunked = asgi_request("POST", "/runtime/tasks", chunks=chunks,
                               headers={**auth, **key, "Transfer-Encoding": "chunked"})
        sized = asgi_request("POST", "/runtime/tasks", chunks=[body],
                             headers={**auth, **key, "Content-Length": str(len(body))})

        assert chunked.status < 500, chunked.body[:500]
        if chunked.status == 201:
            assert sized.status == 200 and sized.json()["taskId"] == chunked.json()["taskId"], sized.body[:500]
        else:
            assert chunked.headers["content-type"] == "application/problem+json"
            assert (sized.status, sized.json()) == (chunked.status, chunked.json())

    fuzz()


PATH_SEGMENTS = st.one_of(
    st.sampled_from(["tasks", "workflows", "schema", "problems", "cancel", "", "..", "TASKS",
                     "0192f0c1-7e4a-7b3c-9d2e-5f6a7b8c9d0e", "0192F0C17E4A7B3C9D2E5F6A7B8C9D0E"]),
    st.uuids().map(str),
    st.text(max_size=12),
)


@override_settings(DEBUG=True)
def test_it_answers_any_generated_path_under_the_api_with_json(api):
    """Whatever path under /runtime/ or /mcp, with DEBUG on: never a 500, never Django's HTML error pages (sent
    through the ASGI entry point, the path decoded as a server hands it over)."""
    token = {"Authorization": f"Bearer {api.raw_token}"}

    @given(root=st.sampled_from(["/runtime", "/mcp"]), segments=st.lists(PATH_SEGMENTS, max_size=4),
           trailing_slash=st.booleans(), method=st.sampled_from(["GET", "POST", "DELETE"]))
    @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck), database=None,
              derandomize=DERANDOMIZE)
    def fuzz(root, segments, trailing_slash, method):
        path = "/".join([root, *segments]) + ("/" if trailing_slash else "")
        if path.startswith(("/runtime/docs", "/runtime/redoc")):
            return  # the HTML pages
        response = asgi_request(method, path, headers=token)

        assert response.status < 500, (path, response.body[:300])
        assert response.headers["content-type"].split(";")[0] in {
            "application/json", "application/problem+json", "application/vnd.oai.openapi+json"}, (path, response)
        if response.status == 404:
            assert response.json()["detail"], path

    fuzz()
