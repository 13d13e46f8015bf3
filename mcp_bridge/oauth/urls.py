"""The authorization server's routes, under the toolkit's namespace (`oauth2_provider`: its views reverse their own
names) and mounted at the root (config/urls.py): RFC 8414 puts the metadata at the origin's /.well-known/."""

from django.urls import path
from oauth2_provider import views as toolkit

from mcp_bridge.oauth import views

app_name = "oauth2_provider"

urlpatterns = [
    # RFC 8414 (the issuer is this origin, no path: the MCP spec's clients look here first).
    path(".well-known/oauth-authorization-server", toolkit.OAuthServerMetadataView.as_view(),
         name="oauth-server-metadata"),
    path("oauth/login/", views.SignInView.as_view(), name="login"),
    path("oauth/authorize/", views.ConsentView.as_view(), name="authorize"),
    path("oauth/token/", toolkit.TokenView.as_view(), name="token"),
    path("oauth/revoke/", toolkit.RevokeTokenView.as_view(), name="revoke-token"),
    path("oauth/register/", views.RegistrationView.as_view(), name="dcr-register"),
    path("oauth/register/<str:client_id>/", views.RegistrationManagementView.as_view(),
         name="dcr-register-management"),
]
