"""The OpenAPI schema and its two HTML pages (Swagger UI, ReDoc), behind the API's own authentication."""

from django.contrib.auth.views import redirect_to_login
from django.urls import reverse
from drf_spectacular.renderers import (
    OpenApiJsonRenderer,
    OpenApiJsonRenderer2,
    OpenApiYamlRenderer,
    OpenApiYamlRenderer2,
)
from drf_spectacular.views import SpectacularAPIView, SpectacularRedocView, SpectacularSwaggerView
from rest_framework import exceptions

from config.base.negotiation import FallbackContentNegotiation


class SchemaApi(SpectacularAPIView):
    """The schema as JSON by default (drf-spectacular's default is YAML); `?format=yaml` or
    `Accept: application/yaml` for YAML, served as application/yaml."""

    renderer_classes = [OpenApiJsonRenderer, OpenApiJsonRenderer2, OpenApiYamlRenderer2, OpenApiYamlRenderer]
    content_negotiation_class = FallbackContentNegotiation


class SignInToRead:
    """An HTML page opened without credentials sends the browser to sign in and come back, instead of a 401
    a browser cannot act on. Wrong credentials (a bad bearer token) still get the 401 problem."""

    content_negotiation_class = FallbackContentNegotiation

    def handle_exception(self, exc):
        if isinstance(exc, exceptions.NotAuthenticated):
            return redirect_to_login(self.request.get_full_path(), login_url=reverse("admin:login"))
        return super().handle_exception(exc)


class SwaggerDocsView(SignInToRead, SpectacularSwaggerView):
    pass


class RedocDocsView(SignInToRead, SpectacularRedocView):
    pass
