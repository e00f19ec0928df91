"""The forwarding's HTTP/1.1 client to the replicas: kept-alive connections, answers as bytes.

Role: `Upstream` sends one request's body, unchanged, to a replica's leader and gives back its
answer (`UpstreamAnswer`: the status, the content type, the body chunk by chunk as it arrives).
It is built on asyncio's protocol callbacks and `httptools`' parser (the one uvicorn parses
requests with), and parses nothing but what relaying needs: the status line, the
content type, the body's framing. The forwarding (`forwarding.py`) keeps every deadline and
every judgement of the replica; this only moves bytes.

Why not a general client: a forwarded request is a POST of a known body to a known address, and
a general client's per-request machinery (request and response objects, header models, pool
bookkeeping, cancellation scopes) cost the router more CPU than the engine spent answering (the
router's profile: docs/performance.md, "The router").

Invariants:
- A connection is reused only after its answer ended whole and both sides allow keep-alive;
  an answer abandoned midway (a client gone, a deadline) closes its connection, so no later
  request reads another's bytes.
- At most `keep_idle` idle connections are kept over all replicas (the oldest is closed first);
  one closed by the replica while idle is dropped as soon as the close arrives.
- A request sent on a kept-alive connection that the replica closed before any byte of an
  answer (a keep-alive race: the replica's idle timeout) is sent once more on a new connection;
  any other failure is the caller's (`UpstreamError`).
- Bounded memory: while the caller does not take the body, at most about `READ_BUFFER` bytes
  are buffered before reading from the replica pauses.
- Cheap per chunk: what arrived between two reads is handed over as one piece, and a timer is
  armed only when a read has to wait.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Callable
from urllib.parse import urlsplit

import httptools

READ_BUFFER = 1 << 20
"""Bytes of an answer held before reading from the replica pauses."""


class UpstreamError(Exception):
    """The replica could not be reached, or broke its answer (closed, malformed)."""


class _Address:
    __slots__ = ("_heads", "host", "host_header", "port")

    def __init__(self, endpoint: str) -> None:
        parts = urlsplit(endpoint)
        if parts.scheme != "http" or not parts.hostname:
            raise UpstreamError(f"not an http:// endpoint: {endpoint!r}")
        self.host = parts.hostname
        self.port = parts.port or 80
        self.host_header = parts.netloc.encode("ascii")
        self._heads: dict[str, bytes] = {}
        """path -> a request's head up to its length (the forwarding posts to a few paths)"""

    def head(self, path: str, length: int) -> bytes:
        """A POST's head to `path` here, for a JSON body of `length` bytes."""
        start = self._heads.get(path)
        if start is None:
            start = b"".join(
                (
                    b"POST ",
                    path.encode("ascii"),
                    b" HTTP/1.1\r\nhost: ",
                    self.host_header,
                    b"\r\ncontent-type: application/json\r\naccept-encoding: identity\r\n"
                    b"content-length: ",
                )
            )
            if len(self._heads) < 64:  # the inference paths: a handful
                self._heads[path] = start
        return b"%b%d\r\n\r\n" % (start, length)


class _Connection(asyncio.Protocol):
    """One TCP connection to a replica, carrying one request at a time."""

    def __init__(self, key: tuple[str, int], on_idle_close: Callable[[_Connection], None]) -> None:
        self.key = key
        self._on_idle_close = on_idle_close
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.idle = False
        self._reset_answer()
        self._parser = httptools.HttpResponseParser(self)
        self._writable = asyncio.Event()
        self._writable.set()

    def _reset_answer(self) -> None:
        self.status = 0
        self.content_type: bytes | None = None
        self._chunks: list[bytes] = []
        self.on_body = self._chunks.append
        """httptools' body callback, bound when a parser is made: each piece of the body is
        kept as it is parsed, with no Python frame per piece (an SSE answer is one piece a
        token); what a read brought is counted and told once the parser returns."""
        self._buffered = 0
        self._paused = False
        self._headers_done = False
        self.complete = False
        self.keep_alive = False
        self.got_bytes = False
        self._error: UpstreamError | None = None
        self._wake: asyncio.Future[None] | None = None
        self._framed = False

    # asyncio's callbacks
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's: not a subclass

    def data_received(self, data: bytes) -> None:
        self.got_bytes = True
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail("the replica switched protocols")
        except httptools.HttpParserError as e:
            self._fail(f"a malformed answer: {e}")
        if self._chunks:
            self._buffered += len(data)  # with the framing: "about" READ_BUFFER
            if self._buffered > READ_BUFFER and not self._paused and self.transport is not None:
                self._paused = True
                self.transport.pause_reading()
            self._signal()

    def eof_received(self) -> bool:
        return False  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.idle:
            self._on_idle_close(self)
            return
        if self._headers_done and not self._framed and not self.complete:
            self.complete = True  # an answer whose end is the close of its connection
        elif not self.complete and self._error is None:
            reason = f": {exc}" if exc else ""
            self._error = UpstreamError(f"the replica closed the connection{reason}")
        self._signal()

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    # httptools' callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        lower = name.lower()
        if lower == b"content-type":
            self.content_type = value
        elif lower in (b"content-length", b"transfer-encoding"):
            self._framed = True

    def on_headers_complete(self) -> None:
        self.status = self._parser.get_status_code()
        self._headers_done = True  # told with the body's first piece, or its end (`started`)

    def on_message_complete(self) -> None:
        self.complete = True
        self.keep_alive = self._parser.should_keep_alive()
        self._signal()

    # the caller's side
    def _fail(self, message: str) -> None:
        self._error = UpstreamError(message)
        self.close()
        self._signal()

    def _signal(self) -> None:
        wake = self._wake
        if wake is not None and not wake.done():
            wake.set_result(None)

    async def _wait(self, deadline: float | None = None) -> None:
        """Until `_signal`, at most until the loop's time `deadline` (`TimeoutError`)."""
        loop = asyncio.get_running_loop()
        wake = self._wake = loop.create_future()
        timer = None if deadline is None else loop.call_at(deadline, _expire, wake)
        try:
            await wake
        finally:
            self._wake = None
            if timer is not None:
                timer.cancel()

    async def send(self, head: bytes, body: bytes, deadline: float) -> None:
        assert self.transport is not None
        self._reset_answer()
        self._parser = httptools.HttpResponseParser(self)
        self.transport.write(head + body)
        if not self._writable.is_set():
            async with asyncio.timeout_at(deadline):
                await self._writable.wait()

    async def started(self, deadline: float) -> None:
        """Returns once the answer's head and the first piece of its body (or its end) came:
        every caller reads that piece next, and a head alone (as a server that writes them
        apart sends it) wakes no one."""
        while not (self._headers_done and (self._chunks or self.complete)):
            if self._error is not None:
                raise self._error
            await self._wait(deadline)

    async def next_chunk(self, timeout_s: float | None = None) -> bytes | None:
        """What of the body arrived since the last call (waiting for some, at most `timeout_s`:
        `TimeoutError`), or None once it ended whole."""
        while not self._chunks:
            if self.complete:
                return None
            if self._error is not None:
                raise self._error
            loop = asyncio.get_running_loop()
            await self._wait(None if timeout_s is None else loop.time() + timeout_s)
        chunks = self._chunks
        data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        chunks.clear()  # the same list: the parser's `on_body` appends to it
        self._buffered = 0
        if self._paused and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()
        return data

    def reusable(self) -> bool:
        return self.complete and self.keep_alive and not self.closed and not self._chunks

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


def _expire(wake: asyncio.Future[None]) -> None:
    if not wake.done():
        wake.set_exception(TimeoutError())


class UpstreamAnswer:
    """A replica's answer: its status and content type now, its body as it comes."""

    __slots__ = ("_conn", "_done", "_upstream", "content_type", "status")

    def __init__(self, conn: _Connection, upstream: Upstream) -> None:
        self._conn = conn
        self._upstream = upstream
        self.status = conn.status
        self.content_type = conn.content_type.decode("latin-1") if conn.content_type else None
        self._done = False

    @property
    def is_success(self) -> bool:
        return 200 <= self.status < 300

    @property
    def ended(self) -> bool:
        """The whole body has arrived and been taken: the next read would say None."""
        return self._conn.complete and not self._conn._chunks

    async def next_chunk(self, timeout_s: float | None = None) -> bytes | None:
        """What of the body arrived since the last call, waiting at most `timeout_s` for some
        (`TimeoutError`); None at its end (`UpstreamError`: cut)."""
        while (chunk := await self._conn.next_chunk(timeout_s)) is not None:
            if chunk:
                return chunk
        return None

    async def aclose(self) -> None:
        """Done with the answer: its connection is kept for the next request when the answer
        ended whole, else closed."""
        if self._done:
            return
        self._done = True
        self._upstream._release(self._conn)


class Upstream:
    def __init__(self, *, connect_s: float, keep_idle: int) -> None:
        self.connect_s = connect_s
        self.keep_idle = keep_idle
        self._idle: OrderedDict[_Connection, None] = OrderedDict()
        self._by_key: dict[tuple[str, int], list[_Connection]] = {}
        self._addresses: dict[str, _Address] = {}
        self.opened = 0
        """Connections opened so far (kept-alive reuse shows as few)."""

    def _address(self, endpoint: str) -> _Address:
        address = self._addresses.get(endpoint)
        if address is None:
            if len(self._addresses) > 4096:  # replicas come and go: a bounded cache
                self._addresses.clear()
            address = self._addresses[endpoint] = _Address(endpoint)
        return address

    async def post(self, endpoint: str, path: str, body: bytes, deadline: float) -> UpstreamAnswer:
        """Send `body` to `endpoint` + `path`; the answer once its status line, its headers and
        the first piece of its body (or its end) arrived, by the running loop's time `deadline`
        (`TimeoutError`; a new connection within `connect_s` too). The caller closes the answer
        however it ends."""
        address = self._address(endpoint)
        head = address.head(path, len(body))
        key = (address.host, address.port)
        conn = self._take(key)
        if conn is not None:
            try:
                return await self._ask(conn, head, body, deadline)
            except UpstreamError:
                if conn.got_bytes:
                    raise
                # closed while idle, as the request left: once more, on a new connection
        return await self._ask(await self._open(key, deadline), head, body, deadline)

    async def _ask(
        self, conn: _Connection, head: bytes, body: bytes, deadline: float
    ) -> UpstreamAnswer:
        """The request sent on `conn`, and its answer's head (and first piece, `started`) by
        `deadline`; `conn` closed on any failure."""
        try:
            await conn.send(head, body, deadline)
            await conn.started(deadline)
        except BaseException:
            conn.close()
            raise
        return UpstreamAnswer(conn, self)

    async def _open(self, key: tuple[str, int], deadline: float) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout_at(min(deadline, loop.time() + self.connect_s)):
                _, conn = await loop.create_connection(
                    lambda: _Connection(key, self._forget), key[0], key[1]
                )
        except OSError as e:
            raise UpstreamError(f"cannot connect to {key[0]}:{key[1]}: {e}") from None
        self.opened += 1
        return conn

    def _take(self, key: tuple[str, int]) -> _Connection | None:
        conns = self._by_key.get(key)
        while conns:
            conn = conns.pop()
            del self._idle[conn]
            conn.idle = False
            if not conn.closed:
                return conn
        return None

    def _release(self, conn: _Connection) -> None:
        if not conn.reusable() or self.keep_idle <= 0:
            conn.close()
            return
        conn.idle = True
        self._idle[conn] = None
        self._by_key.setdefault(conn.key, []).append(conn)
        while len(self._idle) > self.keep_idle:
            oldest = next(iter(self._idle))
            self._forget(oldest)
            oldest.close()

    def _forget(self, conn: _Connection) -> None:
        if conn in self._idle:
            del self._idle[conn]
            conns = self._by_key.get(conn.key)
            if conns is not None:
                conns.remove(conn)
                if not conns:
                    del self._by_key[conn.key]
        conn.idle = False

    async def aclose(self) -> None:
        for conn in list(self._idle):
            self._forget(conn)
            conn.close()
