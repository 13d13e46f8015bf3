"""The checkpoint store's conformance: round trip, checksum, schema migration, size cap."""

import hashlib
import json

import pytest

from checkpoints_app.checkpoints import (
    SCHEMA_VERSION,
    CheckpointCorrupt,
    CheckpointState,
    CheckpointTooLarge,
    checkpoint_document,
    checkpoint_serialize,
    checkpoint_state,
    checkpoint_verify,
)
from config.base.canonical import canonical_json

STATE = CheckpointState(plan_version=1, next_step=12, through_seq=12, variables={"count": 12, "notes": ["a", "ü"]},
                        artifact_refs={"report.md": "tasks/x/report.md"}, effects_succeeded=12, steering_cursor=3,
                        last_step="tick")


def test_it_round_trips_a_checkpoint_through_its_checksum():
    payload, checksum = checkpoint_serialize(checkpoint_document(task_id="t", sequence=2, state=STATE), max_bytes=10_000)

    document = checkpoint_verify(payload=payload, checksum=checksum, schema_version=SCHEMA_VERSION)

    assert checkpoint_state(document) == STATE


def test_it_refuses_a_tampered_payload():
    payload, checksum = checkpoint_serialize(checkpoint_document(task_id="t", sequence=2, state=STATE), max_bytes=10_000)

    with pytest.raises(CheckpointCorrupt, match="checksum"):
        checkpoint_verify(payload=payload.replace('"count":12', '"count":13'), checksum=checksum,
                          schema_version=SCHEMA_VERSION)


def test_it_refuses_a_schema_version_from_the_future():
    document = {**checkpoint_document(task_id="t", sequence=1, state=STATE), "schema_version": SCHEMA_VERSION + 1}
    payload = canonical_json(document)

    with pytest.raises(CheckpointCorrupt, match="newer than this code"):
        checkpoint_verify(payload=payload, checksum=hashlib.sha256(payload.encode()).hexdigest(),
                          schema_version=SCHEMA_VERSION + 1)


def test_it_migrates_a_version_1_checkpoint_with_its_growing_list_to_a_cursor():
    v1 = {"schema_version": 1, "task_id": "t", "sequence": 4, "plan_version": 1, "next_step": 3,
          "completed_steps": [0, 1, 2], "variables": {"count": 3},
          "artifacts": [{"name": "a.txt", "ref": "tasks/t/a.txt"}], "effects": ["t:1:record", "t:2:record", "t:3:record"]}
    payload = json.dumps(v1)

    state = checkpoint_state(checkpoint_verify(payload=payload, checksum=hashlib.sha256(payload.encode()).hexdigest(),
                                               schema_version=1))

    assert (state.through_seq, state.next_step, state.variables) == (3, 3, {"count": 3})
    assert state.artifact_refs == {"a.txt": "tasks/t/a.txt"} and state.effects_succeeded == 3


def test_it_refuses_an_oversized_checkpoint_naming_the_biggest_variables():
    big = CheckpointState(variables={"transcript": "x" * 5000, "small": 1})

    with pytest.raises(CheckpointTooLarge, match=r"transcript \(5002 bytes\).*ctx.artifact"):
        checkpoint_serialize(checkpoint_document(task_id="t", sequence=1, state=big), max_bytes=2048)
