"""Helpers for engine tests: configuration overrides, task creation, driving run_step in-process."""

import dataclasses
from collections import Counter

from django.db import connection

from tasks_app.db.dispatch import hint_queue_names
from tasks_app.engine import slice as engine
from tasks_app.examples import demo_steps, external
from tasks_app.models import TERMINAL_STATUSES, Task
from tasks_app.services import task_create


def configure(settings_fixture, **overrides):
    """Override runtime.yaml values for a test: configure(settings, slice_seconds=0, checkpoint={"every_steps": 5})."""
    config = settings_fixture.RUNTIME
    for key, value in overrides.items():
        if isinstance(value, dict):
            value = dataclasses.replace(getattr(config, key), **value)
        config = dataclasses.replace(config, **{key: value})
    settings_fixture.RUNTIME = config


def create_engine_task(tenant, workflow="demo_steps", **input_) -> Task:
    return task_create(tenant=tenant, owner=None, workflow=workflow, input=input_).task


new_task = create_engine_task  # for modules that pass the tenant themselves


def drive(task_id, *, calls=100, owner="test-worker", until_done=True, **kwargs) -> list[str]:
    """Call run_step until the task stops being runnable (or `calls` times); return each call's outcome."""
    outcomes = []
    for _ in range(calls):
        outcomes.append(engine.run_step(task_id, owner=owner, **kwargs))
        status = Task.objects.values_list("status", flat=True).get(id=task_id)
        if status in TERMINAL_STATUSES or status in ("dead_lettered", "paused", "input_required"):
            return outcomes
    if not until_done:
        return outcomes
    raise AssertionError(f"task still {status} after {calls} run_step calls: {outcomes[-5:]}")


def executions(task_id) -> Counter:
    """How many times each step seq of a demo task actually ran (from the log outside the database)."""
    return Counter(int(line.split()[1]) for line in external.lines(demo_steps.EXECUTIONS_LOG)
                   if line.startswith(str(task_id)))


def effects(task_id) -> Counter:
    return Counter(key for key in external.lines(demo_steps.EFFECTS_LOG) if key.startswith(str(task_id)))


def deadlines_pass(task_id) -> None:
    """Move time instead of sleeping: the calls of the task's open effects can no longer land (their deadlines are
    past on the database's clock), so only now may a person be asked whether they happened."""
    with connection.cursor() as cursor:
        cursor.execute("UPDATE checkpoints_app_sideeffect SET deadline = now() - interval '1 second' "
                       "WHERE task_id = %s AND status IN ('started', 'unknown')", [task_id])


def park_until_deadlines_pass(task_id, **kwargs) -> list[str]:
    """A task whose open effect only a person can tell about waits (parked, no worker) while the call may still land;
    once its deadline has passed it goes on: the outcomes of both."""
    first = drive(task_id, calls=1, until_done=False, **kwargs)
    assert first == ["parked"], first  # not asked before the deadline
    deadlines_pass(task_id)
    return first + drive(task_id, **kwargs)


def expire_lease(task_id) -> None:
    """Move time instead of sleeping: make the task's lease expired now."""
    with connection.cursor() as cursor:
        cursor.execute("UPDATE tasks_app_task SET lease_expires_at = now() - interval '1 second' "
                       "WHERE id = %s AND lease_owner IS NOT NULL", [task_id])



def effect_deadlines_pass(task_id) -> None:
    """Move time instead of sleeping: the task's effects whose calls could still land can no longer (their deadline
    passed a second ago), so the next run asks a person about them (tasks_app.engine.effects)."""
    with connection.cursor() as cursor:
        cursor.execute("UPDATE checkpoints_app_sideeffect SET deadline = now() - interval '1 second' "
                       "WHERE task_id = %s AND deadline > now()", [task_id])


def hints_queued(task_id) -> int:
    """run_step hints for this task waiting in the broker, over all ten priority lists."""
    import redis
    from django.conf import settings

    broker = redis.Redis.from_url(settings.REDIS_URL)
    needle = str(task_id).encode()
    try:
        return sum(1 for queue in hint_queue_names() for message in broker.lrange(queue, 0, -1) if needle in message)
    finally:
        broker.close()


def credentials_grant(settings_fixture, **grants) -> None:
    """Grant credentials for a test as config/runtime.yaml `credentials` does (docs/credentials.md), on top of those
    granted already: credentials_grant(settings, SHOP_TOKEN={"tenants": ["acme"], "hosts": ["127.0.0.1"]})."""
    from config.base.runtime import credentials_parse

    held = settings_fixture.RUNTIME.credentials  # (configure() would take a dict for a section to change in part)
    settings_fixture.RUNTIME = dataclasses.replace(
        settings_fixture.RUNTIME, credentials={**(held if isinstance(held, dict) else {}), **credentials_parse(grants)})


def credentials_env(**grants) -> dict[str, str]:
    """The same grants for processes a test starts (workers, web): {"RUNTIME_CREDENTIALS": their JSON}."""
    import json

    return {"RUNTIME_CREDENTIALS": json.dumps(grants)}
