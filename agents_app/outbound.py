"""The one outbound connector: every connection the runtime opens on a tenant's behalf — a tool server's discovery,
tools/list, tools/call and downstream tasks (agents_app.mcp_client), a tenant's model endpoint (agents_app.llm, the
openai SDK), an OAuth Client ID Metadata Document (mcp_bridge.oauth.cimd) — is an httpx2 client made here.

What it guarantees, and why each part sits where it does (docs/tool-policy.md, "Outbound connections"):

- **Checked where the socket is opened.** The client's transport is httpx2's own over an httpcore2 connection pool
  with a network backend of ours (httpcore's documented extension point, `network_backend`): when the pool opens a
  connection to a host, the backend resolves the name ONCE, checks every address against the policy
  (agents_app.hosts: the deployment's `tools.allowed_hosts` narrowed by the tenant's), and dials one of THOSE
  addresses. There is no second lookup to rebind (an /etc/hosts entry or a DNS answer flipped between a check and a
  connect), and no path around it: the SDKs are handed this client, so whatever URL they end up requesting, the
  socket goes through the check. The URL keeps the name, so the Host header and the TLS server name (SNI, and the
  certificate check) are the name's, as if nothing stood between.
- **No redirect followed** (`follow_redirects=False`; the openai SDK's default client follows them): a 307 from an
  allowed host is an answer, not a new destination. (Were one followed, its connection would be checked all the
  same.)
- **An answer's size capped, per kind** (`tools.max_answer_bytes`, `model.max_answer_bytes`, the CIMD document
  limit): the body is counted as it streams and cut at the cap — nothing is buffered past it; a Content-Length
  beyond the cap is refused before the body is read. Requests ask for `Accept-Encoding: identity` and an answer
  encoded anyway is refused: a compressed body's size says nothing of what it unpacks to.
- **No proxy from the environment** (`trust_env=False`): a proxy would resolve the name itself, past the check.

What a caller reports to a tenant is its own: the status and the kind of failure, never an upstream's body
(`refusal_in`, `cut_in` find this module's errors however deep an SDK wrapped them).
"""

from __future__ import annotations

import functools
import ssl
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import anyio.to_thread
import httpcore2
import httpx2
from django.conf import settings

from agents_app import hosts

CONNECT_TIMEOUT_MAX = 10  # seconds: no connect waits longer, whatever a caller's timeout


class AddressRefused(httpcore2.ConnectError):
    """The policy refused every connection to this host (nothing was sent). An httpcore ConnectError, so an SDK sees
    a connection that could not be made; `refusal_in` finds it again."""


class AnswerTooLarge(httpx2.ReadError):
    """An answer outgrew its kind's cap and was cut off there."""

    def __init__(self, kind: str, cap: int, setting: str):
        super().__init__(f"the {kind} answer was larger than {setting} ({cap:,} bytes) and was cut off there")
        self.kind, self.cap, self.setting = kind, cap, setting


class AnswerEncoded(httpx2.ReadError):
    """An answer compressed though identity was asked for: its unpacked size cannot be bounded as it streams."""


@dataclass(frozen=True)
class Policy:
    """Where connections may go. ``allowed_hosts`` (with ``narrowed_by``): agents_app.hosts' rules; ``public``:
    every address public (hosts.public_check), loopback too with ``allow_loopback``; ``anywhere``: the operator's own
    configured endpoint (resolved once all the same)."""

    allowed_hosts: tuple[str, ...] = ()
    narrowed_by: tuple[tuple[str, tuple[str, ...]], ...] = ()
    public: bool = False
    allow_loopback: bool = False
    anywhere: bool = False

    def check(self, host: str, port: int) -> hosts.HostVerdict:
        if self.anywhere:
            return hosts.any_address(host, port)
        if self.public:
            return hosts.public_check(host, port, allow_loopback=self.allow_loopback)
        return hosts.address_check(host, port, self.allowed_hosts, narrowed_by=self.narrowed_by)


def deployment_policy() -> Policy:
    """The deployment's list alone (tools.allowed_hosts): what a connection made for no particular tenant gets."""
    return Policy(allowed_hosts=tuple(settings.RUNTIME.tools.allowed_hosts))


def tenant_policy(tenant_tool_policy) -> Policy:
    """The deployment's list narrowed by the tenant's (TenantToolPolicy.allowed_hosts, if set) — the same rule as
    hosts.host_check_for_tenant."""
    narrowed = ()
    if tenant_tool_policy is not None and tenant_tool_policy.allowed_hosts is not None:
        narrowed = ((f"{hosts.tenant_label(tenant_tool_policy)} allowed_hosts",
                     tuple(tenant_tool_policy.allowed_hosts)),)
    return Policy(allowed_hosts=tuple(settings.RUNTIME.tools.allowed_hosts), narrowed_by=narrowed)


def policy_for_tenant(tenant_id) -> Policy:
    from agents_app import selectors  # (selectors reads models: loaded when first needed)

    return tenant_policy(selectors.tenant_tool_policy_get(tenant_id=tenant_id))


# -- the caps ---------------------------------------------------------------------------------------------------------
def cap_of(kind: str) -> tuple[int, str]:
    """The cap of a kind of answer and the setting that says it."""
    if kind == "tools":
        return settings.RUNTIME.tools.max_answer_bytes, "tools.max_answer_bytes"
    if kind == "model":
        return settings.RUNTIME.model.max_answer_bytes, "model.max_answer_bytes"
    raise ValueError(f"no configured cap for {kind!r} answers: pass cap=")


@functools.cache
def default_ssl_context() -> ssl.SSLContext:
    # One per process: building one per client was 19 ms of CPU (docs/performance.md, "Downstream tool calls").
    return httpx2.create_ssl_context()


class Connector:
    """Clients whose every connection is checked by ``policy`` and whose every answer is capped at ``cap`` bytes
    (default: the kind's setting). ``cut`` / ``refused``: what happened on this connector's connections (a caller
    whose SDK swallowed the error still learns it)."""

    def __init__(self, policy: Policy, *, kind: str, cap: int | None = None, setting: str | None = None,
                 ssl_context: ssl.SSLContext | None = None):
        self.policy, self.kind = policy, kind
        if cap is None:
            cap, setting = cap_of(kind)
        self.cap, self.setting = cap, setting or f"the {kind} size limit"
        self.ssl_context = ssl_context or default_ssl_context()
        self.cut: AnswerTooLarge | None = None
        self.refused: str | None = None

    # what the backend and the transport report
    def _refuse(self, reason: str) -> AddressRefused:
        self.refused = reason
        return AddressRefused(f"the connection was not opened: {reason}")

    def _too_large(self) -> AnswerTooLarge:
        self.cut = AnswerTooLarge(self.kind, self.cap, self.setting)
        return self.cut

    def _checked_head(self, response: httpx2.Response) -> None:
        encoding = response.headers.get("content-encoding", "identity").strip().lower()
        if encoding not in ("", "identity"):
            raise AnswerEncoded(f"the {self.kind} answer came encoded ({encoding}) though identity was asked for")
        length = response.headers.get("content-length")
        if length is not None and length.strip().isdigit() and int(length) > self.cap:
            raise self._too_large()

    def async_client(self, **options) -> httpx2.AsyncClient:
        """An httpx2.AsyncClient through this connector (``options``: headers, timeout, event_hooks…)."""
        return httpx2.AsyncClient(transport=_AsyncTransport(self), trust_env=False, follow_redirects=False,
                                  **options)

    def client(self, **options) -> httpx2.Client:
        """A synchronous httpx2.Client through this connector (the openai SDK's, the CIMD fetch)."""
        return httpx2.Client(transport=_SyncTransport(self), trust_env=False, follow_redirects=False, **options)


def _connect_timeout(timeout: float | None) -> float:
    return CONNECT_TIMEOUT_MAX if timeout is None else min(timeout, CONNECT_TIMEOUT_MAX)


# -- the network backends: check, then dial the checked address -------------------------------------------------------
class _AsyncPinnedBackend(httpcore2.AsyncNetworkBackend):
    def __init__(self, connector: Connector):
        self._connector, self._inner = connector, httpcore2.AnyIOBackend()

    async def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                          socket_options: Iterable | None = None) -> httpcore2.AsyncNetworkStream:
        # The lookup blocks (getaddrinfo): in a thread, so the loop's other streams go on meanwhile.
        verdict = await anyio.to_thread.run_sync(self._connector.policy.check, host, port)
        if not verdict.allowed:
            raise self._connector._refuse(verdict.reason)
        failed: Exception | None = None
        for address in verdict.addresses:  # each one checked; never the name again
            try:
                return await self._inner.connect_tcp(address, port, timeout=_connect_timeout(timeout),
                                                     local_address=local_address, socket_options=socket_options)
            except (httpcore2.ConnectError, httpcore2.ConnectTimeout) as error:
                failed = error
        raise failed  # (verdict.addresses is never empty when allowed)

    async def connect_unix_socket(self, path, timeout=None, socket_options=None):
        raise self._connector._refuse("a Unix socket is never an outbound destination")

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


class _SyncPinnedBackend(httpcore2.NetworkBackend):
    def __init__(self, connector: Connector):
        self._connector, self._inner = connector, httpcore2.SyncBackend()

    def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                    socket_options: Iterable | None = None) -> httpcore2.NetworkStream:
        verdict = self._connector.policy.check(host, port)
        if not verdict.allowed:
            raise self._connector._refuse(verdict.reason)
        failed: Exception | None = None
        for address in verdict.addresses:
            try:
                return self._inner.connect_tcp(address, port, timeout=_connect_timeout(timeout),
                                               local_address=local_address, socket_options=socket_options)
            except (httpcore2.ConnectError, httpcore2.ConnectTimeout) as error:
                failed = error
        raise failed

    def connect_unix_socket(self, path, timeout=None, socket_options=None):
        raise self._connector._refuse("a Unix socket is never an outbound destination")

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


# httpx2's own pool limits (httpx2.DEFAULT_LIMITS), kept
_POOL = {"max_connections": 100, "max_keepalive_connections": 20, "keepalive_expiry": 5.0}


# -- the transports: httpx2's own, over a pool with the pinned backend; answers counted as they stream ----------------
class _AsyncTransport(httpx2.AsyncHTTPTransport):
    def __init__(self, connector: Connector):
        super().__init__(verify=connector.ssl_context, trust_env=False)
        self._connector = connector
        # httpx2's transport takes no network backend: its pool is replaced by one that has ours (same defaults).
        self._pool = httpcore2.AsyncConnectionPool(ssl_context=connector.ssl_context, **_POOL,
                                                   network_backend=_AsyncPinnedBackend(connector))

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        request.headers["Accept-Encoding"] = "identity"
        response = await super().handle_async_request(request)
        try:
            self._connector._checked_head(response)
        except httpx2.HTTPError:
            await response.aclose()
            raise
        return httpx2.Response(status_code=response.status_code, headers=response.headers,
                               stream=_AsyncCapped(response.stream, self._connector),
                               extensions=response.extensions)


class _SyncTransport(httpx2.HTTPTransport):
    def __init__(self, connector: Connector):
        super().__init__(verify=connector.ssl_context, trust_env=False)
        self._connector = connector
        self._pool = httpcore2.ConnectionPool(ssl_context=connector.ssl_context, **_POOL,
                                              network_backend=_SyncPinnedBackend(connector))

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        request.headers["Accept-Encoding"] = "identity"
        response = super().handle_request(request)
        try:
            self._connector._checked_head(response)
        except httpx2.HTTPError:
            response.close()
            raise
        return httpx2.Response(status_code=response.status_code, headers=response.headers,
                               stream=_SyncCapped(response.stream, self._connector), extensions=response.extensions)


class _AsyncCapped(httpx2.AsyncByteStream):
    def __init__(self, inner: httpx2.AsyncByteStream, connector: Connector):
        self._inner, self._connector, self._seen = inner, connector, 0

    async def __aiter__(self):
        async for chunk in self._inner:
            self._seen += len(chunk)
            if self._seen > self._connector.cap:
                await self.aclose()  # the connection goes with it: nothing more is read from it
                raise self._connector._too_large()
            yield chunk

    async def aclose(self) -> None:
        await self._inner.aclose()


class _SyncCapped(httpx2.SyncByteStream):
    def __init__(self, inner: httpx2.SyncByteStream, connector: Connector):
        self._inner, self._connector, self._seen = inner, connector, 0

    def __iter__(self) -> Iterator[bytes]:
        for chunk in self._inner:
            self._seen += len(chunk)
            if self._seen > self._connector.cap:
                self.close()
                raise self._connector._too_large()
            yield chunk

    def close(self) -> None:
        self._inner.close()


# -- what went wrong, however an SDK wrapped it -----------------------------------------------------------------------
def _chain(error: BaseException | None, seen: set | None = None) -> Iterator[BaseException]:
    seen = set() if seen is None else seen
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        yield error
        if isinstance(error, BaseExceptionGroup):
            for inner in error.exceptions:
                yield from _chain(inner, seen)
        error = error.__cause__ or error.__context__


def refusal_in(error: BaseException) -> AddressRefused | None:
    """This module's refusal to connect, if that is what ``error`` (or what it wraps) is."""
    return next((e for e in _chain(error) if isinstance(e, AddressRefused)), None)


def cut_in(error: BaseException) -> AnswerTooLarge | AnswerEncoded | None:
    """This module's cut of an oversized (or encoded) answer, if that is what ``error`` (or what it wraps) is."""
    return next((e for e in _chain(error) if isinstance(e, (AnswerTooLarge, AnswerEncoded))), None)
