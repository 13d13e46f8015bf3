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


def storable(text: str) -> str:
    """Text PostgreSQL can store: NUL characters and lone surrogates replaced."""
    return text.replace("\x00", "\ufffd").encode("utf-8", "replace").decode()


class NotJson(TypeError):
    """A value that JSON cannot carry unchanged; ``path`` says where (e.g. "state.totals.3")."""

    def __init__(self, path: str, reason: str):
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


def canonical_json_strict(value: Any, path: str = "value", *, allow_nul: bool = False) -> str:
    """Canonical JSON of a value that survives a round trip unchanged and PostgreSQL can store, else NotJson
    naming the first bad place.

    Unlike canonical_json (which stringifies what it does not know, right for fingerprints), durable state and
    step outputs must come back exactly as they were written: no Decimal, datetime, UUID, set, bytes, NaN or
    infinity, no tuples (they would come back as lists), no non-string keys (they would come back as strings),
    no lone surrogates or NUL characters (PostgreSQL refuses them) and no nesting deeper than Python can walk.
    """
    try:
        text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
        text.encode()  # lone surrogates cannot be encoded, nor stored
        same = json.loads(text) == value  # C-speed check for what dumps converts silently (tuples, int keys)
    except RecursionError:
        raise NotJson(path, "the value is nested too deeply to store") from None
    except (TypeError, ValueError):  # UnicodeEncodeError is a ValueError
        raise NotJson(*_first_problem(value, path)) from None
    if not same:
        raise NotJson(*_first_problem(value, path))
    if not allow_nul and "\\u0000" in text:  # the text escapes NUL this way (or it is a literal backslash-u)
        places = nul_paths(value, path)
        if places:
            raise NotJson(places[0], "text with a NUL character (\\u0000), which PostgreSQL cannot store")
    return text


def _first_problem(value: Any, path: str) -> tuple[str, str]:
    stack = [(value, path)]
    while stack:
        item, where = stack.pop()
        if isinstance(item, str):
            try:
                item.encode()
            except UnicodeEncodeError:
                return where, "text with a lone surrogate character, which cannot be stored"
            continue
        if item is None or isinstance(item, (bool, int)):
            continue
        if isinstance(item, float):
            if item != item or item in (float("inf"), float("-inf")):
                return where, f"{item!r} is not a JSON number"
            continue
        if isinstance(item, dict):
            for key, child in item.items():
                if not isinstance(key, str):
                    return where, f"key {key!r} is a {type(key).__name__}; JSON keys are strings"
                try:
                    key.encode()
                except UnicodeEncodeError:
                    return where, "a key with a lone surrogate character, which cannot be stored"
                stack.append((child, f"{where}.{key}"))
            continue
        if isinstance(item, list):
            stack.extend((child, f"{where}.{index}") for index, child in enumerate(item))
            continue
        return where, f"a {type(item).__name__} is not a JSON value (use str, int, float, bool, None, list or dict)"
    return path, "the value does not survive a JSON round trip"
