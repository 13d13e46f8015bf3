"""The one place settings read the environment (django-environ casts and reports missing values)."""

from pathlib import Path

import environ

BASE_DIR = Path(__file__).resolve().parent.parent.parent
env = environ.Env()

# Read here because several concerns depend on it (static files, cookies, error pages).
DEBUG = env.bool("DEBUG", default=False)
