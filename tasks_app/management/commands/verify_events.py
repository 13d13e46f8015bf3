"""python manage.py verify_events [--task ID] [--anchors]: check the tamper-evident event chains (for auditors and
monitoring: the exit status is non-zero on any break). It acts as the deployment (tasks_app.access.SYSTEM): it reads
every tenant's chains and names no person; a person reads their tenant's through the admin's audit pages, under the
access rule (Action.READ_AUDIT).

Without --anchors, each task's chain is recomputed from its events: a changed or removed event is caught, but not a
chain rewritten consistently (every hash recomputed, the task's head updated). --anchors also reads the signed seals
of the chains' heads from blob storage (tasks_app.audit.anchors) and checks their signatures and their own chain,
and that each sealed head is still a point of its task's chain: a rewrite after a seal is caught, naming the task.
"""

from django.core.management.base import BaseCommand, CommandError

from tasks_app.models import Task
from tasks_app.selectors import task_events_verify


class Command(BaseCommand):
    help = ("Recompute every task's event hash chain; report the first bad event of each broken chain. With --anchors, "
            "also check the signed seals of the chains' heads. Exits non-zero on any break. Acts as the deployment "
            "(tasks_app.access.SYSTEM: every tenant's chains), for monitoring; a person reads one tenant's on the "
            "admin's audit pages.")

    def add_arguments(self, parser):
        parser.add_argument("--task", help="only this task id")
        parser.add_argument("--anchors", action="store_true",
                            help="also check the seals in blob storage, and every sealed head against its chain")

    def handle(self, *args, task=None, anchors=False, **options):
        ids = [task] if task else Task.objects.values_list("id", flat=True).iterator()
        checked, broken = 0, set()
        for task_id in ids:
            checked += 1
            bad_seq = task_events_verify(task_id=task_id)
            if bad_seq is not None:
                broken.add(str(task_id))
                self.stdout.write(f"{task_id}: chain broken at event {bad_seq}")
        seal_problems: list[str] = []
        if anchors:
            from tasks_app.audit.anchors import sealed_heads_check, seals_read

            seals = seals_read()
            seal_problems = seals.problems
            for problem in seal_problems:
                self.stdout.write(problem)
            for task_id, problem in sorted(sealed_heads_check(seals, task_ids={str(task)} if task else None).items()):
                broken.add(task_id)
                self.stdout.write(f"{task_id}: {problem}")
            self.stdout.write(f"{len(seals.documents)} seal(s) checked, {len(seals.heads)} sealed head(s)")
        self.stdout.write(f"{checked} task(s) checked, {len(broken)} broken chain(s)")
        if broken or seal_problems:
            raise CommandError("event chains do not verify: the audit trail was altered"
                               + (f" (tasks: {', '.join(sorted(broken)[:20])})" if broken else "")
                               + (f" ({len(seal_problems)} seal problem(s))" if seal_problems else ""))
