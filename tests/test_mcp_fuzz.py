"""Generated input over the MCP endpoint's JSON-RPC surface (hypothesis): whatever the envelope, method, params,
headers or body, the answer is one of the spec's statuses with a JSON (or SSE) body — never a 500, never a hang —
and the endpoint still serves a good request afterwards."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.mcp import rpc

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("external_root")]

ALLOWED = {200, 202, 400, 401, 403, 404, 405, 406, 413, 415, 421}
METHODS = ["server/discover", "tools/list", "tools/call", "tasks/get", "tasks/update", "tasks/cancel", "tasks/result",
           "tasks/list", "resources/list", "resources/read", "resources/templates/list", "prompts/list",
           "prompts/get", "completion/complete", "subscriptions/listen", "initialize", "ping", "logging/setLevel",
           "notifications/initialized", "no/such/method", ""]
scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20)
json_values = st.recursive(scalars,
                           lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner,
                                                                                       max_size=4), max_leaves=12)
TASK_ID = "00000000-0000-4000-8000-000000000000"
params = st.fixed_dictionaries({}, optional={
    "name": st.sampled_from(["demo_steps", "steer_task", "greet", "nope"]) | st.text(max_size=10),
    "arguments": json_values, "taskId": st.sampled_from([TASK_ID, "not-a-uuid"]) | json_values,
    "inputResponses": json_values, "requestState": st.text(max_size=30) | json_values, "uri": json_values,
    "cursor": json_values, "notifications": json_values, "task": json_values,
    "_meta": st.fixed_dictionaries({
        "io.modelcontextprotocol/protocolVersion": st.just("2026-07-28"),
        "io.modelcontextprotocol/clientCapabilities": st.just({"extensions": {"io.modelcontextprotocol/tasks": {}}}),
    }) | st.fixed_dictionaries({}, optional={
        "io.modelcontextprotocol/protocolVersion": st.sampled_from(["2026-07-28", "2025-11-25", "1999-01-01"]),
        "io.modelcontextprotocol/clientCapabilities": st.just({"extensions": {"io.modelcontextprotocol/tasks": {}}})
        | json_values}),
})
envelopes = st.fixed_dictionaries({"jsonrpc": st.sampled_from(["2.0", "1.0"]), "method": st.sampled_from(METHODS)},
                                  optional={"id": st.integers() | st.text(max_size=8) | st.none(),
                                            "params": params | json_values})
GOOD_META = {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
             "io.modelcontextprotocol/clientCapabilities": {"extensions": {"io.modelcontextprotocol/tasks": {}}}}
# Well-formed envelopes with well-formed _meta, so most examples reach the handlers with odd params.
handler_envelopes = st.builds(lambda method, p, i: {"jsonrpc": "2.0", "id": i, "method": method,
                                                     "params": {**p, "_meta": GOOD_META}},
                              st.sampled_from(METHODS), params, st.integers(0, 1000))


def _nested(levels: int) -> bytes:
    return b'{"a": ' * (levels // 2) + b"[" * (levels - levels // 2) + b"]" * (levels - levels // 2) + \
        b"}" * (levels // 2)


# What an attacker puts in a message (issue 37, finding 8): nesting to 12,000 levels (RUNTIME_MAX_JSON_DEPTH is 64;
# json.loads here raised RecursionError, a 500), lone surrogates escaped in JSON beside a proper pair, and bytes
# that are not UTF-8 — in the arguments of a call that would steer or start a task.
hostile_values = st.one_of(
    st.one_of(st.integers(1, 80), st.integers(80, 12_000)).map(_nested),
    st.sampled_from([b'"\\ud800"', b'"x \\udfff"', b'{"\\udc00": 1}', b'"\\ud83d\\ude00"']),
    st.sampled_from([b'"\xed\xa0\x80"', b'"\xff"', b'"a \xc3"', b'{"\xfe": 1}']),
)
hostile_bodies = st.builds(
    lambda method, tool, value: b'{"jsonrpc": "2.0", "id": 3, "method": ' + json.dumps(method).encode()
    + b', "params": {"name": ' + json.dumps(tool).encode() + b', "arguments": {"taskId": "' + TASK_ID.encode()
    + b'", "action": "adjust_goal", "expectedVersion": 0, "steps": 1, "goal": ' + value + b'}, "_meta": '
    + json.dumps(GOOD_META).encode() + b"}}",
    st.sampled_from(["tools/call", "tasks/update", "no/such/method"]), st.sampled_from(["steer_task", "demo_steps"]),
    hostile_values)
# Malformed JSON-RPC: a good message cut anywhere (unterminated strings, objects, escapes).
cut_bodies = handler_envelopes.map(lambda e: json.dumps(e).encode()).flatmap(
    lambda body: st.integers(0, len(body) - 1).map(lambda cut: body[:cut]))
bodies = handler_envelopes.map(lambda e: json.dumps(e).encode()) | envelopes.map(lambda e: json.dumps(e).encode()) \
    | st.lists(envelopes, max_size=3).map(
    lambda b: json.dumps(b).encode()) | st.binary(max_size=64) | json_values.map(lambda v: json.dumps(v).encode()) \
    | hostile_bodies | cut_bodies
header_sets = st.fixed_dictionaries({}, optional={
    "MCP-Protocol-Version": st.sampled_from(["2026-07-28", "2025-11-25", "2099-01-01", ""]),
    "Mcp-Method": st.sampled_from(METHODS), "Mcp-Name": st.sampled_from([TASK_ID, "demo_steps", "x", " x "]),
    "Accept": st.sampled_from(["application/json", "text/event-stream", "application/json, text/event-stream", "*/*"]),
    "Content-Type": st.sampled_from(["application/json", "text/plain"]),
})


GOOD_HEADERS = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
                "MCP-Protocol-Version": "2026-07-28"}


def post(url: str, body: bytes, headers: dict, token: str) -> tuple[int, bytes, str]:
    """POST with the generated headers over good defaults (so most requests get past the transport checks)."""
    merged = {**GOOD_HEADERS, **headers}
    if "Mcp-Method" not in headers:
        try:
            merged["Mcp-Method"] = json.loads(body)["method"]
        except (ValueError, KeyError, TypeError, RecursionError):  # (a hostile body: no header from it)
            pass
    request = urllib.request.Request(url, data=body, method="POST",
                                     headers={"Authorization": f"Bearer {token}", **merged})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read(), response.headers.get("Content-Type", "")
    except urllib.error.HTTPError as error:
        return error.code, error.read(), error.headers.get("Content-Type", "")


def test_it_answers_any_generated_json_rpc_request_with_a_spec_status_and_never_a_500(web, tenant_token):  # noqa: F811
    _tenant, token = tenant_token("acme", scopes=("tasks:read", "tasks:write"))  # no steer: some get 403
    server = web(MCP_SYNC_WAIT_SECONDS=1)  # (no worker: a foreground call ends at the bound, with an error)
    url = server.url("/mcp")
    seen = set()

    @settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
    @given(body=bodies, headers=header_sets)
    def check(body, headers):
        status, raw, content_type = post(url, body, headers, token)
        seen.add(status)
        assert status in ALLOWED, (status, body, headers, raw[:300])
        # An exception that escaped a handler is answered "Internal server error" (-32603): a bug, even with a 200.
        assert b'"Internal server error"' not in raw, (body, headers, raw[:300])
        if raw and status != 202:
            if content_type.startswith("text/event-stream"):
                assert b"data:" in raw
            else:
                try:
                    json.loads(raw)
                except ValueError:
                    raise AssertionError(f"not JSON: {status} {content_type} {raw[:200]!r} for {body!r} {headers}")

    check()
    assert {200, 400} <= seen
    status, _, body = rpc(url, "tools/list", token=token)
    assert status == 200 and body["result"]["tools"]
