"""Forwarding (`service/router/forwarding.py`) through the router service, against real sim-engine
processes on loopback: streams relayed as they are made, a replica killed (its requests retried
on the other), hung (ejected after the configured failures) or killed mid-stream (the stream
ends with an error event), and the answers when nothing can be picked.

The router runs in-process on uvicorn (real HTTP), fed by a scripted controller feed that names
the engines as the replicas (`helpers.router`); each engine is a process of its own, in its own
session, stopped (and continued, if it was stopped) when its test ends. No assertion is about
time: waits are on conditions, each with a deadline, and the one stream that must be seen
"before the engine finished" is shown so by freezing the engine after its first chunk.
"""

from __future__ import annotations

import asyncio
import json
import signal
from typing import Any

import httpx
import pytest

from helpers.router import (
    DEADLINE_S,
    chat,
    engines,
    events,
    replicas_of,
    routable,
    router,
    settings,
    state,
    static_feed,
)
from helpers.services import eventually, free_ports
from llmgw_twin.control.routing import Ejection, RouterTimeouts
from llmgw_twin.service.router.forwarding import REPLICA_HEADER, RETRIED_HEADER


def client(base: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=base, timeout=DEADLINE_S, trust_env=False)


def content_of(payloads: list[str]) -> str:
    text = ""
    for p in payloads:
        for choice in json.loads(p)["choices"]:
            text += choice["delta"].get("content", "")
    return text


def test_a_stream_is_relayed_chunk_by_chunk_as_the_engine_makes_it() -> None:
    quick = RouterTimeouts(connect_ms=2_000, first_byte_ms=10_000, between_chunks_ms=1_000)
    with (
        engines(100) as [(engine, url)],
        router(settings(timeouts=quick), static_feed({"m-r1": url})) as base,
    ):

        async def go() -> None:
            async with client(base) as c:
                await routable(c, 1)
                whole = await c.post("/v1/chat/completions", json=chat(max_tokens=15))
                assert whole.status_code == 200 and whole.headers[REPLICA_HEADER] == "m-r1"
                text = whole.json()["choices"][0]["message"]["content"]
                async with c.stream(
                    "POST", "/v1/chat/completions", json=chat(stream=True, max_tokens=15)
                ) as r:
                    assert r.status_code == 200 and r.headers[REPLICA_HEADER] == "m-r1"
                    assert r.headers["content-type"].startswith("text/event-stream")
                    payloads = [p async for p in events(r)]
                # every chunk the engine made, one event each, then its end
                assert payloads[-1] == "[DONE]" and content_of(payloads[:-1]) == text
                assert len(payloads) == len(text.split()) + 3  # role, tokens, finish, DONE

                # the first chunk reaches the client while the engine is still generating:
                # freeze the engine then, and the stream cannot end, so the router's bound
                # between chunks cuts it with an error event (a router that held the answer
                # back would have had all of it, or sent nothing)
                async with c.stream("POST", "/v1/chat/completions", json=chat(stream=True)) as r:
                    received = events(r)
                    first = json.loads(await anext(received))
                    assert first["choices"][0]["delta"]["role"] == "assistant"
                    engine.signal(signal.SIGSTOP)
                    try:
                        rest = [p async for p in received]
                    finally:
                        engine.signal(signal.SIGCONT)
                assert "[DONE]" not in rest
                error = json.loads(rest[-1])["error"]
                assert (error["type"], error["code"]) == ("server_error", "upstream_timeout")
                s = await state(c)
                assert s["cut_streams"] == 1 and replicas_of(s)["m-r1"]["outstanding"] == 0

        asyncio.run(go())


def test_a_stream_cut_midway_ends_with_an_error_event_and_the_next_request_goes_on() -> None:
    with (
        engines(200, 0) as [(a, url_a), (_, url_b)],
        router(settings(), static_feed({"m-r1": url_a, "m-r2": url_b})) as base,
    ):

        async def go() -> None:
            async with client(base) as c:
                await routable(c, 2)
                async with c.stream("POST", "/v1/chat/completions", json=chat(stream=True)) as r:
                    assert r.status_code == 200 and r.headers[REPLICA_HEADER] == "m-r1"
                    received = events(r)
                    await anext(received)  # the role chunk: the stream is under way
                    a.signal(signal.SIGKILL)
                    rest = [p async for p in received]
                assert "[DONE]" not in rest
                error = json.loads(rest[-1])["error"]
                assert (error["type"], error["code"]) == ("server_error", "upstream_cut")
                assert error["param"] is None and "m-r1" in error["message"]
                # a stream under way is not sent again; the next request is served
                r2 = await c.post("/v1/chat/completions", json=chat())
                assert r2.status_code == 200 and r2.headers[REPLICA_HEADER] == "m-r2"

        asyncio.run(go())


@pytest.mark.parametrize("listener", [True, False], ids=["services-listener", "plain-uvicorn"])
def test_a_client_gone_midway_ends_the_relay_and_gives_the_replicas_slot_back(
    listener: bool,
) -> None:
    # the engine is frozen once the stream is under way, and the router would wait a minute
    # for its next chunk: only hearing that the client left ends the relay before that. The
    # services' listener tells the relay itself (`listener.Gone`); under plain uvicorn the
    # relay waits for the disconnect in a task of its own
    patient = RouterTimeouts(connect_ms=2_000, first_byte_ms=10_000, between_chunks_ms=60_000)
    with (
        engines(50) as [(engine, url)],
        router(settings(timeouts=patient), static_feed({"m-r1": url}), listener=listener) as base,
    ):

        async def go() -> None:
            async with client(base) as c:
                await routable(c, 1)
                try:
                    async with client(base) as leaving:
                        body = chat(stream=True)
                        async with leaving.stream("POST", "/v1/chat/completions", json=body) as r:
                            await anext(events(r))
                            engine.signal(signal.SIGSTOP)
                            s = await state(c)
                            assert replicas_of(s)["m-r1"]["outstanding"] == 1
                    # the client closed its connection midway: the relay ends, the slot is back

                    async def freed() -> bool | None:
                        s = await state(c)
                        return True if replicas_of(s)["m-r1"]["outstanding"] == 0 else None

                    await eventually(freed, DEADLINE_S, "the stream's slot given back")
                finally:
                    engine.signal(signal.SIGCONT)
                s = await state(c)
                assert s["cut_streams"] == 0 and s["ejections"] == 0
                r2 = await c.post("/v1/chat/completions", json=chat(max_tokens=2))
                assert r2.status_code == 200 and r2.headers[REPLICA_HEADER] == "m-r1"

        asyncio.run(go())


def test_a_killed_replicas_requests_are_retried_on_the_other_and_all_succeed() -> None:
    with (
        engines(200, 200) as [(a, url_a), (_, url_b)],
        router(settings(), static_feed({"m-r1": url_a, "m-r2": url_b})) as base,
    ):

        async def go() -> None:
            async with client(base) as c:
                await routable(c, 2)
                asks = [
                    asyncio.create_task(
                        c.post("/v1/chat/completions", json=chat(f"q{i}", max_tokens=15))
                    )
                    for i in range(6)
                ]

                async def both_busy() -> bool | None:
                    reps = replicas_of(await state(c))
                    return True if all(r["outstanding"] for r in reps.values()) else None

                await eventually(both_busy, DEADLINE_S, "requests in flight to both")
                a.signal(signal.SIGKILL)  # mid-answer: ≥12 tokens at 200 ms each
                answers = await asyncio.gather(*asks)
                assert [r.status_code for r in answers] == [200] * 6
                assert all(r.json()["choices"][0]["message"]["content"] for r in answers)
                retried = [r for r in answers if r.headers.get(RETRIED_HEADER) == "1"]
                assert retried and all(r.headers[REPLICA_HEADER] == "m-r2" for r in retried)

                # later requests, streamed or not: refused by m-r1's port, sent to m-r2
                for i in range(6):
                    body = chat(f"later {i}", stream=i % 2 == 1, max_tokens=2)
                    async with c.stream("POST", "/v1/chat/completions", json=body) as r:
                        assert r.status_code == 200 and r.headers[REPLICA_HEADER] == "m-r2"
                        payloads = [p async for p in events(r)]
                        if body["stream"]:
                            assert payloads[-1] == "[DONE]"
                s = await state(c)
                assert s["ejections"] == 1 and replicas_of(s)["m-r1"]["ejected_for_ms"] > 0

        asyncio.run(go())


def test_a_hung_replica_is_ejected_after_the_configured_failures_and_traffic_goes_on() -> None:
    quick = RouterTimeouts(connect_ms=2_000, first_byte_ms=1_000, between_chunks_ms=1_000)
    eject = Ejection(failures=2, base_ms=60_000, max_ms=60_000)
    with engines(0, 0) as [(a, url_a), (_, url_b)]:
        s = settings(timeouts=quick, ejection=eject)
        with router(s, static_feed({"m-r1": url_a, "m-r2": url_b})) as base:

            async def go() -> None:
                async with client(base) as c:
                    await routable(c, 2)
                    a.signal(signal.SIGSTOP)  # its port still accepts; nothing answers
                    try:
                        answers = []
                        for i in range(6):
                            answers.append(await c.post("/v1/chat/completions", json=chat(f"{i}")))
                    finally:
                        a.signal(signal.SIGCONT)
                    assert [r.status_code for r in answers] == [200] * 6
                    assert {r.headers[REPLICA_HEADER] for r in answers} == {"m-r2"}
                    # m-r1 was tried first (never picked, smallest id), then as the least
                    # recently picked; its second failure ejected it: nothing more went to it
                    retried = [r.headers.get(RETRIED_HEADER) == "1" for r in answers]
                    assert retried == [True, True, False, False, False, False]
                    st = await state(c)
                    assert st["ejections"] == 1 and st["failed_attempts"] == 2
                    assert replicas_of(st)["m-r1"]["ejected_for_ms"] > 0

            asyncio.run(go())


def answer_error(r: httpx.Response) -> dict[str, Any]:
    body: dict[str, Any] = r.json()
    assert body["detail"] == body["error"]["message"] and body["error"]["param"] is None
    error: dict[str, Any] = body["error"]
    return error


def test_nothing_to_pick_is_a_503_with_retry_after_and_its_reason() -> None:
    (closed,) = free_ports(1)  # nothing listens there
    eject = Ejection(failures=1, base_ms=60_000, max_ms=60_000)
    with engines(200) as [(_, url)]:
        feed = static_feed(
            {"m-r1": url, "dead-r1": f"http://127.0.0.1:{closed}"}, models=("m", "dead", "idle")
        )
        with router(settings(ejection=eject, outstanding_per_replica=1), feed) as base:

            async def go() -> None:
                async with client(base) as c:
                    await routable(c, 1)
                    r = await c.post("/v1/completions", json={"model": "nope", "prompt": "x"})
                    assert r.status_code == 404 and REPLICA_HEADER not in r.headers
                    assert answer_error(r)["code"] == "model_not_found"
                    r = await c.post("/v1/completions", content=b"{oops")
                    assert r.status_code == 400 and answer_error(r)["code"] == "invalid_json"

                    r = await c.post("/v1/completions", json={"model": "idle", "prompt": "x"})
                    assert r.status_code == 503 and r.headers["retry-after"] == "5"
                    assert answer_error(r)["code"] == "no_ready_replica"

                    # a replica that refuses: 502 naming it (no other to try), then ejected
                    dead = {"model": "dead", "prompt": "x"}
                    r = await c.post("/v1/completions", json=dead)
                    assert r.status_code == 502 and r.headers[REPLICA_HEADER] == "dead-r1"
                    assert answer_error(r)["code"] == "upstream_failed"
                    r = await c.post("/v1/completions", json=dead)
                    assert r.status_code == 503 and answer_error(r)["code"] == "all_ejected"
                    assert 1 <= int(r.headers["retry-after"]) <= 60

                    # the only replica at its limit (1 in flight): busy
                    async with c.stream(
                        "POST", "/v1/chat/completions", json=chat(stream=True)
                    ) as s:
                        await anext(events(s))
                        r = await c.post("/v1/chat/completions", json=chat())
                        assert r.status_code == 503 and r.headers["retry-after"] == "1"
                        assert answer_error(r)["code"] == "all_busy"
                    models = {
                        m["id"]: m["ready_replicas"]
                        for m in (await c.get("/v1/models")).json()["data"]
                    }
                    assert models == {"m": 1, "dead": 1, "idle": 0}

            asyncio.run(go())
