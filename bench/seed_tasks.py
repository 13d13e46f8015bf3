"""Store many finished demo_steps tasks fast, for benchmarks and load tests.

    python3.11 deploy/dev.py seed --count 1000000 [--tenant bench] [--events-per-task 6] [--steps-per-task 0]
        [--batch 20000] [--days 30] [--workers 2] [--seed N]

seeds the database `deploy/dev.py run` serves (its embedded PostgreSQL unless DATABASE_URL is set); or on
services of your own:

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/NAME REDIS_URL=redis://127.0.0.1:6379/N SECRET_KEY=dev \
        .venv/bin/python bench/seed_tasks.py --count 20000 --seed 1

Stores the tasks with PostgreSQL COPY, as the engine would have left them: for benchmarks that compare costs at
1,000 and 1,000,000 stored tasks, and for load-testing the API against a big table. The rows are described in
bench/seeding.py; this module only reads the options and reports. Benchmarks call ``seed_tasks`` in-process.
Bench tooling, not a management command: the apps never import bench (tests/test_layers.py).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

if TYPE_CHECKING:
    from bench.seeding import SeedReport

DESCRIPTION = ("Store COUNT finished demo_steps tasks (mostly completed, a few failed or cancelled) with their events "
               "and a valid hash chain, fast, for benchmarks and load tests.")
# bench.seeding.DEFAULT_EVENTS_PER_TASK (tests/test_seed_tasks.py checks they agree), here because --help is shown
# before Django is set up and bench.seeding imports the models.
DEFAULT_EVENTS_PER_TASK = 6


def seed_tasks(*, count: int, tenant: str = "bench", events_per_task: int | None = None, steps_per_task: int = 0,
               batch: int = 20_000, days: float = 30, workers: int = 2, seed: int | None = None,
               out: TextIO | None = None, verbose: bool = True) -> SeedReport:
    """Store ``count`` finished tasks of the tenant with slug ``tenant`` (created if new), saying what it does on
    ``out`` (default stdout) unless ``verbose`` is false. Django must be set up. Bad options raise
    bench.seeding.SeedError before anything, the tenant included, is written."""
    from bench.seeding import SeedProgress, seed_options_check, seed_shape, tasks_seed
    from tasks_app.services import tenant_get_or_create

    out = out or sys.stdout

    def say(text: str) -> None:
        if verbose:
            out.write(text + "\n")
            out.flush()

    def progress(p: SeedProgress) -> None:
        say(f"  {p.done:,} / {p.total:,} tasks  {p.seconds:7.1f} s  {p.done / p.seconds:,.0f} tasks/s")

    seed_options_check(count=count, batch=batch, days=days, workers=workers)
    shape = seed_shape(events_per_task=events_per_task, steps_per_task=steps_per_task)
    owner = tenant_get_or_create(slug=tenant)
    say(f"seeding {count:,} tasks of tenant {owner.slug!r}: {shape.steps} step(s) and "
        f"{shape.events_per_task} events per completed task"
        f"{', with Step rows' if shape.write_steps else ''}; {batch:,} per transaction")
    report = tasks_seed(tenant=owner, count=count, shape=shape, batch=batch, days=days, workers=workers,
                        seed=seed, on_batch=progress)
    statuses = ", ".join(f"{n:,} {status}" for status, n in report.statuses.most_common())
    say(f"wrote {report.tasks:,} tasks ({statuses}), {report.events:,} events and {report.steps:,} steps "
        f"in {report.seconds:.1f} s, ANALYZE included ({report.tasks / report.seconds:,.0f} tasks/s)")
    return report


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=DESCRIPTION)
    parser.add_argument("--count", type=int, required=True, help="how many tasks to store (at least 1)")
    parser.add_argument("--tenant", default="bench", help="slug of the tenant they belong to (created if new)")
    parser.add_argument("--events-per-task", type=int, default=None,
                        help=f"events of a completed task: 4 + 1 per step, so at least 5 "
                             f"(default {DEFAULT_EVENTS_PER_TASK}, or what --steps-per-task implies)")
    parser.add_argument("--steps-per-task", type=int, default=0,
                        help="also write this many committed Step rows per task (the tasks then have this "
                             "many steps); 0 writes none (default)")
    parser.add_argument("--batch", type=int, default=20_000, help="tasks per COPY transaction (default 20000)")
    parser.add_argument("--days", type=float, default=30,
                        help="spread created_at over this many past days (default 30)")
    parser.add_argument("--workers", type=int, default=2,
                        help="connections writing batches at once (default 2; inside a transaction: 1)")
    parser.add_argument("--seed", type=int, default=None, help="random seed, for the same mix and times again")
    return parser


def main(argv: list[str] | None = None) -> int:
    options = parser()
    args = options.parse_args(argv)

    import django

    django.setup()
    from bench.seeding import SeedError

    try:
        seed_tasks(**vars(args))
    except SeedError as error:
        options.error(str(error))  # usage and the message on stderr, exit 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
