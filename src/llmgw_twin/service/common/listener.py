"""What one server lets its clients hold: connections, time to send a request's head, its size.

Role: every service's listener (the controller's, the agent's, the router's) is served by uvicorn
with `uvicorn_options(settings)`: uvicorn's own bounds where it has them (`limit_concurrency`,
the connection cap: a request beyond it is answered 503; `timeout_keep_alive`, how long an idle
connection is kept between requests), and an HTTP protocol of its own (`GuardedHttp`, uvicorn's
httptools protocol with what uvicorn lacks): a deadline on each request's head, and a bound on
its size. The config keys are the listener's (`listen.max_connections`, `listen.head_timeout`,
`listen.idle_timeout`, `listen.max_head_bytes`: docs/security.md).

Invariants:
- A connection must send a request's whole head (request line and headers) within
  `head_timeout` of being opened, or of the first byte of that request on a kept-alive
  connection; otherwise it is answered 408 and closed. A client that dribbles a byte now and
  then holds no connection longer than that.
- A request's body must keep coming: a connection that sends none of it for `idle_timeout`
  while the server waits for it is closed (the app reads the end of the body as the client
  gone). Time the server itself does not read (it paused reading: the app has not taken what
  came) is not the client's.
- A head over `max_head_bytes` is answered 431 and the connection closed, as soon as the bytes
  read pass the bound (a head that never ends is not read to its end).
- The server's own lag is not the client's slowness: a deadline the event loop reaches late
  (the process was stalled) is set again rather than enforced, and a deadline reached on time
  is judged one turn of the loop later, after what had arrived is read.
- An app hears of its client's connection lost without a task of its own waiting on
  `receive`: each request's scope carries the connection's `Gone` (in the extension `GONE`),
  whose callbacks run once, when the connection is lost (the router's streams use it).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from itertools import chain
from typing import Any

from uvicorn._types import ASGI3Application
from uvicorn.protocols.http.httptools_impl import (
    STATUS_LINE,
    HttpToolsProtocol,
    RequestResponseCycle,
)

from llmgw_twin.service.common.lane import Lane, into_lane

log = logging.getLogger("llmgw_twin.listener")

KiB = 1024
MAX_CONNECTIONS = 16_384
"""Open connections (and requests in flight) a server serves at once; beyond, 503. Above any
fleet's node count: every agent keeps one connection to the controller."""
MAX_CONNECTIONS_BOUNDS = (1, 1_000_000)
HEAD_TIMEOUT_MS = 10_000
HEAD_TIMEOUT_BOUNDS_MS = (100, 600_000)
IDLE_TIMEOUT_MS = 75_000
"""How long an idle connection is kept open: longer than a heartbeat interval, so an agent's
heartbeats reuse one connection (uvicorn's default, 5 s, made every 10 s heartbeat a new one:
a thousand TCP handshakes a second at 10,000 nodes). Clients expire theirs sooner (60 s), so
they never send on a connection the server is closing."""
IDLE_TIMEOUT_BOUNDS_MS = (1_000, 3_600_000)
MAX_HEAD_BYTES = 64 * KiB
MAX_HEAD_BYTES_BOUNDS = (1 * KiB, 1024 * KiB)
LATE_S = 0.5
"""A head deadline the event loop reaches later than this was missed by the server (a stall),
not by the client: it is set again."""
GONE = "llmgw.gone"
"""The scope extension holding the connection's `Gone` (under "connection", as an extension's
value is a dict)."""


class Gone:
    """What runs once a connection is lost: callbacks added by the app while it serves a
    request on it (and discarded when it is done with them)."""

    __slots__ = ("_callbacks", "lost")

    def __init__(self) -> None:
        self._callbacks: list[Callable[[], object]] = []
        self.lost = False

    def add(self, callback: Callable[[], object]) -> None:
        """Run `callback` once the connection is lost (at once if it already was)."""
        if self.lost:
            callback()
        else:
            self._callbacks.append(callback)

    def discard(self, callback: Callable[[], object]) -> None:
        if callback in self._callbacks:
            self._callbacks.remove(callback)

    def fire(self) -> None:
        self.lost = True
        callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback()


@dataclass(frozen=True, slots=True)
class ListenLimits:
    max_connections: int = MAX_CONNECTIONS
    head_timeout_ms: int = HEAD_TIMEOUT_MS
    idle_timeout_ms: int = IDLE_TIMEOUT_MS
    max_head_bytes: int = MAX_HEAD_BYTES


DEFAULT_LISTEN_LIMITS = ListenLimits()


class GuardedHttp(HttpToolsProtocol):
    """uvicorn's httptools protocol, with a deadline and a size bound on each request's head."""

    head_timeout_s: float = HEAD_TIMEOUT_MS / 1000
    max_head_bytes: int = MAX_HEAD_BYTES
    body_idle_s: float = IDLE_TIMEOUT_MS / 1000
    lane: Lane | None = None
    """Requests served ahead of the app, on the request's own cycle (`lane.py`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_timer: asyncio.Handle | None = None
        self._head_deadline = 0.0
        self._in_head = False
        self._head_bytes = 0
        self._refused = False
        self._refusal = (0, "")
        self._in_body = False
        self._body_timer: asyncio.TimerHandle | None = None
        self._body_deadline = 0.0
        self._gone = Gone()
        self._gone_extension: dict[object, object] = {"connection": self._gone}

    # --- the head's deadline ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)  # type: ignore[arg-type]
        self._begin_head()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        self._end_body()
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None
        super().connection_lost(exc)
        self._gone.fire()

    def _begin_head(self) -> None:
        self._in_head = True
        self._head_bytes = 0
        self._arm(self.loop.time() + self.head_timeout_s)

    def _arm(self, deadline: float) -> None:
        """The head's deadline is `deadline` (deadlines only move later). A timer already
        pending is kept: it finds the deadline moved and waits again, so that a kept-alive
        connection's requests do not each make and cancel one."""
        self._head_deadline = deadline
        if self._head_timer is None:
            self._head_timer = self.loop.call_at(deadline, self._head_due)

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_due(self) -> None:
        self._head_timer = None
        if not self._in_head or self.transport.is_closing():
            return  # no head awaited: the next one arms a timer of its own
        now = self.loop.time()
        if now < self._head_deadline:  # a later head's deadline
            self._head_timer = self.loop.call_at(self._head_deadline, self._head_due)
            return
        if now - self._head_deadline > LATE_S:
            self._arm(now + self.head_timeout_s)  # the server was behind, not it
            return
        self._head_timer = self.loop.call_soon(self._head_judged)  # what arrived is read first

    def _head_judged(self) -> None:
        self._head_timer = None
        if not self._in_head or self.transport.is_closing():
            return
        if self.loop.time() < self._head_deadline:  # that head came; this is a later one's
            self._head_timer = self.loop.call_at(self._head_deadline, self._head_due)
            return
        self._refuse(408, f"the request's head did not arrive within {self.head_timeout_s:g}s")

    # --- the body's idle deadline ---------------------------------------------------------------

    def _body_came(self) -> None:
        """Some of the body came (or is awaited from now): its idle deadline starts again."""
        self._body_deadline = self.loop.time() + self.body_idle_s
        if self._body_timer is None:
            self._body_timer = self.loop.call_at(self._body_deadline, self._body_due)

    def _end_body(self) -> None:
        self._in_body = False  # a timer pending finds no body awaited (or the next one's)

    def _body_due(self) -> None:
        self._body_timer = None
        if not self._in_body or self.transport.is_closing():
            return
        now = self.loop.time()
        if now >= self._body_deadline and (
            self.flow.read_paused or now - self._body_deadline > LATE_S
        ):  # the server is not reading what comes, or it was behind: not the client's idling
            self._body_deadline = now + self.body_idle_s
        if now < self._body_deadline:  # (or some of the body came since the timer was set)
            self._body_timer = self.loop.call_at(self._body_deadline, self._body_due)
            return
        client = "%s:%d" % self.client if self.client else "?"  # noqa: UP031
        log.warning(
            "closed a connection from %s: no byte of its body for %gs", client, self.body_idle_s
        )
        self._end_body()
        self.transport.close()

    # --- the lane -------------------------------------------------------------------------------

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: ASGI3Application) -> None:
        """A request the lane takes is served by the lane's app (not over the concurrency
        limit: that 503 is uvicorn's own, `app` then is not the server's)."""
        lane = self.lane
        if lane is not None and app is self.app:
            taken = lane.take(cycle.scope)  # type: ignore[arg-type]
            if taken is not None:
                into_lane(cycle)
                app = taken  # type: ignore[assignment]
        super()._start_asgi_task(cycle, app)

    # --- the parser's callbacks ---------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        super().data_received(data)
        if self._refused:
            self._answer_refusal()
            return
        if self._in_body:
            self._body_came()
        if self._in_head and not self.transport.is_closing():
            self._head_bytes += len(data)
            if self._head_bytes > self.max_head_bytes:
                self._refuse(431, self._too_large())

    def on_message_begin(self) -> None:
        super().on_message_begin()
        extensions = self.scope.get("extensions")
        if extensions is None:
            self.scope["extensions"] = {GONE: self._gone_extension}
        else:  # a server that names extensions of its own: kept
            extensions[GONE] = self._gone_extension
        if not self._in_head:  # a new request on a kept-alive connection
            self._begin_head()

    def on_headers_complete(self) -> None:
        self._in_head = False  # a timer pending finds no head awaited (or the next one's)
        # each header's name and value, and 4 bytes of ": " and CRLF (summed in C, no frame each)
        size = len(self.url) + sum(map(len, chain.from_iterable(self.headers)))
        size += 4 * len(self.headers)
        if size > self.max_head_bytes:
            self._refused = True  # answered once the parser returns (`data_received`)
            self._refusal = (431, self._too_large())
            return
        super().on_headers_complete()
        self._in_body = True  # until the message's end (at once for a request with no body)
        self._body_came()

    def on_body(self, body: bytes) -> None:
        if not self._refused:
            super().on_body(body)

    def on_message_complete(self) -> None:
        self._end_body()
        if not self._refused:
            super().on_message_complete()

    # --- refusals ------------------------------------------------------------------------------

    def _too_large(self) -> str:
        return f"the request's head is over {self.max_head_bytes} bytes"

    def _refuse(self, status: int, why: str) -> None:
        self._refused = True
        self._refusal = (status, why)
        self._answer_refusal()

    def _answer_refusal(self) -> None:
        status, why = self._refusal
        self._in_head = False
        self._cancel_head_timer()
        client = "%s:%d" % self.client if self.client else "?"  # noqa: UP031
        log.warning("refused a connection from %s: %s (%d)", client, why, status)
        body = why.encode("ascii", "replace")
        self.transport.write(
            b"".join(
                [
                    STATUS_LINE[status],
                    b"content-type: text/plain; charset=utf-8\r\n",
                    b"content-length: " + str(len(body)).encode("ascii") + b"\r\n",
                    b"connection: close\r\n\r\n",
                    body,
                ]
            )
        )
        self.transport.close()


def protocol_for(limits: ListenLimits, lane: Lane | None = None) -> type[GuardedHttp]:
    """`GuardedHttp` with these bounds, and `lane` (uvicorn makes one protocol object per
    connection)."""
    return type(
        "GuardedHttp",
        (GuardedHttp,),
        {
            "head_timeout_s": limits.head_timeout_ms / 1000,
            "max_head_bytes": limits.max_head_bytes,
            "body_idle_s": limits.idle_timeout_ms / 1000,
            "lane": lane,
        },
    )


def uvicorn_options(limits: ListenLimits, lane: Lane | None = None) -> dict[str, Any]:
    """The `uvicorn.Config` arguments that bound what clients may hold (and the `lane`)."""
    return {
        "http": protocol_for(limits, lane),
        "limit_concurrency": limits.max_connections,
        "timeout_keep_alive": max(1, limits.idle_timeout_ms // 1000),
        "h11_max_incomplete_event_size": limits.max_head_bytes,
    }
