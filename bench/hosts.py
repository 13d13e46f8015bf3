"""Two hosts on one machine: each a network namespace with its own web tier and worker, against one PostgreSQL and
one Valkey; then one host is killed, cut off or partitioned from PostgreSQL only, and its tasks must move to the
other host within the failover bound, every effect once.

    python3.11 deploy/dev.py chaos --hosts [--faults kill,cut,partition] [--pooler-faults kill,partition]
                                           [--pooler] [--tasks 4] [--steps 160] [--sleep-ms 50] [--repeat 1]
                                           [--json FILE]

Needs root (`ip netns`, veth pairs: iproute2). The layout, made per fault and removed after it:

    root namespace                                  host namespace hN (N = 1, 2)
      PostgreSQL  on 127.0.0.1 and PG_ADDRESS         web (uvicorn) on 10.X.N.2
      Valkey      on 127.0.0.1 and VALKEY_ADDRESS     `celery worker` (prefork, --concurrency 4)
      (both addresses on `lo`: they outlive a host)   beat, on h1 only: recovery must not need it
      vrN 10.X.N.1 <-------- veth --------> vhN 10.X.N.2, default route via 10.X.N.1

Faults, on h1, each against a fresh pair of hosts (same database, tasks of its own):
  kill       SIGKILL every process of h1 at once (`ip netns pids`): the kernel closes their sockets, PostgreSQL
             ends their sessions and their liveness locks go with them (tasks_app/engine/failover.py).
  cut        h1's interface down: nothing reaches it or leaves it, silently. PostgreSQL ends its sessions when its
             TCP keepalives find the peer dead — this run sets tcp_keepalives_idle/interval/count to 1/1/1
             (docs/failover.md: without them a cut host's tasks move at lease expiry). Restored after the tasks
             have moved: h1's workers, stalled mid-step, come back and must be fenced out.
  partition  h1 still reaches Valkey but not PostgreSQL (a blackhole route to PG_ADDRESS in h1): its workers keep
             taking broker messages and cannot claim; the sessions it held end as for a cut. Healed later, as cut.

The faults of --pooler-faults run after those of --faults (--pooler: the same ones again) with every host process
reaching PostgreSQL through a PgBouncer in transaction mode (Debian's `pgbouncer`, in the root namespace, on
PG_ADDRESS too): DATABASE_POOLER=transaction, and the session-level locks on a direct connection
(DATABASE_SESSION_URL, docs/failover.md).

Measured per fault, from the fault's moment: for the tasks h1 held a lease on, the time until each committed a step
again (on h2: `takeover_seconds`); for every task not finished, the same (`every_task_progressing_seconds`). Then
every task must complete, every demo effect be in the effects log exactly once (outside the database), exactly the
planned steps commit, no step of h1's commit after the fault unless h1 came back (cut, partition) and took the task
again under a new lease, the surviving host's web answer every task's snapshot during the fault, and every audit
chain verify. Prints one JSON line; exits 1 when a guarantee or the bound broke.

The bound: 2 s after a kill (the issue's target). After a cut or a partition, the keepalive time (here 2 s: idle 1
+ 1 probe) plus the same 2 s.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "deploy"))

from embedded import EmbeddedPostgres, EmbeddedValkey, port_is_open  # noqa: E402

from bench import chaos  # noqa: E402
from bench.soak import wait_until_serving  # noqa: E402

FAULTS = ("kill", "cut", "partition")
TENANT = "hosts"
KILL_BOUND_SECONDS = 2.0
# PostgreSQL's TCP keepalives in this run: a cut peer is found dead ~2 s after its last packet (idle 1 + 1 probe).
KEEPALIVE = {"tcp_keepalives_idle": 1, "tcp_keepalives_interval": 1, "tcp_keepalives_count": 1,
             "tcp_user_timeout": 2000, "client_connection_check_interval": 250}
KEEPALIVE_SECONDS = 2.0
WORKER_CONCURRENCY = 4
POLL_SECONDS = 0.05
# After a cut or partition, h1 stays away this long after its tasks moved, then comes back (fencing is then tested).
HEAL_AFTER_SECONDS = 3.0
RUN_ID = os.getpid()  # in namespace and interface names (interfaces: at most 15 characters)
NET = f"10.{200 + os.getpid() % 50}"
PG_ADDRESS = f"{NET}.0.3"
VALKEY_ADDRESS = f"{NET}.0.1"


def ip(*args: str, check: bool = True) -> None:
    subprocess.run(["ip", *args], check=check, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL if not check
                   else None)


class Host:
    """A network namespace joined to the root namespace by a veth pair, and the processes started in it."""

    def __init__(self, index: int, tag: str):
        self.index = index
        self.ns = f"rt{RUN_ID}{tag}h{index}"
        self.veth_root, self.veth_host = f"vr{RUN_ID}{tag}{index}"[:15], f"vh{RUN_ID}{tag}{index}"[:15]
        self.gateway, self.address = f"{NET}.{index}.1", f"{NET}.{index}.2"
        self.processes: dict[str, subprocess.Popen] = {}

    def up(self) -> None:
        ip("netns", "add", self.ns)
        ip("link", "add", self.veth_root, "type", "veth", "peer", "name", self.veth_host)
        ip("link", "set", self.veth_host, "netns", self.ns)
        ip("addr", "add", f"{self.gateway}/24", "dev", self.veth_root)
        ip("link", "set", self.veth_root, "up")
        self.exec("ip", "link", "set", "lo", "up")
        self.exec("ip", "addr", "add", f"{self.address}/24", "dev", self.veth_host)
        self.exec("ip", "link", "set", self.veth_host, "up")
        self.exec("ip", "route", "add", "default", "via", self.gateway)

    def exec(self, *args: str) -> None:
        ip("netns", "exec", self.ns, *args)

    def pids(self) -> list[int]:
        listed = subprocess.run(["ip", "netns", "pids", self.ns], capture_output=True, text=True)
        return [int(pid) for pid in listed.stdout.split()]

    def start(self, name: str, command: list[str], env: dict, logs: Path) -> None:
        log = (logs / f"h{self.index}-{name}.log").open("a")
        # `ip netns exec` execs the command in place: the pid is the process's own.
        self.processes[name] = subprocess.Popen(["ip", "netns", "exec", self.ns, *command], cwd=ROOT, env=env,
                                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def kill_all(self) -> int:
        """SIGKILL every process in the namespace at once (pool children included): a host that died."""
        pids = self.pids()
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for process in self.processes.values():
            process.wait()
        return len(pids)

    def cut(self) -> None:
        self.exec("ip", "link", "set", self.veth_host, "down")

    def restore(self) -> None:
        self.exec("ip", "link", "set", self.veth_host, "up")
        self.exec("ip", "route", "replace", "default", "via", self.gateway)  # (went with the link)

    def partition_from(self, address: str) -> None:
        self.exec("ip", "route", "add", "blackhole", f"{address}/32")

    def heal(self, address: str) -> None:
        self.exec("ip", "route", "del", "blackhole", f"{address}/32")

    def down(self) -> None:
        self.kill_all()
        ip("netns", "del", self.ns, check=False)
        ip("link", "del", self.veth_root, check=False)  # (gone with the namespace's end; in case it was not)


def leftovers_remove() -> None:
    """Namespaces of earlier runs that were killed before they could clean up (their process is gone): their
    processes killed, the namespaces deleted (their veth pairs go with them)."""
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split("\n")
    for line in listed:
        match = re.match(r"rt(\d+)[a-z]\d+h\d\b", line)
        if match and not Path(f"/proc/{match[1]}").exists():
            name = line.split()[0]
            for pid in subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True).stdout.split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
            ip("netns", "del", name, check=False)


def service_addresses(action: str) -> None:
    """The addresses PostgreSQL and Valkey listen on besides 127.0.0.1, on the root namespace's `lo`: they do not
    go away with a host's veth."""
    for address in (PG_ADDRESS, VALKEY_ADDRESS):  # ("replace": one a killed run left behind is taken over)
        ip("addr", "replace" if action == "add" else action, f"{address}/32", "dev", "lo", check=action == "add")


class PgBouncer:
    """Debian's pgbouncer in transaction mode, in the root namespace, in front of the run's PostgreSQL."""

    def __init__(self, scratch: Path, pg: EmbeddedPostgres, port: int):
        self.dir, self.pg, self.port = scratch / "pgbouncer", pg, port
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        binary = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
        if not Path(binary).exists():
            raise SystemExit("--pooler needs Debian's pgbouncer: apt-get install -y pgbouncer")
        self.dir.mkdir()
        (self.dir / "users.txt").write_text('"postgres" ""\n')
        (self.dir / "pgbouncer.ini").write_text(f"""[databases]
* = host=127.0.0.1 port={self.pg.port}
[pgbouncer]
listen_addr = 127.0.0.1,{PG_ADDRESS}
listen_port = {self.port}
unix_socket_dir =
auth_type = trust
auth_file = {self.dir / 'users.txt'}
pool_mode = transaction
max_client_conn = 500
default_pool_size = 20
ignore_startup_parameters = extra_float_digits,options
logfile = {self.dir / 'pgbouncer.log'}
""")
        account = self.pg.account
        os.chown(self.dir, account.pw_uid, account.pw_gid) if account else None
        for child in self.dir.iterdir():
            os.chown(child, account.pw_uid, account.pw_gid) if account else None
        user = ["-u", account.pw_name] if account else []  # pgbouncer refuses to run as root
        self.process = subprocess.Popen([binary, *user, str(self.dir / "pgbouncer.ini")], stdout=subprocess.DEVNULL,
                                        stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 10
        while not port_is_open(self.port, timeout=0.2):
            if time.monotonic() > deadline or self.process.poll() is not None:
                raise SystemExit(f"pgbouncer did not start: {(self.dir / 'pgbouncer.log').read_text()[-800:]}")
            time.sleep(0.05)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=10)


def http(method: str, url: str, token: str, body: dict | None = None, timeout: float = 5) -> tuple[int, dict]:
    request = urllib.request.Request(url, method=method, data=json.dumps(body).encode() if body is not None else None)
    request.add_header("Authorization", f"Bearer {token}")
    if body is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as error:
        return error.code, {}


def setup_tenant(env: dict) -> str:
    """Tenant, user and API token, in this process (through 127.0.0.1)."""
    os.environ.update(env)
    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.db import connections

    from tasks_app.services import api_token_create, tenant_get_or_create

    tenant = tenant_get_or_create(slug=TENANT)
    user = get_user_model().objects.create_user(username="hosts-operator", password=None)
    _, token = api_token_create(tenant=tenant, user=user, name="hosts")
    connections.close_all()
    return token


class Progress(threading.Thread):
    """Polls every task's (status, steps_completed, lease_owner, lease_epoch) through 127.0.0.1 (which no fault
    touches) and keeps, after the fault, when each task first committed a step again and under which lease."""

    QUERY = ("SELECT id::text, status, steps_completed, lease_owner, lease_epoch FROM tasks_app_task "
             "WHERE id = ANY(%s::uuid[])")

    def __init__(self, url: str, task_ids: list[str]):
        super().__init__(daemon=True, name="progress")
        self.url, self.task_ids = url, task_ids
        self.rows: dict[str, tuple] = {}
        self.fault_at: float | None = None
        self.at_fault: dict[str, tuple] = {}
        self.moved: dict[str, tuple[float, int]] = {}  # task -> (seconds after the fault, lease epoch then)
        # Tasks h1 held: they count as moved only under a new lease (a commit of h1's already in flight when the
        # network went may still land under the old one: counted apart).
        self.new_lease_needed: set[str] = set()
        self.landed_under_old_lease: set[str] = set()
        self.stopping = threading.Event()
        self.lock = threading.Lock()

    def read(self, conn) -> dict[str, tuple]:
        return {row[0]: row[1:] for row in conn.execute(self.QUERY, [self.task_ids]).fetchall()}

    def run(self) -> None:
        with chaos.db_connect(self.url) as conn:
            while not self.stopping.is_set():
                rows = self.read(conn)
                now = time.monotonic()
                with self.lock:
                    self.rows = rows
                    for task_id, (status, steps, owner, epoch) in rows.items():
                        before = self.at_fault.get(task_id)
                        if task_id in self.moved or before is None or steps <= before[1]:
                            continue
                        if task_id in self.new_lease_needed and epoch == before[3]:
                            self.landed_under_old_lease.add(task_id)
                            continue
                        self.moved[task_id] = (round(now - self.fault_at, 3), epoch)
                time.sleep(POLL_SECONDS)

    def mark_fault(self, fault_at: float, new_lease_needed: set[str]) -> None:
        """The fault struck at ``fault_at`` and is in place: a step counts as progress from what is committed now
        (a commit of h1's that landed between the last poll and the fault is not a move)."""
        with chaos.db_connect(self.url) as conn:
            baseline = self.read(conn)
        with self.lock:
            self.fault_at, self.at_fault, self.new_lease_needed = fault_at, baseline, new_lease_needed

    def snapshot(self) -> dict[str, tuple]:
        with self.lock:
            return dict(self.rows)


def wait_past_grace(url: str) -> None:
    from tasks_app.engine.failover import POSTMASTER_GRACE_SECONDS

    with chaos.db_connect(url) as conn:
        up = conn.execute("SELECT extract(epoch FROM now() - pg_postmaster_start_time())").fetchone()[0]
    time.sleep(max(0.0, POSTMASTER_GRACE_SECONDS + 1 - float(up)))


def owner_pid(owner: str | None) -> int | None:
    """A lease owner is host:pid:random (tasks_app.engine.lease.worker_identity)."""
    try:
        return int(owner.split(":")[1]) if owner else None
    except (IndexError, ValueError):
        return None


def run_fault(number: int, fault: str, args, env: dict, scratch: Path, pg: EmbeddedPostgres, valkey: EmbeddedValkey,
              bouncer: PgBouncer | None, token: str, web_port: int) -> dict:
    tag = f"{fault[0]}{number}"
    logs = scratch / f"{number}-{fault}{'-pooler' if bouncer else ''}"
    logs.mkdir()
    hosts = [Host(1, tag), Host(2, tag)]
    progress = None
    result: dict = {"fault": fault, "pooler": "pgbouncer-transaction" if bouncer else None}
    try:
        for host in hosts:
            host.up()
        db_host, db_port = (PG_ADDRESS, bouncer.port) if bouncer else (PG_ADDRESS, pg.port)
        host_env = {**env, "DATABASE_URL": f"postgres://postgres@{db_host}:{db_port}/{pg.database}",
                    "REDIS_URL": f"redis://{VALKEY_ADDRESS}:{valkey.port}/0",
                    "EXTERNAL_ROOT": str(logs / "external"), "ALLOWED_HOSTS": "*",
                    # The client side's keepalives and timeout as the server's (config/settings/services.py).
                    "DB_KEEPALIVES_IDLE": "1", "DB_KEEPALIVES_INTERVAL": "1", "DB_KEEPALIVES_COUNT": "1",
                    "DB_TCP_USER_TIMEOUT_MS": "2000"}
        if bouncer:
            host_env["DATABASE_SESSION_URL"] = f"postgres://postgres@{PG_ADDRESS}:{pg.port}/{pg.database}"
            host_env["DATABASE_POOLER"] = "transaction"
        for host in hosts:
            host.start("web", [sys.executable, "-m", "uvicorn", "config.asgi:application", "--host", host.address,
                               "--port", str(web_port), "--log-level", "warning", "--no-access-log"], host_env, logs)
            host.start("worker", [sys.executable, "-m", "celery", "-A", "config", "worker", "-n",
                                  f"worker@h{host.index}", "--pool", "prefork", "--concurrency",
                                  str(WORKER_CONCURRENCY), "--loglevel", "WARNING", "--without-gossip",
                                  "--without-mingle", "--without-heartbeat"], host_env, logs)
        hosts[0].start("beat", [sys.executable, "-m", "celery", "-A", "config", "beat", "--loglevel", "WARNING",
                                "--pidfile=", "--scheduler", "config.beat:RuntimeScheduler"], host_env, logs)
        for host in hosts:
            wait_until_serving(f"http://{host.address}:{web_port}/readyz")
        wait_past_grace(pg.url)
        # Created over each host's own web tier, half each.
        task_ids = []
        for number in range(args.tasks):
            host = hosts[number % 2]
            status, body = http("POST", f"http://{host.address}:{web_port}/runtime/tasks", token,
                                {"workflow": "demo_steps", "input": {"steps": args.steps,
                                                                     "sleep_ms": args.sleep_ms}})
            if status != 201 and status != 202 and status != 200:
                raise RuntimeError(f"create over h{host.index}'s web: HTTP {status}")
            task_ids.append(body["taskId"])
        progress = Progress(pg.url, task_ids)
        progress.start()
        # The fault strikes when h1 holds leases and every task has started (and PostgreSQL has been up longer than
        # failover's grace, above: right after a server start holders are not judged by their locks).
        h1_pids: set[int] = set()
        deadline = time.monotonic() + 60
        while True:
            if time.monotonic() > deadline:
                raise RuntimeError("h1 never held a lease with every task started")
            time.sleep(0.1)
            h1_pids = set(hosts[0].pids())
            rows = progress.snapshot()
            held = [t for t, (_, _, owner, _) in rows.items() if owner_pid(owner) in h1_pids]
            if held and len(rows) == len(task_ids) and all(row[1] >= 3 for row in rows.values()):
                break
        fault_at = time.monotonic()
        result["fault_at"] = time.strftime("%H:%M:%S", time.gmtime()) + f"{time.time() % 1:.3f}"[1:]
        if fault == "kill":
            result["processes_killed"] = hosts[0].kill_all()
        elif fault == "cut":
            hosts[0].cut()
        else:
            hosts[0].partition_from(PG_ADDRESS)
        held_before = {t for t, (_, _, owner, _) in rows.items() if owner_pid(owner) in h1_pids}
        progress.mark_fault(fault_at, held_before)
        at_fault = progress.at_fault
        # Held by h1 when it went: its owner then, and still its lease after (not released in between).
        held_by_h1 = sorted(t for t in held_before if at_fault[t][3] == rows[t][3])
        # The surviving host's web answers every task's snapshot while h1 is away.
        snapshots = Counter()
        for task_id in task_ids:
            status, _ = http("GET", f"http://{hosts[1].address}:{web_port}/runtime/tasks/{task_id}", token)
            snapshots[status] += 1
        result["h2_snapshots_during_fault"] = dict(snapshots)
        bound = KILL_BOUND_SECONDS + (KEEPALIVE_SECONDS if fault != "kill" else 0.0)
        unfinished = [t for t, row in at_fault.items() if row[0] not in chaos.TERMINAL]
        # Wait for every unfinished task to move (or give up well past the lease), then heal h1 (cut, partition).
        give_up = progress.fault_at + 60
        while time.monotonic() < give_up and not all(t in progress.moved for t in unfinished):
            time.sleep(0.1)
        if fault in ("cut", "partition"):
            time.sleep(HEAL_AFTER_SECONDS)
            hosts[0].restore() if fault == "cut" else hosts[0].heal(PG_ADDRESS)
            result["healed_after_seconds"] = round(time.monotonic() - progress.fault_at, 1)
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            if all(row[0] == "completed" for row in progress.snapshot().values()):
                break
            time.sleep(0.2)
        takeover = [progress.moved.get(t, (None, None))[0] for t in held_by_h1]
        every = [progress.moved.get(t, (None, None))[0] for t in unfinished]
        result.update({
            "tasks": len(task_ids), "steps_per_task": args.steps, "held_by_h1_at_fault": len(held_by_h1),
            "takeover_seconds": None if None in takeover else max(takeover, default=0.0),
            # Moved under a new lease (h1 was away: h2's), never by h1 committing under its old one.
            "taken_over_under_new_lease": sum(1 for t in held_by_h1 if progress.moved.get(t, (0, 0))[1]
                                              > at_fault[t][3]),
            "every_task_progressing_seconds": None if None in every else max(every, default=0.0),
            "h1_commits_in_flight_at_fault": len(progress.landed_under_old_lease),
            "bound_seconds": bound,
        })
        result.update(verify(pg, task_ids, logs, args.steps))
        result["ok"] = (result["takeover_seconds"] is not None and result["takeover_seconds"] <= bound
                        and result["every_task_progressing_seconds"] is not None
                        and result["every_task_progressing_seconds"] <= bound
                        and result["taken_over_under_new_lease"] == len(held_by_h1)
                        and result["h2_snapshots_during_fault"] == {200: len(task_ids)} and result["verified"])
        return result
    finally:
        if progress is not None:
            progress.stopping.set()
        for host in hosts:
            host.down()


def verify(pg: EmbeddedPostgres, task_ids: list[str], logs: Path, steps: int) -> dict:
    with chaos.db_connect(pg.url) as conn:
        statuses = Counter(dict(conn.execute(
            "SELECT status, count(*) FROM tasks_app_task WHERE id = ANY(%s::uuid[]) GROUP BY status",
            [task_ids]).fetchall()))
        committed = conn.execute("SELECT count(*) FROM tasks_app_step WHERE status = 'committed' AND "
                                 "task_id = ANY(%s::uuid[])", [task_ids]).fetchone()[0]
        holder_gone = conn.execute("SELECT count(*) FROM tasks_app_taskevent WHERE task_id = ANY(%s::uuid[]) AND "
                                   "data->>'reason' = 'holder_gone'", [task_ids]).fetchone()[0]
    effects_log = logs / "external" / "demo_effects.log"
    counts = Counter(effects_log.read_text().split() if effects_log.exists() else [])
    expected = {f"{task_id}:{seq}:record" for task_id in task_ids for seq in range(1, steps + 1)}
    duplicates = sum(n - 1 for key, n in counts.items() if key in expected and n > 1)
    missing = len(expected - counts.keys())
    audit = subprocess.run([sys.executable, "manage.py", "verify_events"], cwd=ROOT, capture_output=True, text=True,
                           timeout=300, env={**os.environ, "DATABASE_URL": pg.url})
    return {"statuses": dict(statuses), "committed_steps": committed, "expected_steps": len(task_ids) * steps,
            "effects": sum(counts.values()), "duplicate_effects": duplicates, "missing_effects": missing,
            "holder_gone_recoveries": holder_gone, "audit_chains_ok": audit.returncode == 0,
            "verified": (statuses.get("completed", 0) == len(task_ids) and committed == len(task_ids) * steps
                         and duplicates == 0 and missing == 0 and audit.returncode == 0)}


def by_fault(results: list[dict]) -> dict:
    """Per fault (and pooler): how many runs, and the takeover seconds' min, median and max."""
    groups: dict[str, list[dict]] = {}
    for result in results:
        groups.setdefault(result["fault"] + (" (pgbouncer)" if result["pooler"] else ""), []).append(result)
    summary = {}
    for name, runs in groups.items():
        seconds = sorted(run["every_task_progressing_seconds"] for run in runs
                         if run["every_task_progressing_seconds"] is not None)
        summary[name] = {"runs": len(runs), "ok": sum(1 for run in runs if run["ok"]),
                         "bound_seconds": runs[0]["bound_seconds"],
                         "every_task_progressing_seconds": {"min": seconds[0], "median": seconds[len(seconds) // 2],
                                                            "max": seconds[-1]} if seconds else None,
                         "duplicate_effects": sum(run["duplicate_effects"] for run in runs),
                         "missing_effects": sum(run["missing_effects"] for run in runs)}
    return summary


def fault_list(text: str) -> list[str]:
    kinds = [kind.strip() for kind in text.split(",") if kind.strip()]
    unknown = sorted(set(kinds) - set(FAULTS))
    if unknown:
        raise argparse.ArgumentTypeError(f"faults are {', '.join(FAULTS)}; got {text!r}")
    return kinds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--faults", type=fault_list, default=list(FAULTS), help=f"from {','.join(FAULTS)}")
    parser.add_argument("--pooler-faults", type=fault_list, default=[],
                        help="then these, through PgBouncer in transaction mode")
    parser.add_argument("--pooler", action="store_true", help="--pooler-faults: the same as --faults")
    parser.add_argument("--tasks", type=int, default=4, help=f"at most one host's slots ({WORKER_CONCURRENCY})")
    parser.add_argument("--steps", type=int, default=160)
    parser.add_argument("--sleep-ms", type=int, default=50)
    parser.add_argument("--repeat", type=int, default=1, help="run the whole list this many times")
    parser.add_argument("--json", type=Path, help="also append the result line to this file")
    args = parser.parse_args()
    if args.pooler:
        args.pooler_faults = list(args.faults)
    if not args.faults and not args.pooler_faults:
        parser.error("no fault to run: --faults and --pooler-faults are both empty")
    if os.geteuid() != 0 or shutil.which("ip") is None:
        print("chaos --hosts needs root and iproute2 (ip netns)", file=sys.stderr)
        return 2
    (ROOT / "var").mkdir(exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="hosts-", dir=ROOT / "var"))
    os.chmod(scratch, 0o755)
    pg = EmbeddedPostgres(scratch, chaos.free_port(), "hosts")
    pg.server_options = ["-c", f"listen_addresses='127.0.0.1,{PG_ADDRESS}'",
                         *[part for name, value in KEEPALIVE.items() for part in ("-c", f"{name}={value}")]]
    valkey = EmbeddedValkey(scratch, chaos.free_port())
    valkey.server_args = ["--bind", f"127.0.0.1 {VALKEY_ADDRESS}", "--protected-mode", "no"]
    bouncer = PgBouncer(scratch, pg, chaos.free_port()) if args.pooler_faults else None
    env = dict(os.environ)
    env.update(DATABASE_URL=pg.url, REDIS_URL=valkey.url, MEDIA_ROOT=str(scratch / "media"), LOG_LEVEL="WARNING",
               DJANGO_SETTINGS_MODULE="config.settings", DB_CONN_MAX_AGE="0",
               SECRET_KEY=os.environ.get("SECRET_KEY", "hosts-" + uuid.uuid4().hex), ALLOWED_HOSTS="127.0.0.1")
    for name in ("RUNTIME_LEASE_SECONDS", "RUNTIME_HEARTBEAT_SECONDS", "RUNTIME_REAPER_INTERVAL_SECONDS"):
        env.pop(name, None)  # the defaults: a 30 s lease, the target
    results = []
    started = time.time()
    # A SIGTERM (a test's timeout) ends the run through its clean-up, as Ctrl-C does.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(3))
    leftovers_remove()
    try:
        service_addresses("add")
        pg.start()
        # Trust for the hosts' subnet too (the run's own throwaway cluster), then reload.
        hba = pg.pgdata / "pg_hba.conf"
        hba.write_text(hba.read_text() + f"\nhost all all {NET}.0.0/16 trust\n")
        pg.ensure_database()
        subprocess.run([str(pg.bin_dir / "psql"), "-h", "127.0.0.1", "-p", str(pg.port), "-U", "postgres", "-tAc",
                        "SELECT pg_reload_conf()"], check=True, stdout=subprocess.DEVNULL)
        valkey.start()
        if bouncer:
            bouncer.start()
        subprocess.run([sys.executable, "manage.py", "migrate", "-v", "0"], cwd=ROOT, env=env, check=True)
        token = setup_tenant(env)
        web_port = chaos.free_port()
        plan = ([(fault, None) for fault in args.faults]
                + [(fault, bouncer) for fault in args.pooler_faults]) * args.repeat
        for number, (fault, via) in enumerate(plan):
            results.append(run_fault(number, fault, args, env, scratch, pg, valkey, via, token, web_port))
            print(json.dumps(results[-1]), flush=True)
    finally:
        if bouncer:
            bouncer.stop()
        valkey.stop()
        pg.stop()
        service_addresses("del")
        if os.environ.get("CHAOS_KEEP") != "1":
            shutil.rmtree(scratch, ignore_errors=True)
    summary = {"run": "hosts", "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
               "lease_seconds": 30, "server_settings": KEEPALIVE, "by_fault": by_fault(results), "faults": results,
               "ok": all(r["ok"] for r in results)
               and len(results) == (len(args.faults) + len(args.pooler_faults)) * args.repeat}
    print(json.dumps(summary))
    if args.json:
        with args.json.open("a") as out:
            out.write(json.dumps(summary) + "\n")
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
