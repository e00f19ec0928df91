"""The control core's step time per large operation, at 1,000 and 10,000 nodes.

    .venv/bin/python benchmarks/core_steps.py [--nodes 1000 10000] [--runs 3]

The core alone (no event loop, no store): a fleet of N nodes of 8 GPUs in fabrics of 100, and
one model whose profile takes one GPU of one node. Each operation is one call the controller's
event loop makes (`handle` of the operator's action, then the `tick` that acts on it), timed
with `time.perf_counter` over `--runs` fresh fleets; the figure is min / median / max in ms.

- place N: a deployment of N replicas applied to an empty fleet, and the tick that places them.
- scale N -> 1: the same deployment, every replica ready, scaled back to one.
- drain a fabric: every node of one fabric drained (100 nodes, their replicas copied elsewhere).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

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
    ctl.tick(now)
    now += 1
    for n in ctl.nodes():
        shards = tuple(
            ShardReport(s, ShardState.SERVING, f"http://{n}:{8000 + i}", None, ("e", "0"))
            for i, s in enumerate(ctl.assigned(n))
        )
        ctl.handle(Heartbeat(n, shards), now)
    ctl.tick(now + 1)
    return now + 2


def timed(op: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    op()
    return (time.perf_counter() - t0) * 1000


def place(nodes: int) -> float:
    ctl, now = fleet(nodes, nodes)
    return timed(lambda: ctl.tick(now))


def scale_down(nodes: int) -> float:
    ctl, now = fleet(nodes, nodes)
    now = ready(ctl, now)

    def op() -> None:
        ctl.handle(ApplyDeployment(Deployment(MODEL, PROFILE.name, 1)), now)
        ctl.tick(now)

    return timed(op)


def drain_fabric(nodes: int) -> float:
    ctl, now = fleet(nodes, nodes)
    now = ready(ctl, now)

    def op() -> None:
        for i in range(FABRIC_SIZE):
            ctl.handle(Drain(NodeId(f"n{i:05d}")), now)
        ctl.tick(now)

    return timed(op)


OPERATIONS = {"place N": place, "scale N -> 1": scale_down, "drain a fabric": drain_fabric}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    print("| operation | nodes | step ms (min / median / max) |")
    print("| --- | --- | --- |")
    for name, op in OPERATIONS.items():
        for n in args.nodes:
            runs = [op(n) for _ in range(args.runs)]
            print(
                f"| {name} | {n:,} | {min(runs):.1f} / {statistics.median(runs):.1f} / "
                f"{max(runs):.1f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
