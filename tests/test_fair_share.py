"""Fair by default (issue 37, finding 5; docs/quotas.md "The default share"): a tenant without a max_running_tasks of
its own holds at most tenants.default_running_share of the live fleet's workers, and no tool server may keep a worker
longer than tools.max_timeout_seconds — measured with the attacker's move on a real fleet: ten tool calls to a server
that accepts connections and never answers, then another tenant's one-step task."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from agents_app.models import ToolServer
from tasks_app.models import Task
from tests.engine_support import create_engine_task
from tests.support.tasks import first_working_at, leased_count


class SilentServer:
    """A real listener on loopback that accepts every connection and never sends a byte (the attacker's server):
    a request to it waits for the caller's timeout."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.held: list[socket.socket] = []
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/mcp"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.held.append(conn)  # held open, never read, never answered

    def close(self):
        self.sock.close()
        for conn in self.held:
            conn.close()


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("external_root")
def test_it_starts_another_tenants_task_while_a_tenant_without_a_cap_calls_a_server_that_never_answers(
        tenant, other_tenant, workers):
    """Tenant A (no max_running_tasks: the default) starts ten calls to a silent server on a fleet of two worker
    processes; tenant B's one-step task starts within seconds (before: after A's calls gave up — 30 s for the tool
    list, up to the server's timeout for a call — while both workers waited on A's server). A holds one worker (the
    default share, 0.5 of two) and never more."""
    from tasks_app.engine.lease import lease_renewer_shutdown

    # The live fleet is the processes holding a liveness lock: this test process's, taken by in-process claims of
    # earlier tests, would count as two more workers.
    lease_renewer_shutdown()
    silent = SilentServer()
    try:
        server = ToolServer.objects.create(tenant=tenant, name="tarpit", url=silent.url, timeout_seconds=30)
        # The attacker's own row, from before the deployment's maximum (or by SQL): an hour per call.
        ToolServer.objects.filter(id=server.id).update(timeout_seconds=3600)
        workers("fair", concurrency=2, env={"DB_CONN_MAX_AGE": "60"})
        a_tasks = [create_engine_task(tenant, "mcp_tool", server="tarpit", tool="lookup", arguments={"key": str(n)})
                   for n in range(10)]
        deadline = time.monotonic() + 20
        # A's first call is waiting on the silent server:
        while leased_count(tenant) == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(1.0)  # (and A's other hints have met a claim)
        b_task = create_engine_task(other_tenant, steps=1, effect=False)

        most_leased, deadline = 0, time.monotonic() + 15
        while time.monotonic() < deadline:
            most_leased = max(most_leased, leased_count(tenant))
            if Task.objects.filter(id=b_task.id, status="completed").exists():
                break
            time.sleep(0.05)
        started = first_working_at(b_task.id)
        assert started is not None, (
            f"tenant B's task did not start within 15 s: tenant A's calls to a silent server hold the fleet "
            f"({leased_count(tenant)} of A's tasks leased)")
        waited = (started - b_task.created_at).total_seconds()
        assert waited < 5, f"tenant B's task waited {waited:.1f} s behind tenant A's calls"
        assert most_leased == 1, f"tenant A held {most_leased} of 2 workers (default share 0.5)"
        assert Task.objects.filter(id__in=[t.id for t in a_tasks], status__in=["completed", "failed"]).count() == 0
    finally:
        silent.close()


@pytest.mark.django_db
def test_it_refuses_a_tool_server_timeout_above_the_deployments_maximum_and_clamps_an_existing_one(
        tenant, admin_client, settings):
    """Saving: the admin's form and the shell's service (tool_servers add) refuse timeout_seconds above
    tools.max_timeout_seconds, saying the maximum. A row above it (saved before the maximum was lowered, or by SQL)
    is loaded clamped: every call path reads it so (the gateway's server_get)."""
    from agents_app.gateway.catalogue import server_get
    from agents_app.services import ToolServerError, tool_server_add
    from tests.engine_support import configure

    assert settings.RUNTIME.tools.max_timeout_seconds == 300  # (the shipped default)
    form = {"tenant": tenant.id, "name": "slow", "url": "http://127.0.0.1:9/mcp", "credential": "",
            "protocol": "auto", "enabled_tools": "", "timeout_seconds": "3600", "max_concurrent_calls": "4",
            "rate_per_minute": ""}
    page = admin_client.post("/admin/agents_app/toolserver/add/", form)
    assert page.status_code == 200 and "At most 300 seconds: the deployment&#x27;s maximum" in page.content.decode()
    with pytest.raises(ToolServerError, match="timeout_seconds: At most 300 seconds"):
        tool_server_add(tenant_slug=tenant.slug, name="slow", url="http://127.0.0.1:9/mcp", actor="test",
                        timeout_seconds=301)
    assert not ToolServer.objects.exists()
    assert admin_client.post("/admin/agents_app/toolserver/add/", {**form, "timeout_seconds": "300"}).status_code == 302

    ToolServer.objects.filter(name="slow").update(timeout_seconds=3600)  # past every form
    assert server_get(tenant_id=tenant.id, name="slow").timeout_seconds == 300
    configure(settings, tools={"max_timeout_seconds": 20})  # the deployment lowers it: existing rows follow
    assert server_get(tenant_id=tenant.id, name="slow").timeout_seconds == 20
    assert ToolServer.objects.values_list("timeout_seconds", flat=True).get(name="slow") == 3600  # (stored as it was)


@pytest.mark.django_db
def test_it_caps_a_tenant_without_its_own_cap_at_its_share_of_the_live_fleet_in_the_claim_and_the_hand_out(
        tenant, other_tenant, settings):
    """The cap is the claim's (one guarded statement under the claim lock): with four live worker processes (four
    lease owners holding liveness locks) and a share of 0.5, a tenant's third claim is refused and its task waits.
    A slot the tenant frees goes first to another tenant running as many (the releasing tenant last on a tie: the
    older backlog used to win every tie), then to the tenant's own room."""
    from tasks_app.db.dispatch import hints_for_waiting
    from tasks_app.engine.lease import _renewer, lease_claim, lease_renewer_shutdown
    from tests.engine_support import configure

    lease_renewer_shutdown()  # (only this test's owners hold liveness locks)
    for owner in ("fleet-1", "fleet-2", "fleet-3", "fleet-4"):  # four live processes of the fleet
        assert _renewer().hold_liveness(owner, timeout=5)
    a = [create_engine_task(tenant, steps=1) for _ in range(3)]
    assert lease_claim(task_id=a[0].id, owner="fleet-1") is not None
    assert lease_claim(task_id=a[1].id, owner="fleet-2") is not None
    assert lease_claim(task_id=a[2].id, owner="fleet-3") is None  # 2 running = floor(0.5 × 4)
    assert Task.objects.get(id=a[2].id).hint_at is None  # the hint consumed: the task waits for a slot
    b = [create_engine_task(other_tenant, steps=1) for _ in range(2)]
    assert lease_claim(task_id=b[0].id, owner="fleet-4") is not None
    Task.objects.filter(id=b[1].id).update(hint_at=None)  # (B's second waits for a slot too)

    Task.objects.filter(id=a[0].id).update(lease_owner=None, lease_expires_at=None, status="completed")
    assert hints_for_waiting(limit=1, releasing_tenant=tenant.id) == 1
    assert Task.objects.get(id=b[1].id).hint_at is not None and Task.objects.get(id=a[2].id).hint_at is None
    assert hints_for_waiting(limit=1, releasing_tenant=tenant.id) == 1
    assert Task.objects.get(id=a[2].id).hint_at is not None
    claim = lease_claim(task_id=a[2].id, owner="fleet-3")
    assert claim is not None and claim.tenant_max_running == 2

    configure(settings, tenants={"default_running_share": None})  # no default share: every slot is the tenant's
    more = create_engine_task(tenant, steps=1)
    assert lease_claim(task_id=more.id, owner="fleet-4") is not None
    lease_renewer_shutdown()


@pytest.mark.django_db
def test_it_applies_no_default_share_while_the_deployment_has_a_single_tenant(tenant):
    """A deployment of one tenant has no one to be fair to: with four live processes and a share of 0.5 its third
    claim is taken (with a second tenant it would be refused, as the test above shows), and the hand-out offers it
    every free slot."""
    from tasks_app.db.dispatch import hints_for_waiting
    from tasks_app.engine.lease import _renewer, lease_claim, lease_renewer_shutdown
    from tasks_app.models import Tenant

    assert list(Tenant.objects.values_list("id", flat=True)) == [tenant.id]
    lease_renewer_shutdown()
    for owner in ("fleet-1", "fleet-2", "fleet-3", "fleet-4"):
        assert _renewer().hold_liveness(owner, timeout=5)
    a = [create_engine_task(tenant, steps=1) for _ in range(5)]
    for task, owner in zip(a[:3], ("fleet-1", "fleet-2", "fleet-3")):
        claim = lease_claim(task_id=task.id, owner=owner)
        assert claim is not None and claim.tenant_max_running is None
    Task.objects.filter(id__in=[a[3].id, a[4].id]).update(hint_at=None)
    assert hints_for_waiting(limit=2) == 2  # (both: no share caps the hand-out either)
    lease_renewer_shutdown()


def test_it_counts_the_live_fleet_by_the_failover_liveness_locks():
    from tasks_app.db import sql
    from tasks_app.engine import failover

    assert sql.LIVENESS_NAMESPACE == failover.LIVENESS_NAMESPACE
    assert f"classid = {failover.LIVENESS_NAMESPACE}::oid" in sql.LIVE_WORKERS
    assert f"l.classid = {failover.LIVENESS_NAMESPACE}::oid" in sql.LEASE_CLAIM_FUNCTION_PATH.read_text()
