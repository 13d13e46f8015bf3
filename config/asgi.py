"""The one HTTP entry point: Django's ASGI application (the MCP bridge and SSE mount here later)."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

django_application = get_asgi_application()

from django.conf import settings

from config.asgi_limits import BodySizeLimit

application = BodySizeLimit(django_application, max_bytes=settings.RUNTIME_MAX_REQUEST_BYTES)
