"""A stream ends when the token that opened it stops being valid (issue 37, finding 9).

A request is authenticated once, when it arrives; a stream then lasts as long as its task — hours for an agent. An
attacker's token, revoked after it opened ``/runtime/tasks/<id>/events``, an MCP ``tasks/result`` or a
``subscriptions/listen``, went on receiving the task's output to the final result. So every long-lived answer
holds a ``StreamGuard`` on its credential, and:

- re-checks it every ``oauth.stream_token_check_seconds`` (config/runtime.yaml) — one indexed statement (the API
  token by its primary key, an OAuth access token by its checksum), made once per token per web process however many
  streams that token has open there (a ``_Watch`` shared by its guards);
- ends at the token's expiry without asking (an OAuth access token's, known when it was authenticated; the
  statement also returns it, on the database's clock);
- checks once more, at once, before a stream hands out a task's final state (``confirm``): a revocation an instant
  before the end is not outrun by the result.

A stream that sees ``guard.ended`` sends its last word — SSE ``event: stream.end`` with ``{"reason", "detail"}``,
MCP a JSON-RPC error (mcp_bridge.waiting.TOKEN_ENDED) — and nothing more. The watch wakes the streams' listeners
when it ends, so a stream waiting quietly for events notices within the check interval, not at its next event.

Which credentials: an API token (``art_…``, tasks_app.ApiToken: revoked, its user deactivated or moved to another
tenant) and whatever credential carries a ``stream_credential`` (mcp_bridge.oauth: OAuth access tokens ``aro_…``;
an external provider's JWT ends at its ``exp``, its provider is not asked). A signed-in session's stream has no
guard: the console's pages follow a session's own lifetime.

A check the database cannot answer (away, pool exhausted) keeps the stream — its own reads fail the same way and end
it — and is tried again at the next interval; the expiry still ends it on time.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import DatabaseError
from django.db.models import F
from psycopg_pool import PoolTimeout

from config.base.asgi_handler import db_in_thread
from tasks_app.models import ApiToken

logger = logging.getLogger(__name__)

# A confirm after a check (or the request's authentication) this recent is answered by it: no second statement.
CONFIRM_FRESH_SECONDS = 0.25
REVOKED = "token_revoked"
EXPIRED = "token_expired"
_DETAILS = {
    REVOKED: "The token this stream was opened with is no longer valid (revoked, or its user deactivated or moved to "
             "another tenant): the stream ends here. Open it again with a valid token.",
    EXPIRED: "The token this stream was opened with has expired: the stream ends here. Open it again with a fresh "
             "token (an OAuth client refreshes its access token).",
}


@dataclass(frozen=True)
class StreamCredential:
    """What a stream's guard re-checks. ``key`` names the token — never the token itself (an id, a checksum) — and
    is what streams of the same token share; ``remaining()`` (blocking, one statement) answers the seconds until it
    expires (``math.inf``: never) while it is valid, ``None`` once it is not; ``expires_at`` (epoch seconds,
    ``math.inf``) as known when the request was authenticated."""

    key: str
    remaining: Callable[[], float | None]
    expires_at: float = math.inf


@dataclass(frozen=True)
class StreamEnd:
    reason: str  # REVOKED or EXPIRED
    detail: str

    def as_dict(self) -> dict[str, str]:
        return {"reason": self.reason, "detail": self.detail}


def _api_token_remaining(token_id: int) -> float | None:
    """An API token is valid while it is not revoked, its user active and still a member of its tenant (what
    sql.TOKEN_AUTH checks at each request). One statement, by primary key. It never expires."""
    valid = ApiToken.objects.filter(pk=token_id, revoked_at__isnull=True, user__is_active=True,
                                    user__tenant_membership__tenant_id=F("tenant_id")).exists()
    return math.inf if valid else None


def api_token_credential(token_id: int) -> StreamCredential:
    return StreamCredential(key=f"api-token:{token_id}", remaining=lambda: _api_token_remaining(token_id))


def credential_of(auth: Any) -> StreamCredential | None:
    """The stream credential of an authenticated request's ``request.auth``: an API token, or a credential that
    carries its own (mcp_bridge.oauth.rest.OAuthCredential); None for a session."""
    if isinstance(auth, ApiToken) and auth.id is not None:
        return api_token_credential(auth.id)
    return getattr(auth, "stream_credential", None)


def check_seconds() -> float:
    return settings.RUNTIME.oauth.stream_token_check_seconds


class _Watch:
    """One token's checks in one process (its event loop), shared by every guard of a stream it opened there."""

    def __init__(self, credential: StreamCredential, loop: asyncio.AbstractEventLoop):
        self.credential, self.loop = credential, loop
        self.guards: set[StreamGuard] = set()
        self.end: StreamEnd | None = None
        self.deadline = loop.time() + max(0.0, credential.expires_at - time.time())  # (inf stays inf)
        self.lock = asyncio.Lock()  # one statement at a time per token (a confirm joins a check under way)
        self.checked_at = loop.time()  # (the request's own authentication just now)
        self.task = loop.create_task(self._run(), name="stream-token-watch")

    async def _run(self) -> None:
        while self.end is None:
            wait = min(check_seconds(), self.deadline - self.loop.time())
            if wait > 0:
                await asyncio.sleep(wait)
            if self.loop.time() >= self.deadline:
                self._finish(EXPIRED)  # at its expiry, without asking
                return
            await self.check(since=self.loop.time())

    async def check(self, *, since: float) -> None:
        """Ask the database, unless a check begun at or after ``since`` has answered (a confirm joining another)."""
        async with self.lock:
            if self.end is not None or self.checked_at >= since:
                return
            self.checked_at = self.loop.time()
            try:
                remaining = await db_in_thread(self.credential.remaining)
            except (DatabaseError, PoolTimeout) as error:
                logger.warning("A stream's token could not be re-checked (%s); tried again in %.0f s",
                               type(error).__name__, check_seconds())
                return
            if remaining is None:
                self._finish(REVOKED)
            elif remaining <= 0:
                self._finish(EXPIRED)
            else:
                self.deadline = min(self.deadline, self.checked_at + remaining)

    def _finish(self, reason: str) -> None:
        self.end = StreamEnd(reason=reason, detail=_DETAILS[reason])
        watches = _watches.get(self.loop, {})
        if watches.get(self.credential.key) is self:
            del watches[self.credential.key]  # (a stream opened from now on gets a watch, and a check, of its own)
        for guard in list(self.guards):
            guard._woken()

    def close(self) -> None:
        self.task.cancel()


# Per event loop (a process's one, in production), per token.
_watches: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, _Watch]] = weakref.WeakKeyDictionary()


class StreamGuard:
    """``async with StreamGuard(credential) as guard:`` around a stream; ``guard.wake(listener)`` for the listener
    its loop waits on; ``guard.ended`` (a StreamEnd, or None) before each thing it sends; ``await guard.confirm()``
    before a task's final state. Without a credential (a session) it never ends anything."""

    def __init__(self, credential: StreamCredential | None):
        self.credential = credential
        self._watch: _Watch | None = None
        self._listeners: list[Any] = []

    async def __aenter__(self) -> StreamGuard:
        if self.credential is None:
            return self
        loop = asyncio.get_running_loop()
        watches = _watches.setdefault(loop, {})
        watch = watches.get(self.credential.key)
        if watch is None or watch.task.done():
            watch = watches[self.credential.key] = _Watch(self.credential, loop)
        watch.guards.add(self)
        self._watch = watch
        return self

    async def __aexit__(self, *exc_info) -> None:
        watch, self._watch = self._watch, None
        if watch is None:
            return
        watch.guards.discard(self)
        if not watch.guards:  # the token's last stream here: stop checking it
            watch.close()
            watches = _watches.get(watch.loop, {})
            if watches.get(watch.credential.key) is watch:
                del watches[watch.credential.key]

    def wake(self, listener) -> None:
        """Wake ``listener`` (a django-eventstream Listener the stream waits on) when the token's checks end it."""
        self._listeners.append(listener)
        if self.ended is not None:
            listener.aevent.set()

    def _woken(self) -> None:
        for listener in self._listeners:
            listener.aevent.set()

    @property
    def ended(self) -> StreamEnd | None:
        return self._watch.end if self._watch is not None else None

    async def confirm(self) -> StreamEnd | None:
        """Check the token now (one statement, shared with a check under way) — before a stream hands out a task's
        final state — and say whether the stream has ended."""
        if self._watch is not None and self._watch.end is None:
            await self._watch.check(since=self._watch.loop.time() - CONFIRM_FRESH_SECONDS)
        return self.ended
