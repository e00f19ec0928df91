"""The listener's deadlines (`service/common/listener.py`) on a clock of the test's own.

`GuardedHttp` is driven here as uvicorn drives it (`data_received` with the bytes a client
sent), on a loop whose time only moves when the test moves it, so that what each deadline
judges is checked at exact instants: a head's deadline runs from the first byte of that
request, on a kept-alive connection too, whatever timer an earlier request left pending; a
head that stops coming is answered 408 at its own deadline; a body that stops coming closes
the connection at its idle deadline, counted from its last byte; and an app hears that its
client's connection was lost through the scope (`GONE`), with no task of its own.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Coroutine
from typing import Any

from uvicorn.config import Config
from uvicorn.server import ServerState

from llmgw_twin.service.common.listener import GONE, Gone, ListenLimits, protocol_for

HEAD_S = 4.0
IDLE_S = 20.0
REQUEST = b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n"


class _Handle:
    def __init__(self, when: float, callback: Callable[..., object], args: tuple[Any, ...]) -> None:
        self.when = when
        self.callback = callback
        self.args = args
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class _Task:
    """A finished task: the app under test never waits on the loop."""

    def add_done_callback(self, callback: Callable[[_Task], object]) -> None:
        callback(self)


class Clock:
    """The loop `GuardedHttp` sees: time moves only in `advance`."""

    def __init__(self) -> None:
        self.now = 0.0
        self._timers: list[tuple[float, int, _Handle]] = []
        self._seq = itertools.count()

    def time(self) -> float:
        return self.now

    def call_at(self, when: float, callback: Callable[..., object], *args: Any) -> _Handle:
        handle = _Handle(when, callback, args)
        heapq.heappush(self._timers, (when, next(self._seq), handle))
        return handle

    def call_later(self, delay: float, callback: Callable[..., object], *args: Any) -> _Handle:
        return self.call_at(self.now + delay, callback, *args)

    def call_soon(self, callback: Callable[..., object], *args: Any) -> _Handle:
        return self.call_at(self.now, callback, *args)

    def create_task(self, coro: Coroutine[Any, Any, None], **_: Any) -> _Task:
        try:
            coro.send(None)
        except StopIteration:
            return _Task()
        raise AssertionError("the app waited on the loop")

    def advance(self, to: float) -> None:
        """Run every timer due by `to`, each at its own instant, then stand at `to`."""
        while self._timers and self._timers[0][0] <= to:
            when, _, handle = heapq.heappop(self._timers)
            self.now = max(self.now, when)
            if not handle.cancelled:
                handle.callback(*handle.args)
        self.now = to

    def pending(self) -> int:
        return sum(1 for _, _, h in self._timers if not h.cancelled)


class Transport:
    def __init__(self) -> None:
        self.written = b""
        self.closing = False

    def write(self, data: bytes) -> None:
        self.written += data

    def close(self) -> None:
        self.closing = True

    def is_closing(self) -> bool:
        return self.closing

    def get_extra_info(self, name: str, default: object = None) -> object:
        return {"peername": ("127.0.0.1", 50000), "sockname": ("127.0.0.1", 8000)}.get(
            name, default
        )

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def answers(self) -> list[int]:
        """The status of each answer written so far."""
        lines = self.written.split(b"\r\n")
        return [int(line.split(b" ")[1]) for line in lines if line.startswith(b"HTTP/1.1 ")]


SCOPES: list[dict[str, Any]] = []


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Answers at once, reading no body (the listener still waits for it: its idle deadline)."""
    SCOPES.append(scope)
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


def connect() -> tuple[Clock, Transport, Any]:
    limits = ListenLimits(head_timeout_ms=int(HEAD_S * 1000), idle_timeout_ms=int(IDLE_S * 1000))
    # uvicorn's own keep-alive timer (it closes a connection idle between requests) far off:
    # the app answers before the body came, which uvicorn would read as idle
    config = Config(
        app=app, lifespan="off", proxy_headers=False, log_config=None, timeout_keep_alive=3600
    )
    config.load()
    clock, transport = Clock(), Transport()
    protocol = protocol_for(limits)(config, ServerState(), {}, _loop=clock)
    protocol.connection_made(transport)  # type: ignore[arg-type]
    return clock, transport, protocol


def test_a_kept_alive_connections_later_head_has_a_deadline_of_its_own() -> None:
    clock, transport, protocol = connect()
    clock.advance(0.5)
    protocol.data_received(REQUEST)  # the first request: its head's deadline was 4.0
    assert transport.answers() == [200]
    clock.advance(3.0)
    protocol.data_received(REQUEST[:10])  # the second head begins: its deadline is 7.0
    clock.advance(6.9)  # past the first head's deadline, before the second's
    assert not transport.closing and transport.answers() == [200]
    protocol.data_received(REQUEST[10:])
    assert transport.answers() == [200, 200]
    assert not transport.closing


def test_a_later_head_that_stops_coming_is_answered_408_at_its_own_deadline() -> None:
    clock, transport, protocol = connect()
    protocol.data_received(REQUEST)
    clock.advance(3.0)
    protocol.data_received(REQUEST[:10])
    clock.advance(6.99)
    assert not transport.closing
    clock.advance(7.0)
    assert transport.answers() == [200, 408]
    assert transport.closing


def test_a_first_head_that_stops_coming_is_answered_408() -> None:
    clock, transport, protocol = connect()
    protocol.data_received(REQUEST[:5])
    clock.advance(3.99)
    assert not transport.closing
    clock.advance(4.0)
    assert transport.answers() == [408]
    assert transport.closing


def test_an_idle_kept_alive_connection_is_not_judged_on_a_head() -> None:
    """Between requests no head is awaited: a timer left by the last one judges nothing."""
    clock, transport, protocol = connect()
    protocol.data_received(REQUEST)
    clock.advance(HEAD_S * 3)
    assert transport.answers() == [200]
    assert clock.pending() <= 2  # uvicorn's keep-alive timer and at most one of ours


def test_many_requests_on_one_connection_leave_no_pile_of_timers() -> None:
    clock, transport, protocol = connect()
    for i in range(100):
        clock.advance(i * 0.01)
        protocol.data_received(REQUEST)
    assert transport.answers() == [200] * 100
    assert clock.pending() <= 3


def test_a_body_that_stops_coming_closes_the_connection_at_its_idle_deadline() -> None:
    clock, transport, protocol = connect()
    protocol.data_received(REQUEST)
    clock.advance(1.0)
    head = b"POST /x HTTP/1.1\r\nhost: x\r\ncontent-length: 10\r\n\r\n"
    protocol.data_received(head + b"12345")
    clock.advance(15.0)
    protocol.data_received(b"678")  # the body's idle deadline is now 35.0
    clock.advance(34.9)
    assert not transport.closing
    clock.advance(35.0)
    assert transport.closing
    assert transport.answers() == [200, 200]


def test_an_app_hears_its_connection_lost_through_the_scope() -> None:
    _, _, protocol = connect()
    SCOPES.clear()
    protocol.data_received(REQUEST + REQUEST)
    assert len(SCOPES) == 2
    gone = SCOPES[0]["extensions"][GONE]["connection"]
    assert isinstance(gone, Gone)
    assert SCOPES[1]["extensions"][GONE]["connection"] is gone  # one per connection
    heard: list[str] = []
    gone.add(lambda: heard.append("kept"))
    dropped = lambda: heard.append("discarded")  # noqa: E731
    gone.add(dropped)
    gone.discard(dropped)
    assert heard == []
    protocol.connection_lost(None)
    assert heard == ["kept"]
    gone.add(lambda: heard.append("late"))  # added once lost: run at once
    assert heard == ["kept", "late"]
