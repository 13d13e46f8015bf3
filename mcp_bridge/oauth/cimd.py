"""Client ID Metadata Documents: a client_id that is an https URL is fetched, by django-oauth-toolkit's
SafeMetadataFetcher — https only, every resolved address public (no loopback, private, link-local or cloud-metadata
address, nor one smuggled in an IPv6 form), the connection pinned to the address checked, no redirects, a size and
time bound: a client_id must not make this server read its own network (SSRF).

OAUTH_CIMD_ALLOW_LOOPBACK (tests only, off by default; `check --deploy` warns) also fetches a document whose host is
a loopback address or ``localhost``, over plain http to that same loopback port: the tests serve one there. Every
other client_id takes the safe path unchanged.
"""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

import urllib3
from django.conf import settings
from oauth2_provider.cimd import CIMDError, SafeMetadataFetcher, _validate_client_id_url
from oauth2_provider.settings import oauth2_settings


def _is_loopback_host(host: str | None) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host or "").is_loopback
    except ValueError:
        return False


class MetadataFetcher(SafeMetadataFetcher):
    def fetch(self, client_id):
        if not (settings.OAUTH_CIMD_ALLOW_LOOPBACK and _is_loopback_host(urlsplit(client_id).hostname)):
            return super().fetch(client_id)
        parsed = _validate_client_id_url(client_id)  # (the same shape rules: https, a path, no userinfo …)
        timeout = oauth2_settings.CIMD_FETCH_TIMEOUT_SECONDS
        pool = urllib3.HTTPConnectionPool(host="127.0.0.1" if parsed.hostname == "localhost" else parsed.hostname,
                                          port=parsed.port or 443, retries=False, maxsize=1,
                                          timeout=urllib3.Timeout(connect=timeout, read=timeout, total=timeout))
        try:
            response = pool.urlopen("GET", parsed.path + (f"?{parsed.query}" if parsed.query else ""),
                                    headers={"Host": parsed.netloc, "Accept": "application/json"}, redirect=False,
                                    preload_content=False)
            try:
                return self._read_document(response)
            finally:
                response.release_conn()
        except urllib3.exceptions.HTTPError as error:
            raise CIMDError(f"could not fetch client_id document: {error}") from None
        finally:
            pool.close()
