"""Quotas and rate limits (docs/quotas.md): a tenant's running cap does not hold up another tenant, measured with
real workers; a stored-task cap refuses creation with problem details; a token over its rate gets 429 with
Retry-After and nothing is written — through the REST API and the MCP endpoint of a real web process."""

import concurrent.futures
import json
import logging
import socket
import time
import urllib.error
import urllib.request

import pytest
from django.contrib.auth import get_user_model

from config.base.rate_limits import rate_parse
from steering_app.models import SteeringCommand
from tasks_app.db.dispatch import hints_for_waiting
from tasks_app.engine.lease import lease_claim
from tasks_app.models import Task, TenantMembership
from tasks_app.services import api_token_create, tenant_get_or_create
from tests.engine_support import new_task
from tests.support.tasks import first_working_at, leased_count
from tests.web_support import call

RATE_HEADER = "retry-after"


# -- the running cap -------------------------------------------------------------------------------------------------
@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("external_root")
def test_it_does_not_delay_another_tenant_behind_a_tenant_at_its_running_cap(tenant, other_tenant, workers):
    """Tenant A (cap 1) queues 30 tasks, then tenant B queues 3. Without the cap B's tasks wait for A's backlog to
    run through the broker's queue (30 tasks on 2 worker children: 3.5 s measured); with it, A's tasks created once
    one of them waits send no hint (they join the waiting ones), the few hints ahead of B's cost a refused claim each,
    and B's start at once (0.03–0.08 s measured), while A still has most of its tasks queued and never runs more than
    one at a time. A's tasks all finish with no reaper running: every slot A frees is handed on, no task is lost."""
    tenant.max_running_tasks = 1
    tenant.save(update_fields=["max_running_tasks"])
    # Connections kept across tasks, as in production (DB_CONN_MAX_AGE 60): the test workers' default of 0 makes each
    # refused claim open a connection of its own (≈ 50 ms here), a cost the cap's refusals do not have.
    workers("quota", concurrency=2, env={"DB_CONN_MAX_AGE": "60"})
    a_tasks = [new_task(tenant, steps=2, sleep_ms=100, effect=False) for _ in range(30)]
    b_tasks = [new_task(other_tenant, steps=1, effect=False) for _ in range(3)]

    most_leased, a_queued_when_b_done = 0, None
    deadline = time.monotonic() + 40
    while time.monotonic() < deadline:
        most_leased = max(most_leased, leased_count(tenant))
        statuses = dict(Task.objects.filter(id__in=[t.id for t in a_tasks + b_tasks]).values_list("id", "status"))
        if a_queued_when_b_done is None and all(statuses[t.id] == "completed" for t in b_tasks):
            a_queued_when_b_done = sum(statuses[t.id] == "queued" for t in a_tasks)
        if all(status == "completed" for status in statuses.values()):
            break
        time.sleep(0.01)

    done = Task.objects.filter(id__in=[t.id for t in a_tasks], status="completed").count()
    assert done == 30, f"only {done} of tenant A's 30 tasks completed: a consumed hint was lost"
    waits = [(first_working_at(t.id) - t.created_at).total_seconds() for t in b_tasks]
    assert max(waits) < 1.0, f"tenant B's tasks waited {waits} s to start behind tenant A's backlog"
    assert a_queued_when_b_done is not None and a_queued_when_b_done >= 20, a_queued_when_b_done
    assert most_leased == 1, f"tenant A ran {most_leased} tasks at once (cap 1)"


@pytest.mark.django_db
def test_it_refuses_a_claim_beyond_the_tenants_cap_and_hands_free_slots_to_other_tenants_first(tenant,
                                                                                                  other_tenant):
    tenant.max_running_tasks = 1
    tenant.save(update_fields=["max_running_tasks"])
    first, second, third = (new_task(tenant, steps=1) for _ in range(3))
    others = new_task(other_tenant, steps=1)

    assert lease_claim(task_id=first.id, owner="w1") is not None
    assert lease_claim(task_id=second.id, owner="w2") is None  # A is at its cap: refused, the hint consumed
    assert Task.objects.get(id=second.id).hint_at is None and Task.objects.get(id=second.id).lease_owner is None
    Task.objects.filter(id__in=[third.id, others.id]).update(hint_at=None)  # both wait for a slot too
    # A's next task joins its waiting ones instead of sending a hint that could only meet the cap; B's sends one.
    fourth, others_next = new_task(tenant, steps=1), new_task(other_tenant, steps=1)
    assert fourth.hint_at is None and Task.objects.get(id=fourth.id).hint_at is None
    assert Task.objects.get(id=others_next.id).hint_at is not None

    assert hints_for_waiting(limit=5) == 1  # only B's: A has no room until its running task lets go
    assert Task.objects.get(id=others.id).hint_at is not None
    assert Task.objects.filter(id__in=[second.id, third.id, fourth.id], hint_at__isnull=True).count() == 3

    Task.objects.filter(id=first.id).update(lease_owner=None, lease_expires_at=None, status="completed")
    assert hints_for_waiting(limit=5) == 1  # A's room is one task: its most urgent, oldest waiting one
    assert Task.objects.get(id=second.id).hint_at is not None and Task.objects.get(id=third.id).hint_at is None
    claim = lease_claim(task_id=second.id, owner="w2")
    assert claim is not None and claim.tenant_max_running == 1


@pytest.mark.django_db
def test_it_hands_a_slot_on_when_a_new_task_joins_a_tenant_that_waits_with_nothing_running(tenant,
                                                                                          django_capture_on_commit_callbacks):
    """The tenant's tasks wait and none runs (its last one let go while the create was in flight): the new task
    joins the waiting ones, and after its commit the tenant's room goes to the most urgent, oldest of them."""
    tenant.max_running_tasks = 1
    tenant.save(update_fields=["max_running_tasks"])
    waiting = new_task(tenant, steps=1)
    Task.objects.filter(id=waiting.id).update(hint_at=None)  # its claim was refused while another ran

    with django_capture_on_commit_callbacks(execute=True):
        joined = new_task(tenant, steps=1)

    assert Task.objects.get(id=joined.id).hint_at is None  # no hint of its own
    assert Task.objects.get(id=waiting.id).hint_at is not None  # the free slot, handed on


# -- the stored cap --------------------------------------------------------------------------------------------------
@pytest.mark.django_db
def test_it_refuses_a_create_beyond_the_tenants_stored_tasks_with_a_problem(api, tenant):
    tenant.max_stored_tasks = 2
    tenant.save(update_fields=["max_stored_tasks"])
    body = {"workflow": "demo_steps", "input": {"steps": 1}}
    first = api.post("/runtime/tasks", body, format="json", HTTP_IDEMPOTENCY_KEY="k-1")
    assert first.status_code == 201
    assert api.post("/runtime/tasks", body, format="json").status_code == 201

    refused = api.post("/runtime/tasks", body, format="json")

    assert refused.status_code == 409 and refused["Content-Type"] == "application/problem+json"
    problem = refused.json()
    assert problem["type"] == "/runtime/problems/task-limit-reached" and problem["limit"] == 2
    assert "max_stored_tasks" in problem["detail"] and "no task was created" in problem["detail"]
    assert Task.objects.filter(tenant=tenant).count() == 2
    # A retry of a stored create needs no room: the same task again.
    again = api.post("/runtime/tasks", body, format="json", HTTP_IDEMPOTENCY_KEY="k-1")
    assert again.status_code == 200 and again.json()["taskId"] == first.json()["taskId"]
    # A fork is a stored task too.
    fork = api.post(f"/runtime/tasks/{first.json()['taskId']}/fork", {"fromStep": 1}, format="json")
    assert fork.status_code == 409 and fork.json()["type"] == "/runtime/problems/task-limit-reached"
    assert Task.objects.filter(tenant=tenant).count() == 2


# -- rate limits -----------------------------------------------------------------------------------------------------
def _token(tenant, username, scopes=("tasks:read", "tasks:write", "steer")) -> str:
    user, _ = get_user_model().objects.get_or_create(username=username)
    TenantMembership.objects.get_or_create(user=user, tenant=tenant)
    return api_token_create(tenant=tenant, user=user, name=username, scopes=scopes)[1]


def _rpc(url: str, token: str, method: str, params: dict, message_id: int = 1):
    """One raw 2026-07-28 JSON-RPC POST to /mcp: (HTTP status, headers, the JSON body or last SSE frame)."""
    params = {**params, "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                                  "io.modelcontextprotocol/clientCapabilities": {
                                      "extensions": {"io.modelcontextprotocol/tasks": {}}}}}
    request = urllib.request.Request(url, method="POST", data=json.dumps(
        {"jsonrpc": "2.0", "id": message_id, "method": method, "params": params}).encode(), headers={
        "Content-Type": "application/json", "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": "2026-07-28", "Mcp-Method": method, "Authorization": f"Bearer {token}",
        **({"Mcp-Name": params["name"]} if "name" in params else {})})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            status, headers, raw = response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as error:
        status, headers, raw = error.code, dict(error.headers), error.read()
    headers = {k.lower(): v for k, v in headers.items()}
    text = raw.decode()
    if headers.get("content-type", "").startswith("text/event-stream"):
        return status, headers, [json.loads(line[5:]) for line in text.splitlines() if line.startswith("data:")][-1]
    return status, headers, json.loads(text) if text else None


@pytest.mark.django_db(transaction=True)
def test_it_answers_429_with_retry_after_over_a_tokens_rate_and_writes_nothing(web, tenant):
    """40 creates from 8 threads against a limit of 10 a minute: exactly 10 are created (one task each, the rest
    429 with Retry-After and problem details, never a 500), on the REST API and on the MCP endpoint alike; a cancel
    over the steering rate leaves its task untouched."""
    server = web(RATE_LIMIT_CREATE="10/minute", RATE_LIMIT_STEER="2/minute")
    rest_token, mcp_token = _token(tenant, "rest-client"), _token(tenant, "mcp-client")
    body = {"workflow": "demo_steps", "input": {"steps": 1}}

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda _: call(server.url("/runtime/tasks"), rest_token, method="POST", body=body),
                                range(40)))
    statuses = [status for status, _, _ in answers]
    assert sorted(set(statuses)) == [201, 429], statuses
    assert statuses.count(201) == 10
    assert Task.objects.filter(tenant=tenant).count() == 10  # nothing half-written by a refused request
    refused_headers, refused = next((headers, problem) for status, headers, problem in answers if status == 429)
    assert 1 <= int(refused_headers[RATE_HEADER]) <= 60
    assert refused_headers["content-type"] == "application/problem+json"
    assert refused["type"] == "/runtime/problems/throttled" and refused["status"] == 429
    assert refused["limit"] == "10/minute" and refused["retryAfterSeconds"] == int(refused_headers[RATE_HEADER])
    assert "10 times per minute" in refused["detail"]

    # MCP: another token has its own window; tools/call over it is an HTTP 429 with a JSON-RPC error, no task.
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        calls = list(pool.map(lambda n: _rpc(server.url("/mcp"), mcp_token, "tools/call",
                                             {"name": "demo_steps", "arguments": {"steps": 1}}, message_id=n),
                              range(16)))
    assert sorted({status for status, _, _ in calls}) == [200, 429], [status for status, _, _ in calls]
    created = [answer for status, _, answer in calls if status == 200]
    assert len(created) == 10 and all("result" in answer for answer in created), created
    assert Task.objects.filter(tenant=tenant).count() == 20
    status, headers, limited = next(call_ for call_ in calls if call_[0] == 429)
    assert int(headers[RATE_HEADER]) >= 1 and limited["error"]["code"] == -32029
    assert limited["error"]["data"]["limit"] == "10/minute" and limited["id"] is not None

    # Steering: two cancels go through, the third is refused before anything is written; on MCP alike (tasks/cancel
    # and steer_task count against the same steering rate of the token).
    queued = list(Task.objects.filter(tenant=tenant).order_by("created_at")[:6])
    outcomes = [call(server.url(f"/runtime/tasks/{task.id}/cancel"), rest_token, method="POST", body={})[0]
                for task in queued[:3]]
    assert outcomes == [202, 202, 429]
    mcp = [_rpc(server.url("/mcp"), mcp_token, "tasks/cancel", {"taskId": str(queued[3].id)}),
           _rpc(server.url("/mcp"), mcp_token, "tasks/cancel", {"taskId": str(queued[4].id)}),
           _rpc(server.url("/mcp"), mcp_token, "tools/call", {"name": "steer_task", "arguments": {
               "taskId": str(queued[5].id), "action": "pause", "expectedVersion": 1}})]
    assert [status for status, _, _ in mcp] == [200, 200, 429], mcp
    assert mcp[2][2]["error"]["code"] == -32029 and mcp[2][2]["error"]["data"]["limit"] == "2/minute"
    for refused_task in (queued[2], queued[5]):
        assert Task.objects.get(id=refused_task.id).status == "queued"
        assert not SteeringCommand.objects.filter(task_id=refused_task.id).exists()


@pytest.mark.django_db
def test_it_uses_the_tenants_own_rate_and_counts_a_signed_in_user_with_their_tokens(api, tenant, settings):
    tenant.create_rate_limit = "2/minute"
    tenant.save(update_fields=["create_rate_limit"])
    body = {"workflow": "demo_steps", "input": {"steps": 1}}
    assert [api.post("/runtime/tasks", body, format="json").status_code for _ in range(2)] == [201, 201]

    refused = api.post("/runtime/tasks", body, format="json")

    assert refused.status_code == 429 and 1 <= int(refused["Retry-After"]) <= 60
    assert refused.json()["limit"] == "2/minute" and "this token" in refused.json()["detail"]
    # A person signed in counts in the same bucket as their tokens (one per person: config.base.rate_limits).
    from django.contrib.auth.models import Group
    from rest_framework.test import APIClient

    api.user.groups.add(Group.objects.get(name="operator"))  # (signed in, creating takes a role: tasks_app.access)
    person = APIClient()
    person.force_login(api.user)
    assert person.post("/runtime/tasks", body, format="json").status_code == 429
    assert Task.objects.filter(tenant=tenant).count() == 2
    # "off": no limit for the tenant's tokens, whatever the deployment's.
    settings.RATE_LIMITS = {**settings.RATE_LIMITS, "create": rate_parse("1/minute")}
    tenant.create_rate_limit = "off"
    tenant.save(update_fields=["create_rate_limit"])
    assert [api.post("/runtime/tasks", body, format="json").status_code for _ in range(2)] == [201, 201]


@pytest.mark.django_db
def test_it_lets_requests_through_with_a_warning_when_redis_is_away(api, tenant, settings, caplog):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead = sock.getsockname()[1]
    settings.REDIS_URL = f"redis://127.0.0.1:{dead}/0"
    tenant.create_rate_limit = "1/minute"
    tenant.save(update_fields=["create_rate_limit"])
    body = {"workflow": "demo_steps", "input": {"steps": 1}}

    with caplog.at_level(logging.WARNING, logger="config.base.rate_limits"):
        statuses = [api.post("/runtime/tasks", body, format="json").status_code for _ in range(3)]

    assert statuses == [201, 201, 201]  # fail open: never a 500, never a refusal for an uncounted limit
    warnings = [r.getMessage() for r in caplog.records if r.name == "config.base.rate_limits"]
    assert len(warnings) == 1 and "rate limits not checked" in warnings[0]  # once per back-off, not per request


def test_it_parses_rates_and_refuses_nonsense():
    assert rate_parse("60/minute").count == 60 and rate_parse("60/minute").seconds == 60
    assert rate_parse(" 5 / seconds ").text == "5/second" and rate_parse("off") is None
    for bad in ("", "0/minute", "60 per minute", "60/week", "-1/hour"):
        with pytest.raises(ValueError):
            rate_parse(bad)


@pytest.mark.django_db
def test_it_edits_a_tenants_quotas_in_the_admin_and_refuses_a_bad_rate(admin_client):
    tenant = tenant_get_or_create(slug="acme", name="Acme")
    url = f"/admin/tasks_app/tenant/{tenant.id}/change/"
    form = {"slug": "acme", "name": "Acme", "workflows": "null", "max_running_tasks": "3", "max_stored_tasks": "",
            "create_rate_limit": "many", "steer_rate_limit": ""}
    page = admin_client.post(url, form)
    assert page.status_code == 200 and "is not a rate" in page.content.decode()
    admin_client.post(url, {**form, "create_rate_limit": "30/minute"})
    tenant.refresh_from_db()
    assert (tenant.max_running_tasks, tenant.max_stored_tasks, tenant.create_rate_limit) == (3, None, "30/minute")
