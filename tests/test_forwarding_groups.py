"""The router's two hops for a role group's model (`service/router/forwarding.py`): the prompt
goes to a prefill replica first (whole, for one token), then the request as sent to a decode
replica of the same group, which answers it; what the prefill answer hands on
(`kv_transfer_params`) goes with it. Each hop is a pick of its own, told `finished` once
however the request ends. Replicas here are scripted answers on an in-process transport (what
is checked is what each replica was sent and what the client got), and once through the router
service in front of real sim engines on loopback."""

from __future__ import annotations

import asyncio
import json
import signal
from typing import Any

import httpx

from helpers.router import (
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
from llmgw_twin.control.model import ModelName, ReplicaId
from llmgw_twin.control.routing import Router, RouterTimeouts
from llmgw_twin.service.router.forwarding import REPLICA_HEADER, Forwarder
from test_groups import join

CHAT = ModelName("chat")


class Body:
    def __init__(self, raw: dict[str, Any]) -> None:
        self._raw = json.dumps(raw).encode()

    async def body(self) -> bytes:
        return self._raw


def group_router() -> Router:
    router = Router(outstanding_limit=4)
    for rid, role in (("chat-r1", "prefill"), ("chat-r2", "decode")):
        join(router, rid, "chat-g1", role)
    return router


def answer(text: str, **extra: Any) -> dict[str, Any]:
    return {"choices": [{"message": {"role": "assistant", "content": text}}], **extra}


Script = dict[str, tuple[int, dict[str, Any]]]
"""Each replica's answer: its status and JSON body."""


def forward(router: Router, script: Script, request: dict[str, Any]) -> tuple[
    httpx.Response, dict[str, list[dict[str, Any]]]
]:  # fmt: skip
    """Forward `request` with each replica answering as `script` says; what each was sent."""
    sent: dict[str, list[dict[str, Any]]] = {}

    def handler(req: httpx.Request) -> httpx.Response:
        host = req.url.host
        sent.setdefault(host, []).append(json.loads(req.content))
        status, body = script[host]
        content = httpx.ByteStream(json.dumps(body).encode())  # read as a stream is
        return httpx.Response(status, stream=content, headers={"content-type": "application/json"})

    async def go() -> httpx.Response:
        fwd = Forwarder(router, transport=httpx.MockTransport(handler))
        fwd.open()
        try:
            out = await fwd.forward(Body(request), "/v1/chat/completions", lambda: {"chat"})
            return httpx.Response(
                out.status_code, headers=dict(out.headers), content=bytes(out.body)
            )
        finally:
            await fwd.aclose()

    return asyncio.run(go()), sent


def test_the_prompt_goes_to_prefill_for_one_token_then_to_decode_which_answers() -> None:
    router = group_router()
    handed = {"remote_engine_id": "e1", "remote_block_ids": [1, 2]}
    script = {
        "chat-r1": (200, answer("x", kv_transfer_params=handed)),
        "chat-r2": (200, answer("the whole answer")),
    }
    request = {"model": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 50}
    got, sent = forward(router, script, {**request, "stream_options": {"x": 1}})
    assert got.status_code == 200 and got.headers[REPLICA_HEADER] == "chat-r2"
    assert got.json()["choices"][0]["message"]["content"] == "the whole answer"
    (first,) = sent["chat-r1"]
    assert first["max_tokens"] == 1 and first["stream"] is False and "stream_options" not in first
    assert first["kv_transfer_params"]["do_remote_decode"] is True  # vLLM's NIXL request
    (second,) = sent["chat-r2"]
    assert second["max_tokens"] == 50 and second["kv_transfer_params"] == handed
    assert second["messages"] == request["messages"]
    for rid in ("chat-r1", "chat-r2"):  # both picks told
        assert router.outstanding(ReplicaId(rid)) == 0


def test_without_handed_params_decode_gets_the_request_exactly_as_sent() -> None:
    router = group_router()
    script = {
        "chat-r1": (200, answer("x")),
        "chat-r2": (200, answer("y")),
    }
    request = {"model": "chat", "prompt": "hi", "max_completion_tokens": 9}
    _, sent = forward(router, script, request)
    assert sent["chat-r1"][0]["max_completion_tokens"] == 1
    assert sent["chat-r2"] == [request]


def test_a_prefill_refusal_is_the_answer_and_decode_is_never_sent_anything() -> None:
    router = group_router()
    too_long = {"error": {"message": "too long", "code": "context_length_exceeded"}}
    script = {
        "chat-r1": (400, too_long),
        "chat-r2": (200, answer("never")),
    }
    got, sent = forward(router, script, {"model": "chat", "prompt": "hi"})
    assert got.status_code == 400 and got.json() == too_long
    assert got.headers[REPLICA_HEADER] == "chat-r1"
    assert "chat-r2" not in sent
    assert router.outstanding(ReplicaId("chat-r2")) == 0


def test_a_prefill_replica_that_fails_is_judged_and_the_decode_pick_freed() -> None:
    router = group_router()
    router.ejection = type(router.ejection)(failures=1)  # one failure ejects

    def broken(req: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=req)

    sent: list[str] = []

    def handler(req: httpx.Request) -> httpx.Response:
        sent.append(req.url.host)
        return broken(req) if req.url.host == "chat-r1" else httpx.Response(200, json={})

    async def go() -> int:
        fwd = Forwarder(router, transport=httpx.MockTransport(handler))
        fwd.open()
        try:
            out = await fwd.forward(
                Body({"model": "chat", "prompt": "hi"}), "/v1/completions", lambda: {"chat"}
            )
            return out.status_code
        finally:
            await fwd.aclose()

    assert asyncio.run(go()) == 502
    assert "chat-r2" not in sent
    assert router.outstanding(ReplicaId("chat-r2")) == 0
    assert ReplicaId("chat-r1") in router.ejected(now_ms=0) or router.ejections == 1


def test_a_retry_after_a_prefill_failure_takes_another_prefill_replica() -> None:
    router = group_router()
    join(router, "chat-r3", "chat-g1", "prefill")
    sent: list[str] = []

    def handler(req: httpx.Request) -> httpx.Response:
        sent.append(req.url.host)
        if req.url.host == "chat-r1":
            raise httpx.ConnectError("refused", request=req)
        content = httpx.ByteStream(json.dumps(answer("ok")).encode())
        return httpx.Response(200, stream=content, headers={"content-type": "application/json"})

    async def go() -> httpx.Response:
        fwd = Forwarder(router, transport=httpx.MockTransport(handler))
        fwd.open()
        try:
            out = await fwd.forward(
                Body({"model": "chat", "prompt": "hi"}), "/v1/completions", lambda: {"chat"}
            )
            return httpx.Response(out.status_code, headers=dict(out.headers))
        finally:
            await fwd.aclose()

    got = asyncio.run(go())
    assert got.status_code == 200 and got.headers[REPLICA_HEADER] == "chat-r2"
    assert sent == ["chat-r1", "chat-r3", "chat-r2"]  # the failed prefill, another, then decode
    assert all(router.outstanding(ReplicaId(r)) == 0 for r in ("chat-r1", "chat-r2", "chat-r3"))


def test_through_the_router_service_the_prefill_engine_answers_first() -> None:
    """Real sim engines on loopback behind the router service: a role group's request is
    answered by its decode engine, and it waits on the prefill engine first (frozen, the
    request fails naming it and the decode engine is not blamed; thawed, it is served)."""
    quick = RouterTimeouts(connect_ms=2_000, first_byte_ms=1_500, between_chunks_ms=1_000)
    roles = {"m-r1": ("m-g1", "prefill"), "m-r2": ("m-g1", "decode")}
    with (
        engines(0, 0) as [(prefill, url_p), (_, url_d)],
        router(
            settings(timeouts=quick), static_feed({"m-r1": url_p, "m-r2": url_d}, roles=roles)
        ) as base,
    ):

        async def go() -> None:
            async with httpx.AsyncClient(base_url=base, timeout=30, trust_env=False) as c:
                await routable(c, 1)  # the decode replica is the model's route
                ok = await c.post("/v1/chat/completions", json=chat(max_tokens=5))
                assert ok.status_code == 200 and ok.headers[REPLICA_HEADER] == "m-r2"
                assert ok.json()["choices"][0]["message"]["content"]
                prefill.signal(signal.SIGSTOP)
                try:
                    stuck = await c.post("/v1/chat/completions", json=chat(max_tokens=5))
                finally:
                    prefill.signal(signal.SIGCONT)
                assert stuck.status_code == 504 and stuck.headers[REPLICA_HEADER] == "m-r1"
                s = await state(c)
                assert replicas_of(s)["m-r2"]["outstanding"] == 0
                streamed = chat(max_tokens=3, stream=True)
                async with c.stream("POST", "/v1/chat/completions", json=streamed) as r:
                    assert r.status_code == 200 and r.headers[REPLICA_HEADER] == "m-r2"
                    payloads = [p async for p in events(r)]
                assert payloads[-1] == "[DONE]"

        asyncio.run(go())
