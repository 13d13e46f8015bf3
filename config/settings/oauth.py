"""The OAuth 2.1 authorization server MCP clients sign in with (django-oauth-toolkit, mounted by mcp_bridge.oauth).

What a client does (the MCP authorization spec, 2025-11-25): a 401 from /mcp names the protected-resource metadata,
which names this origin as the authorization server; its RFC 8414 metadata (/.well-known/oauth-authorization-server)
lists the endpoints; the client registers (a Client ID Metadata Document URL as its client_id, or RFC 7591 dynamic
registration), sends the person to /oauth/authorize/ (PKCE S256, `resource` = this origin's /mcp), who signs in and
consents in the admin's look; the code becomes an access token bound to the person, their tenant, the scopes and the
resource. With MCP_AUTHORIZATION_SERVER set, another server issues the tokens and none of this is used.
"""

from config.settings.env import env

# Access tokens live an hour (the MCP spec asks for short-lived ones); refresh tokens rotate on every use and expire
# after a month without use.
OAUTH_ACCESS_TOKEN_SECONDS = env.int("OAUTH_ACCESS_TOKEN_SECONDS", default=3600)
OAUTH_REFRESH_TOKEN_SECONDS = env.int("OAUTH_REFRESH_TOKEN_SECONDS", default=30 * 86400)
# RFC 7591 registration open to anyone (what MCP clients expect); off: only Client ID Metadata Documents and clients
# an operator made in the admin.
OAUTH_DYNAMIC_REGISTRATION = env.bool("OAUTH_DYNAMIC_REGISTRATION", default=True)
# Client ID Metadata Documents: a client_id that is an https URL is fetched (https only, public addresses only, no
# redirects, bounded size and time: django-oauth-toolkit's SafeMetadataFetcher). Hosts allowed, ALLOWED_HOSTS syntax
# ("*" for any public host).
OAUTH_CIMD_ALLOWED_HOSTS = env.list("OAUTH_CIMD_ALLOWED_HOSTS", default=["*"])
# TESTS ONLY: also fetch a metadata document from a loopback host, over plain http (mcp_bridge.oauth.cimd). Never in
# a deployment: it lets a client_id make this server read its own loopback services (`check --deploy` says so).
OAUTH_CIMD_ALLOW_LOOPBACK = env.bool("OAUTH_CIMD_ALLOW_LOOPBACK", default=False)

OAUTH2_PROVIDER = {
    # Our scopes (tasks_app.models.TOKEN_SCOPES), the same an API token carries.
    "SCOPES": {"tasks:read": "Read your tenant's tasks", "tasks:write": "Start, answer and cancel tasks",
               "steer": "Steer running tasks"},
    "DEFAULT_SCOPES": ["tasks:read"],
    "OAUTH2_VALIDATOR_CLASS": "mcp_bridge.oauth.validators.RuntimeOAuth2Validator",
    # Tokens carry a prefix, so the MCP endpoint knows which table to look in with no second query.
    "ACCESS_TOKEN_GENERATOR": "mcp_bridge.oauth.tokens.access_token_generator",
    "REFRESH_TOKEN_GENERATOR": "mcp_bridge.oauth.tokens.refresh_token_generator",
    "ACCESS_TOKEN_EXPIRE_SECONDS": OAUTH_ACCESS_TOKEN_SECONDS,
    "REFRESH_TOKEN_EXPIRE_SECONDS": OAUTH_REFRESH_TOKEN_SECONDS,
    "AUTHORIZATION_CODE_EXPIRE_SECONDS": 60,
    "ROTATE_REFRESH_TOKEN": True,  # (the MCP spec: public clients' refresh tokens MUST rotate)
    "REFRESH_TOKEN_REUSE_PROTECTION": True,  # a replayed old refresh token revokes its whole family
    "PKCE_REQUIRED": True,
    # RFC 9700 / OAuth 2.1 posture, every gate on: S256 only, no implicit or password grant, no token in a query
    # string, the RFC 9207 `iss` in the authorization response, and tokens stored as sha256 only.
    "COMPLIANT_BCP_RFC9700_IMPLICIT_GRANT": True,
    "COMPLIANT_BCP_RFC9700_PASSWORD_GRANT": True,
    "COMPLIANT_BCP_RFC9700_PKCE_METHOD": True,
    "COMPLIANT_BCP_RFC9700_ACCESS_TOKEN_TRANSPORT": True,
    "COMPLIANT_BCP_RFC9700_AUTHZ_RESPONSE_ISS": True,
    "COMPLIANT_BCP_RFC9700_TOKEN_STORAGE": True,
    "COMPLIANT_BCP_RFC9700_REFRESH_TOKEN": True,
    "COMPLIANT_BCP_RFC9700_PKCE_REQUIRED": True,
    "REQUEST_APPROVAL_PROMPT": "force",  # every authorization asks the person
    # Loopback redirects of native clients on any port (RFC 8252 §7.3), `localhost` included.
    "ALLOW_LOCALHOST_LOOPBACK": True,
    # RFC 8414 metadata: what this server really does.
    "OAUTH2_RESPONSE_TYPES_SUPPORTED": ["code"],
    "OAUTH2_GRANT_TYPES_SUPPORTED": ["authorization_code", "refresh_token"],
    "OAUTH2_TOKEN_ENDPOINT_AUTH_METHODS_SUPPORTED": ["none", "client_secret_basic", "client_secret_post"],
    "DCR_ENABLED": OAUTH_DYNAMIC_REGISTRATION,
    "DCR_REGISTRATION_PERMISSION_CLASSES": ("oauth2_provider.dcr.AllowAllDCRPermission",),
    "CIMD_ENABLED": True,
    "CIMD_METADATA_FETCHER": "mcp_bridge.oauth.cimd.MetadataFetcher",
    "CIMD_REGISTRATION_PERMISSION_CLASSES": ("oauth2_provider.cimd.HostAllowlistCIMDPermission",),
    "CIMD_ALLOWED_HOSTS": OAUTH_CIMD_ALLOWED_HOSTS,
}

# The toolkit's models (its defaults, named: they are swappable, and a migration of ours that points at one resolves
# it through these settings).
OAUTH2_PROVIDER_APPLICATION_MODEL = "oauth2_provider.Application"
OAUTH2_PROVIDER_ACCESS_TOKEN_MODEL = "oauth2_provider.AccessToken"
OAUTH2_PROVIDER_REFRESH_TOKEN_MODEL = "oauth2_provider.RefreshToken"
OAUTH2_PROVIDER_GRANT_MODEL = "oauth2_provider.Grant"
OAUTH2_PROVIDER_ID_TOKEN_MODEL = "oauth2_provider.IDToken"
OAUTH2_PROVIDER_DEVICE_GRANT_MODEL = "oauth2_provider.DeviceGrant"

# Instead of this server, an external OpenID Connect provider (MCP_AUTHORIZATION_SERVER names it to clients): its JWT
# access tokens are accepted at /mcp when signed by a key of OAUTH_EXTERNAL_JWKS_URL, issued by
# OAUTH_EXTERNAL_ISSUER (default MCP_AUTHORIZATION_SERVER), for OAUTH_EXTERNAL_AUDIENCE (default this origin's /mcp,
# RFC 8707 / RFC 9068), unexpired; the person is the active account named by OAUTH_EXTERNAL_USER_CLAIM, acting in
# their tenant (which OAUTH_EXTERNAL_TENANT_CLAIM, when the token has it, must name), with the token's scopes that are
# ours (`scope`, or `scp`). Empty OAUTH_EXTERNAL_JWKS_URL: off (mcp_bridge.oauth.external).
OAUTH_EXTERNAL_JWKS_URL = env.str("OAUTH_EXTERNAL_JWKS_URL", default="")
OAUTH_EXTERNAL_ISSUER = env.str("OAUTH_EXTERNAL_ISSUER", default="")
OAUTH_EXTERNAL_AUDIENCE = env.str("OAUTH_EXTERNAL_AUDIENCE", default="")
OAUTH_EXTERNAL_ALGORITHMS = env.list("OAUTH_EXTERNAL_ALGORITHMS", default=["RS256", "PS256", "ES256"])
OAUTH_EXTERNAL_USER_CLAIM = env.str("OAUTH_EXTERNAL_USER_CLAIM", default="preferred_username")
OAUTH_EXTERNAL_TENANT_CLAIM = env.str("OAUTH_EXTERNAL_TENANT_CLAIM", default="tenant")
