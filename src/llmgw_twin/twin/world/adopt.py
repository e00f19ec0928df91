"""What a restarted agent finds of the shards its predecessor left (the fault `restart_agent`).

As the production agent does from its run-state file (`agent/runstate.py`): every shard whose
engine still runs is adopted in the phase its engine is in (a serving leader serving, with its
endpoint; a joined and loaded worker running; any other engine started); a leader found hung
answers no probe, so it is adopted unresponsive. A shard whose engine is gone (or that had no
engine yet: its sidecar alone) is not adopted, and its replica is failed by the controller as one
whose shard vanished.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from llmgw_twin.control.agent import LocalShard
from llmgw_twin.control.model import ShardSpec
from llmgw_twin.control.states import Phase

if TYPE_CHECKING:
    from llmgw_twin.twin.world.node import SimEngine


def adopted(
    engines: list[SimEngine], endpoint_of: Callable[[ShardSpec], str]
) -> tuple[LocalShard, ...]:
    out: list[LocalShard] = []
    for engine in engines:
        if engine.stopped:
            continue
        spec = engine.spec
        endpoint = None
        if spec.rank == 0 and engine.serving:
            phase = Phase.UNRESPONSIVE if engine.hung else Phase.SERVING
            endpoint = None if engine.hung else endpoint_of(spec)
        elif spec.rank > 0 and engine.loaded and engine.has_joined:
            phase = Phase.UNRESPONSIVE if engine.hung else Phase.RUNNING
        else:
            phase = Phase.ENGINE
        out.append(LocalShard(spec, phase, engine.argv, endpoint))
    return tuple(out)
