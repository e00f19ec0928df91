"""Real mode's clients: a scenario's `traffic`, sent for real through the router.

Each traffic item's requests go out at the same instants as in the twin (the scaled run's
`arrivals`: the contract's spacing, a shaped rate or a trace, read as it goes), as OpenAI chat
completions asking for the request's output tokens, with a prompt of about its input tokens,
each with a client timeout. A request is served when the router answers 200 with a
completion; anything else is a failure, counted as the twin counts them: `failed_no_replica`
when the router had no replica to take it (503), `failed_in_flight` when the replica that
answered for it (`x-llmgw-replica`) failed while the request was out, and `retried` when the
router says it tried another replica.

When the scenario uses the workload additions (`engine_model`, rate shapes, token lengths, a
trace, an `slo` expectation), each request is streamed and timed as the twin times it: its first
token and its end, from the moment it was sent (`latencies`, judged by `slo` as in the twin).

Bounded: a request per arrival of the run and no more, at most `MAX_IN_FLIGHT` at once (a request
that would pass the bound is sent when one ends, and counts late), each within `TIMEOUT_S`.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx

from llmgw_twin.control.model import ModelName, TraceEvent
from llmgw_twin.twin.scenario.arrivals import Arrival, arrivals
from llmgw_twin.twin.scenario.model import Scenario, Traffic
from llmgw_twin.twin.scenario.workload_model import SloExpectation
from llmgw_twin.twin.world.latency import Latencies, Sample

MAX_IN_FLIGHT = 256
TIMEOUT_S = 30.0
IN_FLIGHT_SLACK_MS = 1_000
"""A replica that failed this soon after a request's failure still counts as having died under
it: the event log stamps the failure when the controller noticed it."""


@dataclass(slots=True)
class Sent:
    arrived_ms: int
    done_ms: int = 0
    ok: bool = False
    status: int = 0
    replica: str | None = None
    retried: bool = False
    ttft_us: int = 0
    e2e_us: int = 0
    tokens: int = 0


@dataclass(slots=True)
class ModelTraffic:
    traffic: Traffic
    sent: list[Sent] = field(default_factory=list)


class RealTraffic:
    def __init__(
        self,
        scenario: Scenario,
        url: Callable[[], str],
        headers: dict[str, str],
        now_ms: Callable[[], int],
    ) -> None:
        """`url`: the router's base URL as of now (it may move, as the controller's does)."""
        self.scenario = scenario
        self._url = url
        self._headers = headers
        self._now_ms = now_ms
        self.models = {t.model: ModelTraffic(t) for t in scenario.traffic}
        self.timed = (
            bool(scenario.engine_model)
            or any(t.workload is not None for t in scenario.traffic)
            or any(isinstance(e, SloExpectation) for e in scenario.expectations)
        )
        """Stream and time every request (the scenario uses the workload additions)."""
        self._slots = asyncio.Semaphore(MAX_IN_FLIGHT)

    async def run(self) -> None:
        """Send every request of the run; returns once each has ended."""
        if not self.models:
            return
        limits = httpx.Limits(max_connections=MAX_IN_FLIGHT, max_keepalive_connections=64)
        async with httpx.AsyncClient(
            timeout=TIMEOUT_S, headers=self._headers, limits=limits
        ) as client:
            await asyncio.gather(*(self._send_all(client, m) for m in self.models.values()))

    async def _send_all(self, client: httpx.AsyncClient, model: ModelTraffic) -> None:
        traffic = model.traffic
        tasks = []
        seed = f"{self.scenario.seed}"
        for req in arrivals(traffic, self.scenario.duration_ms, seed):
            delay = req.at_ms - self._now_ms()
            if delay > 0:
                await asyncio.sleep(delay / 1000)  # the run's own clock: real time is the point
            await self._slots.acquire()
            sent = Sent(arrived_ms=self._now_ms())
            model.sent.append(sent)
            tasks.append(asyncio.create_task(self._one(client, traffic, req, sent)))
        await asyncio.gather(*tasks)

    async def _one(
        self, client: httpx.AsyncClient, traffic: Traffic, req: Arrival, sent: Sent
    ) -> None:
        prompt = f"request at {sent.arrived_ms}"
        if traffic.workload is not None:  # about its input tokens: a word a token
            prompt += " x" * max(0, req.input_tokens - 4)
        body: dict[str, object] = {
            "model": traffic.model,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": req.output_tokens,
        }
        try:
            if self.timed:
                # as the twin's requests: exactly their output tokens (vLLM's, SGLang's,
                # llama-server's and the sim engine's `ignore_eos`)
                await self._streamed(client, {**body, "ignore_eos": True}, sent)
                return
            r = await client.post(f"{self._url()}/v1/chat/completions", json=body)
            sent.status = r.status_code
            sent.replica = r.headers.get("x-llmgw-replica")
            sent.retried = r.headers.get("x-llmgw-retried") == "1"
            sent.ok = r.status_code == 200 and "choices" in r.json()
        except (httpx.HTTPError, ValueError):
            sent.ok = False
        finally:
            sent.done_ms = self._now_ms()
            self._slots.release()

    async def _streamed(
        self, client: httpx.AsyncClient, body: dict[str, object], sent: Sent
    ) -> None:
        """The request streamed: served when it ends with `[DONE]`, its first token timed."""
        start = time.perf_counter()
        first: float | None = None
        done = False
        url = f"{self._url()}/v1/chat/completions"
        async with client.stream("POST", url, json={**body, "stream": True}) as r:
            sent.status = r.status_code
            sent.replica = r.headers.get("x-llmgw-replica")
            sent.retried = r.headers.get("x-llmgw-retried") == "1"
            async for line in r.aiter_lines():
                if line == "data: [DONE]":
                    done = True
                elif line.startswith("data: {"):
                    for choice in json.loads(line[len("data: ") :]).get("choices") or ():
                        if (choice.get("delta") or {}).get("content"):
                            sent.tokens += 1
                            first = time.perf_counter() if first is None else first
        end = time.perf_counter()
        sent.ok = r.status_code == 200 and done
        sent.ttft_us = round(((end if first is None else first) - start) * 1_000_000)
        sent.e2e_us = round((end - start) * 1_000_000)

    def latencies(self) -> Latencies:
        """Every served request's times, as the twin records them (`twin/world/latency.py`)."""
        out = Latencies()
        for name, model in self.models.items():
            for s in model.sent:
                if s.ok:
                    tbt = 0 if s.tokens <= 1 else (s.e2e_us - s.ttft_us) // (s.tokens - 1)
                    out.add(name, Sample(s.arrived_ms, s.ttft_us, s.e2e_us, 0, tbt))
        return out

    # --- counts --------------------------------------------------------------------------------

    def arrivals(self, model: ModelName) -> list[int]:
        return [s.arrived_ms for s in self.models[model].sent]

    def failed_at(self, model: ModelName) -> list[int]:
        return [s.arrived_ms for s in self.models[model].sent if not s.ok]

    def report(self, trace: list[TraceEvent]) -> dict[str, dict[str, int]]:
        """Per model: sent, served, failed and why, as the twin reports them."""
        failed_when: dict[str, int] = {
            str(e.get("replica")): e.t_ms for e in trace if e.kind == "replica.failed"
        }
        out: dict[str, dict[str, int]] = {}
        for name, model in sorted(self.models.items()):
            failed = [s for s in model.sent if not s.ok]
            in_flight = sum(
                1
                for s in failed
                if s.replica is not None
                and s.replica in failed_when
                and s.arrived_ms <= failed_when[s.replica] <= s.done_ms + IN_FLIGHT_SLACK_MS
            )
            out[name] = {
                "sent": len(model.sent),
                "served": len(model.sent) - len(failed),
                "failed": len(failed),
                "failed_in_flight": in_flight,
                "failed_no_replica": sum(1 for s in failed if s.status == 503),
                "retried": sum(1 for s in model.sent if s.retried),
            }
        return out
