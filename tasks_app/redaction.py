"""Masks secrets and personal data in text bound for events, logs, pages and streams (ARCHITECTURE §8).

Built-in patterns (tokens, keys, passwords, credentials in URLs, e-mail addresses) always apply; a deployment adds
its own in config/runtime.yaml (`redaction.patterns`, regular expressions, and `redaction.keys`, the JSON keys
whose values are masked whole). Applied where text is made: ctx.log(), error messages, wait prompts and effect
arguments when they are recorded; log records by config.logging_redaction's filter; JSON shown in the console by
redact_json.
"""

import functools
import re

from django.conf import settings

from config.base.json_input import bounded_copy

_PATTERNS = [
    (re.compile(r"(?i)\b(bearer)\s+[A-Za-z0-9._~+/=-]{8,}"), r"\1 [redacted]"),
    (re.compile(r"\bart_[A-Za-z0-9_-]{16,}"), "[redacted-token]"),
    (re.compile(r"\b(sk|pk|rk)-[A-Za-z0-9_-]{16,}"), "[redacted-key]"),
    (re.compile(r"\bAKIA[0-9A-Z]{16}\b"), "[redacted-key]"),
    (re.compile(r"\bgh[pousr]_[A-Za-z0-9]{20,}"), "[redacted-token]"),
    (re.compile(r"(?i)\b(password|passwd|secret|token|api[_-]?key)\s*[=:]\s*\S+"), r"\1=[redacted]"),
    (re.compile(r"(?i)\b[a-z][a-z0-9+.-]*://[^/\s:@]+:[^/\s@]+@"), "[redacted-credentials]@"),
    (re.compile(r"\b[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}\b"), "[redacted-email]"),
]


def redact(text: str) -> str:
    for pattern, replacement in _PATTERNS:
        text = pattern.sub(replacement, text)
    runtime = getattr(settings, "RUNTIME", None)  # (a log line written while settings load)
    for pattern in _configured_patterns(runtime.redaction.patterns if runtime else ()):
        text = pattern.sub("[redacted]", text)
    return text


@functools.lru_cache(maxsize=8)
def _configured_patterns(patterns: tuple[str, ...]) -> list[re.Pattern]:
    return [re.compile(pattern) for pattern in patterns]  # (checked at start-up by config.base.runtime)


@functools.lru_cache(maxsize=8)
def _secret_keys(keys: tuple[str, ...]) -> re.Pattern:
    return re.compile("|".join(re.escape(key) for key in keys) or r"(?!)", re.IGNORECASE)


# The patterns above that mark a secret (not personal data such as an e-mail address).
_SECRET_PATTERNS = [pattern for pattern, replacement in _PATTERNS if "email" not in replacement]
_OPAQUE = re.compile(r"^[A-Za-z0-9+/=_.~-]{24,}$")


def has_secret_pattern(text: str) -> bool:
    """Text that contains a known token or key shape, or a password or key assignment."""
    return any(pattern.search(text) for pattern in _SECRET_PATTERNS)


def looks_like_secret(text: str) -> bool:
    """A value that looks like a credential itself: a known token or key shape, or a long opaque string with the
    character mix of one. Used where only a secret's *name* may be given."""
    if has_secret_pattern(text):
        return True
    if _OPAQUE.match(text):
        kinds = sum(bool(re.search(chars, text)) for chars in (r"[a-z]", r"[A-Z]", r"[0-9]"))
        return kinds >= 3 or len(text) >= 40
    return False


def redact_json(value):
    """A JSON value fit to show or record: values under the configured secret keys (redaction.keys, matched
    anywhere in the key, case-insensitively) masked whole, every string redacted, and objects and arrays nested
    deeper than RUNTIME_MAX_JSON_DEPTH shown as a marker.

    Iterative (config.base.json_input.bounded_copy): a recursive walk raised RecursionError on a 900-deep goal, and every
    page showing it (the steering history, the audit's commands and their CSV) failed until the row was edited by
    hand. Cut at the input cap, the copy is shallow enough for json.dumps wherever it is shown."""
    secret = _secret_keys(settings.RUNTIME.redaction.keys)
    return bounded_copy(value, text=redact, masked=lambda key: bool(secret.search(str(key))))
