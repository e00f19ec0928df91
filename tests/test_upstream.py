"""The forwarding's client to the replicas (`service/router/upstream.py`) against scripted HTTP
servers on loopback: kept-alive connections reused and only when an answer ended whole, the
three ways an answer's end is framed, a stream handed over as it arrives, a connection the
replica closed while idle, a malformed answer, a silent replica, and reading paused while the
caller takes nothing.

Each server is an asyncio server in the test's own loop, on a port the system picks, that
answers each request with what its test scripts (`Script`). No assertion is about time: a wait
is on a condition (an event the server sets), with a deadline.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from llmgw_twin.service.router.upstream import READ_BUFFER, Upstream, UpstreamError

DEADLINE_S = 10.0
WAIT_S = 60.0
"""Each post's own bound on its answer's head: far off (the tests bound themselves)."""


def far() -> float:
    """A post's deadline, `WAIT_S` from now on the running loop's clock."""
    return asyncio.get_running_loop().time() + WAIT_S


Reader = asyncio.StreamReader
Writer = asyncio.StreamWriter
OK = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"

Script = Callable[[int, int, asyncio.StreamReader, asyncio.StreamWriter], Awaitable[bool]]
"""(connection number, request number on it, reader, writer) -> keep the connection open"""


async def read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    return head + await reader.readexactly(length)


class Server:
    def __init__(self, script: Script) -> None:
        self.script = script
        self.connections = 0
        self.requests: list[bytes] = []
        self.writers: list[asyncio.StreamWriter] = []
        self.server: asyncio.Server | None = None
        self.tasks: list[asyncio.Task[None]] = []

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def __aexit__(self, *exc: Any) -> None:
        assert self.server is not None
        self.server.close()
        for w in self.writers:
            w.close()
        for t in self.tasks:
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.writers.append(writer)
        task = asyncio.current_task()
        assert task is not None
        self.tasks.append(task)
        number = self.connections
        n = 0
        try:
            while True:
                self.requests.append(await read_request(reader))
                n += 1
                if not await self.script(number, n, reader, writer):
                    break
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass
        writer.close()


async def ok(_c: int, _n: int, _r: Reader, w: Writer) -> bool:
    w.write(OK)
    await w.drain()
    return True


def client(keep_idle: int = 8) -> Upstream:
    return Upstream(connect_s=DEADLINE_S, keep_idle=keep_idle)


async def body_of(answer: Any) -> bytes:
    parts = []
    while (chunk := await answer.next_chunk(DEADLINE_S)) is not None:
        parts.append(chunk)
    return b"".join(parts)


def run(coro: Awaitable[None]) -> None:
    async def bounded() -> None:
        async with asyncio.timeout(60):
            await coro

    asyncio.run(bounded())


def test_an_answer_ended_whole_leaves_its_connection_for_the_next_request() -> None:
    async def go() -> None:
        async with Server(ok) as url:
            up = client()
            for _ in range(3):
                answer = await up.post(url, "/v1/chat/completions", b'{"model": "m"}', far())
                assert (answer.status, answer.content_type) == (200, "application/json")
                assert await body_of(answer) == b"{}"
                await answer.aclose()
            assert up.opened == 1
            await up.aclose()

    run(go())


def test_the_request_is_the_body_unchanged_with_its_length() -> None:
    async def go() -> None:
        server = Server(ok)
        async with server as url:
            up = client()
            answer = await up.post(
                url, "/v1/completions", b'{"model": "m", "x": "\xc3\xa9"}', far()
            )
            await body_of(answer)
            await answer.aclose()
            await up.aclose()
        head, body = server.requests[0].split(b"\r\n\r\n", 1)
        lines = head.split(b"\r\n")
        assert lines[0] == b"POST /v1/completions HTTP/1.1"
        assert b"content-length: %d" % len(body) in lines
        assert body == b'{"model": "m", "x": "\xc3\xa9"}'

    run(go())


def test_an_answer_abandoned_midway_closes_its_connection() -> None:
    release = asyncio.Event()

    async def two_parts(
        _c: int, _n: int, _r: asyncio.StreamReader, w: asyncio.StreamWriter
    ) -> bool:
        w.write(b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\nab")
        await w.drain()
        await release.wait()
        w.write(b"cd")
        await w.drain()
        return True

    async def go() -> None:
        async with Server(two_parts) as url:
            up = client()
            answer = await up.post(url, "/p", b"{}", far())
            assert await answer.next_chunk(DEADLINE_S) == b"ab"
            await answer.aclose()  # the rest never read: its bytes must not reach another
            release.set()
            answer = await up.post(url, "/p", b"{}", far())  # a new connection's answer, whole
            assert await body_of(answer) == b"abcd"
            await answer.aclose()
            assert up.opened == 2
            await up.aclose()

    run(go())


def test_a_chunked_stream_is_handed_over_as_it_arrives() -> None:
    sent_first = asyncio.Event()
    more = asyncio.Event()

    async def stream(_c: int, _n: int, _r: Reader, w: Writer) -> bool:
        w.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n")
        w.write(b"transfer-encoding: chunked\r\n\r\n")
        w.write(b"7\r\ndata: 1\r\n")
        await w.drain()
        sent_first.set()
        await more.wait()
        w.write(b"7\r\ndata: 2\r\n0\r\n\r\n")
        await w.drain()
        return True

    async def go() -> None:
        async with Server(stream) as url:
            up = client()
            answer = await up.post(url, "/p", b"{}", far())
            assert answer.content_type == "text/event-stream"
            # the first chunk is there while the replica has not sent the second
            assert await answer.next_chunk(DEADLINE_S) == b"data: 1"
            assert not more.is_set()
            more.set()
            assert await body_of(answer) == b"data: 2"
            await answer.aclose()
            answer = await up.post(url, "/p", b"{}", far())  # kept alive after a chunked end
            more.set()
            assert await body_of(answer) == b"data: 1data: 2"
            await answer.aclose()
            assert up.opened == 1
            await up.aclose()

    run(go())


def test_an_answer_ended_by_its_connections_close_is_whole_and_not_kept() -> None:
    async def closing(_c: int, _n: int, _r: Reader, w: Writer) -> bool:
        w.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\nconnection: close\r\n\r\n")
        w.write(b"until the end")
        await w.drain()
        return False

    async def go() -> None:
        async with Server(closing) as url:
            up = client()
            for _ in range(2):
                answer = await up.post(url, "/p", b"{}", far())
                assert await body_of(answer) == b"until the end"
                await answer.aclose()
            assert up.opened == 2
            await up.aclose()

    run(go())


def test_a_connection_the_replica_closed_while_idle_is_not_used_again() -> None:
    async def once(_c: int, _n: int, _r: Reader, w: Writer) -> bool:
        w.write(OK)
        await w.drain()
        return False  # keep-alive was allowed, but the replica closes right after

    async def go() -> None:
        server = Server(once)
        async with server as url:
            up = client()
            for _ in range(3):
                answer = await up.post(url, "/p", b"{}", far())
                assert await body_of(answer) == b"{}"
                await answer.aclose()
            assert server.connections == 3 and len(server.requests) == 3
            await up.aclose()

    run(go())


def test_a_request_the_replica_dropped_unanswered_on_a_kept_connection_goes_once_more() -> None:
    # the keep-alive race: the replica closes its idle connection as the next request arrives
    async def drops_second(
        c: int, n: int, _r: asyncio.StreamReader, w: asyncio.StreamWriter
    ) -> bool:
        if c == 1 and n == 2:
            return False  # closed, nothing answered
        w.write(OK)
        await w.drain()
        return True

    async def go() -> None:
        server = Server(drops_second)
        async with server as url:
            up = client()
            for _ in range(2):
                answer = await up.post(url, "/p", b"{}", far())
                assert answer.status == 200 and await body_of(answer) == b"{}"
                await answer.aclose()
            assert server.connections == 2 and len(server.requests) == 3
            await up.aclose()

    run(go())


def test_a_request_dropped_on_a_new_connection_is_the_callers_failure() -> None:
    async def drops(_c: int, _n: int, _r: Reader, _w: Writer) -> bool:
        return False

    async def go() -> None:
        server = Server(drops)
        async with server as url:
            up = client()
            with pytest.raises(UpstreamError, match="closed the connection"):
                await up.post(url, "/p", b"{}", far())
            assert server.connections == 1  # not sent again: it may have been acted on
            await up.aclose()

    run(go())


def test_a_malformed_answer_and_a_replica_not_listening_are_upstream_errors() -> None:
    async def garbage(_c: int, _n: int, _r: Reader, w: Writer) -> bool:
        w.write(b"SMTP ready\r\n\r\n")
        await w.drain()
        return True

    async def go() -> None:
        async with Server(garbage) as url:
            up = client()
            with pytest.raises(UpstreamError, match="malformed"):
                await up.post(url, "/p", b"{}", far())
        with pytest.raises(UpstreamError, match="cannot connect"):
            await up.post(url, "/p", b"{}", far())  # the server is closed: nothing listens there
        with pytest.raises(UpstreamError, match="not an http"):
            await up.post("https://127.0.0.1:1", "/p", b"{}", far())
        await up.aclose()

    run(go())


def test_a_silent_replica_times_a_read_out_and_its_connection_is_not_kept() -> None:
    answered = asyncio.Event()

    async def stalls(c: int, _n: int, _r: Reader, w: Writer) -> bool:
        w.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        if c == 1:
            w.write(b"2\r\nab\r\n")
            await w.drain()
            answered.set()
            await asyncio.Event().wait()  # never more; cancelled when the test ends
        w.write(b"0\r\n\r\n")
        return True

    async def go() -> None:
        async with Server(stalls) as url:
            up = client()
            answer = await up.post(url, "/p", b"{}", far())
            assert await answer.next_chunk(0.05) == b"ab"
            with pytest.raises(TimeoutError):
                await answer.next_chunk(0.05)
            await answer.aclose()
            answer = await up.post(url, "/p", b"{}", far())
            assert await body_of(answer) == b""
            await answer.aclose()
            assert up.opened == 2
            await up.aclose()

    run(go())


def test_an_answer_is_handed_over_with_its_first_piece_not_its_head_alone() -> None:
    """A head with no body yet does not end `post` (a post that did would be done well within
    the half second given); the caller's bound ends it, and the connection, midway through an
    answer, is not kept."""
    head_sent = asyncio.Event()

    async def head_only(c: int, _n: int, _r: Reader, w: Writer) -> bool:
        w.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        await w.drain()
        if c == 1:
            head_sent.set()
            await asyncio.Event().wait()  # never a body; cancelled when the test ends
        w.write(b"3\r\nabc\r\n0\r\n\r\n")
        return True

    async def go() -> None:
        async with Server(head_only) as url:
            up = client()
            waiting = asyncio.ensure_future(up.post(url, "/p", b"{}", far()))
            await head_sent.wait()
            done, _ = await asyncio.wait({waiting}, timeout=0.5)
            assert not done
            waiting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiting
            answer = await up.post(url, "/p", b"{}", far())
            assert answer.status == 200
            assert await body_of(answer) == b"abc"
            await answer.aclose()
            assert up.opened == 2
            await up.aclose()

    run(go())


def test_idle_connections_are_bounded_over_all_replicas() -> None:
    async def go() -> None:
        async with Server(ok) as url:
            up = client(keep_idle=1)
            answers = [await up.post(url, "/p", b"{}", far()) for _ in range(3)]
            assert up.opened == 3
            for a in answers:
                await body_of(a)
                await a.aclose()
            for _ in range(2):  # one of the three was kept; the next two share it
                a = await up.post(url, "/p", b"{}", far())
                await body_of(a)
                await a.aclose()
            assert up.opened == 3
            await up.aclose()

    run(go())


def test_reading_pauses_while_the_caller_takes_nothing() -> None:
    size = 16 * READ_BUFFER
    writers: list[asyncio.StreamWriter] = []

    async def big(_c: int, _n: int, _r: Reader, w: Writer) -> bool:
        writers.append(w)
        w.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % size)
        w.write(b"x" * size)
        await w.drain()
        return True

    async def go() -> None:
        async with Server(big) as url:
            up = client()
            answer = await up.post(url, "/p", b"{}", far())
            conn = answer._conn
            async with asyncio.timeout(DEADLINE_S):
                while not conn._paused:
                    await asyncio.sleep(0.01)
            # paused with about a buffer's worth held, the rest still the replica's to send
            assert conn._buffered < READ_BUFFER + 512 * 1024
            assert writers[0].transport.get_write_buffer_size() > 0
            assert len(await body_of(answer)) == size
            await answer.aclose()
            await up.aclose()

    run(go())
