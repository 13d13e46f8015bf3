"""A Server-Sent Events stream read as a browser's EventSource reads it, over a real HTTP connection."""

from __future__ import annotations

import http.client
import json
import threading
from dataclasses import dataclass, field


@dataclass
class Sse:
    """One SSE response read to its end (or until ``stop_after`` events): what a browser's EventSource sees."""

    status: int
    headers: dict
    events: list[dict] = field(default_factory=list)  # {"id", "event", "data"}
    comments: int = 0
    ended: bool = False  # the server closed the stream
    body_before_events: bytes = b""


def sse(port: int, path: str, *, token: str | None = None, last_event_id: int | None = None,
        stop_after: int | None = None, timeout: float = 30, on_event=None,
        connected: threading.Event | None = None) -> Sse:
    """``connected`` is set once the server sent the stream's first line: the stream views subscribe before they send
    anything (the snapshot, a replayed event, or the live stream's ': subscribed'), so from then on nothing published
    is missed — what a test waits for instead of sleeping before it starts a publisher."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    headers = {"Accept": "text/event-stream"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    if last_event_id is not None:
        headers["Last-Event-ID"] = str(last_event_id)
    connection.request("GET", path, headers=headers)
    response = connection.getresponse()
    result = Sse(status=response.status, headers={k.lower(): v for k, v in response.getheaders()})
    if response.status != 200:
        result.body_before_events = response.read()
        connection.close()
        return result
    current: dict = {}
    try:
        while True:
            line = response.readline()
            if connected is not None:
                connected.set()
            if not line:
                result.ended = True
                break
            line = line.decode().rstrip("\n")
            if line.startswith(":"):
                result.comments += 1
            elif line == "":
                if current:
                    current["data"] = json.loads(current["data"])
                    result.events.append(current)
                    if on_event:
                        on_event(current)
                    current = {}
                    if stop_after is not None and len(result.events) >= stop_after:
                        break
            else:
                name, _, value = line.partition(": ")
                current[name] = value
    finally:
        connection.close()
    return result
