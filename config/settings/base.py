"""Django core: apps, middleware, templates, static and media files, time."""

from pathlib import Path

from config.settings.env import BASE_DIR, DEBUG, env

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "django_eventstream",
    "django_celery_beat",
    "oauth2_provider",  # the OAuth 2.1 authorization server of MCP clients (config/settings/oauth.py)
    # our apps, lowest layer first (dependencies point one way: mcp_bridge → agents → steering → tasks → checkpoints)
    "checkpoints_app",
    "tasks_app",
    "steering_app",
    "agents_app",
    "mcp_bridge",
    # Apps of your own with a workflows.py, without editing this file: EXTRA_APPS=examples.greeting,myapp
    *env.list("EXTRA_APPS", default=[]),
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "config.urls"
ASGI_APPLICATION = "config.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

LANGUAGE_CODE = "en-us"
# Dates and times as the console writes them (one zone, labelled, to the second): config/formats/en/formats.py.
FORMAT_MODULE_PATH = ["config.formats"]
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

STATIC_URL = "static/"
# Production serves collected files (collectstatic, run by the Dockerfile); development serves from the apps.
STATIC_ROOT = Path(env.str("STATIC_ROOT", default=str(BASE_DIR / "staticfiles")))
WHITENOISE_USE_FINDERS = DEBUG
# Artifacts and large outputs go through Django's storage API; rows hold refs (filesystem by default).
MEDIA_ROOT = Path(env.str("MEDIA_ROOT", default=str(BASE_DIR / "var" / "media")))
MEDIA_URL = "media/"
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}
