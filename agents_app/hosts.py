"""Outbound host limits: where a tool server's URL may lead, checked on every resolved address before any connection.

`host_check(url, allowed_hosts)` resolves the URL's host once (getaddrinfo) and checks EVERY address it resolves
to against the list (config/runtime.yaml `tools.allowed_hosts`, narrowed by the tenant's list):

- a global (public) address passes if the URL's host name is listed ('mcp.example.com', or '*.example.com' for
  its subdomains), or the address is listed (an address, or a network in CIDR form);
- a loopback, private, link-local, reserved, multicast or otherwise non-global address passes only if the address
  itself is listed (by address or network). A listed name does not make such an address reachable: a name whose
  DNS answer changes to 127.0.0.1 or 10.x (DNS rebinding) is refused. The one exception is the names that mean
  loopback by definition (RFC 6761): 'localhost' and '*.localhost', when listed, reach loopback addresses.
- one refused address refuses the URL (a name resolving to a public and a private address is refused).

The IPv6 forms that carry an IPv4 address (IPv4-compatible `::127.0.0.1`, IPv4-translated, 6to4, Teredo, NAT64)
are judged by that IPv4 too (embedded_ipv4); IPv4-mapped is that IPv4.

Using the verdict: host_check decides early, with a clear message; the connection itself goes through the outbound
connector (agents_app.outbound), which calls address_check (or public_check) where the socket is opened, resolving
the name once there and dialling one of the addresses it checked — never the name again (DNS rebinding).
`verdict.connect_url()` / `host_header` / `extensions` remain for code that must dial a verdict's address itself.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

from agents_app.policy import tenant_label

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

DEPLOYMENT_LABEL = "tools.allowed_hosts (deployment)"
# Names that are loopback by definition (RFC 6761 §6.3): the only names that may reach a loopback address.
_LOOPBACK_NAMES = ("localhost",)
_DEFAULT_PORTS = {"http": 80, "https": 443}


@dataclass(frozen=True)
class HostVerdict:
    """The outcome of a host check. `addresses`: what the host resolved to, every one of them checked (in the
    resolver's order; connect to these, not to the name). `reason` names the host, the address and the rule."""

    allowed: bool
    reason: str
    url: str
    host: str = ""
    port: int = 0
    addresses: tuple[str, ...] = ()

    @property
    def host_header(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        scheme = urlsplit(self.url).scheme
        return host if _DEFAULT_PORTS.get(scheme) == self.port else f"{host}:{self.port}"

    @property
    def extensions(self) -> dict:
        """httpx request extensions: TLS to the checked address still verifies the certificate of the name."""
        return {"sni_hostname": self.host} if urlsplit(self.url).scheme == "https" else {}

    def connect_url(self, address: str | None = None) -> str:
        """The URL with a checked address (the first, or `address`, one of `addresses`) in place of the host."""
        if not self.allowed:
            raise ValueError(f"not an allowed URL: {self.reason}")
        address = address or self.addresses[0]
        if address not in self.addresses:
            raise ValueError(f"{address} is not one of the checked addresses {', '.join(self.addresses)}")
        parts = urlsplit(self.url)
        netloc = f"[{address}]" if ":" in address else address
        return urlunsplit(parts._replace(netloc=f"{netloc}:{self.port}"))


@dataclass(frozen=True)
class _Allowed:
    label: str
    names: frozenset[str]
    suffixes: tuple[str, ...]  # ".example.com" for "*.example.com"
    networks: tuple[Network, ...]  # a listed address is a /32 or /128

    @classmethod
    def parse(cls, label: str, entries: Sequence[str]) -> _Allowed:
        names, suffixes, networks = set(), [], []
        for entry in entries:  # (checked at load: config.base.runtime.host_entry_error)
            try:
                networks.append(ipaddress.ip_network(entry))
                continue
            except ValueError:
                pass
            name = _normal_name(entry)
            if name.startswith("*."):
                suffixes.append(name[1:])
            else:
                names.add(name)
        return cls(label, frozenset(names), tuple(suffixes), tuple(networks))

    def lists_name(self, host: str) -> str | None:
        if host in self.names:
            return host
        return next((f"*{suffix}" for suffix in self.suffixes if host.endswith(suffix)), None)

    def lists_address(self, address: Address) -> Network | None:
        return next((net for net in self.networks if net.version == address.version and address in net), None)


def _normal_name(name: str) -> str:
    return name.lower().rstrip(".")


# IPv6 forms that carry an IPv4 address inside them (a crafted AAAA answer or literal could smuggle a refused IPv4 past
# a check that judges the IPv6 address alone — `ipaddress`'s is_global says True for ::127.0.0.1 on CPython 3.11):
# each is judged by the IPv4 it embeds as well. IPv4-mapped (::ffff:a.b.c.d) is unwrapped to the IPv4 itself first
# (_address): a socket to it reaches that IPv4 on a dual-stack host.
_NAT64 = (ipaddress.ip_network("64:ff9b::/96"), ipaddress.ip_network("64:ff9b:1::/48"))  # RFC 6052, RFC 8215
_IPV4_TRANSLATED = ipaddress.ip_network("::ffff:0:0:0/96")  # SIIT (RFC 2765)
_IPV4_COMPATIBLE = ipaddress.ip_network("::/96")  # deprecated (RFC 4291 §2.5.5.1): ::a.b.c.d


def embedded_ipv4(address: Address) -> list[tuple[str, ipaddress.IPv4Address]]:
    """The IPv4 addresses an IPv6 address carries, each with the form's name (none for an IPv4 address)."""
    if not isinstance(address, ipaddress.IPv6Address):
        return []
    low = ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    if address.ipv4_mapped is not None:
        return [("IPv4-mapped", address.ipv4_mapped)]
    if address.sixtofour is not None:
        return [("6to4", address.sixtofour)]
    if address.teredo is not None:
        server, client = address.teredo
        return [("Teredo server", server), ("Teredo client", client)]
    if any(address in network for network in _NAT64):
        return [("NAT64", low)]
    if address in _IPV4_TRANSLATED:
        return [("IPv4-translated", low)]
    if address in _IPV4_COMPATIBLE and int(address) > 1:  # (:: and ::1 are themselves)
        return [("IPv4-compatible", low)]
    return []


def _plain_kind(address: Address) -> str | None:
    for kind, flag in (("loopback", "is_loopback"), ("unspecified", "is_unspecified"),
                       ("link-local", "is_link_local"), ("multicast", "is_multicast"), ("reserved", "is_reserved"),
                       ("private", "is_private")):
        if getattr(address, flag):
            return kind
    return None if address.is_global else "non-global"


def _kind(address: Address) -> str | None:
    """Why an address is not an ordinary public one, or None if it is. An IPv6 address embedding an IPv4 one is
    judged by that IPv4 too: `::127.0.0.1` is a loopback address in an IPv4-compatible form."""
    for form, inner in embedded_ipv4(address):
        kind = _plain_kind(inner)
        if kind is not None:
            return f"{kind} (in the {form} form of {inner})"
    return _plain_kind(address)


def public_refusal(text: str) -> str | None:
    """Why an address (text) is not a public one — every IPv6 form embedding a refused IPv4 included — or None.
    For what must reach public addresses only (OAuth Client ID Metadata Documents)."""
    try:
        address = _address(text)
    except ValueError:
        return f"{text!r} is not an address"
    kind = _kind(address)
    return None if kind is None else f"{address} is a {kind} address"


def _is_loopback_name(host: str) -> bool:
    return any(host == name or host.endswith("." + name) for name in _LOOPBACK_NAMES)


def _literal(host: str) -> Address | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def _address(text: str) -> Address:
    address = ipaddress.ip_address(text.split("%", 1)[0])  # (an IPv6 scope: fe80::1%eth0)
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped  # ::ffff:10.0.0.1 is 10.0.0.1
    return address


def _refuse(url: str, reason: str, **found) -> HostVerdict:
    return HostVerdict(allowed=False, reason=reason, url=url, **found)


def host_check(url: str, allowed_hosts: Sequence[str], *,
               narrowed_by: Sequence[tuple[str, Sequence[str]]] = (),
               resolve: Callable = socket.getaddrinfo) -> HostVerdict:
    """Check where ``url`` leads (module docstring: the rules, and how to connect to the checked address).

    ``allowed_hosts``: the deployment's list. ``narrowed_by``: more lists the address must ALSO pass, each with the
    words its refusals name, e.g. [("tenant acme allowed_hosts", ["mcp.example.com"])]. ``resolve``: getaddrinfo,
    to be replaced only where the system resolver cannot say what a test needs."""
    try:
        parts = urlsplit(url)
        port = parts.port or _DEFAULT_PORTS.get(parts.scheme, 0)
    except ValueError as error:
        return _refuse(url, f"{url!r} is not a valid URL: {error}")
    if parts.scheme not in _DEFAULT_PORTS or not parts.hostname:
        return _refuse(url, f"{url!r} is not an http:// or https:// URL with a host")
    if parts.username is not None or parts.password is not None:
        return _refuse(url, "a tool server's URL may not hold credentials; name the environment variable holding "
                            "its token in the server's credential")
    return address_check(parts.hostname, port, allowed_hosts, narrowed_by=narrowed_by, resolve=resolve, url=url)


def _resolved(host: str, port: int, resolve: Callable) -> tuple[tuple[str, ...], str | None]:
    """The host's addresses (a literal is itself; a name is looked up ONCE), unique, in the resolver's order; or
    why there are none."""
    literal = _literal(host)
    if literal is not None:
        return (str(literal),), None
    try:
        answers = resolve(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as error:
        return (), f"{host} cannot be resolved: {error}"
    texts = tuple(dict.fromkeys(answer[4][0] for answer in answers))
    return texts, (None if texts else f"{host} resolves to no address")


def address_check(host: str, port: int, allowed_hosts: Sequence[str], *,
                  narrowed_by: Sequence[tuple[str, Sequence[str]]] = (), resolve: Callable = socket.getaddrinfo,
                  url: str = "") -> HostVerdict:
    """host_check's rules for a host and port (what a connection is about to be opened to: agents_app.outbound
    calls this at the moment it connects, and dials one of the addresses it returns)."""
    host = _normal_name(host.strip("[]"))
    url = url or f"//{host}:{port}"
    found = {"host": host, "port": port}
    texts, failed = _resolved(host, port, resolve)
    if failed:
        return _refuse(url, failed, **found)
    found["addresses"] = texts
    literal = _literal(host)
    layers = [_Allowed.parse(DEPLOYMENT_LABEL, allowed_hosts)] + [_Allowed.parse(label, entries)
                                                                   for label, entries in narrowed_by]
    reasons = []
    for text in texts:
        address = _address(text)
        for layer in layers:
            passed, why = _address_passes(layer, host, address, by_name=literal is None)
            if not passed:
                shown = host if str(address) == host else f"{host} ({address})"
                return _refuse(url, f"{shown}: {why}", **found)
            reasons.append(why)
    return HostVerdict(allowed=True, reason=f"{host}: " + "; ".join(dict.fromkeys(reasons)), url=url, **found)


def any_address(host: str, port: int, *, resolve: Callable = socket.getaddrinfo) -> HostVerdict:
    """The host resolved once, any address allowed: for an endpoint the deployment's operator configured (its own
    model endpoint), which no tenant chose. Connect to one of its addresses all the same: one lookup."""
    host = _normal_name(host.strip("[]"))
    url, found = f"//{host}:{port}", {"host": host, "port": port}
    texts, failed = _resolved(host, port, resolve)
    if failed:
        return _refuse(url, failed, **found)
    return HostVerdict(allowed=True, reason=f"{host}: the deployment's own endpoint", url=url, addresses=texts,
                       **found)


def public_check(host: str, port: int, *, allow_loopback: bool = False,
                 resolve: Callable = socket.getaddrinfo) -> HostVerdict:
    """Every address the host resolves to (once) is a public one (public_refusal); ``allow_loopback``: loopback
    addresses pass too (tests serving a document on loopback only). No list: for what anyone may name."""
    host = _normal_name(host.strip("[]"))
    url, found = f"//{host}:{port}", {"host": host, "port": port}
    texts, failed = _resolved(host, port, resolve)
    if failed:
        return _refuse(url, failed, **found)
    found["addresses"] = texts
    for text in texts:
        refusal = public_refusal(text)
        if refusal is not None and not (allow_loopback and _address(text).is_loopback):
            return _refuse(url, f"{host}: {refusal}, and only public addresses are fetched", **found)
    return HostVerdict(allowed=True, reason=f"{host}: every address is public", url=url, **found)


def _address_passes(layer: _Allowed, host: str, address: Address, *, by_name: bool) -> tuple[bool, str]:
    kind = _kind(address)
    network = layer.lists_address(address)
    if network is not None:
        listed = str(network.network_address) if network.num_addresses == 1 else str(network)
        return True, f"{address} is listed in {layer.label} ({listed})"
    name = layer.lists_name(host) if by_name else None
    if kind is None:
        if name is not None:
            return True, f"{host} is listed in {layer.label} ({name})"
        return False, f"neither the host nor the address {address} is listed in {layer.label}"
    if kind == "loopback" and name is not None and _is_loopback_name(host):
        return True, f"{host} is a loopback name listed in {layer.label} ({name})"
    return False, (f"{address} is a {kind} address, refused unless {layer.label} lists it by address or network"
                   + (f" (the name {name} is listed, which does not make a {kind} address reachable)" if name else ""))


def host_check_for_tenant(url: str, *, config_policy, tenant_policy) -> HostVerdict:
    """host_check with the deployment's list narrowed by the tenant's (TenantToolPolicy.allowed_hosts, if set)."""
    narrowed = []
    if tenant_policy is not None and tenant_policy.allowed_hosts is not None:
        narrowed.append((f"{tenant_label(tenant_policy)} allowed_hosts", tenant_policy.allowed_hosts))
    return host_check(url, config_policy.allowed_hosts, narrowed_by=narrowed)
