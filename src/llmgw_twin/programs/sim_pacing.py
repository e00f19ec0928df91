"""How long the sim engine's answers take: the batch's word (`--perf-model`, `sim_batcher`), or
a fixed time a token (`--token-latency-ms`), at the replica's pace when a request is accepted:
the slowest of its nodes' (`replica_pace`: the leader's own pace file, its workers' paces).

Invariants: a request's pace is read once, when it is accepted (as the twin's straggler slows the
requests accepted while it lasts); without a pace, or with a batch (which reads it itself, at
each submission), reading it costs nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from fractions import Fraction

from llmgw_twin.programs.sim_batcher import Batcher, Ticket, TooLarge
from llmgw_twin.programs.sim_pace import PaceFile
from llmgw_twin.programs.sim_rendezvous import LeaderRendezvous


class Pacing:
    """How long an answer takes: the batch's word (`--perf-model`), or a fixed time a token."""

    def __init__(
        self, batcher: Batcher | None, latency_s: float, pace: Callable[[], Fraction] | None
    ) -> None:
        self.batcher = batcher
        self.latency_s = latency_s
        self.pace = pace if batcher is None and latency_s > 0 else None

    def latency(self) -> float:
        """A token's time for a request accepted now, at the replica's pace now."""
        return self.latency_s if self.pace is None else self.latency_s * float(self.pace())

    def tickets(self, jobs: Sequence[tuple[int, int]]) -> list[Ticket | None]:
        """One place in the batch per (prompt, output tokens) that generates anything; TooLarge
        (and none held) when one can never fit."""
        if self.batcher is None:
            return [None] * len(jobs)
        out: list[Ticket | None] = []
        try:
            for prompt, output in jobs:
                out.append(None if output < 1 else self.batcher.submit(prompt, output))
        except TooLarge:
            self.release(out)
            raise
        return out

    def release(self, held: Sequence[Ticket | None]) -> None:
        for ticket in held:
            if ticket is not None and self.batcher is not None:
                self.batcher.cancel(ticket)

    async def work(self, held: Sequence[Ticket | None], tokens: int, latency_s: float) -> None:
        if self.batcher is None:
            if latency_s > 0 and tokens > 0:
                await asyncio.sleep(latency_s * tokens)  # the simulated compute itself
            return
        try:
            for ticket in held:
                if ticket is not None:
                    await ticket.done
        finally:
            self.release(held)


async def released(
    chunks: AsyncIterator[bytes],
    held: Sequence[Ticket | None],
    release: Callable[[Sequence[Ticket | None]], None],
) -> AsyncIterator[bytes]:
    """The chunks; the batch places let go when the stream ends or its client goes away."""
    try:
        async for chunk in chunks:
            yield chunk
    finally:
        release(held)


async def paced(ticket: Ticket | None, index: int, latency_s: float) -> None:
    """Wait before a stream's token `index`: the batch's first token, then its end; or the
    fixed latency a token."""
    if ticket is None:
        if latency_s > 0:
            await asyncio.sleep(latency_s)
    elif index == 0:
        await ticket.first
    elif index == 1:
        await ticket.done


def replica_pace(pace: PaceFile | None, rdv: LeaderRendezvous) -> Callable[[], Fraction] | None:
    """The replica's pace now, the slowest of its nodes' (None: always 1, a 1-node replica
    without a pace file, which then costs its requests nothing)."""
    if pace is None:
        return None if rdv.nnodes == 1 else lambda: rdv.slowest
    return lambda: max(pace.now(), rdv.slowest)
