"""The twin's requests in flight: each one a replica accepted, until it is answered or fails.

Role: the twin's router (`traffic.py`) picks a replica and judges how it takes a request
(`reach.py`); an attempt the replica accepted is handed here (`add`, then `fixed` or `batched`)
and is answered in virtual time. At the sim engine's fixed pace (`FIRST_TOKEN_MS`, then
`TOKEN_MS` per token, at the pace of the replica's slowest node), or, for a replica whose profile
the scenario names under `engine_model`, through its batch (`serving.py`): the request waits for
the batch's answer, gives up at the first-byte timeout (leaving the batch), and one too large for
its cache is refused at once (a 400: not retried). An accepted request fails at once when an
engine of its replica stops with its connections closed (`engine_stopped`: its process died, its
node crashed, it was stopped), and at the first-byte timeout when the replica went silent (power
off, a hang, a cut) or runs slower than that. Every answered request's times are recorded when
the scenario uses the workload additions (`latency.py`).

Every outcome goes back to the router through the callbacks it hands in: `finished` for the
routing core (passive ejection), `failed` for a failed attempt (retried once, or counted), and
`rejected` for a request its engine refused (counted, not retried).

Invariants: an attempt ends once (`Pending.done`): whichever of its answer, its engine's stop
and its timeout comes first settles it and the others do nothing; the world's random stream is
never drawn from here, so answering changes no other draw.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction

from llmgw_twin.control.model import ModelName, ProfileName, ReplicaId
from llmgw_twin.control.routing import RouterTimeouts
from llmgw_twin.engines.perf.model import Served
from llmgw_twin.twin.scenario.arrivals import Arrival
from llmgw_twin.twin.scenario.model import Traffic
from llmgw_twin.twin.world.latency import Latencies, Sample
from llmgw_twin.twin.world.node import SimEngine
from llmgw_twin.twin.world.reach import Engines, broken
from llmgw_twin.twin.world.serving import ModelServing
from llmgw_twin.twin.world.sim import World

FIRST_TOKEN_MS = 20
"""The sim engine's time to the first token, in the twin."""
TOKEN_MS = 2
"""And per token after it."""


@dataclass(slots=True)
class Pending:
    """An attempt a replica accepted."""

    traffic: Traffic
    req: Arrival
    replica: ReplicaId
    retry: bool  # a failure may still be retried
    done: bool = False


class InFlight:
    """The requests the replicas accepted and have not answered yet, and their answers."""

    def __init__(
        self,
        world: World,
        timeouts: RouterTimeouts,
        serving: ModelServing | None,
        latencies: Latencies | None,
        finished: Callable[[ModelName, ReplicaId, bool], None],
        failed: Callable[[Traffic, Arrival, ReplicaId, bool, bool], None],
        rejected: Callable[[Traffic, Arrival, bool], None],
    ) -> None:
        self.world = world
        self.timeouts = timeouts
        self.serving = serving
        self.latencies = latencies
        self._finished = finished
        self._failed = failed
        self._rejected = rejected
        self._inflight: dict[ReplicaId, list[Pending]] = {}
        """Requests a replica has accepted and not answered yet."""

    def add(self, pending: Pending) -> None:
        self._inflight.setdefault(pending.replica, []).append(pending)

    def fixed(self, pending: Pending, engines: Engines) -> None:
        """An accepted request answered at the sim engine's fixed pace."""
        traffic, req, rid, retry = pending.traffic, pending.req, pending.replica, pending.retry
        now = self.world.now
        # a replica runs at the pace of its slowest node (`slow_node`): a straggler's answer
        # later than the client's first-byte budget is given up on then (not a replica that died)
        work_ms = FIRST_TOKEN_MS + TOKEN_MS * max(req.output_tokens - 1, 0)
        done_ms = max(node.slowed(work_ms) for node, _, _ in engines)
        if done_ms > self.timeouts.first_byte_ms:

            def too_slow() -> None:
                if not pending.done:
                    self._settle(pending)
                    self._failed(traffic, req, rid, retry, False)

            self.world.later(self.timeouts.first_byte_ms, too_slow)
            return

        def complete() -> None:
            if pending.done:
                return  # its connection closed before: failed then
            if broken(engines, self.world):  # it went silent: the client waits it out
                self.world.later(max(self.timeouts.first_byte_ms - done_ms, 0), give_up)
                return
            self._settle(pending)
            self._finished(traffic.model, rid, True)
            if self.latencies is not None:
                first_ms = max(node.slowed(FIRST_TOKEN_MS) for node, _, _ in engines)
                self._record(traffic, req, now + first_ms, now + done_ms, 0, req.output_tokens)

        def give_up() -> None:
            if not pending.done:
                self._settle(pending)
                self._failed(traffic, req, rid, retry, True)

        self.world.later(done_ms, complete)

    def batched(self, pending: Pending, engines: Engines, profile: ProfileName, died: bool) -> None:
        """An accepted request served by its replica's batch (`serving.py`)."""
        assert self.serving is not None
        traffic, req, rid = pending.traffic, pending.req, pending.replica
        slow = max(max(node.slow, default=Fraction(1)) for node, _, _ in engines)

        def answered(served: Served) -> None:
            if pending.done or broken(engines, self.world):
                return  # failed already, or silent since: the first-byte timeout ends it
            self._settle(pending)
            self._finished(traffic.model, rid, True)
            if self.latencies is not None:
                self.latencies.add(
                    traffic.model,
                    Sample(
                        req.at_ms,
                        served.first_token_us - req.at_ms * 1000,
                        served.done_us - req.at_ms * 1000,
                        served.queued_us,
                        served.tbt_us,
                    ),
                )

        key = self.serving.submit(rid, profile, slow, req.input_tokens, req.output_tokens, answered)
        if key is None:  # it can never fit the cache: the engine refuses it (a 400, not retried)
            self._settle(pending)
            self._finished(traffic.model, rid, True)
            self._rejected(traffic, req, died)
            return

        serving = self.serving

        def too_slow() -> None:
            if not pending.done:
                serving.cancel(rid, key)
                self._settle(pending)
                self._failed(traffic, req, rid, pending.retry, broken(engines, self.world))

        self.world.later(self.timeouts.first_byte_ms, too_slow)

    def _record(
        self,
        traffic: Traffic,
        req: Arrival,
        first_ms: int,
        done_ms: int,
        queued_us: int,
        tokens: int,
    ) -> None:
        """A request answered at the fixed pace: its first token at `first_ms`, done at
        `done_ms` (virtual ms)."""
        assert self.latencies is not None
        tbt_us = 0 if tokens <= 1 else (done_ms - first_ms) * 1000 // (tokens - 1)
        self.latencies.add(
            traffic.model,
            Sample(
                req.at_ms,
                (first_ms - req.at_ms) * 1000,
                (done_ms - req.at_ms) * 1000,
                queued_us,
                tbt_us,
            ),
        )

    def engine_stopped(self, engine: SimEngine, sockets_close: bool) -> None:
        """An engine stopped: when its connections closed, every request its replica holds
        fails now (a powered-off node's just go silent: their clients time out)."""
        if not sockets_close:
            return
        if self.serving is not None:
            self.serving.drop(engine.spec.replica)
        for pending in self._inflight.pop(engine.spec.replica, []):
            if not pending.done:
                pending.done = True
                self._failed(pending.traffic, pending.req, pending.replica, pending.retry, True)

    def _settle(self, pending: Pending) -> None:
        pending.done = True
        held = self._inflight.get(pending.replica)
        if held is not None:
            held.remove(pending)
            if not held:
                del self._inflight[pending.replica]
