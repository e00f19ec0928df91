"""A lane: requests a server serves on the connection's own request cycle, ahead of its app.

Role: a server may be given a `Lane` (`serving.serve(..., lane=...)`, the router's inference
routes: `router/fastpath.py`). Once a request's head is parsed, the listener (`listener.py`)
asks the lane whether it takes the request; a request it takes is served by the ASGI app the
lane names, called by uvicorn's own request cycle (its errors, its keep-alive, its pipelining
and flow control unchanged) with no middleware between, and with `OneWrite` as its `send`.
Every other request goes to the server's app as before.

Why: the router forwards a request in a few hundred microseconds of CPU, and on a busy machine
every one of them shows in its latency (docs/performance.md, "The router"). The app's middleware
looks at nothing the lane needs, and a whole answer sent as a head then a body is two writes,
two wake-ups of the client, where one does.

Invariants:
- `OneWrite` sends what uvicorn's `send` sends, byte for byte (the server's default headers
  first, `connection: close` and the body's framing as uvicorn decides them), and refuses what
  it refuses (an invalid header, a body longer or shorter than its declared length, a message
  out of order); only when is different: the head is held until the first body message and
  leaves with it, in one write (so a body longer than declared, which uvicorn refuses after
  writing the head, is refused with nothing written; either way the connection is closed).
- So an app in a lane sends the body's first message right after the head (the forwarding's
  answers do: a whole body, or a stream's first piece already read).
"""

from __future__ import annotations

from typing import Protocol

from starlette.types import ASGIApp, Message, Scope
from uvicorn.protocols.http.httptools_impl import (
    HEADER_RE,
    HEADER_VALUE_RE,
    STATUS_LINE,
    RequestResponseCycle,
)
from uvicorn.protocols.utils import get_client_addr, get_path_with_query_string


class Lane(Protocol):
    def take(self, scope: Scope) -> ASGIApp | None:
        """The app that serves this request in the lane, or None: the server's app serves it."""
        ...


class OneWrite:
    """uvicorn's `RequestResponseCycle.send` for one cycle, the head held for the body."""

    __slots__ = ("_cycle", "_head")

    def __init__(self, cycle: RequestResponseCycle) -> None:
        self._cycle = cycle
        self._head = b""

    async def __call__(self, message: Message) -> None:
        c = self._cycle
        if c.flow.write_paused and not c.disconnected:
            await c.flow.drain()
        if c.disconnected:
            return
        kind = message["type"]
        if not c.response_started:
            if kind != "http.response.start":
                raise RuntimeError(
                    f"Expected ASGI message 'http.response.start', but got '{kind}'."
                )
            c.response_started = True
            c.waiting_for_100_continue = False
            if c.access_log:
                c.access_logger.info(
                    '%s - "%s %s HTTP/%s" %d',
                    get_client_addr(c.scope),
                    c.scope["method"],
                    get_path_with_query_string(c.scope),
                    c.scope["http_version"],
                    message["status"],
                )
            self._head = self._start(c, message["status"], message.get("headers", ()))
            return
        if c.response_complete:
            raise RuntimeError(
                f"Unexpected ASGI message '{kind}' sent, after response already completed."
            )
        if kind != "http.response.body":
            raise RuntimeError(f"Expected ASGI message 'http.response.body', but got '{kind}'.")
        body = message.get("body", b"")
        more_body = message.get("more_body", False)
        out = [self._head] if self._head else []
        self._head = b""
        if c.scope["method"] == "HEAD":
            c.expected_content_length = 0
        elif c.chunked_encoding:
            if body:
                out += (b"%x\r\n" % len(body), body, b"\r\n")
            if not more_body:
                out.append(b"0\r\n\r\n")
        else:
            if len(body) > c.expected_content_length:
                raise RuntimeError("Response content longer than Content-Length")
            c.expected_content_length -= len(body)
            out.append(body)
        if out:
            c.transport.write(out[0] if len(out) == 1 else b"".join(out))
        if not more_body:
            if c.expected_content_length != 0:
                raise RuntimeError("Response content shorter than Content-Length")
            c.response_complete = True
            c.message_event.set()
            if not c.keep_alive:
                c.transport.close()
            c.on_response()

    @staticmethod
    def _start(c: RequestResponseCycle, status: int, headers: object) -> bytes:
        """The response's head, as uvicorn writes it; the cycle's framing and keep-alive set."""
        pairs = [*c.default_headers, *headers]  # type: ignore[misc]
        # each name and value checked as uvicorn does, in one search over all of them
        # (a tab is allowed in a value and not in a name: names are joined by a harmless byte)
        if HEADER_RE.search(b"-".join(n for n, _ in pairs)):
            raise RuntimeError("Invalid HTTP header name.")
        if HEADER_VALUE_RE.search(b"\t".join(v for _, v in pairs)):
            raise RuntimeError("Invalid HTTP header value.")
        content = [STATUS_LINE[status]]
        has_connection_close = False
        for raw_name, value in pairs:
            name = raw_name.lower()
            if name == b"content-length" and c.chunked_encoding is None:
                c.expected_content_length = int(value.decode())
                c.chunked_encoding = False
            elif name == b"transfer-encoding" and value.lower() == b"chunked":
                c.expected_content_length = 0
                c.chunked_encoding = True
            elif name == b"connection" and b"close" in [
                token.lower().strip() for token in value.split(b",")
            ]:
                c.keep_alive = False
                has_connection_close = True
            content += (name, b": ", value, b"\r\n")
        if not c.keep_alive and not has_connection_close:
            content.append(b"connection: close\r\n")
        if c.chunked_encoding is None and c.scope["method"] != "HEAD" and status not in (204, 304):
            c.chunked_encoding = True
            content.append(b"transfer-encoding: chunked\r\n")
        content.append(b"\r\n")
        return b"".join(content)


def into_lane(cycle: RequestResponseCycle) -> None:
    """`cycle` sends through a `OneWrite` from now: its `run_asgi` (and its 500) call it."""
    cycle.send = OneWrite(cycle)  # type: ignore[method-assign, assignment]
