#!/usr/bin/env python3
"""The README's two commands: all set-up on a fresh machine with only Python 3.11 and git.

    python3.11 deploy/dev.py run            # venv, install, services, migrate, admin login, web + 2 workers + beat
                                            # + the example MCP tool server (the default tenant's `reports`)
    python3.11 deploy/dev.py test [ARGS]    # the same set-up, then the whole test suite (ARGS go to pytest)
    python3.11 deploy/dev.py manage CMD [ARGS]   # manage.py with the run command's database, broker and secret key
    python3.11 deploy/dev.py seed --count N [ARGS]  # store N finished tasks in that database (bench/seed_tasks.py)
    python3.11 deploy/dev.py bench [ARGS]   # the engine benchmark (bench/engine.py), on the test command's services
    python3.11 deploy/dev.py bench --http [ARGS]  # the HTTP load benchmark (bench/web_load.py)
    python3.11 deploy/dev.py bench --sse [ARGS]   # SSE subscribers on one running task (bench/sse_load.py)
    python3.11 deploy/dev.py bench --plan-length [ARGS]  # CPU per step vs the plan's length (bench/plan_length.py)
    python3.11 deploy/dev.py bench --slice-survey [ARGS]  # every kind of slice-rule violation (bench/slice_survey.py)
    python3.11 deploy/dev.py bench --step-cpu [ARGS]  # the engine's CPU per step in one process (bench/step_cpu.py)
    python3.11 deploy/dev.py bench --tools [ARGS]  # a downstream tool call against a bare effect (bench/tool_calls.py)
    python3.11 deploy/dev.py bench --agents [ARGS]  # an agent turn's cost; 50 agents at once (bench/agent_turns.py)
    python3.11 deploy/dev.py bench --compare [ARGS]  # this runtime vs a Celery chain vs DBOS 3.4 (bench/compare.py)
    python3.11 deploy/dev.py chaos [ARGS]   # kill workers and crash PostgreSQL during a run (bench/chaos.py)
    python3.11 deploy/dev.py chaos --soak [--minutes N]  # people, agents and every fault at once (bench/soak.py)
    python3.11 deploy/dev.py chaos --hosts [--pooler]    # two hosts (network namespaces): kill, cut, partition one
    python3.11 deploy/dev.py info        # how to sign in (admin, API token, docs, MCP); starts nothing
    python3.11 deploy/dev.py services start|stop|status   # only the embedded PostgreSQL and Valkey
    python3.11 deploy/dev.py tool-server [--port N] [ARGS]   # the example MCP tool server (docs/tools.md)

Without DATABASE_URL / REDIS_URL the run command starts a real PostgreSQL and Valkey from pip wheels under the
data folder (EMBED_DATA, default ./var) on loopback; the test command first looks for the ones CI machines run
on 127.0.0.1:5432 / 6379 and falls back to the embedded ones. Stage one runs on any Python 3.11 and only makes
the virtualenv; stage two runs inside it.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import shutil
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV = Path(os.environ.get("VENV_DIR", ROOT / ".venv"))
DATABASE_NAME = "agent_runtime"
TOOL_SERVER_PORT = 8765  # the example tool server's (examples/tool_server.py); `run`: unless TOOL_SERVER_PORT is set
DEV_TENANT = "default"  # the local tenant `run` makes (tasks_app ensure_dev_login) and its API token acts in
DEV_TOOL_SERVER = "reports"  # the example tool server's name in that tenant: document_review publishes through it


def tool_server_port() -> int:
    value = os.environ.get("TOOL_SERVER_PORT", str(TOOL_SERVER_PORT))
    if not value.isdigit() or not 0 < int(value) < 65536:
        fail(f"TOOL_SERVER_PORT must be a port number, not {value!r}")
    return int(value)


def say(message: str) -> None:
    print(f"[dev] {message}", flush=True)


class OutputThatOutlivesItsReader:
    """sys.stdout / sys.stderr of every command: writes that find the reader gone go to /dev/null instead of raising.

    `dev.py run 2>&1 | tee run.log`, then Ctrl-C: the terminal interrupts its whole foreground job, so `tee` exits at
    once, while this process is only beginning to stop the stack. Its next line (honcho's "SIGINT received", inside the
    signal handler) raised BrokenPipeError before honcho had signalled a single process; the services' shutdown raised
    again on its first message; and the interpreter then waited forever at exit for honcho's relay processes, whose
    commands nobody had stopped — a hung terminal, and workers, beat, PostgreSQL and Valkey left running. Now the
    file descriptor itself is pointed at /dev/null (so what is still buffered, and the children started afterwards,
    write there too) and the shutdown goes on to the end."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._reader_gone()
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._reader_gone()

    def _reader_gone(self) -> None:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, self._stream.fileno())
        os.close(devnull)
        try:
            self._stream.flush()  # what was buffered for the closed pipe now goes to /dev/null
        except OSError:
            pass

    def __getattr__(self, name):  # isatty, fileno, encoding…: the stream's own
        return getattr(self._stream, name)


def fail(message: str, code: int = 2) -> None:
    print(f"[dev] error: {message}", file=sys.stderr, flush=True)
    raise SystemExit(code)


# ---------------------------------------------------------------------------------------------------------------
# Stage one: the virtualenv (standard library only)
# ---------------------------------------------------------------------------------------------------------------
def venv_python() -> Path:
    return VENV / "bin" / "python"


def in_venv() -> bool:
    return Path(sys.prefix).resolve() == VENV.resolve()


def ensure_venv(requirements: str) -> None:
    if sys.version_info[:2] != (3, 11):
        fail(f"Python 3.11 is required, this is {sys.version.split()[0]}; run with python3.11")
    if not venv_python().exists():
        say(f"creating the virtualenv in {VENV}")
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    # Reinstall only when the pinned requirements changed since the last install into this venv.
    files = [ROOT / "requirements.txt", ROOT / requirements]
    digest = hashlib.sha256(b"".join(f.read_bytes() for f in files)).hexdigest()
    marker = VENV / f".installed-{requirements}"
    pip = [str(venv_python()), "-m", "pip", "--disable-pip-version-check", "-qq"]
    if not (marker.exists() and marker.read_text() == digest):
        say(f"installing {requirements} (pinned) into the virtualenv")
        subprocess.run(pip + ["install", "-r", str(ROOT / requirements)], check=True)  # -qq: errors only
        marker.write_text(digest)
    ensure_project_installed(pip)


def ensure_project_installed(pip: list[str]) -> None:
    """The project itself, editable, for its console script (.venv/bin/runtime, the CLI): again only when
    pyproject.toml or this checkout's place changed, or the script is gone. Without an index or a build environment
    (--no-deps --no-build-isolation: the pinned setuptools and wheel of requirements.txt build it), in about 2 s."""
    marker = VENV / ".installed-project"
    digest = hashlib.sha256((ROOT / "pyproject.toml").read_bytes() + str(ROOT).encode()).hexdigest()
    if marker.exists() and marker.read_text() == digest and (VENV / "bin" / "runtime").exists():
        return
    say("installing the project's `runtime` command into the virtualenv")
    subprocess.run(pip + ["install", "--no-deps", "--no-build-isolation", "--no-index", "-e", str(ROOT)],
                   check=True, cwd=ROOT)
    marker.write_text(digest)


# ---------------------------------------------------------------------------------------------------------------
# Stage two: services, Django, processes (inside the venv)
# ---------------------------------------------------------------------------------------------------------------
def data_dir() -> Path:
    path = Path(os.environ.get("EMBED_DATA", ROOT / "var")).resolve()
    path.mkdir(parents=True, exist_ok=True)
    return path


def private_file(path: Path, make) -> str:
    """Read a local secret, creating it (mode 0600) on first use; it never enters the repository."""
    if not path.exists():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(make())
    return path.read_text().strip()


class Services:
    """Embedded PostgreSQL/Valkey when no URL is given; stops only what it started itself."""

    def __init__(self, prefer_system: bool):
        from embedded import EmbeddedPostgres, EmbeddedValkey, port_is_open

        self.started = []
        self.env = {}
        data = data_dir()
        # TEST_SERVICES=embedded: ignore servers on 5432/6379 (checks the path a machine without them takes).
        prefer_system = prefer_system and os.environ.get("TEST_SERVICES") != "embedded"
        if not os.environ.get("DATABASE_URL"):
            if prefer_system and self._system_postgres_ready(port_is_open):
                self.env["DATABASE_URL"] = f"postgres://postgres@127.0.0.1:5432/{DATABASE_NAME}"
            else:
                self.pg = EmbeddedPostgres(data, int(os.environ.get("EMBED_PG_PORT", 54329)), DATABASE_NAME)
                # A killed worker's backend that was mid-statement ends (and frees its liveness lock) within 250 ms,
                # not when the statement does (docs/failover.md).
                self.pg.server_options = ["-c", "client_connection_check_interval=250"]
                self.started.append(self.pg)
                self.env["DATABASE_URL"] = self.pg.url
        if not os.environ.get("REDIS_URL"):
            if prefer_system and port_is_open(6379):
                # Database 15 so a test run never touches a dev runtime's queues on database 0.
                self.env["REDIS_URL"] = "redis://127.0.0.1:6379/15"
            else:
                self.valkey = EmbeddedValkey(data, int(os.environ.get("EMBED_REDIS_PORT", 63799)))
                self.started.append(self.valkey)
                # Tests use database 15 (and flush it), so they never touch a dev runtime's queues on 0.
                self.env["REDIS_URL"] = self.valkey.url.removesuffix("/0") + ("/15" if prefer_system else "/0")

    @staticmethod
    def _system_postgres_ready(port_is_open) -> bool:
        if not port_is_open(5432):
            return False
        import psycopg

        try:
            psycopg.connect("postgresql://postgres@127.0.0.1:5432/postgres", connect_timeout=3).close()
            return True
        except psycopg.Error:
            return False

    # Who stops the embedded servers: the last command using them (run, manage, seed, test…), whoever started them.
    # Each command holds a shared lock on USERS_LOCK while it runs; at its end, one that can take the lock exclusively
    # is the last and stops them. So a `manage` beside a `run` leaves the run's servers alone, and servers left
    # behind by a command that died (SIGKILL, a closed terminal) are stopped by the next command's end instead of
    # being silently reused and left running again. Only `services start` keeps them up on purpose (KEPT_MARK), until
    # `services stop`.
    USERS_LOCK = "embedded.users.lock"
    KEPT_MARK = "embedded.kept"

    def start(self) -> None:
        import fcntl

        from embedded import EmbeddedPostgres

        if not self.started:
            return
        self._users = (data_dir() / self.USERS_LOCK).open("a")
        try:
            fcntl.flock(self._users, fcntl.LOCK_EX | fcntl.LOCK_NB)
            alone = True
        except BlockingIOError:
            alone = False
        fcntl.flock(self._users, fcntl.LOCK_SH)  # (from exclusive: a conversion; else waits for no one)
        kept = (data_dir() / self.KEPT_MARK).exists()
        for service in self.started:
            name = type(service).__name__.removeprefix("Embedded")
            if not service.running():
                say(f"starting the embedded {name} on 127.0.0.1:{service.port}")
            elif kept:
                say(f"using the embedded {name} on 127.0.0.1:{service.port}, kept running by `dev.py services start`")
            elif alone:
                say(f"the embedded {name} on 127.0.0.1:{service.port} was left running by a command that did not "
                    f"stop it; using it, and stopping it when this command ends")
            else:
                say(f"sharing the embedded {name} on 127.0.0.1:{service.port} with the command already using it")
            service.start()
            if isinstance(service, EmbeddedPostgres):
                service.ensure_database()

    def stop(self) -> None:
        import fcntl

        users = getattr(self, "_users", None)
        if users is None:
            return
        try:
            fcntl.flock(users, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            say("leaving the embedded servers running: another command in this data folder still uses them")
            users.close()
            return
        try:
            if (data_dir() / self.KEPT_MARK).exists():
                say("leaving the embedded servers running: `dev.py services stop` stops them")
                return
            for service in reversed(self.started):
                if service.running():
                    say(f"stopping the embedded {type(service).__name__.removeprefix('Embedded')}")
                    service.stop()
        finally:
            users.close()


def django_env(extra: dict[str, str], *, development: bool) -> dict[str, str]:
    env = dict(os.environ)
    env.update(extra)
    env.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    env["PYTHONUNBUFFERED"] = "1"
    data = data_dir()
    env.setdefault("SECRET_KEY", private_file(data / "secret_key", lambda: secrets.token_urlsafe(50)))
    # Everything local lives in the data folder: artifacts, generated corpora, the examples' "external systems".
    env.setdefault("MEDIA_ROOT", str(data / "media"))
    env.setdefault("CORPUS_ROOT", str(data / "corpus"))
    env.setdefault("EXTERNAL_ROOT", str(data / "external"))
    # The audit seals' signing key: a file outside the database, generated on first use (tasks_app/audit/anchors.py).
    env.setdefault("AUDIT_SIGNING_KEY_FILE", str(data / "audit_signing_key.pem"))
    env.setdefault("AUDIT_SIGNING_KEY_GENERATE", "true")
    if development:
        env.setdefault("DEBUG", "true")
    return env


def manage_in_order(env: dict[str, str], *commands: list[str]) -> None:
    """manage.py commands one after the other in one process (deploy/manage_in_order.py: Django boots once, not once
    a command); CalledProcessError when one fails, the rest not run."""
    args = [arg for command in commands for arg in ("--then", *command)][1:]
    subprocess.run([sys.executable, str(ROOT / "deploy" / "manage_in_order.py"), *args], env=env, cwd=ROOT,
                   check=True)


@contextmanager
def running_services(*, prefer_system: bool, development: bool):
    """Start what is needed, yield the Django environment for child processes, stop what we started."""
    from embedded import EmbeddedServiceError

    services = Services(prefer_system=prefer_system)
    try:
        services.start()
        yield django_env(services.env, development=development)
    except EmbeddedServiceError as error:
        fail(str(error))
    finally:
        services.stop()


def web_command(python: str, host: str, port: int | str, processes: int,
                shutdown_grace_seconds: int = 5, log_level: str = "info") -> list[str]:
    """The web tier: uvicorn with `processes` worker processes on one port (its supervisor restarts one that dies),
    the C HTTP parser and event loop (httptools, uvloop), keep-alive for pollers. Each process has its own bounded
    database pools (config/settings/services.py), and nothing else of its own: any process answers any request.

    On SIGTERM uvicorn waits for open connections to end, and an SSE stream, an MCP listen stream or a blocking
    tasks/result does not end on its own: without a bound a stopping web process (a deploy, Ctrl-C) hangs until its
    supervisor kills it. After `shutdown_grace_seconds` the streams are closed; their clients reconnect to another
    process and lose nothing (a stream resumes from Last-Event-ID, the snapshot is the truth)."""
    return [python, "-m", "uvicorn", "config.asgi:application", "--host", str(host), "--port", str(port),
            "--workers", str(processes), "--http", "httptools", "--loop", "uvloop", "--timeout-keep-alive", "75",
            "--timeout-graceful-shutdown", str(shutdown_grace_seconds), "--no-access-log", "--lifespan", "on",
            "--log-level", log_level.lower(), *forwarded_args(os.environ.get("FORWARDED_ALLOW_IPS"))]


def forwarded_args(trusted: str | None) -> list[str]:
    """Whose X-Forwarded-For / -Proto uvicorn believes: only the proxies named in FORWARDED_ALLOW_IPS (addresses or
    networks, comma-separated), and nobody's when it is unset. uvicorn's own default trusts 127.0.0.1 — every caller
    of a run on one machine — and '*' makes the client address the LEFTMOST X-Forwarded-For entry, which the client
    writes itself: either way a caller could choose the address that per-address limits (oauth.registration_rate),
    METRICS_ALLOWED_NETWORKS and the logs see (an outside check did: 12 registrations past the limit, each with its
    own made-up X-Forwarded-For). With named proxies uvicorn takes the right-most address no trusted proxy added."""
    trusted = (trusted or "").strip()
    if not trusted:
        return ["--no-proxy-headers"]
    if "*" in trusted:
        raise SystemExit("FORWARDED_ALLOW_IPS='*' would let every client choose its own address (X-Forwarded-For): "
                         "name the proxies in front (addresses or networks, comma-separated)")
    return ["--proxy-headers", "--forwarded-allow-ips", trusted]


def metrics_dir_emptied() -> Path:
    """The run's Prometheus multiprocess directory (var/metrics): every web and worker process counts into it and
    the web's /metrics reports the sum. Emptied at each start: the counts of processes gone are not this run's."""
    path = data_dir() / "metrics"
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


def command_run() -> int:
    from embedded import port_is_open
    from honcho.manager import Manager
    from honcho.printer import Printer

    tool_port = tool_server_port()
    tool_url = f"http://127.0.0.1:{tool_port}/mcp"
    if port_is_open(tool_port):  # (else its supervisor would restart it every second, failing each time)
        fail(f"port {tool_port} for the example tool server is taken (a `dev.py tool-server` left running?): stop "
             f"what listens there, or set TOOL_SERVER_PORT to a free port")
    try:
        with running_services(prefer_system=False, development=True) as env:
            host = os.environ.get("WEB_HOST", "127.0.0.1")  # loopback unless told otherwise
            port = os.environ.get("WEB_PORT", "8000")
            say("applying migrations")
            manage_in_order(
                env,
                ["ensure_database"],  # (a DATABASE_URL naming a database the server does not have yet)
                ["migrate", "--noinput", "-v", "0"],
                ["ensure_dev_login", "--credentials-dir", str(data_dir()), "-v", "0"],
                # The example downstream MCP tool server, on loopback, as the local tenant's `reports` (added through
                # the same service as `tool_servers add`, unless the tenant has a server of that name): out of the box
                # a document_review publishes its report through a real, durable tool call (config/runtime.yaml
                # examples.document_review). Its call log goes to a file, not among the processes' lines.
                ["check", "--database", "default", "--tag", "runtime", "--deploy", "--fail-level", "ERROR"],
                ["tool_servers", "add", DEV_TOOL_SERVER, tool_url, "--tenant", DEV_TENANT, "--if-absent"])
            # Routine lines (each request, each task received, each process's start-up) only when asked for:
            # LOG_LEVEL=INFO. Warnings and errors always show.
            level = os.environ.get("LOG_LEVEL", "WARNING").upper()
            env = {**env, "LOG_LEVEL": level, "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir_emptied())}
            concurrency = os.environ.get("WORKER_CONCURRENCY", "4")
            manager = Manager(printer=Printer(output=sys.stdout))  # (its default is the sys.stdout of its import)
            python = sys.executable
            processes = int(os.environ.get("WEB_PROCESSES", "2"))
            grace = int(os.environ.get("WEB_SHUTDOWN_GRACE_SECONDS", "5"))
            quiet = "" if level in ("DEBUG", "INFO") else " --quiet"  # celery's start-up banner, only with INFO
            manager.add_process("web", " ".join(web_command(python, host, port, processes, grace, level)), env=env,
                                cwd=str(ROOT))
            for n in (1, 2):
                # As in tests and benchmarks: no gossip (a pub/sub consumer that, like remote control, makes a
                # worker exit on a broker restart: see config/settings/services.py), no mingle, no heartbeat
                # events. Supervised: a worker that exits (SIGKILL, broker restart) is restarted, instead of
                # honcho stopping the whole stack.
                manager.add_process(f"worker{n}", f"{python} {ROOT / 'deploy' / 'supervise.py'} {python} -m celery "
                                                  f"-A config{quiet} worker -n worker{n}@%h "
                                                  f"--concurrency {concurrency} --loglevel {level} --without-gossip "
                                                  f"--without-mingle --without-heartbeat", env=env, cwd=str(ROOT))
            manager.add_process("beat", f"{python} -m celery -A config{quiet} beat --loglevel {level} "
                                        f"--scheduler config.beat:RuntimeScheduler "
                                        f"--pidfile=", env=env, cwd=str(ROOT))
            # Supervised as the workers are: a tool server that exits (killed) is restarted, the stack keeps going.
            manager.add_process("tools", f"{python} {ROOT / 'deploy' / 'supervise.py'} {python} "
                                         f"{ROOT / 'examples' / 'tool_server.py'} --port {tool_port} --host 127.0.0.1 "
                                         f"--log {data_dir() / 'tool-server.calls.jsonl'} "
                                         f"--state {data_dir() / 'tool_server' / 'state.jsonl'}",
                                 env=env, cwd=str(ROOT))
            say(f"starting the web tier, two workers, beat and the example tool server ({tool_url}); how to sign in "
                f"follows once everything answers")
            threading.Thread(target=say_sign_in_when_ready, args=(host, port), daemon=True).start()
            manager.loop()  # Ctrl-C / SIGTERM: honcho sends SIGTERM to every process group, SIGKILL after 5 s
            return 0 if manager.returncode in (0, 130, 143) else manager.returncode
    except subprocess.CalledProcessError as error:
        fail(f"{' '.join(map(str, error.cmd[1:3]))} failed with exit {error.returncode}")
    except KeyboardInterrupt:
        return 130


def sign_in_lines(host: str, port: str | int) -> str:
    """How to sign in to the local stack: what `run` prints once it answers, and `info` prints on demand. The password
    and the token are read from the data folder's files (mode 0600; ensure_dev_login makes them)."""
    data = Path(os.environ.get("EMBED_DATA", ROOT / "var")).resolve()  # (read only: `info` makes no folder)
    base = f"http://{host}:{port}"
    password_file, token_file = data / "dev-admin-password", data / "dev-api-token"
    password = (f"password: cat {password_file}" if password_file.exists()
                else "password: set one with `python3.11 deploy/dev.py manage changepassword admin`")
    token = (f"export TOKEN=$(cat {token_file})   (tenant 'default')" if token_file.exists()
             else "none yet: `python3.11 deploy/dev.py run` makes one")
    return (f"\n  Admin:     {base}/admin/   user 'admin', {password}\n"
            f"  API token: {token}\n"
            f"  API docs:  {base}/runtime/docs\n"
            f"  MCP:       {base}/mcp   (Authorization: Bearer $TOKEN)\n"
            f"  Agents:    {model_line()}\n")


def model_line() -> str:
    """Which language model `agent` tasks call, as the environment says (runtime.yaml's `model` may say otherwise)."""
    base_url, name = os.environ.get("MODEL_BASE_URL"), os.environ.get("MODEL_NAME")
    if base_url and name:
        return f"{name} at {base_url}" + (" (key: MODEL_API_KEY)" if os.environ.get("MODEL_API_KEY") else "")
    return ("no model from the environment: set MODEL_BASE_URL and MODEL_NAME (and MODEL_API_KEY) before `run`, "
            "or `model:` in config/runtime.yaml")


def say_sign_in_when_ready(host: str, port: str, seconds: float = 180) -> None:
    """Print how to sign in once the web tier answers /readyz (database and broker reachable): the last lines of
    the start-up, not lost among the processes' own."""
    import urllib.request

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://{host}:{port}/readyz", timeout=2) as response:
                if response.status == 200:
                    say("ready:" + sign_in_lines(host, port) + "  (again at any time: python3.11 deploy/dev.py info)")
                    return
        except OSError:
            pass
        time.sleep(0.2)
    say(f"the web tier did not answer http://{host}:{port}/readyz within {seconds:.0f} s: see the lines above")


def command_info() -> int:
    """How to sign in to the local stack, without starting anything."""
    print(sign_in_lines(os.environ.get("WEB_HOST", "127.0.0.1"), os.environ.get("WEB_PORT", "8000")).lstrip("\n"))
    return 0


def command_manage(args: list[str]) -> int:
    """manage.py with the development environment: the same database, broker and local secret key as `run`.
    Uses the embedded servers of a running `run` (or starts them for the command and stops them after)."""
    with running_services(prefer_system=False, development=True) as env:
        return subprocess.run([sys.executable, str(ROOT / "manage.py"), *args], env=env, cwd=ROOT).returncode


def command_seed(args: list[str]) -> int:
    """bench/seed_tasks.py with the same environment as `manage`: it seeds the database `run` serves."""
    with running_services(prefer_system=False, development=True) as env:
        return subprocess.run([sys.executable, str(ROOT / "bench" / "seed_tasks.py"), *args], env=env,
                              cwd=ROOT).returncode


# The project's own packages, compiled before the suite: the suite starts some hundreds of Python processes (workers,
# web tiers, commands), and where PYTHONDONTWRITEBYTECODE is set (seen on CI machines) each would compile every module
# of ours again from source (~0.2 s of CPU per start; measured: importing the apps 1.04 → 0.85 s). Reading .pyc files
# is unaffected by that variable; the suite's own processes are also run without it (command_test).
COMPILED_PACKAGES = ("config", "tasks_app", "steering_app", "checkpoints_app", "mcp_bridge", "agents_app", "bench",
                     "deploy", "examples", "tests")


def compile_project() -> None:
    import compileall

    for package in COMPILED_PACKAGES:
        if (ROOT / package).is_dir():
            compileall.compile_dir(ROOT / package, quiet=1, workers=0)


def command_test(pytest_args: list[str]) -> int:
    compile_project()
    with running_services(prefer_system=True, development=False) as env:
        # And let pytest keep its rewritten test modules (4 xdist workers would otherwise each rewrite every one).
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        say(f"database {env['DATABASE_URL'].split('@')[-1]}, broker {env['REDIS_URL'].split('//')[-1]}")
        code = subprocess.run([sys.executable, "-m", "pytest", *pytest_args], env=env, cwd=ROOT).returncode
    if code == 5:
        say("pytest collected no tests: that is a failure, the suite must run tests")
        return 1
    return code


def command_bench(script: str, broker_db: int, args: list[str]) -> int:
    """bench/<script>.py on the test command's services (system PostgreSQL/Redis when reachable, else embedded)."""
    with running_services(prefer_system=True, development=False) as env:
        env["REDIS_URL"] = env["REDIS_URL"].rsplit("/", 1)[0] + f"/{broker_db}"  # its own broker database
        return subprocess.run([sys.executable, str(ROOT / "bench" / f"{script}.py"), *args], env=env,
                              cwd=ROOT).returncode


def command_services(action: str) -> int:
    from embedded import EmbeddedPostgres, EmbeddedServiceError, EmbeddedValkey

    data = data_dir()
    pg = EmbeddedPostgres(data, int(os.environ.get("EMBED_PG_PORT", 54329)), DATABASE_NAME)
    valkey = EmbeddedValkey(data, int(os.environ.get("EMBED_REDIS_PORT", 63799)))
    try:
        if action == "start":
            pg.start()
            pg.ensure_database()
            valkey.start()
            (data / Services.KEPT_MARK).touch()  # kept running until `services stop`, whatever else ends
            print(f"DATABASE_URL={pg.url}\nREDIS_URL={valkey.url}")
        elif action == "stop":
            (data / Services.KEPT_MARK).unlink(missing_ok=True)
            valkey.stop()
            pg.stop()
        else:
            print(f"postgres: {'running' if pg.status() == 0 else 'stopped'} ({pg.url})")
            print(f"valkey:   {'running' if valkey.ping() else 'stopped'} ({valkey.url})")
    except EmbeddedServiceError as error:
        fail(str(error))
    return 0


def command_tool_server(args: list[str]) -> int:
    """examples/tool_server.py in the virtualenv, in the foreground (it needs no database or broker); its state kept in
    the data folder's tool_server/state.jsonl unless --state says where."""
    if not any(arg == "--port" or arg.startswith("--port=") for arg in args):
        args = ["--port", str(TOOL_SERVER_PORT), *args]
    if not any(arg == "--state" or arg.startswith("--state=") for arg in args):
        args = [*args, "--state", str(data_dir() / "tool_server" / "state.jsonl")]
    script = ROOT / "examples" / "tool_server.py"
    os.execv(sys.executable, [sys.executable, str(script), *args])  # Ctrl-C and SIGTERM reach the server itself


COMMANDS = {
    "run": "python3.11 deploy/dev.py run\n\nSet up (virtualenv, pinned requirements), start the embedded PostgreSQL "
           "and Valkey unless DATABASE_URL / REDIS_URL are set, migrate, make the local admin login, then run the web "
           "tier, two Celery workers, beat and the example MCP tool server (examples/tool_server.py, on "
           "127.0.0.1:TOOL_SERVER_PORT, its call log in EMBED_DATA/tool-server.calls.jsonl, its state kept in "
           "EMBED_DATA/tool_server/state.jsonl across restarts) in the foreground. The "
           "tool server is the default tenant's tool server `reports` (added unless that tenant has one of that "
           "name), through which document_review publishes its report. Ctrl-C stops everything it started.\n"
           "Settings: WEB_HOST (127.0.0.1), WEB_PORT (8000), WEB_PROCESSES (2), WORKER_CONCURRENCY (4), "
           f"TOOL_SERVER_PORT ({TOOL_SERVER_PORT}), EMBED_DATA (./var), EMBED_PG_PORT (54329), EMBED_REDIS_PORT "
           "(63799).",
    "test": "python3.11 deploy/dev.py test [PYTEST ARGS]\n\nSet up, then the whole test suite on PostgreSQL and Redis "
            "at 127.0.0.1:5432 / 6379 when they answer, else on the embedded ones (TEST_SERVICES=embedded forces "
            "those). PYTEST ARGS go to pytest, e.g. `-k idempotent -x`, `-n 0` for one process.",
    "manage": "python3.11 deploy/dev.py manage CMD [ARGS]\n\nmanage.py with the run command's database, broker and "
              "secret key (the servers of a running `run`, or started for the command). `manage help` lists "
              "Django's commands.",
    "seed": "python3.11 deploy/dev.py seed --count N [ARGS]\n\nStore N finished tasks in the database `run` serves "
            "(bench/seed_tasks.py, whose options `python3.11 bench/seed_tasks.py --help` lists).",
    "bench": "python3.11 deploy/dev.py bench [--http | --sse | --plan-length | --slice-survey | --step-cpu | --tools | "
             "--agents | --compare] [ARGS]\n\n"
             "The benchmarks, on the test command's services: bench/engine.py by default, bench/web_load.py "
             "(--http), bench/sse_load.py (--sse), bench/plan_length.py (--plan-length), bench/slice_survey.py "
             "(--slice-survey), bench/step_cpu.py (--step-cpu), bench/tool_calls.py (--tools), bench/agent_turns.py "
             "(--agents), bench/compare.py (--compare: this runtime, a plain Celery chain and DBOS 3.4 side by side). "
             "Each script's own options: python3.11 bench/<script>.py --help (in the virtualenv).",
    "chaos": "python3.11 deploy/dev.py chaos [ARGS]\n\nKill workers and crash PostgreSQL and Valkey during a run on "
             "servers of its own, then check every guarantee (bench/chaos.py; its options: --help in the "
             "virtualenv). With --soak: bench/soak.py, steering people, agents, tool calls and every fault kind. "
             "With --hosts: bench/hosts.py, two hosts in network namespaces (root), one killed, cut off, "
             "partitioned from PostgreSQL; --pooler puts PgBouncer in front.",
    "info": "python3.11 deploy/dev.py info\n\nHow to sign in to the local stack (admin, API token, docs, MCP), read "
            "from the data folder; starts nothing.",
    "services": "python3.11 deploy/dev.py services start|stop|status\n\nOnly the embedded PostgreSQL and Valkey of "
                "the data folder: `start` keeps them running until `stop` (other commands then leave them up).",
    "tool-server": f"python3.11 deploy/dev.py tool-server [--port N] [--host H] [--log PATH] [--state PATH] "
                   f"[--token-env NAME]\n\n"
                   f"The example downstream MCP server (examples/tool_server.py; docs/tools.md) in the virtualenv: "
                   f"tools lookup, upsert, append, fail and report (a long-running tool answering with a task) at "
                   f"http://127.0.0.1:{TOOL_SERVER_PORT}/mcp unless --port says otherwise, its call log on standard "
                   f"output unless --log names a file. Its state (values, the appended list, the idempotency keys "
                   f"applied, the tasks) is journalled to EMBED_DATA/tool_server/state.jsonl (default "
                   f"./var/tool_server/state.jsonl) and kept across restarts, unless --state names another file. "
                   f"--token-env NAME requires Authorization: Bearer <the value of $NAME>. Needs no database or "
                   f"broker.",
}
HELP_FLAGS = {"-h", "--help"}


def usage_error(message: str) -> int:
    print(f"dev.py: {message}\nThe commands: {', '.join(COMMANDS)}; `python3.11 deploy/dev.py --help` says what "
          f"each does.", file=sys.stderr)
    return 2


def main(argv: list[str]) -> int:
    sys.stdout, sys.stderr = OutputThatOutlivesItsReader(sys.stdout), OutputThatOutlivesItsReader(sys.stderr)
    # Help first, with the standard library only: it starts nothing and installs nothing.
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    if argv[0] in HELP_FLAGS or argv[0] == "help":
        print(COMMANDS[argv[1]] if len(argv) > 1 and argv[1] in COMMANDS else __doc__)
        return 0
    command = argv[0]
    if command not in COMMANDS:
        return usage_error(f"unknown command {command!r}")
    # `run --help`, `services --help`…; not `test` (its args are pytest's) nor `manage` (Django's) past the command.
    if HELP_FLAGS & set(argv[1:2] if command in ("test", "manage") else argv[1:]):
        print(COMMANDS[command])
        return 0
    if command == "services" and argv[1:2] not in ([], ["start"], ["stop"], ["status"]):
        return usage_error(f"services takes start, stop or status, not {' '.join(argv[1:])!r}")
    if command == "info":
        return command_info()  # the standard library only: no virtualenv needed
    if not in_venv():
        # The test tools only for the commands that use them: `manage` and `seed` need what `run` needs.
        ensure_venv("requirements-test.txt" if command in ("test", "bench", "chaos") else "requirements.txt")
        os.execv(str(venv_python()), [str(venv_python()), __file__, *argv])
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    if command == "run":
        return command_run()
    if command == "test":
        return command_test(argv[1:])
    if command == "manage":
        return command_manage(argv[1:])
    if command == "seed":
        return command_seed(argv[1:])
    if command == "tool-server":
        return command_tool_server(argv[1:])
    if command == "bench" and "--sse" in argv[1:]:
        return command_bench("sse_load", 11, [arg for arg in argv[1:] if arg != "--sse"])
    if command == "bench" and "--plan-length" in argv[1:]:
        return command_bench("plan_length", 10, [arg for arg in argv[1:] if arg != "--plan-length"])
    if command == "bench" and "--step-cpu" in argv[1:]:
        return command_bench("step_cpu", 10, [arg for arg in argv[1:] if arg != "--step-cpu"])
    if command == "bench" and "--slice-survey" in argv[1:]:
        return command_bench("slice_survey", 10, [arg for arg in argv[1:] if arg != "--slice-survey"])
    if command == "bench" and "--tools" in argv[1:]:
        # (Its own PostgreSQL and Valkey, as bench/engine.py: the broker database named here is never used.)
        return command_bench("tool_calls", 14, [arg for arg in argv[1:] if arg != "--tools"])
    if command == "bench" and "--compare" in argv[1:]:
        # (Its own PostgreSQL and Valkey, as bench/engine.py: the broker database named here is never used.)
        return command_bench("compare", 14, [arg for arg in argv[1:] if arg != "--compare"])
    if command == "bench" and "--agents" in argv[1:]:
        # (Its own PostgreSQL and Valkey too, and the scripted model of tests/clients as the language model.)
        return command_bench("agent_turns", 14, [arg for arg in argv[1:] if arg != "--agents"])
    if command == "bench" and "--http" in argv[1:]:
        return command_bench("web_load", 12, [arg for arg in argv[1:] if arg != "--http"])
    if command == "bench":
        return command_bench("engine", 14, argv[1:])
    if command == "chaos" and "--hosts" in argv[1:]:
        return command_bench("hosts", 13, [arg for arg in argv[1:] if arg != "--hosts"])
    if command == "chaos" and "--soak" in argv[1:]:
        return command_bench("soak", 13, [arg for arg in argv[1:] if arg != "--soak"])
    if command == "chaos":
        return command_bench("chaos", 13, argv[1:])
    return command_services(argv[1] if len(argv) > 1 else "status")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
