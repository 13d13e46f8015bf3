"""Where the client finds the server and its token: arguments, then the environment, then a config file.

    RUNTIME_URL     the server, e.g. https://runtime.example.com (default http://127.0.0.1:8000; a trailing
                    /runtime, as the README's $API has it, is accepted)
    RUNTIME_TOKEN   the bearer token (TOKEN, as the README exports it, when RUNTIME_TOKEN is not set)
    RUNTIME_CONFIG  the config file (default $XDG_CONFIG_HOME/agent-runtime/config.toml, i.e.
                    ~/.config/agent-runtime/config.toml)
    RUNTIME_PROFILE the profile (table) of the config file to use (default: `default`)

The config file, one table per profile:

    [default]
    url = "http://127.0.0.1:8000"
    token_file = "/home/me/agent-runtime/var/dev-api-token"   # or: token = "art_…" (keep the file 0600)

    [staging]
    url = "https://runtime.staging.example.com"
    token = "art_…"

A profile named on the command line (--profile) wins over the environment; the `default` profile fills in what the
environment leaves unset. The token is never printed or logged."""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from tasks_app.client.errors import ConfigurationError

DEFAULT_URL = "http://127.0.0.1:8000"


@dataclass(frozen=True)
class Settings:
    url: str
    token: str = field(repr=False)  # (never in a repr, a log line or an error)
    source: str = ""  # where the token came from, for error messages


def config_path() -> Path:
    if os.environ.get("RUNTIME_CONFIG"):
        return Path(os.environ["RUNTIME_CONFIG"]).expanduser()
    base = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    return base / "agent-runtime" / "config.toml"


def _profile(name: str, *, required: bool) -> dict:
    path = config_path()
    if not path.exists():
        if required:
            raise ConfigurationError(f"No config file at {path} for the profile {name!r}.")
        return {}
    try:
        document = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as error:
        raise ConfigurationError(f"Cannot read the config file {path}: {error}") from None
    table = document.get(name)
    if table is None:
        if required:
            raise ConfigurationError(f"The config file {path} has no profile [{name}] (it has: "
                                     f"{', '.join(sorted(document)) or 'none'}).")
        return {}
    if not isinstance(table, dict):
        raise ConfigurationError(f"[{name}] in {path} must be a table with url and token (or token_file).")
    token = table.get("token")
    if not token and table.get("token_file"):
        token_file = Path(str(table["token_file"])).expanduser()
        try:
            token = token_file.read_text().strip()
        except OSError as error:
            raise ConfigurationError(f"Cannot read token_file {token_file} of [{name}] in {path}: "
                                     f"{error.strerror}") from None
    return {"url": table.get("url"), "token": token, "source": f"[{name}] in {path}"}


def normalize_url(url: str) -> str:
    url = url.strip().rstrip("/")
    return url.removesuffix("/runtime")  # the README's $API ends in /runtime; the client adds it itself


def resolve(*, url: str | None = None, token: str | None = None, profile: str | None = None) -> Settings:
    """The server and token: arguments, then a profile named here, then the environment, then the default profile."""
    named = profile or os.environ.get("RUNTIME_PROFILE")
    chosen = _profile(named, required=True) if named else {}
    fallback = _profile("default", required=False) if not named else {}
    env_token = os.environ.get("RUNTIME_TOKEN") or os.environ.get("TOKEN")
    env_source = "RUNTIME_TOKEN" if os.environ.get("RUNTIME_TOKEN") else "TOKEN"
    candidates = [(token, "the caller"), (chosen.get("token"), chosen.get("source")), (env_token, env_source),
                  (fallback.get("token"), fallback.get("source"))]
    found_token, source = next(((t, s) for t, s in candidates if t), (None, ""))
    found_url = url or chosen.get("url") or os.environ.get("RUNTIME_URL") or fallback.get("url") or DEFAULT_URL
    if not found_token:
        raise ConfigurationError(
            f"No API token: export RUNTIME_TOKEN=… (a development stack's: export RUNTIME_TOKEN=$(cat "
            f"var/dev-api-token)), or put token = \"…\" or token_file = \"…\" under [default] in {config_path()}.")
    return Settings(url=normalize_url(str(found_url)), token=str(found_token).strip(), source=str(source))
