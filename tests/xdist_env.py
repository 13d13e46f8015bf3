"""Each test process of a parallel run (pytest-xdist, `-n`) gets a broker database of its own.

Loaded with `-p tests.xdist_env` (pyproject's addopts), so it runs before pytest-django sets Django up and the
settings read REDIS_URL. pytest-django gives each process a test database of its own (test_<name>_gw0, …); the
broker needs the same, or one process's Celery workers would take the other's run_step messages (harmless to the
runtime — a hint for an unknown task does nothing — but the other process's task would wait for the reaper). Live
events' pub/sub is not split: its channels are named by task id, and task ids are unique.

The first process keeps the database the test command chose (15); the others take 9, 8, 7 (10–14 are the
benchmarks', deploy/dev.py bench). TEST_BROKER_DATABASES lists the ones the suite owns and may flush."""

from __future__ import annotations

import os

# 15 is the test command's; the others let several runs of parts of the suite go on side by side on one Redis, each
# on broker databases of its own (REDIS_URL=redis://127.0.0.1:6379/6, … with -n 2 at most; /0 with one process).
TEST_BROKER_DATABASES = {"15": ["15", "9", "8", "7"], "6": ["6", "5"], "4": ["4", "3"], "1": ["1", "2"],
                         "12": ["12", "13"], "0": ["0"]}

worker = os.environ.get("PYTEST_XDIST_WORKER")  # set by xdist before the worker parses its options: gw0, gw1, …
url = os.environ.get("REDIS_URL", "")
base, _, database = url.rpartition("/")
if worker and database in TEST_BROKER_DATABASES:
    number = int(worker.removeprefix("gw"))
    owned = TEST_BROKER_DATABASES[database]
    if number >= len(owned):
        raise RuntimeError(f"at most {len(owned)} test processes: each needs a broker database of its own")
    os.environ["REDIS_URL"] = f"{base}/{owned[number]}"
    os.environ["TEST_BROKER_OWNED"] = "1"
elif database in TEST_BROKER_DATABASES:
    os.environ["TEST_BROKER_OWNED"] = "1"
