"""The collector's pauses: what survives a full collection is frozen (so the next ones walk only
what is new), and thawed once an interval so that cycles among it are freed after all."""

from __future__ import annotations

import asyncio
import gc

from llmgw_twin.service.controller.gcpauses import GcPauses
from llmgw_twin.service.controller.timings import Buckets


class Cycle:
    def __init__(self) -> None:
        self.me = self


def test_survivors_of_a_full_collection_are_frozen_then_thawed_once_an_interval() -> None:
    async def go() -> None:
        pauses = GcPauses(thaw_every_s=3_600)
        pauses.start()
        try:
            kept = [Cycle() for _ in range(1_000)]  # long-lived state
            before = gc.get_freeze_count()
            gc.collect()  # a full collection: noted by the callback, acted on by `tend`
            pauses.tend()
            assert pauses.freezes == 1 and gc.get_freeze_count() >= before + len(kept)
            pauses.tend()
            assert pauses.freezes == 1  # no full collection since: nothing to act on
            pauses.thaw_every_s = 0  # the interval is over: the next one thaws
            gc.collect()
            pauses.tend()
            assert pauses.thaws == 1 and gc.get_freeze_count() == 0
            del kept
            assert gc.collect() >= 1_000  # the thawed cycles are freed by the next full one
        finally:
            await pauses.stop()
        assert gc.get_freeze_count() == 0 and pauses._noted not in gc.callbacks

    asyncio.run(go())


def test_each_collection_is_timed_by_its_generation() -> None:
    async def go() -> None:
        timed = {0: Buckets(), 1: Buckets(), 2: Buckets()}
        pauses = GcPauses(thaw_every_s=3_600, pauses=timed)
        pauses.start()
        try:
            full = timed[2].count
            gc.collect()
            assert timed[2].count == full + 1 and timed[2].total > 0
            young = timed[0].count
            gc.collect(0)
            assert timed[0].count == young + 1
        finally:
            await pauses.stop()

    asyncio.run(go())


def test_buckets_count_each_observation_under_its_first_bound_not_below() -> None:
    b = Buckets((0.001, 0.01, 0.1))
    for seconds in (0.0005, 0.001, 0.005, 0.5, 0.05):
        b.observe(seconds)
    assert b.counts == [2, 1, 1, 1]  # a bound holds what equals it; 0.5 is past every bound
    assert list(b.cumulative()) == [("0.001", 2), ("0.01", 3), ("0.1", 4), ("+Inf", 5)]
    assert b.count == 5 and abs(b.total - 0.5565) < 1e-9
