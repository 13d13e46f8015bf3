"""Stand-ins for external systems the example workflows call: append-only files outside PostgreSQL.

Because they live outside the database, tests and benchmarks can count what really happened (exactly-once
effects) independently of the ledger that is supposed to guarantee it.
"""

import json
from pathlib import Path

from django.conf import settings


def external_path(name: str) -> Path:
    path = Path(settings.EXTERNAL_ROOT) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def append_line(name: str, line: str) -> None:
    # One write() of a whole line in append mode: lines from concurrent processes never interleave.
    with open(external_path(name), "a") as handle:
        handle.write(line + "\n")


def lines(name: str) -> list[str]:
    path = external_path(name)
    return path.read_text().splitlines() if path.exists() else []


def append_record(name: str, record: dict) -> None:
    append_line(name, json.dumps(record, sort_keys=True))


def find_record(name: str, **match) -> dict | None:
    for line in lines(name):
        record = json.loads(line)
        if all(record.get(k) == v for k, v in match.items()):
            return record
    return None

