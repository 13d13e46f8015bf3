"""Content negotiation that never answers 406: a representation the client did not ask for beats no answer.

DRF answers ``406 Not Acceptable`` when no renderer matches the Accept header (a browser or a tool sending
``Accept: text/html`` to a JSON endpoint), and ``404`` for an unknown ``?format=``. RFC 9110 §12.1 lets a server
disregard Accept instead, and for an API that only speaks JSON that is the more useful answer: the client gets
the data (or the problem) in the view's first representation, with its real Content-Type.
"""

from django.http import Http404
from rest_framework import exceptions
from rest_framework.negotiation import DefaultContentNegotiation


class FallbackContentNegotiation(DefaultContentNegotiation):
    def select_renderer(self, request, renderers, format_suffix=None):
        try:
            return super().select_renderer(request, renderers, format_suffix)
        except (exceptions.NotAcceptable, Http404):
            # ?format=yaml with an Accept that matches no YAML renderer still gets YAML; an unknown format, the
            # view's default.
            wanted = format_suffix or request.query_params.get(self.settings.URL_FORMAT_OVERRIDE)
            renderer = next((r for r in renderers if r.format == wanted), renderers[0])
            return renderer, renderer.media_type
