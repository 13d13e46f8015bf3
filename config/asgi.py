"""The one HTTP entry point: Django under ASGI (the MCP bridge and SSE mount here later).

Layers, outermost first: the snapshot reads of bearer-token pollers, answered on the event loop
(tasks_app.snapshot_edge); the request-body guard (config.asgi_limits); Django, with each request to a sync view
served in one thread hop (config.asgi_handler).
"""

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
# A web process: its requests share bounded database connection pools (config/settings/services.py).
os.environ.setdefault("RUNTIME_PROCESS", "web")

import django  # noqa: E402

django.setup(set_prefix=False)

from django.conf import settings  # noqa: E402

from config.asgi_handler import OneHopASGIHandler  # noqa: E402
from config.asgi_limits import BodySizeLimit  # noqa: E402
from tasks_app.snapshot_edge import SnapshotEdge  # noqa: E402

django_application = OneHopASGIHandler()
application = SnapshotEdge(BodySizeLimit(django_application, max_bytes=settings.RUNTIME_MAX_REQUEST_BYTES),
                           pool_size=settings.WEB_SNAPSHOT_POOL_MAX, pool_timeout=settings.WEB_SNAPSHOT_POOL_TIMEOUT)
