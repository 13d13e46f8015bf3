"""python manage.py ensure_database — create the configured PostgreSQL database when it does not exist yet.

`deploy/dev.py run` calls it before migrating: a DATABASE_URL that names a database the server does not have (a first
run against a shared PostgreSQL) otherwise ended in an 80-line traceback from `migrate`. It connects to the same
server's `postgres` database with the same credentials; when it may not create databases there, it says in one line
what to do instead."""

import psycopg
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from psycopg import sql


class Command(BaseCommand):
    help = "Create the configured PostgreSQL database if the server does not have it yet (development)."

    def handle(self, *args, **options):
        config = settings.DATABASES["default"]
        name = config["NAME"]
        where = f"{config.get('HOST') or 'localhost'}:{config.get('PORT') or 5432}"
        params = {"host": config.get("HOST") or None, "port": config.get("PORT") or None,
                  "user": config.get("USER") or None, "password": config.get("PASSWORD") or None,
                  "dbname": "postgres", "connect_timeout": 5}
        try:
            with psycopg.connect(**{k: v for k, v in params.items() if v is not None}, autocommit=True) as connection:
                if connection.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
                    return
                connection.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        except psycopg.Error as error:
            first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise CommandError(f"database {name!r} on {where} does not exist and could not be created ({first_line}): "
                               f"create it (createdb -h {where.split(':')[0]} -p {where.split(':')[1]} {name}) or set "
                               "DATABASE_URL to one that exists") from None
        self.stdout.write(f"created database {name!r} on {where}")
