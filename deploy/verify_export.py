#!/usr/bin/env python3
"""Verify a task export offline: ``python3 deploy/verify_export.py EXPORT.jsonl --public-key audit_public_key.pem``.

Needs only the export (written by the retention purge with RETENTION_EXPORT=true: exports/tasks/<id>.jsonl in blob
storage) and the seals' public key (``python manage.py audit_key --public``) — no database, no Django, no settings;
the one package it needs is ``cryptography`` (Ed25519). It checks (docs/audit.md):

1. the event chain, recomputed exactly as tasks_app/events.py does: event n's hash is the sha256 of the canonical
   JSON of {"data", "prev", "seq", "type"} (sorted keys, no whitespace, UTF-8 as is), its prev is event n-1's hash,
   seqs run 1, 2, …, and the task row's head (event_seq, event_head_hash) is the last event;
2. each step's state delta against its sha256 (which the chain's progress events carry);
3. the seals: each one's hash and Ed25519 signature under the given key, and that the head it recorded for this task
   is a point of the recomputed chain; at least one seal must cover the task (--allow-unsealed to accept none).

Exit status 0 when everything holds, 1 when something does not (each failure printed), 2 for a bad invocation.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import sys


def canonical_json(value) -> str:
    # As config/base/canonical.py: sorted keys, no whitespace, UTF-8 kept as is.
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False, default=str)


def event_hash(*, prev_hash: str, seq: int, type: str, data) -> str:
    return hashlib.sha256(canonical_json({"prev": prev_hash, "seq": seq, "type": type, "data": data}).encode()
                          ).hexdigest()


def load_public_key(path: str):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    with open(path, "rb") as file:
        key = serialization.load_pem_public_key(file.read())
    if not isinstance(key, Ed25519PublicKey):
        raise SystemExit(f"{path}: not an Ed25519 public key")
    return key


def seal_problem(document: dict, public) -> str | None:
    from cryptography.exceptions import InvalidSignature

    try:
        text = canonical_json(document["seal"]).encode()
        if hashlib.sha256(text).hexdigest() != document["hash"]:
            return "its hash does not match its content"
        public.verify(base64.b64decode(document["signature"]), text)
    except InvalidSignature:
        return "its signature does not verify with this public key"
    except (KeyError, TypeError, ValueError) as error:
        return f"it is not a seal ({type(error).__name__})"
    return None


def verify(lines: list[dict], public, *, allow_unsealed: bool = False) -> tuple[list[str], str]:
    """(failures, summary) for an export's parsed lines."""
    failures: list[str] = []
    kinds: dict[str, list[dict]] = {}
    for line in lines:
        kinds.setdefault(line.get("kind"), []).append(line)
    header = (kinds.get("header") or [{}])[0]
    task_id = header.get("taskId")
    if header.get("format") != "agent-runtime-task-export" or not task_id:
        return ["not a task export (no header line)"], ""
    task = ((kinds.get("task") or [{}])[0]).get("task") or {}
    hashes: dict[int, str] = {}
    head = ""
    for expected, event in enumerate(kinds.get("event", []), start=1):
        seq = event.get("seq")
        recomputed = event_hash(prev_hash=head, seq=seq, type=event.get("type"), data=event.get("data"))
        if seq != expected or event.get("prevHash") != head or event.get("hash") != recomputed:
            failures.append(f"task {task_id}: chain broken at event {expected}")
            break
        hashes[seq] = head = recomputed
    last = max(hashes, default=0)
    if not failures and (task.get("event_seq") != last or task.get("event_head_hash") != head):
        failures.append(f"task {task_id}: the task row's head (seq {task.get('event_seq')}) is not the chain's last "
                        f"event ({last}): events are missing")
    for line in kinds.get("row", []):
        if line.get("model") != "tasks_app.step":
            continue
        step = line.get("row") or {}
        if step.get("delta_sha256") and hashlib.sha256((step.get("state_delta") or "").encode()).hexdigest() \
                != step["delta_sha256"]:
            failures.append(f"task {task_id}: step {step.get('seq')}'s state delta does not match its sha256")
    sealed = 0
    for line in kinds.get("seal", []):
        document = line.get("document") or {}
        problem = seal_problem(document, public)
        sequence = (document.get("seal") or {}).get("sequence")
        if problem:
            failures.append(f"seal {sequence}: {problem}")
            continue
        for head_task, seq, digest in document["seal"]["heads"]:
            if head_task != task_id:
                continue
            if hashes.get(seq) != digest:
                failures.append(f"task {task_id}: seal {sequence} recorded event {seq} with another hash: the chain "
                                f"was rewritten after it was sealed")
            else:
                sealed = max(sealed, seq)
    if not sealed and not allow_unsealed:
        failures.append(f"task {task_id}: no valid seal covers this task (run without it only with --allow-unsealed)")
    summary = (f"task {task_id}: {last} events, chain verified"
               + (f", sealed up to event {sealed}" if sealed else ", not sealed"))
    return failures, summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("export", help="the export file (.jsonl)")
    parser.add_argument("--public-key", required=True, help="the seals' Ed25519 public key (PEM)")
    parser.add_argument("--allow-unsealed", action="store_true", help="accept an export no seal covers")
    args = parser.parse_args(argv)
    public = load_public_key(args.public_key)
    try:
        with open(args.export, encoding="utf-8") as file:
            lines = [json.loads(text) for text in file if text.strip()]
    except (OSError, ValueError) as error:
        print(f"FAILED: cannot read {args.export}: {error}")
        return 1
    failures, summary = verify(lines, public, allow_unsealed=args.allow_unsealed)
    for failure in failures:
        print(f"FAILED: {failure}")
    if failures:
        return 1
    print(f"OK: {summary}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
