"""A task's export before the retention purge deletes it (settings.RETENTION_EXPORT; docs/audit.md): one JSON Lines
file in blob storage, ``exports/tasks/<task id>.jsonl``, that proves itself offline with the seals' public key only
(deploy/verify_export.py). Lines, each an object with a ``kind``:

- ``header``: {format, version, taskId};
- ``task``: the task row (times and decimals as text);
- ``event``: every event in seq order, with ``prevHash`` and ``hash`` — the chain, recomputed by the verifier exactly
  as tasks_app.events.event_hash does;
- ``step``, ``effect`` (the ledger), ``command`` (steering), ``checkpoint`` (sequence, checksum, size: the payload
  is state, not proof), ``artifact`` (name, ref, bytes and the sha256 of the file as stored);
- ``seal``: every seal document (tasks_app.anchors) whose heads include this task — signed, so the verifier knows
  the chain it recomputes is the one the runtime sealed.
"""

from __future__ import annotations

import hashlib
import json

from django.core.files.base import ContentFile
from django.core.files.storage import default_storage

from tasks_app.anchors import Seals, seals_read
from tasks_app.models import Step, Task, TaskEvent
from tasks_app.selectors import task_artifacts

EXPORT_FORMAT = "agent-runtime-task-export"
EXPORT_VERSION = 1
EXPORTS_FOLDER = "exports/tasks"


def _line(kind: str, **values) -> bytes:
    return (json.dumps({"kind": kind, **values}, ensure_ascii=False, separators=(",", ":"), default=str)
            + "\n").encode()


def _file_sha256(ref: str) -> str | None:
    digest = hashlib.sha256()
    try:
        with default_storage.open(ref, "rb") as file:
            for chunk in iter(lambda: file.read(1 << 20), b""):
                digest.update(chunk)
    except FileNotFoundError:
        return None
    return digest.hexdigest()


def task_export_lines(*, task_id, seals: Seals | None = None):
    """The export's lines (bytes), one by one (rows read in chunks)."""
    from checkpoints_app.models import Checkpoint, SideEffect
    from steering_app.models import SteeringCommand

    task = Task.objects.filter(id=task_id).values().get()
    yield _line("header", format=EXPORT_FORMAT, version=EXPORT_VERSION, taskId=str(task_id))
    yield _line("task", task=task)
    for seq, type_, data, at, prev_hash, digest in (TaskEvent.objects.filter(task_id=task_id).order_by("seq")
                                                    .values_list("seq", "type", "data", "at", "prev_hash", "hash")
                                                    .iterator(chunk_size=2000)):
        yield _line("event", seq=seq, type=type_, data=data, at=at, prevHash=prev_hash, hash=digest)
    for row in Step.objects.filter(task_id=task_id).order_by("seq").values().iterator(chunk_size=2000):
        yield _line("step", step=row)
    for row in SideEffect.objects.filter(task_id=task_id).values().iterator(chunk_size=2000):
        yield _line("effect", effect=row)
    for row in SteeringCommand.objects.filter(task_id=task_id).order_by("pk").values().iterator(chunk_size=2000):
        yield _line("command", command=row)
    for row in (Checkpoint.objects.filter(task_id=task_id).order_by("sequence")
                .values("sequence", "checksum", "size_bytes", "schema_version", "created_at")):
        yield _line("checkpoint", checkpoint=row)
    for artifact in task_artifacts(task_id=task_id).values():
        yield _line("artifact", name=artifact["name"], ref=artifact["ref"], bytes=artifact["bytes"],
                    seq=artifact["seq"], sha256=_file_sha256(artifact["ref"]))
    seals = seals if seals is not None else seals_read()
    for sequence, document in sorted(seals.documents.items()):
        if any(head[0] == str(task_id) for head in document["seal"]["heads"]):
            yield _line("seal", sequence=sequence, document=document)


def task_export(*, task_id, seals: Seals | None = None) -> str:
    """Write the task's export to blob storage; its name (never an existing file's: storage picks a free one)."""
    content = b"".join(task_export_lines(task_id=task_id, seals=seals))
    return default_storage.save(f"{EXPORTS_FOLDER}/{task_id}.jsonl", ContentFile(content))
