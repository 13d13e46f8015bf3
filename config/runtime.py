"""Runtime configuration: config/runtime.yaml, overridden by RUNTIME_* environment variables.

Loaded once by the settings module, so an invalid value stops web, workers and beat at start with a message
that names the key, instead of misbehaving later.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, fields, is_dataclass
from pathlib import Path
from typing import Any, get_type_hints

import yaml
from django.core.exceptions import ImproperlyConfigured

DEFAULT_PATH = Path(__file__).resolve().parent / "runtime.yaml"


@dataclass(frozen=True)
class CheckpointPolicy:
    every_steps: int = 10
    max_interval_seconds: float = 60
    max_bytes: int = 1024 * 1024
    keep: int = 3
    # The range a task's own checkpointPolicy may choose from (POST /runtime/tasks).
    task_min_every_steps: int = 1
    task_max_every_steps: int = 10_000
    task_min_seconds: float = 1
    task_max_seconds: float = 3600


@dataclass(frozen=True)
class RedactionPolicy:
    keys: tuple[str, ...] = ("password", "passwd", "secret", "token", "api_key", "apikey", "authorization",
                             "cookie", "credential", "private_key")
    patterns: tuple[str, ...] = ()


@dataclass(frozen=True)
class InputFilesPolicy:
    max_bytes: int = 512 * 1024
    max_files: int = 5


@dataclass(frozen=True)
class StepRetryPolicy:
    max_attempts: int = 3
    backoff_seconds: float = 0.5
    backoff_max_seconds: float = 30
    tool_timeout_attempts: int = 2


@dataclass(frozen=True)
class RuntimeConfig:
    max_concurrent_tasks: int = 64
    lease_seconds: float = 30
    heartbeat_seconds: float = 10
    max_recoveries: int = 3
    slice_seconds: float = 2.0
    progress_event_seconds: float = 0.25
    step_timeout_seconds: float = 900
    reaper_interval_seconds: float = 10
    redispatch_after_seconds: float = 30
    retention_days: int = 30
    checkpoint: CheckpointPolicy = CheckpointPolicy()
    step_retry: StepRetryPolicy = StepRetryPolicy()
    # Effect names that always wait for a person's approval (a task's approvalPolicy and ctx.effect(approval=True)
    # add to these, never remove them).
    require_approval: tuple[str, ...] = ()
    # Names of the secrets this deployment holds (in its environment or secret store): provide_input may refer to
    # them by name; a value that looks like a secret itself is refused.
    credentials: tuple[str, ...] = ()
    input_files: InputFilesPolicy = InputFilesPolicy()
    redaction: RedactionPolicy = RedactionPolicy()


# (key, check, what a valid value is)
_RULES = [
    ("max_concurrent_tasks", lambda v: v >= 1, "an integer ≥ 1"),
    ("lease_seconds", lambda v: v >= 1, "seconds ≥ 1"),
    ("heartbeat_seconds", lambda v: v > 0, "seconds > 0"),
    ("max_recoveries", lambda v: v >= 0, "an integer ≥ 0"),
    ("slice_seconds", lambda v: v >= 0, "seconds ≥ 0"),
    ("progress_event_seconds", lambda v: v >= 0, "seconds ≥ 0 (0: one progress event per step)"),
    ("step_timeout_seconds", lambda v: v > 0, "seconds > 0"),
    ("reaper_interval_seconds", lambda v: v >= 1, "seconds ≥ 1"),
    ("redispatch_after_seconds", lambda v: v >= 1, "seconds ≥ 1"),
    ("retention_days", lambda v: v >= 0, "days ≥ 0 (0 keeps tasks forever)"),
    ("checkpoint.every_steps", lambda v: v >= 1, "an integer ≥ 1"),
    ("checkpoint.max_interval_seconds", lambda v: v > 0, "seconds > 0"),
    ("checkpoint.max_bytes", lambda v: v >= 1024, "bytes ≥ 1024"),
    ("checkpoint.keep", lambda v: v >= 1, "an integer ≥ 1"),
    ("step_retry.max_attempts", lambda v: v >= 1, "an integer ≥ 1"),
    ("step_retry.backoff_seconds", lambda v: v >= 0, "seconds ≥ 0"),
    ("step_retry.backoff_max_seconds", lambda v: v >= 0, "seconds ≥ 0"),
    ("step_retry.tool_timeout_attempts", lambda v: v >= 1, "an integer ≥ 1"),
    ("checkpoint.task_min_every_steps", lambda v: v >= 1, "an integer ≥ 1"),
    ("checkpoint.task_max_every_steps", lambda v: v >= 1, "an integer ≥ 1"),
    ("checkpoint.task_min_seconds", lambda v: v > 0, "seconds > 0"),
    ("checkpoint.task_max_seconds", lambda v: v > 0, "seconds > 0"),
    ("input_files.max_bytes", lambda v: v >= 1, "bytes ≥ 1"),
    ("input_files.max_files", lambda v: v >= 0, "an integer ≥ 0"),
]
_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]{0,99}$")
# Lists of regular expressions rather than names.
_REGEX_LISTS = {"redaction.patterns"}


def _regex_list(key: str, value) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise _fail(key, f"must be a list of regular expressions, got {value!r}")
    for pattern in value:
        try:
            re.compile(pattern)
        except re.error as error:
            raise _fail(key, f"{pattern!r} is not a valid regular expression: {error}") from None
    return tuple(value)


def _fail(key: str, message: str) -> ImproperlyConfigured:
    return ImproperlyConfigured(f"runtime configuration `{key}`: {message}")


def _cast(key: str, kind: type, value: Any) -> Any:
    if isinstance(value, str):  # from the environment
        try:
            value = yaml.safe_load(value)
        except yaml.YAMLError:
            raise _fail(key, f"cannot parse {value!r}") from None
    if getattr(kind, "__origin__", None) is tuple:  # a list of names (e.g. RUNTIME_REQUIRE_APPROVAL='[a, b]')
        if value is None:
            return ()
        if key in _REGEX_LISTS:
            return _regex_list(key, value)
        if not isinstance(value, list) or not all(isinstance(v, str) and _NAME.match(v) for v in value):
            raise _fail(key, f"must be a list of names (letters, digits, '_', '.', '-'), got {value!r}")
        return tuple(value)
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise _fail(key, f"must be {'a number' if kind is float else 'an integer'}, got {value!r}")
    return value


def _build(cls, raw: dict, prefix: str = ""):
    if not isinstance(raw, dict):
        raise _fail(prefix.rstrip(".") or "(top level)", "must be a mapping")
    hints = get_type_hints(cls)
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise _fail(prefix + unknown[0], f"unknown key; known keys: {', '.join(sorted(known))}")
    values = {}
    for f in fields(cls):
        key = prefix + f.name
        env_value = os.environ.get("RUNTIME_" + key.replace(".", "__").upper())
        kind = hints[f.name]
        if is_dataclass(kind):
            values[f.name] = _build(kind, raw.get(f.name, {}) or {}, key + ".")
        elif env_value is not None:
            values[f.name] = _cast(key, kind, env_value)
        elif f.name in raw:
            values[f.name] = _cast(key, kind, raw[f.name])
    return cls(**values)


def _get(config: RuntimeConfig, dotted: str):
    value = config
    for part in dotted.split("."):
        value = getattr(value, part)
    return value


def load_runtime_config(path: Path | str | None = None) -> RuntimeConfig:
    path = Path(path or os.environ.get("RUNTIME_CONFIG_FILE") or DEFAULT_PATH)
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except OSError as error:
        raise ImproperlyConfigured(f"runtime configuration file {path}: {error.strerror}") from None
    except yaml.YAMLError as error:
        raise ImproperlyConfigured(f"runtime configuration file {path} is not valid YAML: {error}") from None
    config = _build(RuntimeConfig, raw)
    for key, check, expected in _RULES:
        value = _get(config, key)
        if not check(value):
            raise _fail(key, f"must be {expected}, got {value!r}")
    if config.heartbeat_seconds > config.lease_seconds / 3:
        raise _fail("heartbeat_seconds", f"must be at most lease_seconds / 3 ({config.lease_seconds / 3:g}) so "
                                         f"a renewal can fail twice before the lease expires")
    if config.checkpoint.task_max_every_steps < config.checkpoint.task_min_every_steps:
        raise _fail("checkpoint.task_max_every_steps", "must be ≥ checkpoint.task_min_every_steps")
    if config.checkpoint.task_max_seconds < config.checkpoint.task_min_seconds:
        raise _fail("checkpoint.task_max_seconds", "must be ≥ checkpoint.task_min_seconds")
    if config.step_retry.backoff_max_seconds < config.step_retry.backoff_seconds:
        raise _fail("step_retry.backoff_max_seconds", "must be ≥ step_retry.backoff_seconds")
    return config
