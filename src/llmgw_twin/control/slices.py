"""Large operations cut into slices, so that no reconcile grows with the size of an operation.

A reconcile runs on the runtime's event loop (the service) or as one event (the twin). Applying
a deployment of 10,000 replicas, scaling one from 10,000 to 1, or finding room for the
replacements of a whole lost fabric would each be one call of a second or more, through which
the controller hears no heartbeat. So one reconcile creates at most `SLICE` replicas, retires at
most `SLICE` and places at most `SLICE`; what is left waits for the next reconcile, which the
core asks for at once (`Slices.more`: `Step.wake_at_ms` is the same instant), and the runtime
serves its event loop between the two.

Placement goes by rounds: a round starts with a reason to place (a new replica, room freed) and
tries every pending replica once, `SLICE` at a time in the placement pass's own order (largest
first, `passes.plan_pass`); a reason that comes during a round starts another after it. So every
pending replica is tried within a bounded number of reconciles of any reason, and none is starved
by the ones ahead of it in the order that still do not fit.

Deterministic: the same inputs are cut the same way. Below `SLICE` nothing is cut and a
reconcile does what it did before slices.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from llmgw_twin.control.model import ModelName, ReplicaId

if TYPE_CHECKING:
    from llmgw_twin.control.replicas import ReplicaRecord

SLICE = 250
"""Replicas created, retired or placed in one reconcile, each: about 50 ms of a reconcile at
10,000 nodes on the development machine (`benchmarks/core_steps.py`)."""


class Slices:
    def __init__(self) -> None:
        self.created = 0
        self.retired = 0
        self.more = False
        """Work is left that the next reconcile, at once, goes on with."""
        self.again: set[ModelName] = set()
        """Deployments whose creation or retirement was cut: reconciled again next time."""
        self.tried: set[ReplicaId] = set()
        """The replicas the placement round under way has tried (empty: no round under way)."""
        self.retiring: dict[ModelName, tuple[int, Iterator[ReplicaRecord]]] = {}
        """A cut scale-down's order, with the count it scales to: the next slice goes
        on in it (`surplus.retire_order`, O(log n) a victim), where judging the order anew each
        slice would cost O(n) a slice. A count changed since starts a new order."""

    def begin(self) -> None:
        """A new reconcile: a fresh allowance of each."""
        self.created = self.retired = 0
        self.more = False

    def may_create(self, model: ModelName) -> bool:
        """Whether one more replica may be created in this reconcile (else `model` waits)."""
        if self.created >= SLICE:
            self._cut(model)
            return False
        self.created += 1
        return True

    def retirable(self, model: ModelName, surplus: int) -> int:
        """How many of `model`'s `surplus` replicas this reconcile retires."""
        take = min(surplus, SLICE - self.retired)
        if take < surplus:
            self._cut(model)
        self.retired += take
        return take

    def _cut(self, model: ModelName) -> None:
        self.again.add(model)
        self.more = True

    def in_round(self) -> bool:
        return bool(self.tried)

    def placing(self, fresh: int) -> int | None:
        """The most of `fresh` untried pending replicas to place now (None: all of them, which
        ends the round)."""
        if fresh <= SLICE:
            self.tried.clear()
            return None
        self.more = True
        return SLICE
