"""python manage.py verify_events [--task ID]: check the tamper-evident event chain of tasks (for auditors)."""

from django.core.management.base import BaseCommand, CommandError

from tasks_app.models import Task
from tasks_app.selectors import task_events_verify


class Command(BaseCommand):
    help = "Recompute every task's event hash chain; report the first bad event of each broken chain."

    def add_arguments(self, parser):
        parser.add_argument("--task", help="only this task id")

    def handle(self, *args, task=None, **options):
        ids = [task] if task else Task.objects.values_list("id", flat=True).iterator()
        checked, broken = 0, []
        for task_id in ids:
            checked += 1
            bad_seq = task_events_verify(task_id=task_id)
            if bad_seq is not None:
                broken.append(task_id)
                self.stdout.write(f"{task_id}: chain broken at event {bad_seq}")
        self.stdout.write(f"{checked} task(s) checked, {len(broken)} broken chain(s)")
        if broken:
            raise CommandError("event chains do not verify: the audit trail was altered")
