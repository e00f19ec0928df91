"""Forwarding an OpenAI request to a ready replica: pick, send, retry once, relay, judge.

Role: the one forwarding of the controller's inference routes and of the router service
(docs/router.md). `Forwarder.forward` reads the request's `model` (and `stream`), asks the core
`Router` for a replica (least outstanding, ejected and full ones skipped), sends the body
unchanged to the replica's leader, and answers with what the replica answered. The core decides
which replica and when one is ejected; this only moves bytes, keeps time and tells the core how
each pick went.

Invariants:
- Every pick is told `Router.finished` exactly once, however its request ends: not ok when the
  replica could not be reached, timed out, cut its answer or answered 5xx; ok otherwise (4xx is
  the request's fault, not the replica's; a client gone or a cancelled request judges nothing
  against the replica).
- At most `MAX_ATTEMPTS` attempts, on different replicas: a second one only when the first
  failed before any byte of its answer reached the client. A non-streaming answer is read whole
  (at most `max_answer_bytes`) before the client gets any of it, so any failure before its end
  is retried; a streaming (`"stream": true`) 2xx answer is relayed chunk by chunk as it comes
  from its first chunk on, never buffered, so only a failure before that first chunk is
  retried. A stream cut after it ends with one OpenAI-format error event, then the answer
  closes.
- An answer the replica gave (any status, 5xx included) is passed on as it is: its status, its
  content type, its body. Failures of the forwarding itself are OpenAI-format errors (`replies`).
- No wait is unbounded: connecting (`connect_ms`), the first byte of the answer
  (`first_byte_ms`), and each later chunk (`between_chunks_ms`), the core's `RouterTimeouts`
  (the twin's too); sending the body is within the first byte's bound.
- Every answer carries `x-llmgw-replica` (the replica that answered, or that failed) once a
  replica was picked, and `x-llmgw-retried: 1` when a second replica was tried.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from fastapi.responses import Response

from llmgw_twin.control.model import ModelName, ReplicaId
from llmgw_twin.control.routing import NoRoute, Route, Router, RouterTimeouts
from llmgw_twin.service.common.limits import MiB
from llmgw_twin.service.common.replies import openai_error
from llmgw_twin.service.router.answers import (
    REPLICA_HEADER,
    RETRIED_HEADER,
    Answer,
    Relay,
    Whole,
    error_event,
    tag,
    tagged,
)
from llmgw_twin.service.router.holding import Holds
from llmgw_twin.service.router.reading import parse_request
from llmgw_twin.service.router.request_metrics import RequestMetrics, RequestWatch
from llmgw_twin.service.router.upstream import Upstream, UpstreamError

if TYPE_CHECKING:
    import httpx

__all__ = ["REPLICA_HEADER", "RETRIED_HEADER", "Forwarder", "error_event", "parse_request"]

log = logging.getLogger("llmgw_twin.forwarding")

MAX_ATTEMPTS = 2
MAX_ANSWER_BYTES = 64 * MiB
"""The largest non-streaming answer held before it is passed on."""
KEEPALIVE_PER_LIMIT = 4
"""Idle kept-alive connections to the replicas: this many times the outstanding limit."""
RETRY_AFTER_S = {NoRoute.NO_REPLICA: 5, NoRoute.BUSY: 1}
"""What a 503 says to wait; for `all_ejected`, until the first ejected replica is back."""
NO_CONTROLLER_RETRY_AFTER_S = 5
ASK_KV = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}
"""What a role group's first hop asks the prefill replica for: prefill only, its KV cache kept
for a decode replica to fetch; vLLM's NIXL connector then answers with `kv_transfer_params`."""
Deployed = Callable[[], Collection[str] | None]


class Incoming(Protocol):
    """A request to forward: its body, read when the forwarding asks (a starlette `Request`)."""

    async def body(self) -> bytes: ...


class Client(Protocol):
    """A client to the replicas: `upstream.Upstream`, or `upstream_httpx.HttpxUpstream`."""

    async def post(self, endpoint: str, path: str, body: bytes, deadline: float) -> Answer:
        """The replica's answer, its head arrived by the running loop's time `deadline`
        (`TimeoutError`)."""
        ...

    async def aclose(self) -> None: ...


def monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


class _Failed(Exception):
    """The replica failed before any byte of its answer was passed on."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


class _TooLarge(Exception):
    pass


@dataclass(slots=True)
class Pick:
    """One pick of the core's, told `finished` once."""

    forwarder: Forwarder
    route: Route
    ok: bool = True
    done: bool = False

    def finish(self, ok: bool | None = None) -> None:
        if self.done:
            return
        self.done = True
        if ok is not None:
            self.ok = ok
        self.forwarder.judge(self.route, self.ok)


class Forwarder:
    def __init__(
        self,
        router: Router,
        *,
        timeouts: RouterTimeouts | None = None,
        max_answer_bytes: int = MAX_ANSWER_BYTES,
        transport: httpx.AsyncBaseTransport | None = None,
        clock: Callable[[], int] = monotonic_ms,
        holds: Holds | None = None,
    ) -> None:
        if router.outstanding_limit is None:
            raise ValueError("forwarding needs a router with an outstanding limit")
        self.router = router
        self.timeouts = timeouts or RouterTimeouts()
        self.max_answer_bytes = max_answer_bytes
        self._transport = transport
        self._clock = clock
        self._client: Client | None = None
        self.retried = 0
        self.failed = 0
        self.cut = 0
        """Requests sent again to a second replica; attempts that failed before any byte was
        passed on; streams cut midway."""
        self.metrics = RequestMetrics(self)
        self.holds = holds or Holds()
        """Requests held for a model scaled to zero (`holding.py`)."""

    def open(self) -> None:
        t = self.timeouts
        assert self.router.outstanding_limit is not None
        if self._transport is not None:
            from llmgw_twin.service.router.upstream_httpx import HttpxUpstream

            self._client = HttpxUpstream(self._transport, connect_s=t.connect_ms / 1000)
        else:
            # the core bounds the requests in flight to each replica; no second queue here
            keep = self.router.outstanding_limit * KEEPALIVE_PER_LIMIT
            self._client = Upstream(connect_s=t.connect_ms / 1000, keep_idle=keep)

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    def judge(self, route: Route, ok: bool) -> None:
        now = self._clock()
        if self.router.finished(route.replica, ok, now):
            back_ms = self.router.ejected(now).get(route.replica, now) - now
            log.warning(
                "replica %s at %s ejected for %d ms: its requests failed in a row",
                route.replica,
                route.endpoint,
                back_ms,
            )

    async def forward(self, request: Incoming, path: str, deployed: Deployed) -> Response:
        """Serve one inference request; `deployed()` is the models that exist (None: not
        known yet). Each request is counted and timed (`self.metrics`)."""
        watch = self.metrics.watch()
        try:
            answer = await self._serve(request, path, deployed, watch)
        except BaseException:
            watch.gone()
            raise
        watch.answered(answer, tried=tagged(answer))
        return answer

    async def _serve(
        self, request: Incoming, path: str, deployed: Deployed, watch: RequestWatch
    ) -> Response:
        raw = await request.body()
        parsed = parse_request(raw)
        if isinstance(parsed, Response):
            return parsed
        model, stream = parsed
        models = deployed()
        if models is None:
            return openai_error(
                503,
                "the router has not heard from the controller yet; try again shortly",
                "server_error",
                "no_controller",
                headers={"retry-after": str(NO_CONTROLLER_RETRY_AFTER_S)},
            )
        if model not in models:
            return openai_error(
                404,
                f"model {model!r} is not deployed (deployed: {sorted(models)})",
                "invalid_request_error",
                "model_not_found",
            )
        watch.model = model  # a deployed model's name: a bounded label
        tried: list[ReplicaId] = []
        failed: list[ReplicaId] = []  # the replicas that failed a try (a prefill one, say)
        failure: tuple[ReplicaId, _Failed] | None = None
        while len(tried) < MAX_ATTEMPTS:
            route = self.router.pick(model, self._clock(), exclude=failed)
            if route is None and not tried and self._holds(model):
                if self.holds.full(model):
                    return self.holds.refuse(model, full=True)
                route = await self.holds.wait(self.router, model, self._clock)
                if route is None:
                    return self.holds.refuse(model, full=False)
            if route is None:
                break
            tried.append(route.replica)
            if len(tried) > 1:
                self.retried += 1
            decode = Pick(self, route)
            hop = route.prefill or route  # the replica tried now
            try:
                body = raw
                if route.prefill is not None:  # a role group: the prompt goes to prefill first
                    try:
                        sent = await self._prefill(route.prefill, path, raw)
                    except BaseException:
                        decode.finish()  # never tried: nothing judged against it
                        raise
                    if isinstance(sent, Response):  # the prefill replica's own refusal
                        decode.finish()
                        return tag(sent, route.prefill.replica, len(tried) > 1)
                    body, hop = sent, route
                answer = await self._attempt(decode, path, body, stream)
            except _Failed as e:
                self.failed += 1
                log.warning("replica %s at %s failed: %s", hop.replica, hop.endpoint, e)
                failure = (hop.replica, e)
                failed.append(hop.replica)
                continue
            return tag(answer, route.replica, len(tried) > 1)
        if failure is None:
            return self._no_route(model)
        replica, why = failure
        message = f"replica {replica} failed: {why}"
        reply = openai_error(why.status, message, "server_error", why.code)
        return tag(reply, replica, len(tried) > 1)

    def _holds(self, model: ModelName) -> bool:
        """Whether a request for `model` waits: it is held at zero, and no replica of it is
        routable at all (ejected or full ones are answered as before)."""
        return (
            self.holds.applies(model)
            and self.router.why_none(model, self._clock()) is NoRoute.NO_REPLICA
        )

    def _no_route(self, model: ModelName) -> Response:
        now = self._clock()
        why = self.router.why_none(model, now)
        if why is NoRoute.NO_REPLICA:
            message = f"no ready replica of model {model!r}; try again once one is ready"
            retry_s = RETRY_AFTER_S[why]
        elif why is NoRoute.EJECTED:
            ejected = self.router.ejected(now)
            back = min(ejected[r.replica] for r in self.router.routes(model))
            retry_s = max(1, math.ceil((back - now) / 1000))
            message = (
                f"every ready replica of model {model!r} failed recently and is out of routing; "
                f"try again in {retry_s}s"
            )
        else:
            retry_s = RETRY_AFTER_S[NoRoute.BUSY]
            message = (
                f"every ready replica of model {model!r} has {self.router.outstanding_limit} "
                f"requests in flight; try again in {retry_s}s"
            )
        return openai_error(
            503, message, "server_error", why.value, headers={"retry-after": str(retry_s)}
        )

    async def _attempt(self, pick: Pick, path: str, raw: bytes, stream: bool) -> Response:
        """The replica's answer, or `_Failed` when nothing of it can be passed on."""
        assert self._client is not None, "the forwarder is not open"
        t = self.timeouts
        answer: Answer | None = None
        relayed = False
        try:
            try:
                # the first byte of the body within `first_byte_ms` of sending: the head within
                # it (`post`), and what is left of it for the first piece (which `Upstream`
                # hands over with the head)
                loop = asyncio.get_running_loop()
                deadline = loop.time() + t.first_byte_ms / 1000
                answer = await self._client.post(pick.route.endpoint, path, raw, deadline)
                first = await answer.next_chunk(max(0.0, deadline - loop.time())) or b""
                if stream and answer.is_success:
                    relayed = True
                    return Relay(self, pick, answer, first)
                body = await self._rest(answer, first)
            except TimeoutError:
                raise _Failed(504, "upstream_timeout", self._late(answer)) from None
            except UpstreamError as e:
                raise _Failed(502, "upstream_failed", str(e)) from None
            except _TooLarge:
                pick.finish(ok=True)  # it answered; another replica would answer the same
                return openai_error(
                    502,
                    f"replica {pick.route.replica}'s answer is over {self.max_answer_bytes} bytes",
                    "server_error",
                    "answer_too_large",
                )
        except _Failed:
            pick.finish(ok=False)
            raise
        except BaseException:  # cancelled: the client or the server went away
            pick.finish(ok=True)
            raise
        finally:
            if answer is not None and not relayed:
                await answer.aclose()
        assert answer is not None
        pick.finish(ok=answer.status < 500)
        return Whole(body, answer.status, answer.content_type)

    async def _prefill(self, prefill: Route, path: str, raw: bytes) -> bytes | Response:
        """A role group's first hop: the prefill replica computes the prompt's KV cache, asked
        whole for one token, and to keep it for a remote decode (`ASK_KV`, vLLM's NIXL
        connector's request; engines without one ignore it). The body for the decode replica
        (the request as sent, with the prefill answer's `kv_transfer_params` when it gives
        them: vLLM's disaggregation), or the prefill replica's answer when it is not a success
        (passed on as it is)."""
        request = json.loads(raw)
        first = {**request, "stream": False, "max_tokens": 1, "kv_transfer_params": ASK_KV}
        first.pop("stream_options", None)
        if "max_completion_tokens" in first:
            first["max_completion_tokens"] = 1
        answer = await self._attempt(Pick(self, prefill), path, json.dumps(first).encode(), False)
        if not 200 <= answer.status_code < 300:
            return answer
        try:
            handed = json.loads(bytes(answer.body)).get("kv_transfer_params")
        except (ValueError, AttributeError):
            handed = None
        if handed is None:
            return raw
        return json.dumps({**request, "kv_transfer_params": handed}).encode()

    def _late(self, answer: Answer | None) -> str:
        t = self.timeouts
        if answer is None:
            return (
                f"no answer, or no byte of its body, within {t.first_byte_ms} ms "
                f"(connect bound {t.connect_ms} ms)"
            )
        return f"no byte of the answer within {t.first_byte_ms} ms, or a stall of its body"

    async def _rest(self, answer: Answer, first: bytes) -> bytes:
        """The whole body, at most `max_answer_bytes`, each chunk within `between_chunks_ms`."""
        parts = [first]
        size = len(first)
        between_s = self.timeouts.between_chunks_ms / 1000
        while size <= self.max_answer_bytes:
            chunk = await answer.next_chunk(between_s)
            if chunk is None:
                return b"".join(parts)
            parts.append(chunk)
            size += len(chunk)
        raise _TooLarge
