"""Masks secrets and personal data in text bound for events and logs (ARCHITECTURE §8)."""

import re

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
    return text


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


# Keys whose values are masked wherever a JSON value is shown (effect arguments and results, answers).
_SECRET_KEYS = re.compile(r"(?i)(password|passwd|secret|token|api[_-]?key|authorization|cookie|credential)")


def redact_json(value):
    """A JSON value fit to show: values under secret-looking keys masked, every string redacted."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {key: "[redacted]" if _SECRET_KEYS.search(str(key)) else redact_json(item)
                for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [redact_json(item) for item in value]
    return value
