"""Canonical JSON and its sha256: one byte sequence per value, for fingerprints, checksums and hash chains."""

import hashlib
import json
from typing import Any


def canonical_json(value: Any) -> str:
    # Sorted keys, no whitespace, UTF-8 kept as is: equal values always give equal text.
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False,
                      default=str)


def canonical_sha256(value: Any) -> str:
    return hashlib.sha256(canonical_json(value).encode()).hexdigest()
