"""Used by `deploy/dev.py run`: make sure a development admin login and API token exist, and say how to use them.

The password and token are random, created on first run and kept in files of the local data folder (mode 0600),
never in the repository; later runs only point at those files.
"""

import os
import secrets
from pathlib import Path

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from django.db import transaction

from tasks_app.models import ApiToken
from tasks_app.services import api_token_create, tenant_get_or_create, tenant_membership_ensure, token_hash

ADMIN_USERNAME = "admin"
TENANT_SLUG = "default"


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(text + "\n")


class Command(BaseCommand):
    help = "Create the development admin login and API token if missing, and print how to sign in."

    def add_arguments(self, parser):
        parser.add_argument("--credentials-dir", required=True)
        parser.add_argument("--base-url", default="http://127.0.0.1:8000")

    @transaction.atomic
    def handle(self, *args, credentials_dir, base_url, **options):
        # (deploy/dev.py runs it with -v 0 and says how to sign in itself, once the stack answers: `dev.py info`.)
        folder = Path(credentials_dir)
        password_file = folder / "dev-admin-password"
        token_file = folder / "dev-api-token"
        User = get_user_model()
        tenant = tenant_get_or_create(slug=TENANT_SLUG, name="Default tenant")
        admin = User.objects.filter(username=ADMIN_USERNAME).first()
        if admin is None:
            password = secrets.token_urlsafe(16)
            admin = User.objects.create_superuser(ADMIN_USERNAME, email="", password=password)
            _write_private(password_file, password)
        tenant_membership_ensure(user=admin, tenant=tenant)
        # A token file from an earlier database (var/pg removed, another DATABASE_URL) would answer 401: replace it.
        if not token_file.exists() or not ApiToken.objects.filter(
                token_hash=token_hash(token_file.read_text().strip()), revoked_at__isnull=True).exists():
            _, raw = api_token_create(tenant=tenant, user=admin, name="dev", actor="cli:ensure_dev_login")
            _write_private(token_file, raw)

        if password_file.exists():
            password_hint = f"password: cat {password_file}"
        else:
            password_hint = f"password: set one with `python3.11 deploy/dev.py manage changepassword {ADMIN_USERNAME}`"
        if options.get("verbosity", 1) < 1:
            return
        self.stdout.write(
            f"\n  Admin:     {base_url}/admin/   user {ADMIN_USERNAME!r}, {password_hint}\n"
            f"  API token: export TOKEN=$(cat {token_file})   (tenant {TENANT_SLUG!r})\n"
            f"  API docs:  {base_url}/runtime/docs\n"
        )
