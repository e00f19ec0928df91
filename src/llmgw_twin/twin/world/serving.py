"""Replicas that serve with the engine performance model, in virtual time.

When a scenario names a profile under `engine_model`, each of that profile's replicas gets its
own `BatchEngine` (`engines/perf/model.py`) the first time it accepts a request: a batch, a
queue and a KV cache. An accepted request is submitted to it; the engine says when its next
request finishes, and one timer per replica wakes then (a newer submission or cancellation
replaces it), so the twin pays an event per finished request, not per iteration.

Invariants:
- Deterministic: exact integer microseconds inside the model, a wake at the first whole
  millisecond at or after a finish, keys handed out in order.
- The replica's pace is its slowest node's (`slow_node`), as the fixed answer time's is: the
  factor in force when the twin last touched the batch applies to the iterations after it.
- A replica whose engine stopped (`drop`) takes its batch with it: its requests are failed by
  the traffic's own rules, never answered from here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from fractions import Fraction

from llmgw_twin.control.model import ProfileName, ReplicaId
from llmgw_twin.engines.perf.model import BatchEngine, EnginePerf, Served
from llmgw_twin.twin.world.sim import World

Done = Callable[[Served], None]


@dataclass(slots=True)
class _Batch:
    engine: BatchEngine
    waiting: dict[int, Done] = field(default_factory=dict)
    wake: int = 0
    """The generation of the replica's live timer; older timers do nothing."""


class ModelServing:
    def __init__(self, world: World, perf: dict[ProfileName, EnginePerf]) -> None:
        self.world = world
        self.perf = perf
        self._batches: dict[ReplicaId, _Batch] = {}
        self._keys = 0

    def serves(self, profile: ProfileName) -> bool:
        return profile in self.perf

    def submit(
        self,
        rid: ReplicaId,
        profile: ProfileName,
        slow: Fraction,
        prompt_tokens: int,
        output_tokens: int,
        done: Done,
    ) -> int | None:
        """The request's key, or None when it can never fit the replica's cache."""
        batch = self._batches.get(rid)
        if batch is None:
            batch = self._batches[rid] = _Batch(BatchEngine(self.perf[profile]))
        self._keys += 1
        key = self._keys
        now_us = self.world.now * 1000
        batch.engine.catch_up(now_us)  # the iterations begun before now, at the pace then
        batch.engine.slow = slow
        if not batch.engine.submit(key, now_us, prompt_tokens, output_tokens):
            return None
        batch.waiting[key] = done
        self._schedule(rid, batch)
        return key

    def cancel(self, rid: ReplicaId, key: int) -> None:
        batch = self._batches.get(rid)
        if batch is None or batch.waiting.pop(key, None) is None:
            return
        batch.engine.cancel(key, self.world.now * 1000)
        self._schedule(rid, batch)

    def drop(self, rid: ReplicaId) -> None:
        self._batches.pop(rid, None)

    def load(self, rid: ReplicaId) -> tuple[int, int, int]:
        """(queued, running, KV tokens held) of the replica's batch now."""
        batch = self._batches.get(rid)
        if batch is None:
            return 0, 0, 0
        return batch.engine.queued, batch.engine.running, batch.engine.kv_used

    def _schedule(self, rid: ReplicaId, batch: _Batch) -> None:
        nxt = batch.engine.next_done_us()
        batch.wake += 1
        if nxt is None:
            return
        generation = batch.wake
        at_ms = -(-nxt // 1000)
        self.world.later(max(0, at_ms - self.world.now), lambda: self._wake(rid, generation))

    def _wake(self, rid: ReplicaId, generation: int) -> None:
        batch = self._batches.get(rid)
        if batch is None or batch.wake != generation:
            return
        for served in batch.engine.advance(self.world.now * 1000):
            done = batch.waiting.pop(served.key, None)
            if done is not None:
                done(served)
        if self._batches.get(rid) is batch:
            self._schedule(rid, batch)
