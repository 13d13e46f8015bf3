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


def nul_paths(value: Any, path: str = "") -> list[str]:
    """Where a JSON value holds a NUL character (in a string or a key): PostgreSQL's jsonb and text refuse it."""
    if isinstance(value, str):
        return [path] if "\x00" in value else []
    if isinstance(value, dict):
        found = []
        for key, item in value.items():
            child = f"{path}.{key}" if path else str(key)
            if "\x00" in str(key):
                found.append(child)
            found += nul_paths(item, child)
        return found
    if isinstance(value, list):
        return [p for index, item in enumerate(value) for p in nul_paths(item, f"{path}.{index}" if path else str(index))]
    return []
