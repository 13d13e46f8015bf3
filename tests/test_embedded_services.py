"""The embedded launcher's messages for the mistakes a newcomer makes: each must say what to do."""

import os
import signal
import socket

import pytest

from tests.embedded_support import data_folder, embedded, free_port


@pytest.fixture
def taken_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def test_it_explains_a_port_taken_by_another_program(taken_port):
    with data_folder() as data:
        with pytest.raises(embedded.EmbeddedServiceError, match=f"port {taken_port} .* already taken.*EMBED_REDIS_PORT"):
            embedded.EmbeddedValkey(data, taken_port).start()
        with pytest.raises(embedded.EmbeddedServiceError, match=f"port {taken_port} .* already taken.*EMBED_PG_PORT"):
            embedded.EmbeddedPostgres(data, taken_port, "x").start()


def test_it_explains_a_half_initialised_data_folder():
    with data_folder() as data:
        (data / "pg").mkdir()
        (data / "pg" / "postgresql.conf").write_text("# left by an interrupted run\n")

        with pytest.raises(embedded.EmbeddedServiceError, match="no complete PostgreSQL cluster.*rm -rf"):
            embedded.EmbeddedPostgres(data, free_port(), "x").start()


@pytest.mark.skipif(os.geteuid() != 0, reason="the server-account check applies when run as root")
def test_it_explains_a_data_folder_the_server_account_cannot_reach():
    with data_folder() as data:
        private = data / "private"
        private.mkdir(mode=0o700)
        os.chmod(private, 0o700)

        with pytest.raises(embedded.EmbeddedServiceError, match="cannot reach .*EMBED_DATA"):
            embedded.EmbeddedPostgres(private / "inner", free_port(), "x").start()


def test_it_starts_both_servers_and_keeps_data_across_a_restart():
    with data_folder() as data:
        pg = embedded.EmbeddedPostgres(data, free_port(), "smoke")
        valkey = embedded.EmbeddedValkey(data, free_port())
        try:
            pg.start()
            pg.ensure_database()
            valkey.start()
            assert valkey.ping() and pg.status() == 0
            import psycopg
            import redis

            with psycopg.connect(pg.url, autocommit=True) as conn:
                conn.execute("CREATE TABLE kept (v int); INSERT INTO kept VALUES (7)")
            redis.Redis.from_url(valkey.url).rpush("queued", "message")
            pg.stop()
            valkey.stop()
            assert pg.status() == 3 and not valkey.ping()

            pg.start()
            valkey.start()
            with psycopg.connect(pg.url) as conn:
                assert conn.execute("SELECT v FROM kept").fetchone() == (7,)
            assert redis.Redis.from_url(valkey.url).lrange("queued", 0, -1) == [b"message"]  # AOF kept it
        finally:
            valkey.stop()
            pg.stop()


def test_it_stops_a_valkey_that_refuses_to_shut_down():
    with data_folder() as data:
        valkey = embedded.EmbeddedValkey(data, free_port())
        valkey.start()
        pid = valkey._pid()
        try:
            __import__("redis").Redis(port=valkey.port).set("k", "v")
            (valkey.dir / "dump.rdb").mkdir()  # its final save cannot replace a folder: SIGTERM will not stop it

            valkey.stop(grace_seconds=2)

            assert not valkey.ping()
            with pytest.raises(ProcessLookupError):
                for _ in range(50):  # reaped lazily on this VM (pitfall 8): wait until gone or a zombie
                    os.kill(pid, 0)
                    if open(f"/proc/{pid}/stat").read().split()[2] == "Z":
                        raise ProcessLookupError
                    __import__("time").sleep(0.1)
        finally:
            try:
                os.kill(pid, signal.SIGKILL)  # never leave a server behind, whatever failed above
            except ProcessLookupError:
                pass
