"""The policy gateway's decision (agents_app.policy), its configuration, outbound host checks (agents_app.hosts),
per-server limits on real Redis (agents_app.limits) and a task's toolPolicy at create (docs/tool-policy.md)."""

from __future__ import annotations

import os
import select
import signal
import socket
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest
import redis
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured, ValidationError

from agents_app.gateway.errors import ToolDenied
from agents_app.hosts import host_check, host_check_for_tenant
from agents_app.limits import ToolBusy, ToolLimitsUnavailable, limit_keys, server_slot, slot_acquire
from agents_app.models import TenantToolPolicy, ToolServer
from agents_app.policy import Verdict, tool_decision
from agents_app.selectors import tenant_tool_policy_get
from config.base.problems import Problem
from config.base.runtime import ToolsPolicy, load_runtime_config
from tasks_app.models import Task, Tenant
from tasks_app.services import task_create
from tests.helpers import create_task
from tests.support.concurrency import at_once

ROOT = Path(__file__).resolve().parent.parent
DEPLOYMENT = ToolsPolicy()  # the shipped defaults: deny shell.root, filesystem.delete_recursive; allow all else


# ---------------------------------------------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------------------------------------------
def test_it_ships_the_design_s_tool_policy_defaults():
    tools = load_runtime_config().tools

    assert tools.deny == ("shell.root", "filesystem.delete_recursive") and tools.allow is None
    assert tools.allowed_hosts == ("127.0.0.1", "::1", "localhost") and tools.require_approval == ()
    assert tools.max_calls_per_task == 1000 and tools.rate_per_minute == 600


def test_it_lets_the_environment_override_every_tool_key(monkeypatch):
    monkeypatch.setenv("RUNTIME_TOOLS__DENY", '["a.*"]')
    monkeypatch.setenv("RUNTIME_TOOLS__ALLOW", '["github.*", "docs.read"]')
    monkeypatch.setenv("RUNTIME_TOOLS__REQUIRE_APPROVAL", '["github.create_*"]')
    monkeypatch.setenv("RUNTIME_TOOLS__ALLOWED_HOSTS", '["mcp.example.com", "10.0.0.0/8", "::1"]')
    monkeypatch.setenv("RUNTIME_TOOLS__MAX_CALLS_PER_TASK", "7")
    monkeypatch.setenv("RUNTIME_TOOLS__RATE_PER_MINUTE", "30")

    tools = load_runtime_config().tools

    assert tools.deny == ("a.*",) and tools.allow == ("github.*", "docs.read")
    assert tools.require_approval == ("github.create_*",)
    assert tools.allowed_hosts == ("mcp.example.com", "10.0.0.0/8", "::1")
    assert (tools.max_calls_per_task, tools.rate_per_minute) == (7, 30)
    decision = tool_decision(server="a", tool="b", config_policy=tools, tenant_policy=None, task_policy=None,
                             calls_made=0)
    assert decision.verdict == Verdict.DENY and decision.rule == "tools.deny 'a.*' (deployment)"


def test_it_lets_the_environment_remove_the_allow_list(monkeypatch, tmp_path):
    path = tmp_path / "runtime.yaml"
    path.write_text("tools:\n  allow: [github.*]\n")
    monkeypatch.setenv("RUNTIME_TOOLS__ALLOW", "null")

    assert load_runtime_config(path).tools.allow is None


@pytest.mark.parametrize("text, key, says", [
    ("tools:\n  deny: [shell root]\n", "tools.deny", "'shell root' is not a glob on server.tool"),
    ("tools:\n  allow: github.*\n", "tools.allow", "must be a list of tool patterns"),
    ("tools:\n  require_approval: [1]\n", "tools.require_approval", "1 is not a glob"),
    ("tools:\n  allowed_hosts: [10.0.0.1/8]\n", "tools.allowed_hosts", "has host bits set"),
    ("tools:\n  allowed_hosts: ['bad host!']\n", "tools.allowed_hosts", "is not a host name"),
    ("tools:\n  max_calls_per_task: 0\n", "tools.max_calls_per_task", "an integer ≥ 1"),
    ("tools:\n  rate_per_minute: 20000\n", "tools.rate_per_minute", "from 1 to 10000"),
    ("tools:\n  slot_seconds: 0\n", "tools.slot_seconds", "seconds ≥ 1"),
    ("tools:\n  denny: []\n", "tools.denny", "unknown key"),
])
def test_it_refuses_an_invalid_tool_policy_naming_the_key(tmp_path, text, key, says):
    path = tmp_path / "runtime.yaml"
    path.write_text(text)

    with pytest.raises(ImproperlyConfigured, match=f"`{key}`") as refused:
        load_runtime_config(path)
    assert says in str(refused.value)


def test_it_refuses_an_invalid_tool_policy_from_the_environment(monkeypatch):
    monkeypatch.setenv("RUNTIME_TOOLS__DENY", "shell.root")  # a string, not a JSON list

    with pytest.raises(ImproperlyConfigured, match="`tools.deny`: must be a list of tool patterns"):
        load_runtime_config()


# ---------------------------------------------------------------------------------------------------------------
# The decision
# ---------------------------------------------------------------------------------------------------------------
def tenant_policy(**fields) -> TenantToolPolicy:
    """A tenant's policy as admin keeps it (not saved: the decision reads no row)."""
    return TenantToolPolicy(tenant=Tenant(slug="acme"), **{"deny": [], "require_approval": [], **fields})


def decide(tool, *, deployment=DEPLOYMENT, tenant=None, task=None, calls_made=0, **extra):
    server, _, name = tool.partition(".")
    return tool_decision(server=server, tool=name, config_policy=deployment, tenant_policy=tenant,
                         task_policy=task, calls_made=calls_made, **extra)


@pytest.mark.parametrize("tool, layers, verdict, rule", [
    # The deployment's defaults (the design's deny list).
    ("shell.root", {}, "deny", "tools.deny 'shell.root' (deployment)"),
    ("filesystem.delete_recursive", {}, "deny", "tools.deny 'filesystem.delete_recursive' (deployment)"),
    ("github.create_issue", {}, "allow", "no rule denies it or asks for approval"),
    # Each layer's deny and allow list.
    ("docs.read", {"deployment": ToolsPolicy(allow=("github.*",))}, "deny",
     "tools.allow (deployment) (no pattern matches)"),
    ("github.delete_repo", {"tenant": {"deny": ["github.delete_*"]}}, "deny", "tenant acme deny 'github.delete_*'"),
    ("github.create_issue", {"tenant": {"allow": ["github.get_*"]}}, "deny",
     "tenant acme allow list (no pattern matches)"),
    ("github.get_issue", {"task": {"deny": ["github.*"]}}, "deny", "task toolPolicy.deny 'github.*'"),
    ("github.get_issue", {"task": {"allow": ["docs.*"]}}, "deny", "task toolPolicy.allow (no pattern matches)"),
    ("github.get_issue", {"tenant": {"allow": ["github.*"]}, "task": {"allow": ["github.get_*"]}}, "allow",
     "no rule denies it or asks for approval"),
    # A task cannot widen its tenant's policy, nor a tenant the deployment's.
    ("github.delete_repo", {"tenant": {"deny": ["github.delete_*"]}, "task": {"allow": ["github.*"]}}, "deny",
     "tenant acme deny 'github.delete_*'"),
    ("github.get_issue", {"tenant": {"allow": ["docs.*"]}, "task": {"allow": ["github.*", "docs.*"]}}, "deny",
     "tenant acme allow list (no pattern matches)"),
    ("shell.root", {"tenant": {"allow": ["shell.*"]}, "task": {"allow": ["shell.root"]}}, "deny",
     "tools.deny 'shell.root' (deployment)"),
    ("email.send", {"tenant": {"require_approval": ["email.*"]}, "task": {"requireApproval": []}}, "approval",
     "tenant acme require_approval 'email.*'"),
    # Approval from any layer; a deny anywhere beats it.
    ("payment.create", {"deployment": ToolsPolicy(require_approval=("payment.create",))}, "approval",
     "tools.require_approval 'payment.create' (deployment)"),
    ("github.create_pr", {"task": {"requireApproval": ["github.create_*"]}}, "approval",
     "task toolPolicy.requireApproval 'github.create_*'"),
    ("github.delete_repo", {"deployment": ToolsPolicy(require_approval=("github.*",)),
                            "task": {"deny": ["github.delete_*"]}}, "deny", "task toolPolicy.deny 'github.delete_*'"),
    # Globs: fnmatch on the whole "server.tool", case-sensitive, '*' across dots, '?' and classes.
    ("github.repos.delete", {"task": {"deny": ["github.*"]}}, "deny", "task toolPolicy.deny 'github.*'"),
    ("github.delete_repo", {"task": {"deny": ["github.Delete*"]}}, "allow", "no rule denies it or asks for approval"),
    ("github.Delete_repo", {"task": {"deny": ["github.Delete*"]}}, "deny", "task toolPolicy.deny 'github.Delete*'"),
    ("db.query_v2", {"task": {"deny": ["db.query_v[0-9]"]}}, "deny", "task toolPolicy.deny 'db.query_v[0-9]'"),
    ("db.query_v", {"task": {"deny": ["db.query_v?"]}}, "allow", "no rule denies it or asks for approval"),
    ("github.get_issue", {"task": {"deny": ["github"]}}, "allow", "no rule denies it or asks for approval"),
])
def test_it_decides_by_the_narrowest_of_the_three_layers(tool, layers, verdict, rule):
    tenant = tenant_policy(**layers["tenant"]) if "tenant" in layers else None

    decision = decide(tool, deployment=layers.get("deployment", DEPLOYMENT), tenant=tenant, task=layers.get("task"))

    assert (decision.verdict, decision.rule, decision.tool) == (verdict, rule, tool)


@pytest.mark.parametrize("layers, calls_made, verdict, rule", [
    ({}, 999, "allow", "no rule denies it or asks for approval"),
    ({}, 1000, "deny", "tools.max_calls_per_task 1000 (deployment) (reached: 1000 calls made)"),
    ({"tenant": {"max_calls_per_task": 50}, "task": {"maxCalls": 5000}}, 50, "deny",
     "tenant acme max_calls_per_task 50 (reached: 50 calls made)"),  # a task's larger limit does not widen
    ({"tenant": {"max_calls_per_task": 50}, "task": {"maxCalls": 3}}, 2, "allow",
     "no rule denies it or asks for approval"),
    ({"tenant": {"max_calls_per_task": 50}, "task": {"maxCalls": 3}}, 3, "deny",
     "task toolPolicy.maxCalls 3 (reached: 3 calls made)"),
])
def test_it_stops_a_task_at_the_smallest_call_limit(layers, calls_made, verdict, rule):
    tenant = tenant_policy(**layers["tenant"]) if "tenant" in layers else None

    decision = decide("github.get_issue", tenant=tenant, task=layers.get("task"), calls_made=calls_made)

    assert (decision.verdict, decision.rule) == (verdict, rule)


def test_it_lets_an_approved_call_through_but_not_one_denied_meanwhile():
    gated = tenant_policy(require_approval=["email.*"])
    gated_then_denied = tenant_policy(require_approval=["email.*"], deny=["email.send"])

    approved = decide("email.send", tenant=gated, approved=True)
    denied = decide("email.send", tenant=gated_then_denied, approved=True)

    assert approved.verdict == Verdict.ALLOW and approved.rule == "approved (tenant acme require_approval 'email.*')"
    assert denied.verdict == Verdict.DENY and denied.rule == "tenant acme deny 'email.send'"


def test_it_denies_a_tool_its_server_does_not_enable():
    decision = decide("crm.upsert", enabled_tools=["lookup"])

    assert decision.verdict == Verdict.DENY
    assert decision.rule == "tool server crm enabled_tools (it is not one of them)"
    assert decide("crm.lookup", enabled_tools=["lookup"]).allowed


def test_it_types_a_denial_naming_the_rule():
    decision = decide("shell.root")

    error = ToolDenied(decision.error()["message"])  # what the gateway raises for it (agents_app.gateway.call.decide)

    assert error.reason == "tool_denied" and error.retryable is False and decision.error() == {
        "type": "tool_denied", "tool": "shell.root", "rule": "tools.deny 'shell.root' (deployment)",
        "message": "The tool shell.root was not called: denied by tools.deny 'shell.root' (deployment)."}


def test_it_applies_a_tenant_policy_changed_mid_task_to_the_next_call(api, tenant):
    created = create_task(api, {"workflow": "demo_steps", "input": {"steps": 1},
                                "toolPolicy": {"allow": ["github.*", "shell.*"]}})
    task = Task.objects.get(id=created.json()["taskId"])

    def next_call(tool: str):  # what the gateway does before each call: the tenant's policy read afresh
        server, _, name = tool.partition(".")
        return tool_decision(server=server, tool=name, config_policy=settings.RUNTIME.tools,
                             tenant_policy=tenant_tool_policy_get(tenant_id=task.tenant_id),
                             task_policy=task.tool_policy, calls_made=0)

    before = next_call("github.delete_repo")
    TenantToolPolicy.objects.create(tenant=tenant, deny=["github.delete_*"])  # an operator's edit in admin
    after = next_call("github.delete_repo")

    assert before.verdict == Verdict.ALLOW
    assert after.verdict == Verdict.DENY and after.rule == "tenant acme deny 'github.delete_*'"
    assert next_call("github.get_issue").verdict == Verdict.ALLOW
    assert next_call("shell.root").rule == "tools.deny 'shell.root' (deployment)"  # the task's allow cannot widen
    assert next_call("docs.read").rule == "task toolPolicy.allow (no pattern matches)"


def test_it_refuses_a_tenant_policy_with_a_bad_pattern_or_host_in_admin(tenant):
    policy = TenantToolPolicy(tenant=tenant, deny=["github delete"], allowed_hosts=["10.0.0.1/8"])

    with pytest.raises(ValidationError) as refused:
        policy.full_clean()

    assert set(refused.value.message_dict) == {"deny", "allowed_hosts"}
    assert "is not a glob on server.tool" in refused.value.message_dict["deny"][0]


# ---------------------------------------------------------------------------------------------------------------
# A task's toolPolicy at create
# ---------------------------------------------------------------------------------------------------------------
def test_it_keeps_a_task_s_tool_policy_and_shows_it(api):
    policy = {"deny": ["github.delete_*"], "allow": ["github.*"], "requireApproval": ["github.create_*"],
              "maxCalls": 20}

    response = create_task(api, {"workflow": "demo_steps", "input": {"steps": 1}, "toolPolicy": policy})

    assert response.status_code == 201 and response.json()["toolPolicy"] == policy
    assert Task.objects.get(id=response.json()["taskId"]).tool_policy == policy


def test_it_refuses_a_bad_tool_policy_naming_each_field(api):
    response = create_task(api, {"workflow": "demo_steps", "input": {"steps": 1}, "toolPolicy": {
        "deny": "github.*", "allow": ["github.*", "github delete", 7], "maxCalls": 0, "widen": True}})

    assert response.status_code == 400 and response["Content-Type"] == "application/problem+json"
    errors = {error["field"]: error["message"] for error in response.json()["errors"]}
    assert set(errors) == {"toolPolicy.deny", "toolPolicy.allow.1", "toolPolicy.allow.2", "toolPolicy.maxCalls",
                           "toolPolicy.widen"}
    assert errors["toolPolicy.allow.1"].startswith("Must be a glob on server.tool")
    assert errors["toolPolicy.widen"] == "Unknown key; known keys: deny, allow, requireApproval, maxCalls."
    assert not Task.objects.exists()


@pytest.mark.parametrize("policy, field", [
    (["github.*"], "toolPolicy"),
    ({"allow": ["github.*"] * 101}, "toolPolicy.allow"),
    ({"maxCalls": True}, "toolPolicy.maxCalls"),
    ({"requireApproval": ["x" * 201]}, "toolPolicy.requireApproval.0"),
])
def test_it_refuses_a_tool_policy_of_the_wrong_shape(api, policy, field):
    response = create_task(api, {"workflow": "demo_steps", "input": {"steps": 1}, "toolPolicy": policy})

    assert response.status_code == 400
    assert [error["field"] for error in response.json()["errors"]] == [field]


def test_it_refuses_a_bad_tool_policy_in_the_service_too(tenant, api):
    with pytest.raises(Problem) as refused:
        task_create(tenant=tenant, owner=api.user, workflow="demo_steps", input={"steps": 1},
                    tool_policy={"deny": [None]})

    assert refused.value.errors[0]["field"] == "toolPolicy.deny.0" and not Task.objects.exists()


def test_it_counts_the_tool_policy_in_the_idempotency_fingerprint(api):
    body = {"workflow": "demo_steps", "input": {"steps": 1}, "toolPolicy": {"deny": ["github.*"]}}
    first = create_task(api, body, key="same-key")

    again = create_task(api, body, key="same-key")
    other = create_task(api, {**body, "toolPolicy": {"deny": ["docs.*"]}}, key="same-key")

    assert (first.status_code, again.status_code, other.status_code) == (201, 200, 409)


# ---------------------------------------------------------------------------------------------------------------
# Outbound hosts
# ---------------------------------------------------------------------------------------------------------------
LOOPBACK_DEFAULT = DEPLOYMENT.allowed_hosts


def test_it_allows_localhost_and_returns_the_addresses_it_checked():
    verdict = host_check("http://localhost:8765/mcp", LOOPBACK_DEFAULT)

    assert verdict.allowed, verdict.reason
    assert "127.0.0.1" in verdict.addresses and (verdict.host, verdict.port) == ("localhost", 8765)
    assert verdict.connect_url().endswith(":8765/mcp") and verdict.host_header == "localhost:8765"


def test_it_allows_a_listed_loopback_address_and_says_by_which_entry():
    verdict = host_check("http://127.0.0.1:8765/mcp", LOOPBACK_DEFAULT)

    assert verdict.allowed and verdict.addresses == ("127.0.0.1",)
    assert verdict.reason == "127.0.0.1: 127.0.0.1 is listed in tools.allowed_hosts (deployment) (127.0.0.1)"
    assert verdict.connect_url() == "http://127.0.0.1:8765/mcp"


def test_it_refuses_a_private_address_unless_listed_by_address_or_network():
    refused = host_check("http://10.1.2.3:8080/mcp", LOOPBACK_DEFAULT)
    listed = host_check("http://10.1.2.3:8080/mcp", [*LOOPBACK_DEFAULT, "10.0.0.0/8"])

    assert not refused.allowed and refused.reason == (
        "10.1.2.3: 10.1.2.3 is a private address, refused unless tools.allowed_hosts (deployment) lists it by "
        "address or network")
    assert listed.allowed and listed.reason == "10.1.2.3: 10.1.2.3 is listed in tools.allowed_hosts (deployment) " \
                                               "(10.0.0.0/8)"


@pytest.mark.parametrize("url, kind", [
    ("http://169.254.169.254/latest/meta-data", "link-local"),  # the cloud metadata service
    ("http://[::ffff:10.0.0.1]/mcp", "private"),  # an IPv4-mapped IPv6 address is its IPv4 address
    ("http://0.0.0.0:8765/mcp", "unspecified"),
    ("http://[fe80::1]/mcp", "link-local"),
    ("http://240.0.0.1/mcp", "reserved"),
    ("http://100.64.0.1/mcp", "non-global"),  # carrier-grade NAT
])
def test_it_refuses_special_ranges(url, kind):
    verdict = host_check(url, LOOPBACK_DEFAULT)

    assert not verdict.allowed and f"is a {kind} address" in verdict.reason


def test_it_allows_a_public_address_only_if_listed():
    assert not host_check("https://93.184.215.14/mcp", LOOPBACK_DEFAULT).allowed
    verdict = host_check("https://93.184.215.14/mcp", ["93.184.215.0/24"])
    assert verdict.allowed and verdict.extensions == {"sni_hostname": "93.184.215.14"}


def test_it_refuses_a_name_that_resolves_to_loopback_unless_the_address_is_listed():
    name = socket.gethostname().lower()  # /etc/hosts maps the machine's name to a loopback address
    addresses = {info[4][0] for info in socket.getaddrinfo(name, 80, type=socket.SOCK_STREAM)}
    if not any(address.startswith("127.") or address == "::1" for address in addresses):
        pytest.skip(f"{name} does not resolve to loopback here ({addresses})")

    by_name_only = host_check(f"http://{name.upper()}:8765/mcp", [name])  # names match case-insensitively
    by_address = host_check(f"http://{name}:8765/mcp", [name, "127.0.0.0/8", "::1"])

    assert not by_name_only.allowed
    assert f"is a loopback address, refused unless tools.allowed_hosts (deployment) lists it by address or network " \
           f"(the name {name} is listed, which does not make a loopback address reachable)" in by_name_only.reason
    assert by_address.allowed and set(by_address.addresses) == addresses


def test_it_lets_the_name_localhost_stand_for_loopback():
    verdict = host_check("http://LOCALHOST:8765/mcp", ["localhost"])

    assert verdict.allowed and "localhost is a loopback name listed in tools.allowed_hosts" in verdict.reason


def test_it_refuses_a_name_if_any_of_its_addresses_is_refused():
    def resolver(host, port, type):  # a public name whose DNS also answers a private address (rebinding)
        return [(socket.AF_INET, type, 6, "", ("93.184.215.14", port)), (socket.AF_INET, type, 6, "", ("10.0.0.7",
                                                                                                      port))]

    verdict = host_check("https://mcp.example.com/mcp", ["*.example.com"], resolve=resolver)

    assert not verdict.allowed and verdict.addresses == ("93.184.215.14", "10.0.0.7")
    assert verdict.reason.startswith("mcp.example.com (10.0.0.7): 10.0.0.7 is a private address")
    with pytest.raises(ValueError):
        verdict.connect_url()


def test_it_refuses_what_is_not_an_http_url_with_a_host():
    assert "is not an http:// or https:// URL" in host_check("ftp://localhost/x", LOOPBACK_DEFAULT).reason
    assert "may not hold credentials" in host_check("http://u:p@localhost/x", LOOPBACK_DEFAULT).reason
    assert "cannot be resolved" in host_check("http://no-such-host.invalid/x", ["no-such-host.invalid"]).reason


def test_it_narrows_the_deployment_s_hosts_by_the_tenant_s(tenant):
    policy = TenantToolPolicy.objects.create(tenant=tenant, allowed_hosts=["10.1.0.0/16"])
    deployment = ToolsPolicy(allowed_hosts=("10.0.0.0/8",))
    policy = tenant_tool_policy_get(tenant_id=tenant.id)

    inside = host_check_for_tenant("http://10.1.0.5/mcp", config_policy=deployment, tenant_policy=policy)
    outside = host_check_for_tenant("http://10.2.0.5/mcp", config_policy=deployment, tenant_policy=policy)
    wider = host_check_for_tenant("http://192.168.0.5/mcp", config_policy=deployment,
                                  tenant_policy=TenantToolPolicy(tenant=tenant, allowed_hosts=["192.168.0.0/16"]))

    assert inside.allowed and not outside.allowed and "tenant acme allowed_hosts" in outside.reason
    assert not wider.allowed and "tools.allowed_hosts (deployment)" in wider.reason  # a tenant cannot widen


def test_it_opens_no_connection_to_a_host_outside_the_list():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]

        verdict = host_check(f"http://127.0.0.1:{port}/mcp", ["10.0.0.0/8"])

        readable, _, _ = select.select([listener], [], [], 0.2)
    assert not verdict.allowed and readable == []  # nobody knocked


# ---------------------------------------------------------------------------------------------------------------
# Per-server limits, on real Redis
# ---------------------------------------------------------------------------------------------------------------
@pytest.fixture
def tool_server():
    """make(max_concurrent_calls=…, rate_per_minute=…) → a ToolServer (not saved: the limits need its id, name and
    numbers) whose Redis keys are fresh."""
    client = redis.Redis.from_url(settings.REDIS_URL)
    made = []

    def make(**fields):
        server = ToolServer(id=uuid.uuid4().int % 2**62, name="crm", **fields)
        client.delete(*limit_keys(server))
        made.append(server)
        return server

    yield make
    for server in made:
        client.delete(*limit_keys(server))
    client.close()


def test_it_gives_a_full_server_s_slots_to_exactly_its_cap_of_racing_threads(tool_server):
    server = tool_server(max_concurrent_calls=3)

    outcomes = at_once(*[lambda: slot_acquire(server)] * 10)

    held = [outcome for outcome in outcomes if not isinstance(outcome, Exception)]
    busy = [outcome for outcome in outcomes if isinstance(outcome, ToolBusy)]
    try:
        assert (len(held), len(busy)) == (3, 7)
        assert {error.limit for error in busy} == {"concurrency"} and all(0 < e.retry_after <= 1 for e in busy)
        assert "running 3 calls already" in str(busy[0])
    finally:
        for slot in held:
            slot.release()
    with server_slot(server):  # released: free again
        pass


def test_it_counts_the_rate_across_threads_and_says_when_to_retry(tool_server):
    server = tool_server(max_concurrent_calls=100, rate_per_minute=4)

    def call():
        with server_slot(server):
            return "called"

    outcomes = at_once(*[call] * 9)

    assert outcomes.count("called") == 4
    refused = [outcome for outcome in outcomes if isinstance(outcome, ToolBusy)]
    assert len(refused) == 5 and {error.limit for error in refused} == {"rate"}
    assert all(55 < error.retry_after <= 60 for error in refused)


def test_it_takes_the_deployment_s_rate_when_the_server_has_none(tool_server):
    server = tool_server(max_concurrent_calls=10)
    policy = ToolsPolicy(rate_per_minute=2)

    for _ in range(2):
        with server_slot(server, config_policy=policy):
            pass

    with pytest.raises(ToolBusy, match="called 2 times in the last minute"):
        slot_acquire(server, config_policy=policy)


HOLDER = textwrap.dedent("""
    import sys, django
    django.setup()
    from agents_app.limits import ToolBusy, slot_acquire
    from agents_app.models import ToolServer
    server = ToolServer(id=int(sys.argv[1]), name="crm", max_concurrent_calls=int(sys.argv[2]))
    try:
        slot = slot_acquire(server)
        print("held", flush=True)
    except ToolBusy as busy:
        print(busy.limit, flush=True)
    sys.stdin.read()  # hold the slot until the test closes our stdin (or kills us)
""")


def holder(server, *, env=None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", HOLDER, str(server.id), str(server.max_concurrent_calls)],
                            cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "REDIS_URL": settings.REDIS_URL, **(env or {})})


def test_it_caps_a_server_across_processes(tool_server):
    server = tool_server(max_concurrent_calls=2)
    processes = [holder(server) for _ in range(4)]
    try:
        said = sorted(process.stdout.readline().strip() for process in processes)
    finally:
        for process in processes:
            process.stdin.close()
            process.wait(timeout=10)

    assert said == ["concurrency", "concurrency", "held", "held"]


def test_it_frees_a_crashed_worker_s_slot_within_slot_seconds(tool_server):
    server = tool_server(max_concurrent_calls=2)
    policy = ToolsPolicy(slot_seconds=1)
    crashed = holder(server, env={"RUNTIME_TOOLS__SLOT_SECONDS": "1"})
    assert crashed.stdout.readline().strip() == "held"
    with server_slot(server, config_policy=policy):  # a live call, renewing its slot (and so the key) meanwhile
        os.kill(crashed.pid, signal.SIGKILL)
        crashed.wait(timeout=10)
        killed_at = time.monotonic()

        with pytest.raises(ToolBusy):
            slot_acquire(server, config_policy=policy)  # the dead worker's slot is still counted: nobody released it
        while True:
            try:
                slot = slot_acquire(server, config_policy=policy)
                break
            except ToolBusy:
                assert time.monotonic() - killed_at < 3, "the dead worker's slot did not expire"
                time.sleep(0.05)
        slot.release()


def test_it_keeps_a_long_call_s_slot_by_renewing_it(tool_server):
    server = tool_server(max_concurrent_calls=1)
    policy = ToolsPolicy(slot_seconds=1)

    with server_slot(server, config_policy=policy) as slot:
        time.sleep(1.6)  # longer than slot_seconds: only renewals keep it
        with pytest.raises(ToolBusy):
            slot_acquire(server, config_policy=policy)
        assert not slot.lost
    with server_slot(server, config_policy=policy):
        pass


def test_it_refuses_a_call_when_redis_cannot_count(tool_server, settings):
    server = tool_server(max_concurrent_calls=1)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        settings.REDIS_URL = f"redis://127.0.0.1:{sock.getsockname()[1]}/0"  # nobody listens there

        with pytest.raises(ToolLimitsUnavailable) as refused:
            slot_acquire(server)

    assert refused.value.limit == "unavailable" and refused.value.retry_after > 0
