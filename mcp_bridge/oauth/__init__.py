"""OAuth 2.1 for MCP clients: django-oauth-toolkit as the authorization server, bound to our tenants.

- models: which tenant a grant, an access token and a refresh token act in (the toolkit knows only the user);
- validators: the toolkit's validator, narrowed to authorization code + refresh, writing those bindings and the
  audit records in the transactions of the writes they record;
- views: the consent page (admin look), its sign-in page, registration and revocation with their audit records;
- tokens: the token formats and the one lookup the MCP endpoint calls (a principal, or None);
- cimd: the Client ID Metadata Document fetcher (the toolkit's SSRF-hardened one; loopback only for tests).
"""
