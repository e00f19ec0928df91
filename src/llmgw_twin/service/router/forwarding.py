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
  (the twin's too); sending the body (`WRITE_TIMEOUT_S`).
- Every answer carries `x-llmgw-replica` (the replica that answered, or that failed) once a
  replica was picked, and `x-llmgw-retried: 1` when a second replica was tried.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections.abc import AsyncIterator, Callable, Collection
from dataclasses import dataclass

import httpx
from fastapi import Request
from fastapi.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from llmgw_twin.control.model import ModelName, ReplicaId
from llmgw_twin.control.routing import NoRoute, Route, Router, RouterTimeouts
from llmgw_twin.service.common.limits import MiB
from llmgw_twin.service.common.replies import openai_error
from llmgw_twin.service.router.holding import Holds
from llmgw_twin.service.router.request_metrics import ReplicaAnswer, RequestMetrics, RequestWatch

log = logging.getLogger("llmgw_twin.forwarding")

REPLICA_HEADER = "x-llmgw-replica"
RETRIED_HEADER = "x-llmgw-retried"
MAX_ATTEMPTS = 2
MAX_ANSWER_BYTES = 64 * MiB
"""The largest non-streaming answer held before it is passed on."""
KEEPALIVE_PER_LIMIT = 4
"""Idle kept-alive connections to the replicas: this many times the outstanding limit."""
RETRY_AFTER_S = {NoRoute.NO_REPLICA: 5, NoRoute.BUSY: 1}
"""What a 503 says to wait; for `all_ejected`, until the first ejected replica is back."""
NO_CONTROLLER_RETRY_AFTER_S = 5
UPSTREAM_HEADERS = {"content-type": "application/json", "accept-encoding": "identity"}
WRITE_TIMEOUT_S = 30.0
"""Sending a request's body to a replica."""
Deployed = Callable[[], Collection[str] | None]


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
class _Pick:
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


def parse_request(raw: bytes) -> tuple[ModelName, bool] | Response:
    """The model a request names and whether it streams, or the 400 that refuses it."""
    try:
        body = json.loads(raw)
    except ValueError:
        return _invalid("invalid request: the body is not JSON", "invalid_json")
    except RecursionError:
        return _invalid("invalid request: the body's JSON is nested too deep", "invalid_json")
    model = body.get("model") if isinstance(body, dict) else None
    if not isinstance(model, str) or not model:
        return _invalid(
            "invalid request: body.model: the name of a deployed model is required",
            "model_required",
        )
    assert isinstance(body, dict)
    return ModelName(model), body.get("stream") is True


def _invalid(message: str, code: str) -> Response:
    return openai_error(400, message, "invalid_request_error", code)


def error_event(message: str, code: str) -> bytes:
    """The last event of a stream cut midway, in the shape OpenAI clients read."""
    error = {"message": message, "type": "server_error", "code": code, "param": None}
    return b"data: " + json.dumps({"error": error}).encode() + b"\n\n"


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
        self._client: httpx.AsyncClient | None = None
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
        # httpx's own read bound is a backstop: ours (first byte, between chunks) come first
        backstop_s = max(t.first_byte_ms, t.between_chunks_ms) / 1000 + 1
        self._client = httpx.AsyncClient(
            transport=self._transport,
            trust_env=False,
            timeout=httpx.Timeout(
                connect=t.connect_ms / 1000,
                read=backstop_s,
                write=WRITE_TIMEOUT_S,
                pool=t.connect_ms / 1000,
            ),
            # the core bounds the requests in flight to each replica; no second queue here
            limits=httpx.Limits(
                max_connections=None,
                max_keepalive_connections=self.router.outstanding_limit * KEEPALIVE_PER_LIMIT,
            ),
        )

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

    async def forward(self, request: Request, path: str, deployed: Deployed) -> Response:
        """Serve one inference request; `deployed()` is the models that exist (None: not
        known yet). Each request is counted and timed (`self.metrics`)."""
        watch = self.metrics.watch()
        try:
            answer = await self._serve(request, path, deployed, watch)
        except BaseException:
            watch.gone()
            raise
        watch.answered(answer, tried=REPLICA_HEADER in answer.headers)
        return answer

    async def _serve(
        self, request: Request, path: str, deployed: Deployed, watch: RequestWatch
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
        failure: tuple[ReplicaId, _Failed] | None = None
        while len(tried) < MAX_ATTEMPTS:
            route = self.router.pick(model, self._clock(), exclude=tried)
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
            try:
                answer = await self._attempt(_Pick(self, route), path, raw, stream)
            except _Failed as e:
                self.failed += 1
                log.warning("replica %s at %s failed: %s", route.replica, route.endpoint, e)
                failure = (route.replica, e)
                continue
            return _tag(answer, route.replica, len(tried) > 1)
        if failure is None:
            return self._no_route(model)
        replica, failed = failure
        message = f"replica {replica} failed: {failed}"
        reply = openai_error(failed.status, message, "server_error", failed.code)
        return _tag(reply, replica, len(tried) > 1)

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

    async def _attempt(self, pick: _Pick, path: str, raw: bytes, stream: bool) -> Response:
        """The replica's answer, or `_Failed` when nothing of it can be passed on."""
        assert self._client is not None, "the forwarder is not open"
        t = self.timeouts
        request = self._client.build_request(
            "POST", pick.route.endpoint + path, content=raw, headers=UPSTREAM_HEADERS
        )
        upstream: httpx.Response | None = None
        relayed = False
        try:
            try:
                async with asyncio.timeout(t.first_byte_ms / 1000):
                    upstream = await self._client.send(request, stream=True)
                    chunks = upstream.aiter_raw()
                    first = await anext(chunks, b"")
                if stream and upstream.is_success:
                    relayed = True
                    return _Relay(self, pick, upstream, chunks, first)
                body = await self._rest(chunks, first)
            except (TimeoutError, httpx.TimeoutException):
                raise _Failed(504, "upstream_timeout", self._late(upstream)) from None
            except (httpx.HTTPError, httpx.InvalidURL) as e:
                raise _Failed(502, "upstream_failed", f"{type(e).__name__}: {e}") from None
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
            if upstream is not None and not relayed:
                await upstream.aclose()
        assert upstream is not None
        pick.finish(ok=upstream.status_code < 500)
        headers = {}
        if "content-type" in upstream.headers:
            headers["content-type"] = upstream.headers["content-type"]
        return _Answer(body, status_code=upstream.status_code, headers=headers)

    def _late(self, upstream: httpx.Response | None) -> str:
        t = self.timeouts
        if upstream is None:
            return f"no answer within {t.first_byte_ms} ms (connect bound {t.connect_ms} ms)"
        return f"no byte of the answer within {t.first_byte_ms} ms, or a stall of its body"

    async def _rest(self, chunks: AsyncIterator[bytes], first: bytes) -> bytes:
        """The whole body, at most `max_answer_bytes`, each chunk within `between_chunks_ms`."""
        parts = [first]
        size = len(first)
        between_s = self.timeouts.between_chunks_ms / 1000
        while size <= self.max_answer_bytes:
            async with asyncio.timeout(between_s):
                chunk = await anext(chunks, None)
            if chunk is None:
                return b"".join(parts)
            parts.append(chunk)
            size += len(chunk)
        raise _TooLarge


def _tag(response: Response, replica: ReplicaId, retried: bool) -> Response:
    response.headers[REPLICA_HEADER] = replica
    if retried:
        response.headers[RETRIED_HEADER] = "1"
    return response


class _Answer(ReplicaAnswer, Response):
    """A replica's own answer, read whole."""


class _Relay(ReplicaAnswer, StreamingResponse):
    """A replica's streamed answer, passed on chunk by chunk as it comes; however it ends (done,
    cut, stalled, the client gone), the replica's connection is closed and the pick judged."""

    streamed = True

    def __init__(
        self,
        forwarder: Forwarder,
        pick: _Pick,
        upstream: httpx.Response,
        chunks: AsyncIterator[bytes],
        first: bytes,
    ) -> None:
        headers = {}
        if "content-type" in upstream.headers:
            headers["content-type"] = upstream.headers["content-type"]
        super().__init__(
            self._relay(chunks, first), status_code=upstream.status_code, headers=headers
        )
        self._forwarder = forwarder
        self._pick = pick
        self._upstream = upstream

    async def _relay(self, chunks: AsyncIterator[bytes], first: bytes) -> AsyncIterator[bytes]:
        yield first
        between_ms = self._forwarder.timeouts.between_chunks_ms
        while True:
            try:
                async with asyncio.timeout(between_ms / 1000):
                    chunk = await anext(chunks, None)
            except (TimeoutError, httpx.TimeoutException):
                message, code = f"the replica sent nothing for {between_ms} ms", "upstream_timeout"
            except httpx.HTTPError as e:
                message, code = f"the replica cut its answer: {type(e).__name__}", "upstream_cut"
            else:
                if chunk is None:
                    return
                yield chunk
                continue
            break
        self._forwarder.cut += 1
        # judged before the client hears of the cut, so that whoever reads the router's state
        # after the error event finds the replica's slot already given back
        self._pick.finish(ok=False)
        replica = self._pick.route.replica
        log.warning("stream from replica %s cut midway: %s", replica, message)
        yield error_event(f"replica {replica}: {message}", code)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._pick.finish()
            if self.watch is not None:
                self.watch.stream_ended(cut=not self._pick.ok)
            await self._upstream.aclose()
