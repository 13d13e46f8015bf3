"""python manage.py create_tasks --workflow demo_steps --count 100 --input '{"steps": 20}' [--tenant T]

Creates tasks through the same service as the API (validation, events, dispatch): for load generation,
benchmarks and chaos runs. Prints the task ids, one per line.
"""

import json

from django.core.management.base import BaseCommand, CommandError

from config.base.problems import Problem
from tasks_app.services import task_create, tenant_get_or_create


class Command(BaseCommand):
    help = "Create COUNT tasks of a workflow with the given input (for load tests and chaos runs)."

    def add_arguments(self, parser):
        parser.add_argument("--workflow", required=True)
        parser.add_argument("--input", default="{}", help="the input as JSON")
        parser.add_argument("--count", type=int, default=1)
        parser.add_argument("--tenant", default="default")
        parser.add_argument("--priority", type=int, default=5)

    def handle(self, *args, workflow, input, count, tenant, priority, **options):
        try:
            data = json.loads(input)
        except ValueError as error:
            raise CommandError(f"--input is not JSON: {error}") from None
        owner_tenant = tenant_get_or_create(slug=tenant)
        for _ in range(count):
            try:
                created = task_create(tenant=owner_tenant, owner=None, workflow=workflow, input=data, priority=priority)
            except Problem as problem:
                details = "; ".join(f"{e['field']}: {e['message']}" for e in (problem.errors or []))
                raise CommandError(f"{problem.detail} {details}".strip()) from None
            self.stdout.write(str(created.task.id))
