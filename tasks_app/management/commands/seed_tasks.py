"""python manage.py seed_tasks --count 1000000 [--tenant bench] [--events-per-task 6] [--steps-per-task 0]
[--batch 20000] [--days 30] [--workers 2] [--seed N]

Stores many finished demo_steps tasks fast (PostgreSQL COPY), as the engine would have left them: for benchmarks
that compare costs at 1,000 and 1,000,000 stored tasks, and for load-testing the API against a big table. The
rows are described in bench/seeding.py; this command only reads the options and reports.
"""

from django.core.management.base import BaseCommand, CommandError

from bench.seeding import (
    DEFAULT_EVENTS_PER_TASK,
    SeedError,
    SeedProgress,
    seed_options_check,
    seed_shape,
    tasks_seed,
)
from tasks_app.services import tenant_get_or_create


class Command(BaseCommand):
    help = ("Store COUNT finished demo_steps tasks (mostly completed, a few failed or cancelled) with their events "
            "and a valid hash chain, fast, for benchmarks and load tests.")

    def add_arguments(self, parser):
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

    def handle(self, *args, count, tenant, events_per_task, steps_per_task, batch, days, workers, seed, **options):
        self.verbose = options.get("verbosity", 1) >= 1  # 0: quiet (the benchmark seeds in-process)
        try:
            seed_options_check(count=count, batch=batch, days=days, workers=workers)
            shape = seed_shape(events_per_task=events_per_task, steps_per_task=steps_per_task)
            owner = tenant_get_or_create(slug=tenant)
            self.say(f"seeding {count:,} tasks of tenant {owner.slug!r}: {shape.steps} step(s) and "
                     f"{shape.events_per_task} events per completed task"
                     f"{', with Step rows' if shape.write_steps else ''}; {batch:,} per transaction")
            report = tasks_seed(tenant=owner, count=count, shape=shape, batch=batch, days=days, workers=workers,
                                seed=seed, on_batch=self._progress)
        except SeedError as error:
            raise CommandError(str(error)) from None
        statuses = ", ".join(f"{n:,} {status}" for status, n in report.statuses.most_common())
        self.say(
            f"wrote {report.tasks:,} tasks ({statuses}), {report.events:,} events and {report.steps:,} steps "
            f"in {report.seconds:.1f} s, ANALYZE included ({report.tasks / report.seconds:,.0f} tasks/s)"
        )

    def say(self, text: str) -> None:
        if self.verbose:
            self.stdout.write(text)

    def _progress(self, progress: SeedProgress) -> None:
        self.say(f"  {progress.done:,} / {progress.total:,} tasks  {progress.seconds:7.1f} s  "
                          f"{progress.done / progress.seconds:,.0f} tasks/s")
