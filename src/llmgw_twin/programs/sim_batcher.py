"""The sim engine's batch in real time: the twin's engine model (`engines/perf/model.py`) driven
by the event loop's clock, so a sim engine started with `--perf-model` answers as the twin's
replicas of that profile do.

Each request is submitted to one `BatchEngine` at the moment it arrives (microseconds of the
loop's monotonic clock); one timer wakes the loop when the model says the next first token or
finish comes, and resolves the waiting requests' futures. The model decides every time; this
module only waits for it.

Invariants: one timer at most; a request whose client went away leaves the batch at once
(`cancel`), so it holds no cache; a request too large for the cache is refused before it waits.
With a pace (a straggler, `sim_pace`), the replica's pace at each submission applies to the
iterations from then on, as the twin's batch takes it (`twin/world/serving.py`).
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction

from llmgw_twin.engines.perf.model import BatchEngine, EnginePerf, Served


class TooLarge(Exception):
    """The request needs more KV cache than the engine has."""


@dataclass(slots=True)
class Ticket:
    key: int
    first: asyncio.Future[None]
    done: asyncio.Future[Served]


class Batcher:
    def __init__(
        self,
        perf: EnginePerf,
        clock_us: Callable[[], int] | None = None,
        pace: Callable[[], Fraction] | None = None,
    ) -> None:
        self.engine = BatchEngine(perf, stream=True)
        self._clock_us = clock_us
        self._pace = pace
        self._keys = itertools.count(1)
        self._tickets: dict[int, Ticket] = {}
        self._timer: asyncio.TimerHandle | None = None

    def _now_us(self) -> int:
        if self._clock_us is not None:
            return self._clock_us()
        return int(asyncio.get_running_loop().time() * 1_000_000)

    def submit(self, prompt_tokens: int, output_tokens: int) -> Ticket:
        """A request arrives now; TooLarge when it could never fit."""
        loop = asyncio.get_running_loop()
        key = next(self._keys)
        now_us = self._now_us()
        if self._pace is not None and (slow := self._pace()) != self.engine.slow:
            self.engine.catch_up(now_us)  # the iterations begun before now, at the pace then
            self.engine.slow = slow
        if not self.engine.submit(key, now_us, prompt_tokens, output_tokens):
            raise TooLarge(
                f"{prompt_tokens} prompt and {output_tokens} output tokens are more than the "
                f"{self.engine.perf.kv_tokens} tokens of KV cache"
            )
        ticket = Ticket(key, loop.create_future(), loop.create_future())
        self._tickets[key] = ticket
        self._reschedule()
        return ticket

    def cancel(self, ticket: Ticket) -> None:
        if self._tickets.pop(ticket.key, None) is None:
            return
        self.engine.cancel(ticket.key, self._now_us())
        for fut in (ticket.first, ticket.done):
            fut.cancel()
        self._reschedule()

    def load(self) -> tuple[int, float]:
        """Now: the requests waiting for a batch slot or KV cache, and the share of the KV cache
        in use (0 to 1); the engine's `/metrics` (`sim_metrics`)."""
        self.engine.catch_up(self._now_us())
        return self.engine.queued, self.engine.kv_used / self.engine.perf.kv_tokens

    async def serve(self, prompt_tokens: int, output_tokens: int) -> Served:
        """Wait until the request is done; it leaves the batch if the wait is cancelled."""
        ticket = self.submit(prompt_tokens, output_tokens)
        try:
            return await ticket.done
        finally:
            self.cancel(ticket)

    def _reschedule(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        times = [
            t
            for t in (self.engine.next_first_token_us(), self.engine.next_done_us())
            if t is not None
        ]
        if not times:
            return
        delay_s = max(0, min(times) - self._now_us()) / 1_000_000
        self._timer = asyncio.get_running_loop().call_later(delay_s, self._wake)

    def _wake(self) -> None:
        self._timer = None
        now = self._now_us()
        for key in self.engine.first_tokens(now):
            ticket = self._tickets.get(key)
            if ticket is not None and not ticket.first.done():
                ticket.first.set_result(None)
        for served in self.engine.advance(now):
            ticket = self._tickets.pop(served.key, None)
            if ticket is None:
                continue
            if not ticket.first.done():
                ticket.first.set_result(None)
            ticket.done.set_result(served)
        self._reschedule()
