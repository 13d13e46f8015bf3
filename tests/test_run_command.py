"""The README's run command on the embedded path: boots, serves, stops everything on Ctrl-C, keeps data.

This is the CI smoke test of the embedded default: real PostgreSQL and Valkey from the wheels, uvicorn, two
Celery workers, beat and the example tool server, all started by `deploy/dev.py run` exactly as a newcomer would.
"""

import json
import os
import shlex
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

import psutil
import pytest

from tests.embedded_support import ROOT, data_folder, embedded, free_port

pytestmark = pytest.mark.slow


def _interruptible():
    """In the child: SIGINT as a terminal's job has it (a test process may run with SIGINT ignored, which a child
    inherits; tee would then survive the Ctrl-C that a user's tee does not)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _request(method, url, token=None, body=None):
    request = urllib.request.Request(url, method=method, data=json.dumps(body).encode() if body else None)
    request.add_header("Content-Type", "application/json")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"null")


class RunCommand:
    """`deploy/dev.py run` as a newcomer starts it: in a terminal job of its own, its output into ``log`` — or, with
    ``piped``, through `tee` (`dev.py run 2>&1 | tee run.log`), where Ctrl-C interrupts tee too."""

    def __init__(self, data, ports, *, piped: bool = False):
        self.data, self.ports, self.piped = data, ports, piped
        self.log = data / f"run-{time.monotonic_ns()}.log"
        self.base = f"http://127.0.0.1:{ports['web']}"

    def __enter__(self):
        env = {k: v for k, v in os.environ.items()
               if k not in {"DATABASE_URL", "REDIS_URL", "SECRET_KEY", "DEBUG", "MEDIA_ROOT", "CORPUS_ROOT",
                            "EXTERNAL_ROOT"}}
        env.update(EMBED_DATA=str(self.data), EMBED_PG_PORT=str(self.ports["pg"]),
                   EMBED_REDIS_PORT=str(self.ports["redis"]), WEB_PORT=str(self.ports["web"]),
                   TOOL_SERVER_PORT=str(self.ports["tools"]), WORKER_CONCURRENCY="1")
        self.env = env
        command = [sys.executable, str(ROOT / "deploy" / "dev.py"), "run"]
        if self.piped:  # a shell's pipeline: dev.py and tee in one process group, the terminal's foreground job
            command = ["bash", "-c", f"{shlex.join(command)} 2>&1 | tee {shlex.quote(str(self.log))}; "
                                     f"exit ${{PIPESTATUS[0]}}"]  # dev.py's own exit status
        self.process = subprocess.Popen(command, env=env, cwd=ROOT, stdout=subprocess.DEVNULL if self.piped else
                                        self.log.open("w"), stderr=subprocess.STDOUT, start_new_session=True,
                                        preexec_fn=_interruptible)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            assert self.process.poll() is None, self.log.read_text()[-3000:]
            try:
                if _request("GET", f"{self.base}/readyz")[0] == 200:
                    break
            except OSError:
                pass
            time.sleep(0.5)
        else:
            raise AssertionError("not ready in 120 s:\n" + self.log.read_text()[-3000:])
        self.token = (self.data / "dev-api-token").read_text().strip()
        return self

    def processes(self):
        """Every process of this run: the command's tree plus the daemonized servers (not its children), found by
        their data folder or port (Valkey rewrites its title to `valkey-server 127.0.0.1:<port>`)."""
        marks = [str(self.data), *(f":{port}" for port in self.ports.values()),
                 *(f"--port {port}" for port in self.ports.values())]
        found = []
        for proc in psutil.process_iter(["cmdline", "status"]):
            try:
                if proc.info["status"] == psutil.STATUS_ZOMBIE:
                    continue  # exited; PID 1 reaps orphans lazily on this VM
                cmdline = " ".join(proc.info["cmdline"] or [])
                if any(mark in cmdline for mark in marks):
                    found.append(proc)
            except psutil.Error:
                continue
        try:
            found += [p for p in psutil.Process(self.process.pid).children(recursive=True)
                      if p.status() != psutil.STATUS_ZOMBIE]
        except psutil.Error:
            pass
        return found

    def interrupt(self):
        os.killpg(self.process.pid, signal.SIGINT)  # what Ctrl-C delivers: to every process of the foreground job
        return self.process.wait(timeout=60)

    def __exit__(self, *exc):
        # After a failed assertion the run is still up: stop it the way a user would (Ctrl-C), which also stops
        # its children in their own sessions; only what survives that is killed.
        leftovers = self.processes()
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
        for proc in leftovers + self.processes():
            try:
                proc.kill()
            except psutil.Error:
                pass


def _wait_status(run, task_id, seconds=60):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        status, snapshot = _request("GET", f"{run.base}/runtime/tasks/{task_id}", run.token)
        if snapshot["status"] in ("completed", "failed", "cancelled"):
            return snapshot["status"]
        time.sleep(0.3)
    return snapshot["status"]


def _wait_progress(run, task_id, *, above: float, seconds=30):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        _, snapshot = _request("GET", f"{run.base}/runtime/tasks/{task_id}", run.token)
        if snapshot["progress"] > above:
            return snapshot
        time.sleep(0.3)
    raise AssertionError(f"no progress past {above} in {seconds} s: {snapshot}")


def _wait_log(run, text: str, seconds=15) -> bool:
    deadline = time.monotonic() + seconds
    while text not in run.log.read_text():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def _wait_gone(run, seconds=20):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        left = run.processes()
        if not left:
            return []
        time.sleep(0.5)
    return [(p.pid, p.cmdline()) for p in left]


def test_it_runs_stops_on_ctrl_c_and_finds_its_data_on_the_next_run():
    with data_folder() as data:
        ports = {"pg": free_port(), "redis": free_port(), "web": free_port(), "tools": free_port()}

        with RunCommand(data, ports) as first:
            status, created = _request("POST", f"{first.base}/runtime/tasks", first.token,
                                       {"workflow": "demo_steps", "input": {"steps": 2}})
            assert status == 201, created
            # The README's `dev.py manage …` reaches the same database and folders as the running stack.
            generated = subprocess.run([sys.executable, str(ROOT / "deploy" / "dev.py"), "manage", "generate_corpus",
                                        "--count", "30"], env=first.env, cwd=ROOT, check=False, capture_output=True,
                                       text=True)
            assert generated.returncode == 0, generated.stdout + generated.stderr
            status, review = _request("POST", f"{first.base}/runtime/tasks", first.token,
                                      {"workflow": "document_review",
                                       "input": {"batch_size": 10, "approve_publication": False}})
            assert status == 201, review
            assert _wait_status(first, review["taskId"]) == "completed"
            # It published through the example tool server `run` started and registered as the tenant's `reports`.
            _, reviewed = _request("GET", f"{first.base}/runtime/tasks/{review['taskId']}", first.token)
            assert reviewed["result"]["published"]["via"] == "reports", reviewed["result"]
            assert _wait_status(first, created["taskId"]) == "completed"
            # A worker SIGKILLed (as the OOM killer would) is restarted; the stack keeps running and working.
            supervisor = next(p for p in first.processes()  # (not the `sh -c` honcho may start it with)
                              if p.cmdline()[1:2] and p.cmdline()[1].endswith("supervise.py")
                              and "worker1@%h" in p.cmdline())
            worker1 = supervisor.children()[0]  # the celery worker's main process (its pool is below it)
            worker1.kill()
            status, after_kill = _request("POST", f"{first.base}/runtime/tasks", first.token,
                                          {"workflow": "demo_steps", "input": {"steps": 3}})
            assert status == 201, after_kill
            assert _wait_status(first, after_kill["taskId"]) == "completed"
            assert "restarting it in 1 s" in first.log.read_text()
            assert len(first.processes()) >= 7  # web, 2 workers, beat, tools, postgres, valkey (and children)
            # Ctrl-C while a task runs: the workers shut down warm, finishing the slice in hand (their pool
            # processes are not in the group honcho signals: deploy/supervise.py), and the task goes on at once on
            # the next run — not after its lease expired, as when a pool process died mid-step.
            status, running = _request("POST", f"{first.base}/runtime/tasks", first.token,
                                       {"workflow": "demo_steps", "input": {"steps": 3000, "sleep_ms": 40}})
            assert status == 201, running
            _wait_progress(first, running["taskId"], above=0.0)
            assert first.interrupt() == 0
            assert "WorkerLostError" not in first.log.read_text(), first.log.read_text()[-3000:]
            assert _wait_gone(first) == []
            for port in ports.values():
                assert not embedded.port_is_open(port), f"port {port} still open after Ctrl-C"

        # A run that died without stopping its servers (SIGKILL, a closed terminal) left them running. The next run
        # uses them, says so, and stops them at its end — not silently reused and left running again. And it runs
        # piped through tee, whose Ctrl-C also ends tee before the run has stopped anything.
        leftovers = [embedded.EmbeddedPostgres(data, ports["pg"], "agent_runtime"),
                     embedded.EmbeddedValkey(data, ports["redis"])]
        for server in leftovers:
            server.start()
        with RunCommand(data, ports, piped=True) as second:
            status, snapshot = _request("GET", f"{second.base}/runtime/tasks/{created['taskId']}", second.token)
            assert status == 200 and snapshot["taskId"] == created["taskId"]
            _, stopped = _request("GET", f"{second.base}/runtime/tasks/{running['taskId']}", second.token)
            _wait_progress(second, running["taskId"], above=stopped["progress"], seconds=15)  # lease: 30 s
            assert second.token == first.token  # the login was kept, not re-created
            assert _wait_log(second, "Admin:"), second.log.read_text()[-3000:]  # (said once /readyz answers)
            assert second.log.read_text().count("was left running by a command that did not stop it") == 2
            assert second.interrupt() == 0
            assert _wait_gone(second, seconds=15) == []
            for port in ports.values():
                assert not embedded.port_is_open(port), f"port {port} still open after Ctrl-C of a piped run"


@pytest.mark.django_db
def test_it_creates_the_database_a_database_url_names_before_migrating(settings):
    """`run` against a PostgreSQL that does not have the named database yet creates it (it ended in migrate's
    80-line traceback); asked again, it leaves the existing one alone."""
    import io
    import uuid

    import psycopg
    from django.core.management import call_command

    config = settings.DATABASES["default"]
    name = f"ensure_{uuid.uuid4().hex[:12]}"
    out = io.StringIO()
    original = config["NAME"]
    config["NAME"] = name
    try:
        call_command("ensure_database", stdout=out)
        call_command("ensure_database", stdout=out)
    finally:
        config["NAME"] = original
    params = {"host": config.get("HOST") or None, "port": config.get("PORT") or None,
              "user": config.get("USER") or None, "password": config.get("PASSWORD") or None, "dbname": "postgres"}
    with psycopg.connect(**{k: v for k, v in params.items() if v is not None}, autocommit=True) as connection:
        existed = connection.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone()
        connection.execute(f'DROP DATABASE IF EXISTS "{name}"')

    assert existed and out.getvalue().count(f"created database {name!r}") == 1


@pytest.mark.django_db(transaction=True)  # (the second call's login is committed by another process)
def test_it_prepares_in_one_process_and_stops_at_the_first_command_that_fails(tmp_path):
    """`run` prepares the stack with five manage.py commands in one Django process (deploy/manage_in_order.py); one
    that fails stops the rest, as separate manage.py calls with check=True did, and says why."""
    from tests.worker_support import test_database_url

    env = {**os.environ, "DATABASE_URL": test_database_url()}
    credentials = tmp_path / "credentials"
    credentials.mkdir()  # (dev.py makes its data folder first)
    done = subprocess.run([sys.executable, str(ROOT / "deploy" / "manage_in_order.py"), "ensure_database",
                           "--then", "no_such_command", "--then", "ensure_dev_login", "--credentials-dir",
                           str(credentials)], env=env, cwd=ROOT, capture_output=True, text=True, timeout=60)

    assert done.returncode == 1 and "Unknown command: 'no_such_command'" in done.stderr, done.stderr
    assert list(credentials.iterdir()) == []  # the command after the failing one did not run
    ran = subprocess.run([sys.executable, str(ROOT / "deploy" / "manage_in_order.py"), "ensure_database", "--then",
                          "ensure_dev_login", "--credentials-dir", str(credentials), "-v", "0"], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0, ran.stderr
    assert (credentials / "dev-api-token").exists()
