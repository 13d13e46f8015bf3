"""The one HTTP entry point: the MCP endpoint (mcp_bridge.asgi), then Django under ASGI; streams still open when
the process stops end cleanly (config.asgi_shutdown).

Layers of the Django side, outermost first: the snapshot reads of bearer-token pollers, answered on the event loop
(tasks_app.web.snapshot_edge); the request-body guard (config.base.asgi_limits); Django, with each request to a sync view
served in one thread hop (config.base.asgi_handler).
"""

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
# A web process: its requests share bounded database connection pools (config/settings/services.py).
os.environ.setdefault("RUNTIME_PROCESS", "web")

import django  # noqa: E402

django.setup(set_prefix=False)

from django.conf import settings  # noqa: E402

from config.base.asgi_handler import OneHopASGIHandler  # noqa: E402
from config.base.asgi_limits import BodySizeLimit  # noqa: E402
from config.asgi_shutdown import EndStreamsOnShutdown  # noqa: E402
from mcp_bridge.asgi import McpEndpoint  # noqa: E402
from mcp_bridge.bridge import retention_days  # noqa: E402
from mcp_bridge.poll_edge import PollEdge  # noqa: E402
from mcp_bridge.server import SERVER_NAME, SERVER_VERSION, build_manager, build_server  # noqa: E402
from tasks_app.observability import metrics  # noqa: E402
from tasks_app.web.snapshot_edge import SnapshotEdge  # noqa: E402

metrics.web_process_started()  # counted as a web process; its database pool sampled for /metrics
django_application = OneHopASGIHandler()
edge = SnapshotEdge(BodySizeLimit(django_application, max_bytes=settings.RUNTIME_MAX_REQUEST_BYTES),
                    pool_size=settings.WEB_SNAPSHOT_POOL_MAX, pool_timeout=settings.WEB_SNAPSHOT_POOL_TIMEOUT)
mcp = McpEndpoint(build_manager(build_server()), max_bytes=settings.MCP_MAX_REQUEST_BYTES,
                  poll_edge=PollEdge(edge, server_info={"name": SERVER_NAME, "version": SERVER_VERSION},
                                     retention_days=retention_days))


async def route(scope, receive, send):
    """/mcp and the protected-resource metadata go to the MCP endpoint (before Django, whose catch-all answers
    every other /mcp path with a problem+json 404); the lifespan runs the MCP SDK's session manager."""
    if scope["type"] == "lifespan":
        return await mcp.lifespan(scope, receive, send)
    if scope["type"] == "http" and mcp.owns(scope["path"]):
        return await mcp(scope, receive, send)
    return await edge(scope, receive, send)


# Outermost: streams still open when the server stops this process end as streams end (config.asgi_shutdown).
application = EndStreamsOnShutdown(route)
