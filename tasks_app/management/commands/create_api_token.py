"""python manage.py create_api_token --tenant T --user U: print a new bearer token (only its hash is stored)."""

import getpass

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from tasks_app import access
from tasks_app.models import TOKEN_SCOPES, Tenant
from tasks_app.services import api_token_create, tenant_get_or_create


class Command(BaseCommand):
    help = "Create an API token for a user in a tenant and print it once. Only its sha256 is stored."

    def add_arguments(self, parser):
        parser.add_argument("--tenant", required=True, help="tenant slug")
        parser.add_argument("--user", required=True, help="username")
        parser.add_argument("--name", default="", help="a label shown in admin (e.g. 'ci', 'laptop')")
        parser.add_argument("--scopes", default=",".join(TOKEN_SCOPES),
                            help=f"what the token may do, comma-separated: {', '.join(TOKEN_SCOPES)} (default: all)")
        parser.add_argument("--create", action="store_true",
                            help="create the tenant and the user (without a password) if they do not exist")

    @transaction.atomic
    def handle(self, *args, tenant, user, name, create, scopes, **options):
        User = get_user_model()
        if create:
            tenant_obj = tenant_get_or_create(slug=tenant)
            user_obj, created = User.objects.get_or_create(username=user)
            if created:
                user_obj.set_unusable_password()
                user_obj.save(update_fields=["password"])
        else:
            try:
                tenant_obj = Tenant.objects.get(slug=tenant)
            except Tenant.DoesNotExist:
                raise CommandError(f"no tenant {tenant!r}; add --create to create it") from None
            try:
                user_obj = User.objects.get(username=user)
            except User.DoesNotExist:
                raise CommandError(f"no user {user!r}; add --create to create it") from None
        try:
            token, raw = api_token_create(tenant=tenant_obj, user=user_obj, name=name,
                                          scopes=[scope.strip() for scope in scopes.split(",") if scope.strip()],
                                          actor=f"cli:{getpass.getuser()}")  # (the audit trail's actor: who ran it)
        except ValueError as error:
            raise CommandError(str(error)) from None
        # The raw token goes to stdout only, once; nothing is logged. What it may do (its scopes ∩ its user's role:
        # tasks_app.access) goes to stderr, so that a script reading the token reads only the token.
        self.stdout.write(raw)
        may = ", ".join(access.allowed_actions(access.actor_for_token(token))) or "nothing"
        self.stderr.write(f"This token may: {may} (its scopes, narrowed by the role of {user_obj.username}).")
