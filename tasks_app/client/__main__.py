"""python -m tasks_app.client: the `runtime` CLI."""

import sys

from tasks_app.client.cli import main

sys.exit(main())
