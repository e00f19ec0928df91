"""A lane (`service/common/lane.py`) answers byte for byte as uvicorn's own cycle does, in fewer
writes: each kind of answer an app may send (whole, streamed, to a request that closes, to
HTTP/1.0, with no body, with a header uvicorn refuses, longer than it declared) is served on
one connection through the lane and on another through the app's usual way, and what each
connection was written, and whether it was closed, is the same (but for an answer longer than it
declared, whose head uvicorn wrote before cutting it, and the lane never wrote); a whole answer
leaves in one write. A request the lane does not take is the app's, as is every request over
the server's concurrency limit."""

from __future__ import annotations

from typing import Any

import pytest
from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.config import Config
from uvicorn.server import ServerState

from llmgw_twin.service.common.listener import ListenLimits, protocol_for
from test_listener_deadlines import Clock, Transport

JSON = (b"content-type", b"application/json")


class Writes(Transport):
    def __init__(self) -> None:
        super().__init__()
        self.writes = 0

    def write(self, data: bytes) -> None:
        self.writes += 1
        super().write(data)


def whole(body: bytes, *headers: tuple[bytes, bytes], declared: int | None = None) -> ASGIApp:
    length = str(len(body) if declared is None else declared).encode()

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        start = [JSON, (b"content-length", length), *headers]
        await send({"type": "http.response.start", "status": 200, "headers": start})
        await send({"type": "http.response.body", "body": body})

    return app


async def streamed(scope: Scope, receive: Receive, send: Send) -> None:
    start = [(b"content-type", b"text/event-stream"), (b"x-llmgw-replica", b"m-r1")]
    await send({"type": "http.response.start", "status": 200, "headers": start})
    for piece in (b"data: 1\n\n", b"data: 2\n\n", b""):
        await send({"type": "http.response.body", "body": piece, "more_body": bool(piece)})


async def no_content(scope: Scope, receive: Receive, send: Send) -> None:
    await send({"type": "http.response.start", "status": 204, "headers": []})
    await send({"type": "http.response.body", "body": b""})


APPS: dict[str, ASGIApp] = {
    "/whole": whole(b'{"ok": true}', (b"x-llmgw-replica", b"m-r1")),
    "/stream": streamed,
    "/empty": no_content,
    "/bad-value": whole(b"{}", (b"x-llmgw-replica", b"a\x01b")),
    "/bad-name": whole(b"{}", (b"x llmgw", b"1")),
    "/longer": whole(b"{}", declared=1),
}


async def by_path(scope: Scope, receive: Receive, send: Send) -> None:
    await APPS[scope["path"]](scope, receive, send)


class Taker:
    """A lane that takes the paths it is given."""

    def __init__(self, *paths: str) -> None:
        self.paths = paths
        self.taken: list[str] = []

    def take(self, scope: Scope) -> ASGIApp | None:
        if scope["path"] not in self.paths:
            return None
        self.taken.append(scope["path"])
        return by_path


def connect(lane: Taker | None, limit: int | None = None) -> tuple[Writes, Any]:
    config = Config(
        app=by_path,
        lifespan="off",
        proxy_headers=False,
        log_config=None,
        date_header=False,  # the same bytes both ways, whenever each is written
        limit_concurrency=limit,
    )
    config.load()
    transport = Writes()
    protocol = protocol_for(ListenLimits(), lane)(config, ServerState(), {}, _loop=Clock())
    protocol.connection_made(transport)  # type: ignore[arg-type]
    return transport, protocol


def request(path: str, *headers: bytes, version: bytes = b"1.1") -> bytes:
    line = b"POST " + path.encode() + b" HTTP/" + version + b"\r\nhost: x\r\n"
    return b"".join([line, *headers, b"content-length: 2\r\n\r\n{}"])


CASES = [
    ("/whole", request("/whole")),
    ("/stream", request("/stream")),
    ("/whole", request("/whole", b"connection: close\r\n")),
    ("/whole", request("/whole", version=b"1.0")),
    ("/empty", request("/empty")),
    ("/bad-value", request("/bad-value")),
    ("/bad-name", request("/bad-name")),
    ("/longer", request("/longer")),
]


IDS = [f"{p}-{i}" for i, (p, _) in enumerate(CASES)]


@pytest.mark.parametrize(("path", "raw"), CASES, ids=IDS)
def test_the_lane_writes_what_uvicorn_writes(path: str, raw: bytes) -> None:
    lane = Taker(path)
    served = []
    for lane_or_none in (lane, None):
        transport, protocol = connect(lane_or_none)
        protocol.data_received(raw)
        served.append(transport)
    ours, theirs = served
    assert lane.taken == [path]
    assert theirs.written.startswith(b"HTTP/1.1 ") or theirs.closing
    if path == "/longer":  # uvicorn wrote the head, then cut; the lane never wrote it
        assert theirs.closing and ours.closing
        assert ours.written == b""
        return
    assert ours.written == theirs.written
    assert ours.closing == theirs.closing
    assert ours.writes <= theirs.writes


def test_a_whole_answer_leaves_in_one_write_and_the_connection_serves_the_next() -> None:
    transport, protocol = connect(Taker("/whole"))
    protocol.data_received(request("/whole"))
    assert transport.writes == 1
    assert transport.written.endswith(b'\r\n\r\n{"ok": true}')
    protocol.data_received(request("/whole"))  # kept alive: the next request on it
    assert transport.writes == 2
    assert transport.written.count(b"HTTP/1.1 200 OK\r\n") == 2
    assert not transport.closing


def test_what_the_lane_does_not_take_is_the_apps_and_so_is_a_request_over_the_limit() -> None:
    lane = Taker("/whole")
    transport, protocol = connect(lane)
    protocol.data_received(request("/stream"))
    assert lane.taken == []
    assert transport.answers() == [200]
    # over the concurrency limit, uvicorn's own 503 answers: the lane is not asked
    lane = Taker("/whole")
    transport, protocol = connect(lane, limit=1)
    protocol.data_received(request("/whole"))
    assert lane.taken == []
    assert transport.answers() == [503]
