"""The collector's pauses: what survives a full collection is frozen (so the next ones walk only
what is new), and thawed once an interval so that cycles among it are freed after all."""

from __future__ import annotations

import asyncio
import gc

from llmgw_twin.service.gcpauses import GcPauses


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
