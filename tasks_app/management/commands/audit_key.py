"""python manage.py audit_key --public | --generate: the seals' signing key (tasks_app.audit.anchors; docs/audit.md).

--public prints the public key (PEM), which is all an offline verifier of an export needs
(deploy/verify_export.py --public-key). --generate writes a new private key to AUDIT_SIGNING_KEY_FILE if none is
there (never replacing one: the seals it signed would no longer verify). The private key is never printed.
"""

from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from tasks_app.audit.anchors import key_generate, public_key_pem


class Command(BaseCommand):
    help = "Print the audit seals' public key (--public), or generate the private key file (--generate)."

    def add_arguments(self, parser):
        parser.add_argument("--public", action="store_true", help="print the public key (PEM)")
        parser.add_argument("--generate", action="store_true", help="create the private key file if missing")

    def handle(self, *args, public=False, generate=False, **options):
        if not (public or generate):
            raise CommandError("say --public or --generate")
        if generate:
            path = Path(settings.AUDIT_SIGNING_KEY_FILE)
            made = key_generate(path)
            self.stderr.write(f"{'generated' if made else 'kept the existing'} key at {path}")
        if public:
            self.stdout.write(public_key_pem(), ending="")
