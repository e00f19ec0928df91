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
- The bytes are uvicorn's: its own `send` frames, checks and writes every message (the default
  headers, `connection: close`, chunking, the refusals of an invalid header or a body longer or
  shorter than declared); `OneWrite` only holds the head that `send` writes, and hands it to the
  transport with the next write, in one (or alone, when a body message writes nothing). So a
  body longer than declared, which uvicorn refuses after writing the head, is refused with
  nothing written; either way the connection is closed.
- So an app in a lane sends the body's first message right after the head (the forwarding's
  answers do: a whole body, or a stream's first piece already read).
"""

from __future__ import annotations

from functools import partial
from typing import Any, Protocol

from starlette.types import ASGIApp, Message, Scope
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle


class Lane(Protocol):
    def take(self, scope: Scope) -> ASGIApp | None:
        """The app that serves this request in the lane, or None: the server's app serves it."""
        ...


class _HeldHead:
    """The cycle's transport as uvicorn's `send` sees it in a lane: the write made while
    `holding` (the response's head) is kept, and leaves with the next write."""

    __slots__ = ("_head", "_transport", "holding")

    def __init__(self, transport: Any) -> None:
        self._transport = transport
        self._head = b""
        self.holding = False

    def write(self, data: bytes) -> None:
        if self.holding:
            self._head, self.holding = data, False
        elif self._head:
            head, self._head = self._head, b""
            self._transport.write(head + data)
        else:
            self._transport.write(data)

    def flush(self) -> None:
        if self._head:
            self.write(b"")

    def __getattr__(self, name: str) -> Any:  # closing, `is_closing`: the transport's own
        return getattr(self._transport, name)


class OneWrite:
    """A cycle's `send` in a lane: uvicorn's own, with the head held for the body."""

    __slots__ = ("_cycle", "_held", "_send")

    def __init__(self, cycle: RequestResponseCycle) -> None:
        self._cycle = cycle
        self._held = _HeldHead(cycle.transport)
        cycle.transport = self._held  # type: ignore[assignment]
        self._send = partial(RequestResponseCycle.send, cycle)

    async def __call__(self, message: Message) -> None:
        held = self._held
        if message["type"] == "http.response.start" and not self._cycle.response_started:
            held.holding = True
            try:
                await self._send(message)  # type: ignore[arg-type]
            finally:
                held.holding = False  # (refused, or the client gone: nothing was written)
            return
        await self._send(message)  # type: ignore[arg-type]
        if not self._cycle.disconnected:
            held.flush()  # a body message that wrote nothing (a HEAD request's)


def into_lane(cycle: RequestResponseCycle) -> None:
    """`cycle` sends through a `OneWrite` from now: its `run_asgi` (and its 500) call it."""
    cycle.send = OneWrite(cycle)  # type: ignore[method-assign, assignment]
