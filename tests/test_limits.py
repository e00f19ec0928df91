"""Limits: request bodies (413 before any handler reads them) and the router's requests in flight
per replica (the core's outstanding limit: another ready replica, then 503 with `Retry-After`).

Bodies go to the real apps: straight through ASGI, with a `receive` that counts what the app
pulls (so "not read" is observed, not inferred), and over a socket to uvicorn on loopback. The
wire models' bounds are tests/test_wire_bounds.py.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from helpers.controller import CHAT_MODEL, Sent, controller, runtime_of, two_ready_replicas
from helpers.live import live_controller
from helpers.services import eventually, free_range
from llmgw_twin.control.model import ReplicaId
from llmgw_twin.service.agent.app import AgentRuntime, create_agent_app
from llmgw_twin.service.agent.config import load_agent_config
from llmgw_twin.service.agent.fakesysfs import fabric_prefix_for, write_sysfs_root
from llmgw_twin.service.common.limits import CONTROL_BODY_LIMIT, INFERENCE_BODY_LIMIT, BodyLimit
from llmgw_twin.service.controller.app import ControllerRuntime
from llmgw_twin.service.controller.routes import create_controller_app
from llmgw_twin.service.router.forwarding import RETRIED_HEADER

CHUNK = 64 * 1024


def agent_app(tmp_path: Path) -> FastAPI:
    """An agent's app, not started: a body over the limit is refused before anything runs."""
    write_sysfs_root(tmp_path / "n1", gpus=2, fabric_prefix=fabric_prefix_for("ib-a"), node="n1")
    first, last = free_range(2)
    (tmp_path / "n1.yaml").write_text(
        "node: n1\ncontroller: http://controller.test\nlisten: {host: 127.0.0.1, port: 9}\n"
        f"root: n1\nports: {{first: {first}, last: {last}}}\n"
    )
    return create_agent_app(AgentRuntime(load_agent_config(tmp_path / "n1.yaml")))


def asgi_scope(path: str, length: int | None) -> dict[str, Any]:
    headers = [(b"content-type", b"application/json")]
    if length is not None:
        headers.append((b"content-length", str(length).encode()))
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.4"},
        "http_version": "1.1",
        "method": "POST" if "profiles" not in path else "PUT",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": headers,
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8080),
    }


async def send_endless(
    app: FastAPI, path: str, length: int | None
) -> tuple[int, dict[str, str], Any, int]:
    """Call `app` with a body that never ends (CHUNK bytes at a time, declared `length` long):
    the status, headers and JSON body of its answer, and how many chunks it pulled."""
    pulled = 0
    sent: list[Any] = []

    async def receive() -> Any:
        nonlocal pulled
        pulled += 1
        return {"type": "http.request", "body": b"x" * CHUNK, "more_body": True}

    async def send(message: Any) -> None:
        sent.append(message)

    await app(asgi_scope(path, length), receive, send)
    headers = {k.decode(): v.decode() for k, v in sent[0]["headers"]}
    body = json.loads(b"".join(m.get("body", b"") for m in sent[1:]))
    return sent[0]["status"], headers, body, pulled


ROUTES = [
    ("controller", "/v1/agents/heartbeat", CONTROL_BODY_LIMIT),
    ("controller", "/v1/admin/profiles/p", CONTROL_BODY_LIMIT),
    ("controller", "/v1/chat/completions", INFERENCE_BODY_LIMIT),
    ("agent", "/v1/assign", CONTROL_BODY_LIMIT),
]


@pytest.mark.parametrize(("service", "path", "limit"), ROUTES)
def test_a_declared_body_over_the_limit_is_413_json_and_never_read(
    tmp_path: Path, service: str, path: str, limit: int
) -> None:
    app = agent_app(tmp_path) if service == "agent" else create_controller_app(runtime_of(tmp_path))
    status, headers, body, pulled = asyncio.run(send_endless(app, path, 100 * 1024 * 1024))
    assert status == 413 and headers["content-type"] == "application/json"
    assert f"takes at most {limit} bytes" in body["detail"]
    assert headers["connection"] == "close"
    assert pulled == 0, "the body was read"


@pytest.mark.parametrize(("service", "path", "limit"), ROUTES)
def test_a_chunked_body_is_413_once_it_passes_the_limit(
    tmp_path: Path, service: str, path: str, limit: int
) -> None:
    app = agent_app(tmp_path) if service == "agent" else create_controller_app(runtime_of(tmp_path))
    status, _, body, pulled = asyncio.run(send_endless(app, path, None))
    assert status == 413 and "request body too large" in body["detail"]
    assert pulled == limit // CHUNK + 1, "read past the chunk that passed the limit"


def test_over_http_a_chunked_body_that_never_ends_is_answered_413(tmp_path: Path) -> None:
    """A real client on a real socket: the body passes the limit by one byte and is never
    finished; the answer comes anyway, and the connection is closed after it."""

    def build() -> FastAPI:
        return create_controller_app(runtime_of(tmp_path))

    with live_controller(build) as url:
        host, port = url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=30) as sock:
            sock.sendall(
                b"POST /v1/agents/heartbeat HTTP/1.1\r\nhost: c\r\n"
                b"content-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n"
            )
            piece = b"%x\r\n" % CHUNK + b"x" * CHUNK + b"\r\n"
            for _ in range(CONTROL_BODY_LIMIT // CHUNK):
                sock.sendall(piece)
            sock.sendall(b"1\r\nx\r\n")  # one byte over; no last chunk ever follows
            answer = b""
            while data := sock.recv(65536):
                answer += data
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 413 "), head
    assert b"connection: close" in head.lower()
    assert "request body too large" in json.loads(body)["detail"]


# --- the wire models' bounds ---------------------------------------------------------------


def test_a_body_of_exactly_the_limit_reaches_the_app_as_it_streams() -> None:
    """The app gets the body as it was sent, piece by piece (the limit holds none of it), and
    what the server says next; one byte over, the app's next read is refused with a 413."""
    got: list[Any] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        got.extend([await receive() for _ in range(4)])
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    async def go(size: int) -> int:
        pieces = [b"x" * 3, b"x" * (size - 3), b""]
        messages = [
            {"type": "http.request", "body": p, "more_body": i < 2} for i, p in enumerate(pieces)
        ]
        messages.append({"type": "http.disconnect"})
        sent: list[Any] = []

        async def receive() -> Any:
            return messages.pop(0)

        async def send(message: Any) -> None:
            sent.append(message)

        await BodyLimit(app, limit=10)(asgi_scope("/x", None), receive, send)
        return int(sent[0]["status"])

    assert asyncio.run(go(10)) == 204
    assert got == [
        {"type": "http.request", "body": b"x" * 3, "more_body": True},
        {"type": "http.request", "body": b"x" * 7, "more_body": True},
        {"type": "http.request", "body": b"", "more_body": False},
        {"type": "http.disconnect"},
    ]
    got.clear()
    assert asyncio.run(go(11)) == 413 and got == []


def test_json_nested_too_deep_is_a_4xx_with_a_message_not_a_500(tmp_path: Path) -> None:
    deep = b"[" * 100_000 + b"]" * 100_000
    headers = {"content-type": "application/json"}

    async def go() -> None:
        async with controller(tmp_path) as (_, client):
            r = await client.post("/v1/chat/completions", content=deep, headers=headers)
            assert r.status_code == 400 and "nested too deep" in r.json()["detail"]
            r = await client.put("/v1/admin/profiles/p", content=deep, headers=headers)
            assert r.status_code == 400 and r.json()["detail"]

    asyncio.run(go())


# --- requests in flight per replica --------------------------------------------------------


CHAT = {"model": CHAT_MODEL, "messages": [{"role": "user", "content": "hi"}]}


def test_a_replica_at_its_limit_spills_over_to_another_then_503_with_retry_after(
    tmp_path: Path,
) -> None:
    async def go() -> None:
        arrived: asyncio.Queue[tuple[str, asyncio.Event]] = asyncio.Queue()

        async def engine(request: httpx.Request) -> httpx.Response:
            """Answers once the test opens the request's gate."""
            gate = asyncio.Event()
            await arrived.put((request.url.host, gate))

            async def body() -> AsyncIterator[bytes]:
                await gate.wait()
                yield b'{"choices": []}'

            return httpx.Response(200, headers={"content-type": "application/json"}, content=body())

        async def next_arrival() -> tuple[str, asyncio.Event]:
            return await asyncio.wait_for(arrived.get(), 5)

        sent: Sent = []
        async with controller(tmp_path, sent, httpx.MockTransport(engine)) as (runtime, client):
            replicas = await two_ready_replicas(client, sent)
            runtime.router.outstanding_limit = 1

            def ask() -> asyncio.Task[httpx.Response]:
                return asyncio.create_task(client.post("/v1/chat/completions", json=CHAT))

            a = ask()
            host_a, gate_a = await next_arrival()
            b = ask()
            host_b, gate_b = await next_arrival()
            assert sorted((host_a, host_b)) == [f"engine-{r}" for r in replicas]  # one each
            gate_b.set()
            assert (await b).status_code == 200
            # a's replica is full: c goes to b's
            c = ask()
            host_c, gate_c = await next_arrival()
            assert host_c == host_b
            assert [runtime.router.outstanding(ReplicaId(r)) for r in replicas] == [1, 1]

            busy = await client.post("/v1/chat/completions", json=CHAT)
            assert busy.status_code == 503
            assert busy.headers["retry-after"] == "1"
            error = busy.json()["error"]
            assert (error["type"], error["code"]) == ("server_error", "all_busy")
            assert "1 requests in flight" in error["message"]
            assert arrived.empty(), "a request beyond the limits reached an engine"

            gate_a.set()
            gate_c.set()
            done_a, done_c = await a, await c
            assert (done_a.status_code, done_c.status_code) == (200, 200)
            assert f"engine-{done_c.headers['x-llmgw-replica']}" == host_b
            assert done_a.json() == {"choices": []}
            assert [runtime.router.outstanding(ReplicaId(r)) for r in replicas] == [0, 0]
            e = ask()  # the slots came back: both replicas take requests again
            _, gate_e = await next_arrival()
            gate_e.set()
            assert (await e).status_code == 200

    asyncio.run(go())


def test_a_client_gone_mid_stream_gives_its_slot_back(tmp_path: Path) -> None:
    """Over uvicorn: the client reads one event of an endless stream and hangs up."""

    async def endless(_request: httpx.Request) -> httpx.Response:
        async def events() -> AsyncIterator[bytes]:
            while True:
                yield b'data: {"n": 1}\n\n'
                await asyncio.sleep(0)  # a turn for the loop, as a real stream gives

        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=events())

    sent: Sent = []
    runtimes: list[ControllerRuntime] = []

    def build() -> FastAPI:
        runtimes.append(runtime_of(tmp_path, sent, httpx.MockTransport(endless)))
        return create_controller_app(runtimes[0])

    async def go(url: str) -> None:
        async with httpx.AsyncClient(base_url=url, trust_env=False, timeout=30) as client:
            await two_ready_replicas(client, sent)
            async with client.stream(
                "POST", "/v1/chat/completions", json=CHAT | {"stream": True}
            ) as r:
                assert r.status_code == 200
                replica = r.headers["x-llmgw-replica"]
                async for chunk in r.aiter_bytes():
                    assert chunk.startswith(b"data:")
                    break
                assert runtimes[0].router.outstanding(ReplicaId(replica)) == 1

            async def released() -> bool | None:
                return True if runtimes[0].router.outstanding(ReplicaId(replica)) == 0 else None

            await eventually(released, 10, "the slot of the request whose client hung up")

    with live_controller(build) as url:
        asyncio.run(go(url))


def test_a_replica_failing_mid_answer_gives_its_slot_back(tmp_path: Path) -> None:
    async def failing(_request: httpx.Request) -> httpx.Response:
        async def events() -> AsyncIterator[bytes]:
            yield b'data: {"n": 1}\n\n'
            raise httpx.ReadError("the replica went away")

        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=events())

    async def go() -> None:
        sent: Sent = []
        async with controller(tmp_path, sent, httpx.MockTransport(failing)) as (runtime, client):
            replicas = await two_ready_replicas(client, sent)
            # not streamed: nothing reached the client, so the other replica was tried too
            answer = await client.post("/v1/chat/completions", json=CHAT)
            assert answer.status_code == 502
            assert answer.json()["error"]["code"] == "upstream_failed"
            assert answer.headers[RETRIED_HEADER] == "1"
            assert answer.headers["x-llmgw-replica"] in replicas
            assert [runtime.router.outstanding(ReplicaId(r)) for r in replicas] == [0, 0]

    asyncio.run(go())


def test_the_controller_config_sets_its_limits_and_the_runtime_keeps_to_them(
    tmp_path: Path,
) -> None:
    from llmgw_twin.service.common.config import ConfigError
    from llmgw_twin.service.controller.config import ControllerLimits, load_controller_config

    (tmp_path / "c.yaml").write_text(
        "listen: {port: 8080}\nstore: c.db\n"
        "limits: {max_body: 1MiB, max_inference_body: 2MiB, max_outstanding_per_replica: 3}\n"
    )
    settings = load_controller_config(tmp_path / "c.yaml")
    assert load_controller_config(tmp_path / "c.yaml").limits != ControllerLimits()
    assert settings.limits.body_bytes == 1024 * 1024
    assert settings.limits.inference_body_bytes == 2 * 1024 * 1024
    assert settings.limits.outstanding_per_replica == 3
    for bad, key in [
        ("{max_body: 0MiB}", "limits.max_body"),
        ("{max_inference_body: 2TiB}", "limits.max_inference_body"),
        ("{max_outstanding_per_replica: 0}", "limits.max_outstanding_per_replica"),
        ("{max_body: lots}", "limits.max_body"),
    ]:
        (tmp_path / "bad.yaml").write_text(f"listen: {{port: 8080}}\nstore: c.db\nlimits: {bad}\n")
        with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
            load_controller_config(tmp_path / "bad.yaml")

    async def go() -> None:
        runtime = ControllerRuntime(settings)
        assert runtime.router.outstanding_limit == 3
        app = create_controller_app(runtime)
        transport = httpx.ASGITransport(app=app)
        await runtime.start()
        try:
            async with httpx.AsyncClient(transport=transport, base_url="http://c") as client:
                body = b"x" * (1024 * 1024 + 1)
                headers = {"content-type": "application/json"}
                r = await client.put("/v1/admin/profiles/p", content=body, headers=headers)
                assert r.status_code == 413 and "detail" in r.json()
                # the inference limit is 2 MiB: this body gets past it (and is not JSON)
                r = await client.post("/v1/completions", content=body, headers=headers)
                assert r.status_code == 400, r.text
        finally:
            await runtime.stop()

    asyncio.run(go())
