"""python manage.py generate_corpus [--name default] [--count 2000] [--seed 7]"""

import re
import shutil

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from tasks_app.examples.corpus import corpus_generate


class Command(BaseCommand):
    help = "Generate a deterministic corpus of contract-like documents (with known answers) for document_review."

    def add_arguments(self, parser):
        parser.add_argument("--name", default="default", help="folder name under CORPUS_ROOT")
        parser.add_argument("--count", type=int, default=2000)
        parser.add_argument("--seed", type=int, default=7)

    def handle(self, *args, name, count, seed, **options):
        if not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", name):
            raise CommandError("--name: 1–64 letters, digits, '_' or '-'")
        if count < 1:
            raise CommandError("--count must be at least 1")
        out = settings.CORPUS_ROOT / name
        if out.exists():
            shutil.rmtree(out)
        corpus_generate(out, count=count, seed=seed)
        self.stdout.write(f"{count} documents in {out} (answers in answers.json). Review them with:\n"
                          f'  {{"workflow": "document_review", "input": {{"corpus": "{name}"}}}}')
