"""Where an authorization code may be sent: an https URL, or plain http on this machine's loopback (127.0.0.1, [::1],
``localhost``; any port: RFC 8252 §7.3's native apps).

The MCP authorization specification (2025-11-25, "Communication Security"): redirect URIs MUST be either localhost
URLs or HTTPS URLs. A plain-http URL on another host hands the code to whoever is on the path (an attacker
registered ``http://evil.example/cb`` and received the code after consent). The one rule, applied at dynamic
registration (RFC 7591 ``invalid_redirect_uri``, and RFC 7592's update) and again at the authorization endpoint (the
validator, mcp_bridge.oauth.validators): a client registered before the rule, or made in the admin, or described by a
metadata document, is held to it there, and the code is never sent to such a URI (no redirect: the error page).
"""

from __future__ import annotations

from urllib.parse import urlsplit

# Exactly these hosts count as loopback for plain http: the literal addresses RFC 8252 names, and `localhost`.
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "::1", "localhost"})
RULE = "a redirect URI must be https://…, or http:// on loopback (127.0.0.1, [::1] or localhost, any port)"


def redirect_uri_error(uri: object) -> str | None:
    """What is wrong with ``uri`` as a redirect URI, or None when a code may be sent to it."""
    if not isinstance(uri, str) or not uri or any(ch.isspace() for ch in uri):
        return f"{uri!r} is not a URL: {RULE}."
    try:
        parts = urlsplit(uri)
        parts.port  # noqa: B018  (raises ValueError for a port that is not a number in range)
    except ValueError:
        return f"{uri!r} is not a valid URL: {RULE}."
    if parts.fragment or "#" in uri:
        return f"{uri!r} has a fragment, which a redirect URI must not have (RFC 6749 §3.1.2); {RULE}."
    if parts.username is not None or parts.password is not None:
        return f"{uri!r} carries user information, which a redirect URI must not have; {RULE}."
    scheme, host = parts.scheme.lower(), (parts.hostname or "")
    if not host:
        return f"{uri!r} has no host: {RULE}."
    if scheme == "https":
        return None
    if scheme == "http" and host in LOOPBACK_HOSTS:
        return None
    return f"{uri!r} is refused: {RULE}."


def redirect_uris_error(uris: object) -> str | None:
    """The first refusal among a client's redirect URIs (a list, as RFC 7591 sends them), or None."""
    if not isinstance(uris, list):
        return None  # (not a list: the toolkit answers invalid_client_metadata)
    for uri in uris:
        error = redirect_uri_error(uri)
        if error is not None:
            return error
    return None
