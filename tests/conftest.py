"""Fixtures on real PostgreSQL and Redis (the test command points DATABASE_URL / REDIS_URL at them)."""

import os
import signal
import socket

import pytest
from django.contrib.auth import get_user_model
from rest_framework.test import APIClient

from tasks_app.services import api_token_create, tenant_get_or_create

# Fixture modules for every test module (pytest reads pytest_plugins only in this, the top conftest).
pytest_plugins = ["tests.support.console", "tests.support.model", "tests.support.tokens"]


def pytest_collection_finish(session):
    """A client library's venv is built beside the first tests when a test that uses it is to run (tests/clients)."""
    from tests.clients.support import USED_BY

    files = {item.nodeid.split("::")[0] for item in session.items}
    session.config._mcp_clients_builds = [venv.build_in_background() for path, venv in USED_BY.items()
                                          if path in files]


# Whole-stack runs that take tens of seconds each: started first, so that in a parallel run (pyproject's addopts) the
# other process works through the short tests meanwhile instead of waiting for one of these at the end.
LONGEST_FIRST = ("tests/test_chaos.py", "tests/test_two_hosts.py", "tests/test_run_command.py", "tests/test_cli.py",
                 "tests/test_bench_tools.py", "tests/test_bench_agents.py", "tests/test_mcp_conformance.py")


@pytest.hookimpl(trylast=True)  # after pytest-django's ordering (plain `db` tests before transactional ones)
def pytest_collection_modifyitems(items):
    rank = {path: number for number, path in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))  # stable: the rest keep their order


def pytest_sessionfinish(session):
    for build in getattr(session.config, "_mcp_clients_builds", ()):
        if build is not None and build.poll() is None:
            os.killpg(build.pid, signal.SIGKILL)  # the run ended first (-x, an interrupt): the next run builds again
            build.wait()


@pytest.fixture
def tenant(db):
    return tenant_get_or_create(slug="acme", name="Acme")


@pytest.fixture
def other_tenant(db):
    return tenant_get_or_create(slug="globex", name="Globex")


def _client_for(tenant, username):
    user = get_user_model().objects.create_user(username=username, password=None)
    _, raw = api_token_create(tenant=tenant, user=user, name="test")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    client.user = user
    client.raw_token = raw
    return client


@pytest.fixture
def api(tenant):
    """An API client authenticated with a bearer token of tenant `acme`."""
    return _client_for(tenant, "alice")


@pytest.fixture
def other_api(other_tenant):
    """An API client of another tenant, `globex`."""
    return _client_for(other_tenant, "mallory")



@pytest.fixture
def external_root(settings, tmp_path):
    """The example workflows' 'external systems' (effects log, outbox) write here, outside PostgreSQL."""
    settings.EXTERNAL_ROOT = tmp_path / "external"
    settings.MEDIA_ROOT = tmp_path / "media"
    return settings.EXTERNAL_ROOT


@pytest.fixture(scope="session")
def django_db_setup(request, django_test_environment, django_db_blocker, django_db_modify_db_settings):
    """pytest-django's fixture, with the database copied from a migrated template (tests/template_db.py) instead
    of migrated in every test process. What a test marked serialized_rollback restores is serialized as Django's
    setup would (tests/test_reaper_schedule.py: the rows migrations made)."""
    from pytest_django.fixtures import _get_databases_for_setup

    from tests.template_db import test_database_create, test_database_drop

    _, serialized_aliases = _get_databases_for_setup(request.session.items)
    with django_db_blocker.unblock():
        name = test_database_create()
        if serialized_aliases:
            from django.core.management import call_command
            from django.db import connection

            connection._test_serialized_contents = connection.creation.serialize_db_to_string()
            restore = connection.creation.deserialize_db_from_string

            def restore_into_empty_tables(data):
                # Restored over what the database holds now, a row migrate made collides with its copy made again
                # under another id (auth_group "viewer": a server process a test started committed it outside any
                # test's transaction, after a flush) — a fresh clone's CI failed so. Empty the tables first.
                call_command("flush", verbosity=0, interactive=False, database=connection.alias,
                             inhibit_post_migrate=True)
                restore(data)

            connection.creation.deserialize_db_from_string = restore_into_empty_tables
    yield
    with django_db_blocker.unblock():
        test_database_drop(name)


@pytest.fixture(scope="session", autouse=True)
def _lease_renewer_closed_at_the_end(django_db_setup):
    """The lease renewer keeps its connection for the process's life; close it before the test database goes."""
    yield
    from tasks_app.engine.lease import lease_renewer_shutdown

    lease_renewer_shutdown()


@pytest.fixture(scope="session", autouse=True)
def _flush_between_tests_with_delete():
    """Django empties the database after each transactional test (flush) with one TRUNCATE of every table. On
    PostgreSQL a TRUNCATE makes new files for each table and index, many times slower than a DELETE of the few rows
    a test leaves, over some 300 transactional tests (figures: docs/performance.md; tests only: nothing else
    flushes).

    The order of the DELETEs does not matter: flush runs them in one transaction and every foreign key is DEFERRABLE
    INITIALLY DEFERRED (Django makes them so; no migration adds another kind)."""
    from unittest import mock

    from django.db.backends.postgresql.operations import DatabaseOperations

    truncate = DatabaseOperations.sql_flush
    # What migrate made and the post-migrate signal would make again, row for row, after every test: no test
    # changes these two (a test's permissions are grants to its users and groups, which are deleted).
    KEPT_ACROSS_TESTS = {"django_content_type", "auth_permission"}

    def delete_every_row(self, style, tables, *, reset_sequences=False, allow_cascade=False):
        if reset_sequences or not tables:
            return truncate(self, style, tables, reset_sequences=reset_sequences, allow_cascade=allow_cascade)
        # The append-only tables (events, admin actions, seals) accept DELETE only in a transaction that says it
        # purges (tasks_app migration 0029): the flush is one.
        return ["SELECT set_config('runtime.purge', 'on', true);"] + [
            f"{style.SQL_KEYWORD('DELETE FROM')} {style.SQL_FIELD(self.quote_name(table))};" for table in tables
            if table not in KEPT_ACROSS_TESTS]

    with mock.patch.object(DatabaseOperations, "sql_flush", delete_every_row):
        yield


def _broker_flush() -> None:
    import redis
    from django.conf import settings as django_settings

    if os.environ.get("TEST_BROKER_OWNED") != "1":
        return  # not a test database: never flush someone's queues
    client = redis.Redis.from_url(django_settings.REDIS_URL)
    client.flushdb()
    client.close()


@pytest.fixture(autouse=True)
def _no_hint_outlives_its_test():
    """A test that queues tasks without running them leaves their run_step hints in the broker; a later test's worker
    would take them all at once (each a claim statement, 'not_claimed'), and a test that watches a worker stay quiet
    (tests/test_steering.py, tests/test_waits_workers.py) would see it busy. Each test starts with an empty broker."""
    yield
    _broker_flush()


@pytest.fixture(scope="session", autouse=True)
def _empty_test_broker():
    """Tests own the broker database (deploy/dev.py test points REDIS_URL at database 15, tests/xdist_env.py gives
    each parallel test process its own): start it empty."""
    _broker_flush()


@pytest.fixture
def new_task(tenant):
    """new_task(workflow="demo_steps", **input) → a queued task of tenant `acme`, created through the service."""
    from tests.engine_support import create_engine_task

    def make(workflow="demo_steps", **input_):
        return create_engine_task(tenant, workflow, **input_)

    return make


@pytest.fixture
def step_context(new_task):
    """step_context(**overrides) → a StepContext for step 1 of a fresh task whose lease the test holds."""
    from tasks_app.engine.context import StepContext
    from tasks_app.engine.lease import lease_claim
    from tasks_app.engine.state import DurableState

    def make(*, task=None, state=None, **overrides):
        task = task or new_task(steps=1)
        claim = lease_claim(task_id=task.id, owner="test-worker")
        values = dict(fence=claim.fence, step_seq=1, step_index=0, step_name="s", attempt=1, goal=None, input={},
                      state=DurableState(state if state is not None else {}), artifact_refs={})
        values.update(overrides)
        return StepContext(**values)

    return make


@pytest.fixture
def broker_down():
    """Point the Celery app at a port nobody listens on for the test: every send fails fast."""
    from config.celery import app

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead_port = sock.getsockname()[1]
    original = app.conf.broker_url

    def point_broker_at(url):
        # Drop every cached connection and producer (kombu keeps them in global pools keyed by URL, and a
        # force-closed pool stays registered there), so the next send connects to `url` afresh.
        from kombu import pools

        app.conf.broker_url = url
        pools.reset()
        app._pool = None
        app.amqp._producer_pool = None

    point_broker_at(f"redis://127.0.0.1:{dead_port}/0")
    try:
        yield point_broker_at
    finally:
        point_broker_at(original)


@pytest.fixture
def workers(tmp_path):
    """workers(name, **kwargs) → a real `celery worker` process on the test database and broker, SIGKILLed at the
    end of the test (tests/worker_support.Worker)."""
    from tests.worker_support import Worker

    started = []

    def start(name, **kwargs):
        worker = Worker(name, tmp_path, **kwargs)
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.stop()


@pytest.fixture(scope="session")
def _shared_web_processes(tmp_path_factory):
    """Web processes kept for the whole run (of this test process), by (env, n): see `web`."""
    servers = {}
    yield servers, tmp_path_factory.mktemp("shared-web")
    for server in servers.values():
        server.stop()


@pytest.fixture
def web(transactional_db, tmp_path, request, _shared_web_processes):
    """web(**env) → a real uvicorn process serving config.asgi on the test database (tests/web_support.WebProcess),
    stopped at the end of the test; rows must be committed for it to see them.

    In a module that sets SHARED_WEB = True, the process outlives the test: the next test of the run that asks for
    one with the same env (the n-th such call of a test gets the n-th such process, so a test of two processes still
    has two) reuses it — a web process keeps nothing of a request but what the database holds, and starting one is
    seconds the suite spends dozens of times. A test that stops, restarts or reads the log of its process, or must
    see one start, asks web(private=True)."""
    from tests.web_support import WebProcess

    started, shared = [], getattr(request.module, "SHARED_WEB", False)
    servers, shared_dir = _shared_web_processes
    asked: dict[tuple, int] = {}

    def start(*, private: bool = False, **env):
        env = {k: str(v) for k, v in env.items()}
        if shared and not private:
            key = tuple(sorted(env.items()))
            asked[key] = asked.get(key, 0) + 1
            server = servers.get((key, asked[key]))
            if server is None or server.process.poll() is not None:
                server = WebProcess(shared_dir, env=env, name=f"shared-web{len(servers)}")
                servers[(key, asked[key])] = server
            return server
        process = WebProcess(tmp_path, env=env, name=f"web{len(started)}")
        started.append(process)
        return process

    yield start
    for process in started:
        process.stop()


@pytest.fixture(scope="session")
def scripted_model(tmp_path_factory):
    """The scripted OpenAI-compatible model (tests/scripted_model_support.py), one process per test process, started
    by the first test that asks for it: tests share it by putting a unique key (unique_key()) in their first user
    message, so no test resets it."""
    from tests.scripted_model_support import running_scripted_model

    with running_scripted_model(tmp_path_factory.mktemp("scripted-model")) as model:
        yield model
