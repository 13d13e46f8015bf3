"""A scratch database for the in-process tools (bench/slice_survey.py, bench/plan_length.py): created and migrated
on the configured server as "<DATABASE_URL's name>_<suffix>", dropped at the end, as Django's test runner makes a
test database — every case commits real tasks, and nobody's data is touched. The example workflows' external
systems write to a temporary folder. Tasks are driven in this process (engine.run_step), so no worker is needed;
the hints task_create sends go to REDIS_URL and nobody takes them, so deploy/dev.py gives these tools a broker
database of their own (10), whose task queue is purged at the end.

Call after django.setup()."""

from __future__ import annotations

import tempfile
from contextlib import contextmanager
from pathlib import Path

SCRATCH_BROKER_DB = "/10"  # deploy/dev.py's broker database for the in-process tools: they own it


@contextmanager
def scratch_database(suffix: str):
    """Yield tenant `acme` in a freshly migrated scratch database; drop it afterwards."""
    from django.conf import settings
    from django.db import connection
    from django.test import override_settings

    from tasks_app.engine.lease import lease_renewer_shutdown
    from tasks_app.services import tenant_get_or_create

    connection.settings_dict.setdefault("TEST", {})["NAME"] = f"{connection.settings_dict['NAME']}_{suffix}"
    real_name = connection.settings_dict["NAME"]
    connection.creation.create_test_db(verbosity=0, autoclobber=True, serialize=False)
    try:
        with tempfile.TemporaryDirectory(prefix=f"{suffix}-") as scratch, \
                override_settings(EXTERNAL_ROOT=Path(scratch) / "external", MEDIA_ROOT=Path(scratch) / "media"):
            yield tenant_get_or_create(slug="acme", name="Acme")
    finally:
        lease_renewer_shutdown()  # its connection would keep the scratch database from being dropped
        connection.creation.destroy_test_db(real_name, verbosity=0)
        if settings.REDIS_URL.endswith(SCRATCH_BROKER_DB):
            from config.celery import app

            app.control.purge()  # the hints nobody took (only the task queue's messages, not the whole database)
