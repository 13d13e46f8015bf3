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
