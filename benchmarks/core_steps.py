"""The control core's step time per large operation, at 1,000 and 10,000 nodes.

    .venv/bin/python benchmarks/core_steps.py [--nodes 1000 10000] [--runs 3]

The core alone (no event loop, no store): a fleet of N nodes of 8 GPUs in fabrics of 100, and
one model whose profile takes one GPU of one node. Each operation is the operator's action
(`handle`) and the reconciles that carry it out: the first `tick`, then each one the core asks
for at once (`Step.wake_at_ms` the same instant: a large operation cut into slices,
`control/slices.py`; the event loop is served between two). Timed with `time.perf_counter` over
`--runs` fresh fleets: the longest single call (what the event loop waits for at worst) and the
whole operation, each min / median / max in ms, and the number of calls.

- place N: a deployment of N replicas applied to an empty fleet, and the tick that places them.
- scale N -> 1: the same deployment, every replica ready, scaled back to one.
- drain a fabric: every node of one fabric drained (100 nodes, their replicas copied elsewhere).
- N nodes join a waiting deployment: N/2 whole-node replicas applied to an empty fleet (each
  unplaceable), then the nodes register in a seeded order, 500 between two reconciles, each
  placed shard reported serving at once, until nothing is left to do: a whole fleet registering
  at a controller's start, as in `load.py`.
- defragment among 4N: 4N ready one-GPU replicas, four a node, then one whole-node replica that
  fits nowhere until the defragmenter empties a node (its plan looks at every ready replica).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

from llmgw_twin.control.controller import Controller
from llmgw_twin.control.model import (
    Deployment,
    EngineName,
    FabricId,
    ModelName,
    NodeId,
    NodeInfo,
    Profile,
    ProfileName,
    ReplicaState,
    ShardReport,
    ShardState,
    Timings,
)
from llmgw_twin.control.protocol import (
    ApplyDeployment,
    ApplyProfile,
    Drain,
    Heartbeat,
    NodeRegistered,
)

MODEL = ModelName("m")
PROFILE = Profile(ProfileName("p1"), EngineName("sim"), 1, 1, "/models/m", 20_000)
FABRIC_SIZE = 100


def fleet(nodes: int, replicas: int) -> tuple[Controller, int]:
    """A controller with `nodes` heard nodes and a deployment of `replicas`, not yet placed."""
    ctl = Controller(Timings())
    ctl.handle(ApplyProfile(PROFILE), 0)
    for i in range(nodes):
        info = NodeInfo(
            NodeId(f"n{i:05d}"), FabricId(f"ib-{i // FABRIC_SIZE:03d}"), 8, 81920, (PROFILE.engine,)
        )
        ctl.handle(NodeRegistered(info), 0)
        ctl.handle(Heartbeat(info.node, ()), 0)
    ctl.handle(ApplyDeployment(Deployment(MODEL, PROFILE.name, replicas)), 1)
    return ctl, 1


def ready(ctl: Controller, now: int) -> int:
    """Place what is pending and bring every assigned shard up; returns the time after."""
    while ctl.tick(now).wake_at_ms == now:
        pass
    now += 1
    for n in ctl.nodes():
        shards = tuple(
            ShardReport(s, ShardState.SERVING, f"http://{n}:{8000 + i}", None, ("e", "0"))
            for i, s in enumerate(ctl.assigned(n))
        )
        ctl.handle(Heartbeat(n, shards), now)
    while ctl.tick(now + 1).wake_at_ms == now + 1:
        pass
    return now + 2


@dataclass(frozen=True)
class Timed:
    longest_ms: float
    """The longest single call."""
    total_ms: float
    calls: int


def timed(ctl: Controller, now: int, action: Callable[[], object]) -> Timed:
    """`action`, then the tick at `now` and every tick the core asks for at the same instant."""
    calls: list[float] = []
    t0 = time.perf_counter()
    action()
    while True:
        step = ctl.tick(now)
        calls.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        if step.wake_at_ms != now:
            break
    return Timed(max(calls) * 1000, sum(calls) * 1000, len(calls))


def place(nodes: int) -> Timed:
    ctl, now = fleet(nodes, nodes)
    return timed(ctl, now, lambda: None)


def scale_down(nodes: int) -> Timed:
    ctl, now = fleet(nodes, nodes)
    now = ready(ctl, now)
    return timed(
        ctl, now, lambda: ctl.handle(ApplyDeployment(Deployment(MODEL, PROFILE.name, 1)), now)
    )


def drain_fabric(nodes: int) -> Timed:
    ctl, now = fleet(nodes, nodes)
    now = ready(ctl, now)

    def action() -> None:
        for i in range(FABRIC_SIZE):
            ctl.handle(Drain(NodeId(f"n{i:05d}")), now)

    return timed(ctl, now, action)


WHOLE_NODE = Profile(ProfileName("p8"), EngineName("sim"), 1, 8, "/models/m", 20_000)
JOIN_CHUNK = 500


def join(nodes: int) -> Timed:
    """A deployment of N/2 whole-node replicas waiting on an empty fleet (each unplaceable);
    the nodes then register in a seeded order, `JOIN_CHUNK` between two reconciles, each shard
    reported serving as soon as it is assigned, and the reconciles go on until nothing is left
    to do: a whole fleet registering at a controller's start (the load benchmark's run)."""
    ctl = Controller(Timings())
    ctl.handle(ApplyProfile(WHOLE_NODE), 0)
    ctl.handle(ApplyDeployment(Deployment(MODEL, WHOLE_NODE.name, nodes // 2)), 0)
    ctl.tick(0)
    order = list(range(nodes))
    random.Random(1).shuffle(order)
    calls: list[float] = []
    now = 1

    def reconcile() -> bool:
        """One reconcile, and the serving reports it asks for; True if it did anything."""
        nonlocal now
        t0 = time.perf_counter()
        step = ctl.tick(now)
        calls.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        for node in {c.node for c in step.commands}:
            shards = tuple(
                ShardReport(s, ShardState.SERVING, f"http://{node}:{8000 + i}", None, ("e",))
                for i, s in enumerate(ctl.assigned(node))
            )
            ctl.handle(Heartbeat(node, shards), now)
        calls.append(time.perf_counter() - t0)
        now += 100
        return bool(step.commands) or step.wake_at_ms == now - 100

    for first in range(0, nodes, JOIN_CHUNK):
        t0 = time.perf_counter()
        for i in order[first : first + JOIN_CHUNK]:
            info = NodeInfo(
                NodeId(f"n{i:05d}"),
                FabricId(f"ib-{i // FABRIC_SIZE:03d}"),
                8,
                81920,
                (WHOLE_NODE.engine,),
            )
            ctl.handle(NodeRegistered(info), now)
            ctl.handle(Heartbeat(info.node, ()), now)
        calls.append(time.perf_counter() - t0)
        reconcile()
    for _ in range(nodes):  # bounded: each reconcile places a slice
        if not reconcile():
            break
    ready = sum(1 for r in ctl.replicas() if r.state is ReplicaState.READY)
    assert ready == nodes // 2, f"{ready} of {nodes // 2} replicas ready"
    return Timed(max(calls) * 1000, sum(calls) * 1000, len(calls))


def defragment(nodes: int) -> Timed:
    """4N ready one-GPU replicas (four a node, spread), then a whole-node replica that fits
    nowhere until a node is emptied: the defragmenter's plan among every ready replica."""
    ctl, now = fleet(nodes, 4 * nodes)
    now = ready(ctl, now)

    def action() -> None:
        ctl.handle(ApplyProfile(WHOLE_NODE), now)
        ctl.handle(ApplyDeployment(Deployment(ModelName("big"), WHOLE_NODE.name, 1)), now)

    return timed(ctl, now, action)


OPERATIONS = {
    "place N": place,
    "scale N -> 1": scale_down,
    "drain a fabric": drain_fabric,
    "N nodes join a waiting deployment": join,
    "defragment among 4N": defragment,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    print("| operation | nodes | longest call ms | whole operation ms | calls |")
    print("| --- | --- | --- | --- | --- |")
    for name, op in OPERATIONS.items():
        for n in args.nodes:
            runs = [op(n) for _ in range(args.runs)]
            calls = sorted({r.calls for r in runs})
            print(
                f"| {name} | {n:,} | {spread([r.longest_ms for r in runs])} | "
                f"{spread([r.total_ms for r in runs])} | {'-'.join(map(str, calls))} |",
                flush=True,
            )


def spread(ms: list[float]) -> str:
    """min / median / max"""
    return f"{min(ms):.1f} / {statistics.median(ms):.1f} / {max(ms):.1f}"


if __name__ == "__main__":
    main()
