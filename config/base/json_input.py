"""JSON that cannot break anything: one reading of every JSON body the runtime accepts, and bounded walks for the
JSON values it shows.

Reading (``loads``, used by the REST parser, /mcp, OAuth registration and the admin's JSON form fields): the body
must be UTF-8 (RFC 8259 §8.1; a byte sequence that is not, raw UTF-8-encoded surrogates included, is refused), its
objects and arrays nested at most RUNTIME_MAX_JSON_DEPTH levels (default 64), and no string or key may hold a lone
surrogate (``"\\ud800"``: valid JSON text, but no UTF-8 can carry it, so PostgreSQL, a hash or a page would fail
on it later). Python's own parser recurses once per level: 10,000 ``[`` ran it past the interpreter's recursion
limit, a RecursionError that every caller let through as a 500. The depth is measured before parsing, on the
text with its strings taken out, in C-speed passes, so an attacker's 1 MB of brackets costs milliseconds.

Showing (``bounded_copy``, used by tasks_app.redaction.redact_json, the REST renderer and canonical_json): a value
already stored — written by SQL, or accepted before the cap existed — may be nested any depth PostgreSQL takes
(thousands of levels). A recursive walk over it, or json.dumps, raised RecursionError on every page that showed it,
until someone edited the row by hand. The walks here are iterative; what lies deeper than the cap is shown as the
``cut_marker`` text instead of failing.
"""

from __future__ import annotations

import json
import operator
import re
from collections.abc import Callable
from itertools import accumulate, count
from typing import Any

from django import forms
from django.conf import settings
from django.db import models
from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser
from rest_framework.renderers import JSONRenderer

from config.base.problems import Problem, SizeLimitedJSONParser

# A JSON string (escapes included), so that brackets inside strings are not counted as nesting. On the UTF-8
# bytes: no byte of a multi-byte character is ASCII, so a quote or backslash byte is always that character.
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
# "[" and "{" open a level, "]" and "}" close one: as the bytes 2 and 0 (every other byte deleted), whose running
# sum minus the count of brackets read so far is the depth at each bracket (see nesting_depth).
_LEVELS = bytes.maketrans(b"[{]}", b"\x02\x02\x00\x00")
_NOT_BRACKETS = bytes(set(range(256)) - set(b"[{]}"))
# A \uD800–\uDFFF escape: only then can the parsed value hold a lone surrogate (the text itself is valid UTF-8).
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")

TOO_DEEP, NOT_UTF8, LONE_SURROGATE, MALFORMED = "too-deep", "not-utf8", "lone-surrogate", "malformed"


def max_depth() -> int:
    return settings.RUNTIME_MAX_JSON_DEPTH


class JsonInputError(ValueError):
    """A body refused before anything was done with it; ``kind`` is one of TOO_DEEP, NOT_UTF8, LONE_SURROGATE,
    MALFORMED, and the message says what was wrong in words a client can act on."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


def nesting_depth(text: str | bytes, *, stop_above: int | None = None) -> int:
    """How deeply the objects and arrays of a JSON text nest (``1`` for ``{}``, ``0`` for a scalar). Exact for
    valid JSON; for invalid JSON an estimate (the parser refuses that text anyway). With ``stop_above``, the scan
    may stop at the first stretch of text that goes deeper: the answer is then at least that deep, not exact
    (an attacker's megabyte of brackets costs a fraction of a millisecond, not the whole scan)."""
    raw = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else bytes(text)
    steps = _STRING.sub(b"", raw).translate(_LEVELS, _NOT_BRACKETS)
    deepest = level = 0
    for start in range(0, len(steps), _STRETCH):
        sums = list(accumulate(steps[start:start + _STRETCH]))
        deepest = max(deepest, level + max(map(operator.sub, sums, count(1))))
        level += sums[-1] - len(sums)
        if stop_above is not None and deepest > stop_above:
            break
    return deepest


_STRETCH = 65_536  # brackets per step of nesting_depth's scan


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not a JSON value")  # NaN, Infinity, -Infinity: Python's extension, not JSON


def loads(raw: bytes | str, *, depth: int | None = None) -> Any:
    """Parse one JSON document under the rules above, or raise JsonInputError saying why not."""
    limit = max_depth() if depth is None else depth
    if isinstance(raw, (bytes, bytearray, memoryview)):
        try:
            text = bytes(raw).decode("utf-8")  # strict: refuses encoded surrogates, which json.loads would pass
        except UnicodeDecodeError as error:
            raise JsonInputError(NOT_UTF8, f"The body is not valid UTF-8 (byte {error.start}): send JSON encoded as "
                                           f"UTF-8.") from None
    else:
        text = raw
    found = nesting_depth(raw, stop_above=limit)
    if found > limit:
        raise JsonInputError(TOO_DEEP, f"The JSON nests objects and arrays {found} levels deep (or more); at most "
                                       f"{limit} are accepted (RUNTIME_MAX_JSON_DEPTH).")
    try:
        value = json.loads(text, parse_constant=_refuse_constant)
    except RecursionError:  # (only if the estimate above was wrong for a malformed text)
        raise JsonInputError(TOO_DEEP, f"The JSON nests objects and arrays too deeply; at most {limit} levels are "
                                       f"accepted (RUNTIME_MAX_JSON_DEPTH).") from None
    except ValueError as error:
        raise JsonInputError(MALFORMED, str(error)) from None
    if _SURROGATE_ESCAPE.search(text):
        where = lone_surrogate_path(value)
        if where is not None:
            raise JsonInputError(LONE_SURROGATE, f"The JSON holds a lone surrogate escape (\\uD800–\\uDFFF without "
                                                 f"its pair) at {where or 'the top'}: no UTF-8 text can carry it. "
                                                 f"Send the character itself, or a pair of escapes.")
    return value


def lone_surrogate_path(value: Any) -> str | None:
    """Where a JSON value holds a string or key with a lone surrogate ("a.b.0"; "" for the value itself), else
    None. Iterative: the value may be deep."""
    stack = [(value, "")]
    while stack:
        item, path = stack.pop()
        if isinstance(item, str):
            if not item.isascii() and not _encodes(item):
                return _printable(path)
        elif isinstance(item, dict):
            for key, child in item.items():
                where = f"{path}.{key}" if path else str(key)
                if isinstance(key, str) and not key.isascii() and not _encodes(key):
                    return _printable(where)
                stack.append((child, where))
        elif isinstance(item, list | tuple):
            stack.extend((child, f"{path}.{index}" if path else str(index)) for index, child in enumerate(item))
    return None


def _printable(path: str) -> str:
    return path.encode("utf-8", "backslashreplace").decode()  # (the path may hold the surrogate: \\ud800 then)


def _encodes(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


# --- values stored: read back whatever their depth ---------------------------------------------------------------

# One JSON token of PostgreSQL's jsonb text (a string is read by json's own scanstring, from its opening quote).
_TOKEN = re.compile(r'\s*(?:([\[{])|([\]}])|([,:])|(")|(-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][-+]?\d+)?)'
                    r"|(true|false|null))")
_LITERALS = {"true": True, "false": False, "null": None}


def loads_iterative(text: str) -> Any:
    """json.loads for a valid JSON text, with an explicit stack instead of recursion: for a value nested deeper than
    Python's parser can read (PostgreSQL stores thousands of levels)."""
    stack: list[Any] = []  # the open containers
    keys: list[Any] = []  # for each, the key whose value comes next (objects), else None
    pos = 0
    while True:
        match = _TOKEN.match(text, pos)
        if match is None:
            raise ValueError(f"not JSON at character {pos}")
        pos, kind = match.end(), match.lastindex
        if kind == 1:
            stack.append({} if match.group(1) == "{" else [])
            keys.append(None)
            continue
        if kind == 3:
            continue
        if kind == 2:
            value = stack.pop()
            keys.pop()
        elif kind == 4:
            value, pos = json.decoder.scanstring(text, pos)
            if stack and isinstance(stack[-1], dict) and keys[-1] is None:
                keys[-1] = value  # (a key: its value follows the colon)
                continue
        elif kind == 5:
            number = match.group(5)
            value = float(number) if any(c in number for c in ".eE") else int(number)
        else:
            value = _LITERALS[match.group(6)]
        if not stack:
            if text[pos:].strip():
                raise ValueError(f"extra data at character {pos}")
            return value
        if isinstance(stack[-1], dict):
            stack[-1][keys[-1]] = value
            keys[-1] = None
        else:
            stack[-1].append(value)


def loads_stored(text: str | bytes) -> Any:
    """json.loads for a value this runtime stored (a jsonb column read as text by a raw cursor, a psycopg loader):
    a value nested deeper than json.loads can read is read by loads_iterative instead of raising RecursionError.
    Whole: the caller shows it through a bounded walk (bounded_copy, the REST renderer, dumps_bounded)."""
    try:
        return json.loads(text)
    except RecursionError:
        return loads_iterative(text.decode() if isinstance(text, (bytes, bytearray, memoryview)) else text)


def loads_stored_shown(text: str | bytes) -> Any:
    """loads_stored for a reader that only shows the value (the snapshot edge's connections): a value too deep for
    json.loads comes back cut at the cap (bounded_copy), so the json.dumps of whatever answer holds it fits."""
    try:
        return json.loads(text)
    except RecursionError:
        return bounded_copy(loads_stored(text))


class StoredJSONField(models.JSONField):
    """Django's JSONField, except that a stored value nested deeper than json.loads can read (written by SQL, or
    before the input cap) is read iteratively instead of raising RecursionError — which failed every page and
    every query loading the row. The same column to the migrations: it deconstructs as Django's JSONField."""

    def from_db_value(self, value, expression, connection):
        try:
            return super().from_db_value(value, expression, connection)
        except RecursionError:
            return loads_iterative(value)

    def deconstruct(self):
        name, _path, args, kwargs = super().deconstruct()
        return name, "django.db.models.JSONField", args, kwargs


# --- where bodies are parsed -------------------------------------------------------------------------------------


class JsonInputRefused(Problem):
    """400 problem details for a body ``loads`` refused."""

    def __init__(self, error: JsonInputError):
        super().__init__(str(error), reason=error.kind)
        self.slug = "json-too-deep" if error.kind == TOO_DEEP else "malformed-json"


class StrictJSONParser(JSONParser):
    """DRF's JSON parser reading through ``loads``: UTF-8 only, the nesting cap, no lone surrogates, no NaN."""

    def parse(self, stream, media_type=None, parser_context=None):
        raw = stream.read() if stream is not None else b""
        try:
            return loads(raw)
        except JsonInputError as error:
            if error.kind == MALFORMED:  # (as DRF said it: "The body is not valid JSON: …", config.base.problems)
                raise ParseError(f"JSON parse error - {error}") from None
            raise JsonInputRefused(error) from None


class JsonBodyParser(SizeLimitedJSONParser, StrictJSONParser):
    """The REST API's parser (REST_FRAMEWORK DEFAULT_PARSER_CLASSES): SizeLimitedJSONParser reads at most the size
    limit (413 beyond it), then hands the bytes on — its super().parse is StrictJSONParser's, by this order."""


class JsonFormField(forms.JSONField):
    """The admin's JSON form field: text read through ``loads`` (a form error saying why, where Django's field let a
    RecursionError through as a 500 and passed lone surrogates on to PostgreSQL), a stored value shown bounded."""

    def to_python(self, value):
        if self.disabled or value in self.empty_values or isinstance(value, (list, dict, int, float,
                                                                             forms.fields.JSONString)):
            return super().to_python(value)
        try:
            converted = loads(value)
        except JsonInputError as error:
            # Not JSON at all: Django's own words ("Enter a valid JSON."); refused by the rules: why.
            message = self.error_messages["invalid"] if error.kind == MALFORMED else str(error)
            raise forms.ValidationError(message, code="invalid", params={"value": value}) from None
        return forms.fields.JSONString(converted) if isinstance(converted, str) else converted

    def bound_data(self, data, initial):
        if self.disabled:
            return initial
        if data is None:
            return None
        try:
            return loads(data)
        except JsonInputError:
            return forms.fields.InvalidJSONInput(data)

    def prepare_value(self, value):
        if isinstance(value, forms.fields.InvalidJSONInput):
            return value
        try:
            return json.dumps(value, ensure_ascii=False, cls=self.encoder)
        except RecursionError:  # (stored deeper than json.dumps walks: shown cut, not a 500 on the change form)
            return json.dumps(bounded_copy(value), ensure_ascii=False, cls=self.encoder)


# --- where values are shown ------------------------------------------------------------------------------------


def cut_marker(depth: int) -> str:
    return f"[nested deeper than {depth} levels: not shown]"


def bounded_copy(value: Any, *, text: Callable[[str], str] | None = None,
                 masked: Callable[[Any], bool] | None = None, depth: int | None = None,
                 masked_as: str = "[redacted]") -> Any:
    """A copy of a JSON value with every object and array nested deeper than ``depth`` (default: the input cap)
    replaced by ``cut_marker(depth)``, each string passed through ``text``, and each value under a key for which
    ``masked(key)`` is true replaced by ``masked_as``. Tuples become lists; anything else is kept as it is.
    Iterative, so no depth of input can make it raise RecursionError; a value within the cap comes back whole."""
    limit = max_depth() if depth is None else depth
    marker = cut_marker(limit)
    root: list[Any] = [None]
    stack: list[tuple[Any, Any, Any, int]] = [(value, root, 0, 1)]  # (item, where to put its copy, slot, level)
    while stack:
        item, parent, slot, level = stack.pop()
        if isinstance(item, str):
            parent[slot] = text(item) if text is not None else item
        elif isinstance(item, dict):
            if level > limit:
                parent[slot] = marker
                continue
            copy: dict = {}
            parent[slot] = copy
            for key, child in item.items():
                if masked is not None and masked(key):
                    copy[key] = masked_as
                else:
                    copy[key] = None  # (its place, so the keys keep their order)
                    stack.append((child, copy, key, level + 1))
        elif isinstance(item, list | tuple):
            if level > limit:
                parent[slot] = marker
                continue
            copy = [None] * len(item)
            parent[slot] = copy
            stack.extend((child, copy, index, level + 1) for index, child in enumerate(item))
        else:
            parent[slot] = item
    return root[0]


def dumps_bounded(value: Any, **options) -> str:
    """json.dumps(value, **options), except that a value too deep for it (stored by SQL, or before the input cap) is
    written cut at the cap (bounded_copy's marker) instead of raising RecursionError. A value within the cap: the
    same text, at json.dumps' speed (the copy is made only when the fast path failed)."""
    try:
        return json.dumps(value, **options)
    except RecursionError:
        return json.dumps(bounded_copy(value), **options)


class BoundedJSONRenderer(JSONRenderer):
    """The REST API's renderer: DRF's, except that a value too deep for json.dumps (stored by SQL, or before the
    input cap) is rendered cut at the cap with a marker, and a lone surrogate in a stored string as its \\u escape,
    instead of failing the whole answer with a 500."""

    def render(self, data, accepted_media_type=None, renderer_context=None):
        try:
            return super().render(data, accepted_media_type, renderer_context)
        except RecursionError:
            data = bounded_copy(data)
        except UnicodeEncodeError:
            pass  # a lone surrogate in a stored string: UTF-8 cannot carry it, a \ud800 escape can
        escaping = type(self)()
        escaping.ensure_ascii = True
        return escaping.render(data, accepted_media_type, renderer_context)
