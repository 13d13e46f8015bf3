"""Settings, one module per concern, every value from the environment with a safe production default.

Production needs SECRET_KEY, ALLOWED_HOSTS, DATABASE_URL and REDIS_URL; everything else has a default.
The development command (deploy/dev.py run) sets DEBUG=true and a local SECRET_KEY for you.
"""

from config.settings.api import *
from config.settings.base import *
from config.settings.logs import *
from config.settings.metrics import *
from config.settings.oauth import *
from config.settings.runtime import *
from config.settings.security import *
from config.settings.services import *

# The Celery app, loaded with the settings so that it exists in every process that runs Django (web, worker, beat,
# manage, tests) before any app code can send a task: the apps send by name through celery.current_app
# (tasks_app.db.dispatch) and never import it. Loaded last: config.celery reads the settings lazily (on first use of
# app.conf), so nothing here is read half-defined. It was loaded by config/__init__.py before issue 38, which ran
# it with every import of config's base.
from config.celery import app as celery_app  # noqa: E402,F401
