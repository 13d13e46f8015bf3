"""Client ID Metadata Documents: a client_id that is an https URL is fetched — through the runtime's one outbound
connector (agents_app.outbound), not django-oauth-toolkit's own fetcher: https only, the host resolved once and
every address it resolves to public (agents_app.hosts.public_check: no loopback, private, link-local, reserved or
cloud-metadata address, nor one smuggled inside an IPv6 form — IPv4-mapped, IPv4-compatible `::127.0.0.1`, 6to4,
Teredo, NAT64 — which the toolkit's check let through: `https://[::127.0.0.1]:8443/` passed it), the connection made
to the address checked (the TLS name and Host header the URL's), no redirects, the document cut at
CIMD_MAX_DOCUMENT_SIZE and the whole fetch bounded by CIMD_FETCH_TIMEOUT_SECONDS: a client_id must not make this
server read its own network (SSRF).

OAUTH_CIMD_ALLOW_LOOPBACK (tests only, off by default; `check --deploy` warns) also fetches a document whose host is
a loopback address or ``localhost``, over plain http to that same loopback port: the tests serve one there. Every
other client_id takes the safe path unchanged.
"""

from __future__ import annotations

import ipaddress
import json
import time

import httpx2
from django.conf import settings
from oauth2_provider.cimd import CIMDError, SafeMetadataFetcher, _effective_max_age, _validate_client_id_url
from oauth2_provider.settings import oauth2_settings

from agents_app import outbound

ACCEPT = "application/json, application/*+json"


def _is_loopback_host(host: str | None) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host or "").is_loopback
    except ValueError:
        return False


class MetadataFetcher(SafeMetadataFetcher):
    def fetch(self, client_id):
        parsed = _validate_client_id_url(client_id)  # (the toolkit's shape rules: https, a path, no userinfo …)
        loopback = bool(settings.OAUTH_CIMD_ALLOW_LOOPBACK and _is_loopback_host(parsed.hostname))
        url = client_id
        if loopback:  # (tests: plain http to the same loopback port)
            host = f"[{parsed.hostname}]" if ":" in parsed.hostname else parsed.hostname
            url = f"http://{host}:{parsed.port or 443}{parsed.path}" + (f"?{parsed.query}" if parsed.query else "")
        cap = oauth2_settings.CIMD_MAX_DOCUMENT_SIZE
        connector = outbound.Connector(outbound.Policy(public=True, allow_loopback=loopback), kind="metadata",
                                       cap=cap, setting="CIMD_MAX_DOCUMENT_SIZE")
        timeout = oauth2_settings.CIMD_FETCH_TIMEOUT_SECONDS
        # One deadline for the whole fetch (connect and every read): a slow-drip body cannot hold a web worker past it.
        deadline = time.monotonic() + timeout
        try:
            with connector.client(timeout=httpx2.Timeout(timeout)) as http, \
                    http.stream("GET", url, headers={"Accept": ACCEPT}) as response:
                if response.status_code != 200:
                    raise CIMDError(f"client_id document returned HTTP {response.status_code}")
                media_type = response.headers.get("content-type", "").split(";")[0].strip().lower()
                if media_type != "application/json" and not (
                        media_type.startswith("application/") and media_type.endswith("+json")):
                    raise CIMDError(f"client_id document is not JSON (Content-Type: {media_type!r})")
                body = bytearray()
                for chunk in response.iter_bytes():
                    body += chunk
                    if time.monotonic() > deadline:
                        raise CIMDError("client_id document took longer than CIMD_FETCH_TIMEOUT_SECONDS")
                cache_control = response.headers.get("cache-control")
        except httpx2.HTTPError as error:
            if connector.refused is not None:
                raise CIMDError(f"client_id host refused: {connector.refused}") from None
            if connector.cut is not None:
                raise CIMDError("client_id document exceeds the maximum allowed size") from None
            raise CIMDError(f"could not fetch client_id document: {type(error).__name__}") from None
        try:
            data = json.loads(bytes(body))
        except ValueError as error:
            raise CIMDError("client_id document is not valid JSON") from error
        if not isinstance(data, dict):
            raise CIMDError("client_id document must be a JSON object")
        return data, _effective_max_age(cache_control)
