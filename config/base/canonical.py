"""Canonical JSON and its sha256: one byte sequence per value, for fingerprints, checksums and hash chains."""

import hashlib
import json
from typing import Any


def canonical_json(value: Any) -> str:
    # Sorted keys, no whitespace, UTF-8 kept as is: equal values always give equal text.
    try:
        return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False,
                          default=str)
    except RecursionError:
        # A value nested deeper than json.dumps can walk (stored by SQL, or before config.base.json_input's cap): the
        # same text, written without recursion, so that hashing or showing it never fails.
        return _canonical_json_iterative(value)


def canonical_sha256(value: Any) -> str:
    # surrogatepass: a lone surrogate (valid in a Python str, not in UTF-8) hashes instead of raising; text without
    # one encodes exactly as before, so no hash already recorded changes.
    return hashlib.sha256(canonical_json(value).encode("utf-8", "surrogatepass")).hexdigest()


class _Text(str):
    """Output already written (a bracket, a separator, a key), as opposed to a value still to encode."""


def _canonical_json_iterative(value: Any) -> str:
    """canonical_json's text, character for character, with an explicit stack instead of recursion."""
    parts: list[str] = []
    work: list[Any] = [value]
    while work:
        item = work.pop()
        if type(item) is _Text:
            parts.append(item)
        elif isinstance(item, str):
            parts.append(json.dumps(item, ensure_ascii=False))
        elif item is None or item is True or item is False or isinstance(item, (int, float)):
            parts.append(json.dumps(item, allow_nan=False))
        elif isinstance(item, dict):
            pairs = sorted(item.items())  # (as json.dumps' sort_keys: by key; mixed key types raise TypeError)
            work.append(_Text("}"))
            for index, (key, child) in enumerate(reversed(pairs)):
                work.append(child)
                separator = "{" if index == len(pairs) - 1 else ","
                work.append(_Text(separator + json.dumps(_key_text(key), ensure_ascii=False) + ":"))
            if not pairs:
                work.append(_Text("{"))
        elif isinstance(item, list | tuple):
            work.append(_Text("]"))
            for index, child in enumerate(reversed(item)):
                work.append(child)
                work.append(_Text("[" if index == len(item) - 1 else ","))
            if not item:
                work.append(_Text("["))
        else:
            parts.append(json.dumps(str(item), ensure_ascii=False))  # default=str
    return "".join(parts)


def _key_text(key: Any) -> str:
    """A dict key as json.dumps writes it (it converts these five kinds, refuses the rest)."""
    if isinstance(key, str):
        return key
    if key is None or key is True or key is False or isinstance(key, (int, float)):
        return json.dumps(key, allow_nan=False)
    raise TypeError(f"keys must be str, int, float, bool or None, not {type(key).__name__}")


def nul_paths(value: Any, path: str = "") -> list[str]:
    """Where a JSON value holds a NUL character (in a string or a key): PostgreSQL's jsonb and text refuse it.
    Depth-first, in the value's order; iterative, so no depth of value makes it raise RecursionError."""
    found = []
    stack: list[tuple[Any, str, bool]] = [(value, path, False)]  # (item, its path, whether its key holds a NUL)
    while stack:
        item, where, bad_key = stack.pop()
        if bad_key:
            found.append(where)
        if isinstance(item, str):
            if "\x00" in item:
                found.append(where)
        elif isinstance(item, dict):
            for key, child in reversed(list(item.items())):
                stack.append((child, f"{where}.{key}" if where else str(key), "\x00" in str(key)))
        elif isinstance(item, list):
            stack.extend((child, f"{where}.{index}" if where else str(index), False)
                         for index, child in reversed(list(enumerate(item))))
    return found


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
