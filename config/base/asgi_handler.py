"""Django's ASGI handler, with a request to a sync view served in one thread hop instead of one per middleware.

Under ASGI, Django runs a sync middleware's process_request and process_response each through sync_to_async:
with our eight middlewares and a sync DRF view that was a dozen hops between the event loop and the request's
thread per request, a large share of a list request's CPU (figures: docs/performance.md). Here the middleware
chain is loaded as sync and the whole of it, view included, runs in one hop; the request's thread is the one
Django would have used (thread-sensitive, per request), so its database connection is returned to the pool when
the response is closed, as before.

A request for an async view (the event streams, later) goes through Django's own async chain unchanged: a sync
chain would run an async streaming view to its end before sending anything.
"""

from __future__ import annotations

from asgiref.sync import iscoroutinefunction, sync_to_async
from django.core.handlers import base
from django.core.handlers.asgi import ASGIHandler
from django.db import connection
from django.urls import Resolver404, get_resolver


class OneHopASGIHandler(ASGIHandler):
    def __init__(self):
        base.BaseHandler.__init__(self)
        self.load_middleware(is_async=False)
        self.async_views = ASGIHandler()  # Django's own handler, async middleware chain

    async def get_response_async(self, request):
        if self._view_is_async(request.path_info):
            return await self.async_views.get_response_async(request)
        return await sync_to_async(self.get_response, thread_sensitive=True)(request)

    @staticmethod
    def _view_is_async(path: str) -> bool:
        try:
            view = get_resolver().resolve(path).func
        except Resolver404:
            return False
        return iscoroutinefunction(view) or getattr(getattr(view, "view_class", None), "view_is_async", False)


async def db_in_thread(function, *args, **kwargs):
    """Run blocking Django work from async code in a worker thread, and give its database connection back to the
    pool at once: an SSE stream or an MCP request that waits on anything afterwards holds none."""

    def run():
        try:
            return function(*args, **kwargs)
        finally:
            connection.close()

    return await sync_to_async(run, thread_sensitive=False)()
