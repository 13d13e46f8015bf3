"""Retention and export (docs/audit.md): the purge removes exactly the expired terminal tasks and everything of theirs
(every table referencing a task, and its files), a fork of a purged task still works, and an export made before the
purge verifies offline — with the script and the public key only — while a tampered one does not."""

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from django.apps import apps
from django.conf import settings as django_settings
from django.core.files.storage import default_storage
from django.db import connection, models
from django.utils import timezone

from agents_app.models import DownstreamTask, TranscriptMessage
from steering_app.models import SteeringCommand
from tasks_app import forks
from tasks_app.audit import anchors
from tasks_app.engine import reaper
from tasks_app.events import event_hash
from tasks_app.models import AdminAction, StorageHold, Task
from tests import workflows
from tests.engine_support import configure, drive

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("external_root", "audit_storage")]
VERIFY_EXPORT = Path(django_settings.BASE_DIR) / "deploy" / "verify_export.py"


@pytest.fixture
def audit_storage(settings, tmp_path):
    settings.MEDIA_ROOT = str(tmp_path / "media")
    settings.AUDIT_SIGNING_KEY_FILE = tmp_path / "keys" / "audit_signing_key.pem"
    settings.AUDIT_SIGNING_KEY_GENERATE = True
    configure(settings, retention_days=30, checkpoint={"every_steps": 2})
    return tmp_path


@pytest.fixture
def script():
    names = []

    def make(steps: dict) -> str:
        names.append(uuid.uuid4().hex)
        workflows.SCRIPTS[names[-1]] = steps
        return names[-1]

    yield make
    for name in names:
        workflows.SCRIPTS.pop(name, None)


def references_to_task() -> list[tuple[type[models.Model], str]]:
    """Every (model, field) that points at a task, found from the models (a table added later is counted too); not a
    fork's link to its original (SET NULL: a fork is a task of its own, not a part of the original)."""
    return [(model, field.name) for model in apps.get_models() if model is not Task
            for field in model._meta.concrete_fields
            if isinstance(field, models.ForeignKey) and field.related_model is Task]


def rows_of(task_id) -> dict[str, int]:
    return {f"{model._meta.db_table}.{name}": model._default_manager.filter(**{name: task_id}).count()
            for model, name in references_to_task()}


def expire(*tasks) -> None:
    Task.objects.filter(id__in=[task.id for task in tasks]).update(completed_at=timezone.now()
                                                                   - timezone.timedelta(days=31))


def finished_with_everything(new_task, script) -> Task:
    """A finished task with rows in every table that references a task: steps, events, plan chunks, checkpoints, the
    ledger (its effects), a steering command, a downstream task, transcript messages; and files (artifacts)."""
    name = script({0: [{"do": "artifact", "name": "notes.txt", "content": "kept with its task"},
                       {"do": "effect", "name": "crm.update"}],
                   1: [{"do": "set", "key": "x", "value": 1}], 2: [{"do": "set", "key": "y", "value": 2}]})
    task = new_task("scripted", script=name, steps=3)
    assert drive(task.id)[-1] == "completed"
    SteeringCommand.objects.create(task=task, type="set_priority", payload={"priority": 9}, old_version=1,
                                   new_version=2, requested_by="user:test")
    DownstreamTask.objects.create(task=task, effect_key=f"{task.id}:1:x", downstream_id="d-1")
    TranscriptMessage.objects.create(task=task, digest="a" * 64, role="user", message={"content": "hello"})
    return Task.objects.get(id=task.id)


def test_it_purges_exactly_the_expired_tasks_and_every_row_and_file_of_theirs(new_task, script):
    old, kept, recent = (finished_with_everything(new_task, script) for _ in range(3))
    running = new_task("demo_steps", steps=2)
    expire(old, kept, running)
    Task.objects.filter(id=kept.id).update(completed_at=timezone.now() - timezone.timedelta(days=29))
    before = {task.id: rows_of(task.id) for task in (old, kept, recent)}
    assert all(before[old.id].values()), before[old.id]  # every table has rows to lose
    assert default_storage.exists(f"tasks/{old.id}")

    assert reaper.terminal_tasks_purge() == 1

    assert not any(rows_of(old.id).values()), rows_of(old.id)
    assert rows_of(kept.id) == before[kept.id] and rows_of(recent.id) == before[recent.id]
    assert set(Task.objects.values_list("id", flat=True)) == {kept.id, recent.id, running.id}
    assert not default_storage.exists(f"tasks/{old.id}") and default_storage.exists(f"tasks/{kept.id}")
    (record,) = AdminAction.objects.filter(action="purge")
    assert (record.actor, record.object_id) == ("system:retention", str(old.id))


def test_it_keeps_a_purged_originals_files_while_a_live_fork_refers_to_them(new_task, script):
    name = script({0: [{"do": "artifact", "name": "notes.txt", "content": "written by the original"}],
                   1: [{"do": "read_artifact", "name": "notes.txt"}]})
    original = new_task("scripted", script=name, steps=2)
    assert drive(original.id)[-1] == "completed"
    fork = forks.fork_create(original=Task.objects.get(id=original.id), owner=None, actor="user:test", from_step=2)
    expire(original)

    assert reaper.terminal_tasks_purge() == 1

    assert not Task.objects.filter(id=original.id).exists()
    assert list(StorageHold.objects.values_list("folder", "task_id")) == [(f"tasks/{original.id}", fork.id)]
    assert drive(fork.id)[-1] == "completed"  # its step 2 reads the original's file
    from tasks_app.engine.restore import state_read

    assert state_read(Task.objects.get(id=fork.id)).variables["read:notes.txt"] == "written by the original"

    expire(fork)
    assert reaper.terminal_tasks_purge() == 1  # the last hold goes with the fork, and the folder with it
    assert not StorageHold.objects.exists() and not default_storage.exists(f"tasks/{original.id}")


def verify_offline(export: Path, public_key: Path, *extra: str) -> subprocess.CompletedProcess:
    """The documented command, with no database, no Django and no settings in its environment."""
    env = {"PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", "/tmp")}
    return subprocess.run([sys.executable, str(VERIFY_EXPORT), str(export), "--public-key", str(public_key), *extra],
                          env=env, capture_output=True, text=True, timeout=60, cwd="/")


def test_it_exports_before_purging_and_the_export_verifies_offline_with_the_public_key(
        new_task, settings, tmp_path):
    settings.RETENTION_EXPORT = True
    task = new_task("demo_steps", steps=3)
    assert drive(task.id)[-1] == "completed"
    expire(task)
    task = Task.objects.get(id=task.id)

    assert reaper.terminal_tasks_purge() == 1

    assert not Task.objects.filter(id=task.id).exists()
    export = tmp_path / "export.jsonl"
    export.write_bytes(default_storage.open(f"exports/tasks/{task.id}.jsonl", "rb").read())
    public_key = tmp_path / "public.pem"
    public_key.write_text(anchors.public_key_pem())
    lines = [json.loads(line) for line in export.read_text().splitlines()]
    assert [line["kind"] for line in lines].count("event") == task.event_seq
    assert {"task", "event", "row", "seal"} <= {line["kind"] for line in lines}
    assert {"tasks_app.step", "tasks_app.planchunk", "checkpoints_app.checkpoint", "checkpoints_app.sideeffect"} \
        <= {line["model"] for line in lines if line["kind"] == "row"}

    good = verify_offline(export, public_key)
    assert good.returncode == 0, good.stdout + good.stderr
    assert f"OK: task {task.id}: {task.event_seq} events, chain verified, sealed up to event {task.event_seq}" \
        in good.stdout

    # One event's data changed: the chain breaks there.
    edited = [dict(line, data={**line["data"], "message": "forged"}) if line["kind"] == "event" and line["seq"] == 1
              else line for line in lines]
    tampered = tmp_path / "tampered.jsonl"
    tampered.write_text("".join(json.dumps(line) + "\n" for line in edited))
    broken = verify_offline(tampered, public_key)
    assert broken.returncode == 1 and f"task {task.id}: chain broken at event 1" in broken.stdout

    # The same change with every hash recomputed (and the head moved): the chain holds, the seal does not.
    head = ""
    for line in edited:
        if line["kind"] == "event":
            line["prevHash"], line["hash"] = head, event_hash(prev_hash=head, seq=line["seq"], type=line["type"],
                                                              data=line["data"])
            head = line["hash"]
        elif line["kind"] == "task":
            line["task"]["event_head_hash"] = head
    tampered.write_text("".join(json.dumps(line) + "\n" for line in edited))
    rewritten = verify_offline(tampered, public_key)
    assert rewritten.returncode == 1 and "was rewritten after it was sealed" in rewritten.stdout

    # Another key: the seal does not verify.
    other = tmp_path / "other.pem"
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    other.write_bytes(Ed25519PrivateKey.generate().public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    forged_key = verify_offline(export, other)
    assert forged_key.returncode == 1 and "signature does not verify" in forged_key.stdout


def test_it_purges_in_short_transactions_by_tasks_and_by_events(new_task, settings, monkeypatch):
    from tasks_app.audit import retention

    monkeypatch.setattr(retention, "PURGE_BATCH", 2)
    tasks = [new_task("demo_steps", steps=1) for _ in range(5)]
    for task in tasks:
        assert drive(task.id)[-1] == "completed"
    expire(*tasks)
    statements = []

    def count(execute, sql, params, many, context):
        statements.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(count):
        assert retention.terminal_tasks_purge(batches=2) == 4  # two transactions of two tasks each

    assert sum(1 for sql in statements if "set_config('runtime.purge', 'on'" in sql) == 2
    assert Task.objects.count() == 1

    # However few tasks, a transaction takes about PURGE_MAX_EVENTS events at most (one task at least).
    monkeypatch.setattr(retention, "PURGE_BATCH", 100)
    monkeypatch.setattr(retention, "PURGE_MAX_EVENTS", 1)
    more = [new_task("demo_steps", steps=1) for _ in range(2)]
    for task in more:
        assert drive(task.id)[-1] == "completed"
    expire(*more)
    statements.clear()
    with connection.execute_wrapper(count):
        assert retention.terminal_tasks_purge() == 3
    assert sum(1 for sql in statements if "set_config('runtime.purge', 'on'" in sql) == 3
    assert not Task.objects.exists()
