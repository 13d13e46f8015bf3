"""python manage.py dead_letters list | retry TASK_ID [--effects applied|not_applied] | abandon TASK_ID"""

from django.core.management.base import BaseCommand, CommandError

from tasks_app import recovery


class Command(BaseCommand):
    help = "List dead-lettered tasks, retry one from its last good checkpoint, or abandon it as failed."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True)
        sub.add_parser("list")
        retry = sub.add_parser("retry")
        retry.add_argument("task_id")
        retry.add_argument("--effects", choices=["applied", "not_applied"],
                           help="how to resolve effects whose outcome is unknown (check the remote system first)")
        abandon = sub.add_parser("abandon")
        abandon.add_argument("task_id")

    def handle(self, *args, action, **options):
        who = "manage.py"
        try:
            if action == "list":
                tasks = list(recovery.dead_letters()[:200])
                for task in tasks:
                    reason = (task.error or {}).get("reason", "?")
                    self.stdout.write(f"{task.id}  {task.workflow_name:20} {reason:28} {task.status_message}")
                self.stdout.write(f"{len(tasks)} dead-lettered task(s)" + (" (first 200)" if len(tasks) == 200 else ""))
            elif action == "retry":
                task = recovery.dead_letter_retry(task_id=options["task_id"], effects=options["effects"],
                                                  requested_by=who)
                self.stdout.write(f"{task.id} is {task.status}; a worker resumes it from its last good checkpoint")
            else:
                task = recovery.dead_letter_abandon(task_id=options["task_id"], requested_by=who)
                self.stdout.write(f"{task.id} abandoned: {task.status}")
        except recovery.DeadLetterError as error:
            raise CommandError(str(error)) from None
        except recovery.Task.DoesNotExist:
            raise CommandError(f"no task {options.get('task_id')}") from None
