"""Several manage.py commands in one process, in order: `manage_in_order.py migrate --noinput --then check`.

`deploy/dev.py run` prepares a stack with five commands (create the database, migrate, the local login, the checks,
the example tool server); as five manage.py processes each booted Django anew, a second or two of CPU apiece, before
anything could start. Here Django boots once. Each command's arguments are parsed by its own parser, as manage.py
would (django.core.management.call_command); the first that fails stops the rest with exit status 1, its message on
stderr as manage.py prints it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

THEN = "--then"


def commands_of(argv: list[str]) -> list[list[str]]:
    commands: list[list[str]] = [[]]
    for arg in argv:
        if arg == THEN:
            commands.append([])
        else:
            commands[-1].append(arg)
    return [command for command in commands if command]


def main(argv: list[str]) -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django
    from django.core.management import call_command
    from django.core.management.base import CommandError

    django.setup()
    for name, *args in commands_of(argv):
        try:
            call_command(name, *args)
        except CommandError as error:
            sys.stderr.write(f"{type(error).__name__}: {error}\n" if str(error) else f"{name} failed\n")
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
