"""The checkpoint document: build, checksum, verify, migrate (ARCHITECTURE §5).

A checkpoint is rebuildable business state, never process memory. Schema (version 3):

    {"schema_version": 3, "task_id": "...", "sequence": 7, "plan_version": 1, "next_step": 70,
     "completed": {"through_seq": 70}, "variables": {...}, "artifact_refs": {"name": "storage/path"},
     "side_effects": {"succeeded": 70}, "steering_cursor": 0, "last_step": "tick", "open_wait": null}

``open_wait`` is the last input wait a step asked for (ctx.wait_for_input), answered or not: the task waits while
the task's answers do not hold its ``waitId``.

``completed`` is a cursor, not a growing list: recovery replays the Step deltas with seq > through_seq.
Older schema versions are upgraded on load through MIGRATIONS, one version at a time.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from config.base.canonical import canonical_json

SCHEMA_VERSION = 3


class CheckpointCorrupt(Exception):
    """The stored checkpoint cannot be trusted (checksum, schema); recovery must not guess."""


class CheckpointTooLarge(Exception):
    pass


@dataclass
class CheckpointState:
    """What a checkpoint restores; the engine keeps one of these for the task it leases."""

    plan_version: int = 1
    next_step: int = 0
    through_seq: int = 0  # the last committed step's seq
    variables: dict[str, Any] = field(default_factory=dict)
    artifact_refs: dict[str, str] = field(default_factory=dict)
    effects_succeeded: int = 0
    steering_cursor: int = 0
    last_step: str | None = None
    open_wait: dict[str, Any] | None = None


def checkpoint_document(*, task_id, sequence: int, state: CheckpointState) -> dict[str, Any]:
    return {
        "schema_version": SCHEMA_VERSION,
        "task_id": str(task_id),
        "sequence": sequence,
        "plan_version": state.plan_version,
        "next_step": state.next_step,
        "completed": {"through_seq": state.through_seq},
        "variables": state.variables,
        "artifact_refs": state.artifact_refs,
        "side_effects": {"succeeded": state.effects_succeeded},
        "steering_cursor": state.steering_cursor,
        "last_step": state.last_step,
        "open_wait": state.open_wait,
    }


def checkpoint_serialize(document: dict[str, Any], *, max_bytes: int) -> tuple[str, str]:
    """Canonical JSON text and its sha256. Over max_bytes → CheckpointTooLarge naming the biggest variables."""
    text = canonical_json(document)
    size = len(text.encode())
    if size > max_bytes:
        sizes = sorted(((len(canonical_json(v)), k) for k, v in document.get("variables", {}).items()), reverse=True)
        biggest = ", ".join(f"{k} ({n} bytes)" for n, k in sizes[:3])
        raise CheckpointTooLarge(
            f"checkpoint is {size} bytes, over the {max_bytes}-byte cap (checkpoint.max_bytes). Largest state "
            f"variables: {biggest}. Store big values with ctx.artifact() and keep only the reference in state."
        )
    return text, hashlib.sha256(text.encode()).hexdigest()


def _v1_to_v2(doc: dict[str, Any]) -> dict[str, Any]:
    # Version 1 kept every completed step index in a list that grew with the task, and effect keys likewise.
    completed = doc.get("completed_steps", [])
    return {
        "schema_version": 2,
        "task_id": doc["task_id"],
        "sequence": doc["sequence"],
        "plan_version": doc.get("plan_version", 1),
        "next_step": doc["next_step"],
        "completed": {"through_seq": len(completed)},
        "variables": doc.get("variables", {}),
        "artifact_refs": {a["name"]: a["ref"] for a in doc.get("artifacts", [])},
        "side_effects": {"succeeded": len(doc.get("effects", []))},
        "steering_cursor": 0,
        "last_step": None,
    }


def _v2_to_v3(doc: dict[str, Any]) -> dict[str, Any]:
    # Version 3 adds the open input wait; a version-2 task had none (steps could not wait yet).
    return {**doc, "schema_version": 3, "open_wait": None}


# from-version -> function upgrading a document to from-version + 1
MIGRATIONS: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {1: _v1_to_v2, 2: _v2_to_v3}


def checkpoint_verify(*, payload: str, checksum: str, schema_version: int) -> dict[str, Any]:
    """Verify the checksum of stored text, parse it, and migrate it to SCHEMA_VERSION."""
    if hashlib.sha256(payload.encode()).hexdigest() != checksum:
        raise CheckpointCorrupt("checkpoint checksum mismatch: the stored state was altered or damaged")
    try:
        document = json.loads(payload)
    except ValueError as error:
        raise CheckpointCorrupt(f"checkpoint is not valid JSON: {error}") from None
    version = document.get("schema_version")
    if version != schema_version:
        raise CheckpointCorrupt(f"checkpoint says schema_version {version} but its row says {schema_version}")
    if not isinstance(version, int) or version > SCHEMA_VERSION:
        raise CheckpointCorrupt(f"checkpoint schema_version {version!r} is newer than this code ({SCHEMA_VERSION})")
    while version < SCHEMA_VERSION:
        if version not in MIGRATIONS:
            raise CheckpointCorrupt(f"no migration from checkpoint schema_version {version}")
        document = MIGRATIONS[version](document)
        version = document["schema_version"]
    return document


def checkpoint_state(document: dict[str, Any]) -> CheckpointState:
    return CheckpointState(
        plan_version=document["plan_version"],
        next_step=document["next_step"],
        through_seq=document["completed"]["through_seq"],
        variables=document["variables"],
        artifact_refs=document["artifact_refs"],
        effects_succeeded=document["side_effects"]["succeeded"],
        steering_cursor=document["steering_cursor"],
        last_step=document.get("last_step"),
        open_wait=document.get("open_wait"),
    )
