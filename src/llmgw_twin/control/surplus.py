"""Which replicas a scale-down retires, in order, in O(n log n) for n replicas.

The rule (`Lifecycle.reconcile_deployment`): retire the least useful replica, one at a time,
judged after each retirement. Least useful, in order: one with a shard on a node not heard as
alive, then unplaced, then not ready, then on an outdated profile, then on a node being drained,
then from the fabric that holds the most live replicas of the model now, then the newest.

The first five criteria do not change while replicas are retired, so the candidates fall into
classes taken in order. Within a class only the fabric counts change, and they only go down (a
retirement, or a copy reaped with its original), so each class keeps, per fabric, its replicas
newest last, and a heap of fabrics keyed by (count, newest) whose entries are checked against
the live counts when they come out: a stale one goes back with its current key. Each victim
costs O(log n); a minimum scan over the rest per victim made a scale-down of 10,000 replicas
quadratic (minutes of one step).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator, Mapping
from itertools import groupby
from typing import Protocol, TypeVar

from llmgw_twin.control.model import FabricId, ReplicaState


class Retirable(Protocol):
    """What the order reads of a replica (`replicas.ReplicaRecord` has it)."""

    @property
    def fabric(self) -> FabricId | None: ...
    @property
    def seq(self) -> int: ...
    @property
    def state(self) -> ReplicaState: ...


R = TypeVar("R", bound=Retirable)


def retire_order(
    counted: list[R], static: Callable[[R], tuple[bool, ...]], per_fabric: Mapping[FabricId, int]
) -> Iterator[R]:
    """The replicas to retire, least useful first, judged anew at each step: the caller retires
    each before asking for the next. `static` gives the criteria that do not change during a
    scale-down (smaller: retired sooner). `per_fabric` is the live count of the model's placed
    replicas per fabric, read at every step."""
    keyed = sorted(((static(r), r) for r in counted), key=lambda kr: kr[0])
    for _, group in groupby(keyed, key=lambda kr: kr[0]):
        yield from _class_order([r for _, r in group], per_fabric)


def _count(rec: Retirable, per_fabric: Mapping[FabricId, int]) -> int:
    return per_fabric.get(rec.fabric, 0) if rec.fabric is not None else 0


def _class_order(members: list[R], per_fabric: Mapping[FabricId, int]) -> Iterator[R]:
    by_fabric: dict[str, list[R]] = {}
    for rec in sorted(members, key=lambda r: r.seq):  # newest last: popped first
        by_fabric.setdefault(rec.fabric or "", []).append(rec)
    heap = [(-_count(rs[-1], per_fabric), -rs[-1].seq, f) for f, rs in by_fabric.items()]
    heapq.heapify(heap)
    while heap:
        entry = heapq.heappop(heap)
        fabric = entry[2]
        queue = by_fabric[fabric]
        while queue and queue[-1].state is ReplicaState.REAPED:  # gone with another's reap
            queue.pop()
        if not queue:
            continue
        head = queue[-1]
        now = (-_count(head, per_fabric), -head.seq, fabric)
        if now != entry:  # its count went down (or its head was reaped) since it was pushed
            heapq.heappush(heap, now)
            continue
        queue.pop()
        yield head
        if queue:
            heapq.heappush(heap, (-_count(queue[-1], per_fabric), -queue[-1].seq, fabric))
