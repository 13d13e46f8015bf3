"""Anchored chain heads (docs/audit.md): what makes a chain rewritten consistently inside the database detectable.

Each task's events form a hash chain (tasks_app.events), and the task row holds its head. Someone who can write the
database (the trigger disabled, the events rewritten, every hash recomputed, the head updated) leaves a chain that
verifies. So, periodically (beat: the "runtime: seal audit chains" schedule, migration 0029), ``anchors_seal``
writes the heads of every chain changed since the last seal — (task id, last seq, head hash) — into a **seal**:
canonical JSON, signed with an Ed25519 key held outside the database (settings.AUDIT_SIGNING_KEY_FILE), chained to
the seal before it by that seal's hash, kept as an immutable file in blob storage (``anchors/<sequence>-<hash>.json``,
never overwritten). ``verify_events --anchors`` checks that every sealed head is still a point of the current chain
(the event at that seq still has that hash) and that the seals' signatures and chain hold: a rewrite after a seal is
named by its task, a deleted or altered seal file by its sequence.

What a seal cannot catch (said in docs/audit.md): a rewrite of events not yet sealed (at most one interval's worth),
and the removal of the newest seals together with their index rows (ship seals to write-once storage for that).

The seal file: ``{"seal": {"version", "sequence", "sealedAt", "previous", "keyId", "heads": [[task, seq, hash]]},
"hash": sha256(canonical JSON of seal), "signature": base64(Ed25519 over the same text)}``. deploy/verify_export.py
checks one offline with the public key only.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import os
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.files.base import ContentFile
from django.core.files.storage import default_storage
from django.db import connection, transaction

from config.base.canonical import canonical_json
from tasks_app.models import AdminAction, AnchorSeal, SealedHead, Task

logger = logging.getLogger(__name__)

ANCHORS_FOLDER = "anchors"
SEAL_VERSION = 1
# Heads per seal: a seal file stays a few hundred kB however many chains changed; a run makes more seals if needed.
SEAL_MAX_HEADS = 5000
SEALS_PER_RUN = 20
# pg_try_advisory_xact_lock key: one sealer at a time (two would both take sequence n+1; the second's insert of
# the index row would fail, after its file was written). A second beat run while one seals simply does nothing.
SEAL_LOCK = 0x5EA1_0001
# The chains whose head moved since their last seal (or never sealed): one pass over the task table joined to the
# sealed heads (a hash join), taken in id order so a run that stops at SEAL_MAX_HEADS continues where it left off.
CHANGED_HEADS = """
SELECT t.id, t.event_seq, t.event_head_hash
  FROM tasks_app_task t LEFT JOIN tasks_app_sealedhead s ON s.task_id = t.id
 WHERE t.event_seq > COALESCE(s.seq, 0)
 ORDER BY t.id
 LIMIT %s
"""
# The hash each sealed (task, seq) has now, for a batch of sealed heads.
EVENT_HASHES_AT = """
SELECT h.task_id, e.hash
  FROM unnest(%s::uuid[], %s::bigint[]) AS h(task_id, seq)
  LEFT JOIN tasks_app_taskevent e ON e.task_id = h.task_id AND e.seq = h.seq
"""
PURGE_ACTOR = "system:retention"  # the actor of the retention purge's records (tasks_app.audit.retention)


# -- the key (outside the database) ---------------------------------------------------------------------------------
def signing_key() -> Ed25519PrivateKey:
    """The seals' private key, read from settings.AUDIT_SIGNING_KEY_FILE (generated there first when
    AUDIT_SIGNING_KEY_GENERATE is on: development and tests). Never logged, never stored in the database."""
    path = Path(settings.AUDIT_SIGNING_KEY_FILE)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        if not settings.AUDIT_SIGNING_KEY_GENERATE:
            raise ImproperlyConfigured(f"No audit signing key at {path} (AUDIT_SIGNING_KEY_FILE): make one with "
                                       f"`python manage.py audit_key --generate`, or mount the deployment's.") from None
        key_generate(path)
        data = path.read_bytes()
    key = serialization.load_pem_private_key(data, password=None)
    if not isinstance(key, Ed25519PrivateKey):
        raise ImproperlyConfigured(f"{path} does not hold an Ed25519 private key (PEM, PKCS#8).")
    return key


def key_generate(path: Path) -> bool:
    """Write a new Ed25519 private key to ``path`` (mode 0600); False if a file is there already (never replaced:
    the seals it signed would no longer verify)."""
    pem = Ed25519PrivateKey.generate().private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                      serialization.NoEncryption())
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # another process made it first: theirs is the key
        return False
    with os.fdopen(descriptor, "wb") as file:
        file.write(pem)
    return True


def public_key_pem(key: Ed25519PrivateKey | None = None) -> str:
    """The public half, which is all an offline verifier needs (deploy/verify_export.py --public-key)."""
    public = (key or signing_key()).public_key()
    return public.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()


def key_id(public: Ed25519PublicKey) -> str:
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


# -- sealing -----------------------------------------------------------------------------------------------------------
def seal_document(body: dict, key: Ed25519PrivateKey) -> dict:
    text = canonical_json(body)
    return {"seal": body, "hash": hashlib.sha256(text.encode()).hexdigest(),
            "signature": base64.b64encode(key.sign(text.encode())).decode()}


def seal_problem(document: dict, public: Ed25519PublicKey) -> str | None:
    """What is wrong with a seal document (its hash, its signature), or None."""
    try:
        text = canonical_json(document["seal"])
        if hashlib.sha256(text.encode()).hexdigest() != document["hash"]:
            return "its hash does not match its content"
        public.verify(base64.b64decode(document["signature"]), text.encode())
    except InvalidSignature:
        return "its signature does not verify"
    except (KeyError, TypeError, ValueError) as error:
        return f"it is not a seal ({type(error).__name__})"
    return None


def anchors_seal(*, max_seals: int = SEALS_PER_RUN) -> int:
    """Seal the heads of the chains changed since the last seal (the beat task runtime.audit_seal). How many seals
    were made (0: nothing changed, or another sealer is at work)."""
    key = signing_key()
    made = 0
    while made < max_seals and seal_one(key):
        made += 1
    return made


def seal_one(key: Ed25519PrivateKey) -> bool:
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_xact_lock(%s)", [SEAL_LOCK])
        if not cursor.fetchone()[0]:
            return False
        cursor.execute(CHANGED_HEADS, [SEAL_MAX_HEADS])
        heads = cursor.fetchall()
        if not heads:
            return False
        cursor.execute("SELECT now()")
        sealed_at = cursor.fetchone()[0]
        last_sequence, previous = AnchorSeal.objects.order_by("-sequence").values_list("sequence", "hash").first() \
            or (0, "")
        sequence = last_sequence + 1
        body = {"version": SEAL_VERSION, "sequence": sequence, "sealedAt": sealed_at.isoformat(), "previous": previous,
                "keyId": key_id(key.public_key()), "heads": [[str(task_id), seq, head] for task_id, seq, head in heads]}
        document = seal_document(body, key)
        # Written before the commit: if the commit fails, the file is an unchained orphan the verifier ignores (the
        # next seal takes the same sequence under another hash); the other order could leave a committed index row
        # with no file, which the verifier must report as a deleted seal.
        stored = default_storage.save(f"{ANCHORS_FOLDER}/{sequence:012d}-{document['hash'][:16]}.json",
                                      ContentFile(json.dumps(document, separators=(",", ":")).encode()))
        AnchorSeal.objects.create(sequence=sequence, sealed_at=sealed_at, hash=document["hash"], file=stored,
                                  heads=len(heads))
        SealedHead.objects.bulk_create(
            [SealedHead(task_id=task_id, seq=seq, hash=head, seal_sequence=sequence) for task_id, seq, head in heads],
            update_conflicts=True, unique_fields=["task_id"], update_fields=["seq", "hash", "seal_sequence"])
    logger.info("audit: seal %s made over %s chain heads", sequence, len(heads))
    return True


# -- verifying ---------------------------------------------------------------------------------------------------------
@dataclass
class Seals:
    """The seals read back from storage and checked: each task's newest sealed head, and what does not hold."""

    heads: dict[str, tuple[int, str, int]] = field(default_factory=dict)  # task id → (seq, hash, seal sequence)
    documents: dict[int, dict] = field(default_factory=dict)  # sequence → the chained seal document
    problems: list[str] = field(default_factory=list)


def seals_read(public: Ed25519PublicKey | None = None) -> Seals:
    """Every seal file in storage, checked: signature, hash, sequence and link to the one before, from seal 1 to the
    newest the files or the index rows know of. A file that is missing, altered or unchained is a problem naming its
    sequence; orphans (a seal whose transaction rolled back after its file was written) are ignored."""
    public = public or signing_key().public_key()
    found = Seals()
    try:
        _, names = default_storage.listdir(ANCHORS_FOLDER)
    except FileNotFoundError:
        names = []
    candidates: dict[int, list[dict]] = defaultdict(list)
    for name in names:
        try:
            sequence = int(name.split("-", 1)[0])
            with default_storage.open(f"{ANCHORS_FOLDER}/{name}", "rb") as file:
                candidates[sequence].append(json.loads(file.read()))
        except (ValueError, OSError):
            found.problems.append(f"anchors/{name}: not a readable seal file")
    indexed = dict(AnchorSeal.objects.values_list("sequence", "hash"))
    previous = ""
    for sequence in range(1, max([*candidates, *indexed], default=0) + 1):
        valid = [document for document in candidates.get(sequence, ())
                 if seal_problem(document, public) is None and document["seal"].get("sequence") == sequence]
        chained = [document for document in valid if document["seal"].get("previous") == previous]
        if chained:
            document = chained[0]
        elif valid:
            found.problems.append(f"seal {sequence}: does not chain to seal {sequence - 1} (a seal was removed or "
                                  f"replaced)")
            document = valid[0]
        else:
            found.problems.append(f"seal {sequence}: its file is " + ("altered (hash or signature does not verify)"
                                                                      if candidates.get(sequence) else
                                                                      "missing from storage (anchors/)"))
            previous = indexed.get(sequence, "")
            continue
        if sequence in indexed and indexed[sequence] != document["hash"]:
            found.problems.append(f"seal {sequence}: its index row names another seal than its file")
        previous = document["hash"]
        found.documents[sequence] = document
        for task_id, seq, head in document["seal"]["heads"]:
            found.heads[task_id] = (seq, head, sequence)
    return found


def sealed_heads_check(seals: Seals, *, task_ids: set[str] | None = None, batch: int = 1000) -> dict[str, str]:
    """Each task whose sealed head is no longer a point of its chain: task id → what is wrong. A task that is gone
    is fine only if the retention purge recorded it (AdminAction by PURGE_ACTOR)."""
    items = [(task_id, head) for task_id, head in seals.heads.items() if task_ids is None or task_id in task_ids]
    broken: dict[str, str] = {}
    for start in range(0, len(items), batch):
        chunk = items[start:start + batch]
        with connection.cursor() as cursor:
            cursor.execute(EVENT_HASHES_AT, [[task_id for task_id, _ in chunk], [head[0] for _, head in chunk]])
            now = {str(task_id): value for task_id, value in cursor.fetchall()}
        missing = [task_id for task_id, _ in chunk if now.get(task_id) is None]
        present = {str(task_id) for task_id in Task.objects.filter(id__in=missing).values_list("id", flat=True)}
        purged = set(AdminAction.objects.filter(actor=PURGE_ACTOR, action="purge", model="tasks_app.task",
                                                object_id__in=missing).values_list("object_id", flat=True))
        for task_id, (seq, head, sequence) in chunk:
            value = now.get(task_id)
            if value == head:
                continue
            if value is None and task_id not in present:
                if task_id not in purged:
                    broken[task_id] = (f"sealed up to seq {seq} (seal {sequence}) but the task is gone, with no "
                                       f"retention purge record")
            elif value is None:
                broken[task_id] = f"event {seq}, sealed in seal {sequence}, is gone: the chain was cut"
            else:
                broken[task_id] = (f"event {seq} no longer has the hash seal {sequence} recorded: the chain was "
                                   f"rewritten after it was sealed")
    return broken
