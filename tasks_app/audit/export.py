"""A task's export before the retention purge deletes it (settings.RETENTION_EXPORT; docs/audit.md): one JSON Lines
file in blob storage, ``exports/tasks/<task id>.jsonl``, that proves itself offline with the seals' public key only
(deploy/verify_export.py). Lines, each an object with a ``kind``:

- ``header``: {format, version, taskId};
- ``task``: the task row (times and decimals as text);
- ``event``: every event in seq order, with ``prevHash`` and ``hash`` — the chain, recomputed by the verifier exactly
  as tasks_app.events.event_hash does;
- ``row``: {model, row} for every row of every table that belongs to the task (rows_referencing_task): steps with
  their state deltas, plan chunks, the effect ledger, steering commands, checkpoints (without their payload),
  downstream tasks, transcript messages;
- ``artifact``: name, ref, bytes and the sha256 of the file as stored;
- ``seal``: the seal document (tasks_app.audit.anchors) of the task's newest sealed head — signed, so the verifier
  knows the chain it recomputes is the one the runtime sealed (the purge seals every head before it exports).
"""

from __future__ import annotations

import hashlib
import json

from django.apps import apps
from django.core.files.base import ContentFile
from django.core.files.storage import default_storage
from django.db import models

from tasks_app.models import AnchorSeal, SealedHead, Task, TaskEvent

EXPORT_FORMAT = "agent-runtime-task-export"
EXPORT_VERSION = 1
EXPORTS_FOLDER = "exports/tasks"
# Columns left out: a checkpoint's payload is the task's state at that point, bulk rather than proof (its checksum
# and size stay; the steps' deltas, which rebuild any state, are exported whole).
OMITTED_COLUMNS = {"checkpoints_app.checkpoint": ("payload",)}


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


def rows_referencing_task() -> list[tuple[type[models.Model], str]]:
    """Every (model, field) whose rows belong to a task (a foreign key to Task; not a fork's link to its original),
    from the app registry: the apps above this one (steering commands, downstream tasks, transcript messages) are
    included without this module importing them, and a table added later is exported too."""
    return sorted(((model, field.name) for model in apps.get_models() if model is not Task
                   for field in model._meta.concrete_fields
                   if isinstance(field, models.ForeignKey) and field.related_model is Task),
                  key=lambda item: item[0]._meta.label_lower)


def task_export_lines(*, task_id):
    """The export's lines (bytes), one by one (rows read in chunks)."""
    task = Task.objects.filter(id=task_id).values().get()
    yield _line("header", format=EXPORT_FORMAT, version=EXPORT_VERSION, taskId=str(task_id))
    yield _line("task", task=task)
    for seq, type_, data, at, prev_hash, digest in (TaskEvent.objects.filter(task_id=task_id).order_by("seq")
                                                    .values_list("seq", "type", "data", "at", "prev_hash", "hash")
                                                    .iterator(chunk_size=2000)):
        yield _line("event", seq=seq, type=type_, data=data, at=at, prevHash=prev_hash, hash=digest)
    for model, name in rows_referencing_task():
        if model is TaskEvent:
            continue
        label = model._meta.label_lower
        omitted = OMITTED_COLUMNS.get(label, ())
        columns = [field.attname for field in model._meta.concrete_fields if field.attname not in omitted]
        for row in model._default_manager.filter(**{name: task_id}).values(*columns).iterator(chunk_size=2000):
            yield _line("row", model=label, row=row)
    artifacts: dict[str, dict] = {}
    for seq, data in (TaskEvent.objects.filter(task_id=task_id, type="artifact").order_by("seq")
                      .values_list("seq", "data")):
        artifacts.pop(data["name"], None)  # a name written again: the newest (selectors.task_artifacts' rule)
        artifacts[data["name"]] = {"name": data["name"], "ref": data["ref"], "bytes": data["bytes"], "seq": seq}
    for artifact in artifacts.values():
        yield _line("artifact", **artifact, sha256=_file_sha256(artifact["ref"]))
    seal = (AnchorSeal.objects.filter(sequence__in=SealedHead.objects.filter(task_id=task_id)
                                      .values("seal_sequence")).values_list("sequence", "file").first())
    if seal is not None:  # the seal of the task's newest sealed head (the purge seals every head before exporting)
        with default_storage.open(seal[1], "rb") as file:
            yield _line("seal", sequence=seal[0], document=json.loads(file.read()))


def task_export(*, task_id) -> str:
    """Write the task's export to blob storage; its name (never an existing file's: storage picks a free one)."""
    content = b"".join(task_export_lines(task_id=task_id))
    return default_storage.save(f"{EXPORTS_FOLDER}/{task_id}.jsonl", ContentFile(content))
