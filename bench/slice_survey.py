"""Survey of the slice rule's violations: every kind, how often, and the smallest case of each.

    python3.11 deploy/dev.py bench --slice-survey [--examples 3000] [--random]

or on services of your own (a PostgreSQL server and a Redis database nobody else uses):

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/NAME REDIS_URL=redis://127.0.0.1:6379/N SECRET_KEY=dev \
        .venv/bin/python bench/slice_survey.py --examples 3000

Not a check, so not in the test suite: it asserts nothing and always exits 0. It drives the generated cases of
tests/test_slice_properties.py (its strategy and its invariants, imported from there: one home for both) without
stopping at the first violation or shrinking, and lists each kind of violation of "no exception leaves a slice
without a durable decision" with its smallest case as ``case = {…}`` JSON. Also listed, marked "note": runs that
kept the rule only through the engine's catch-all dead letter (reason engine_error). Then, with the test:

    SLICE_FOCUS=<part of a kind> pytest tests/test_slice_properties.py   # minimise that kind only
    SLICE_CASE='{…}' pytest tests/test_slice_properties.py -k replay     # re-run one printed case

It runs on a scratch database of its own, "<DATABASE_URL's name>_slice_survey" (bench/scratch.py), driving the
tasks in this process.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
os.environ.setdefault("LOG_LEVEL", "WARNING")

def survey(*, examples: int, derandomize: bool, tenant) -> tuple[int, dict[str, list[str]]]:
    """Run ``examples`` generated cases; return how many ran and the cases of each kind of violation (or note)."""
    from hypothesis import Phase, given
    from hypothesis import settings as hypothesis_settings

    from tests.test_slice_properties import HEALTH_CHECKS_OFF, cases, failure_kind, run_case

    found: dict[str, list[str]] = defaultdict(list)
    ran = 0

    @hypothesis_settings(max_examples=examples, deadline=None, database=None, derandomize=derandomize,
                         phases=[Phase.generate], suppress_health_check=HEALTH_CHECKS_OFF)
    @given(case=cases())
    def one(case):
        nonlocal ran
        ran += 1
        try:
            task = run_case(case, tenant)
        except Exception as error:  # noqa: BLE001 — a violation is what this counts, not a failure of the survey
            found[failure_kind(error)].append(json.dumps(case))
            return
        if task.status == "dead_lettered" and (task.error or {}).get("reason") == "engine_error":
            head = (task.error.get("message") or "").split(":")[0]
            found[f"note: dead-lettered engine_error: {head}"].append(json.dumps(case))

    one()
    return ran, found


def report(ran: int, found: dict[str, list[str]]) -> str:
    lines = [f"{ran} cases run; {len(found)} kinds of violation (or note) in {sum(len(v) for v in found.values())} "
             f"of them, the smallest case of each:"]
    for kind, examples in sorted(found.items(), key=lambda item: -len(item[1])):
        lines.append(f"{len(examples):6d}  {kind}\n        {min(examples, key=len)}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=3000, help="generated cases to run (default 3000)")
    parser.add_argument("--random", action="store_true",
                        help="a random seed instead of the fixed, reproducible one")
    args = parser.parse_args()

    import django

    django.setup()
    from bench.scratch import scratch_database
    from tests import slice_workflow as wf

    with scratch_database("slice_survey") as tenant:
        wf.workflow_register()
        ran, found = survey(examples=args.examples, derandomize=not args.random, tenant=tenant)
    print(report(ran, found), flush=True)

if __name__ == "__main__":
    main()
