"""Twin throughput on a large fleet, side by side with bare SimPy in the same run.

    .venv/bin/python benchmarks/fleet.py [--nodes 10000] [--minutes 10]

Builds a fleet of `--nodes` 8-GPU nodes in fabrics of 100, fills it with 2-node replicas (4 GPUs
per node, so two replicas share each node pair), kills 1% of the nodes halfway, and runs it.
Prints the twin's wall time beside bare SimPy running the same heartbeat pattern (seeded phases,
one delivery per beat, a 1 s tick, no control logic: `twin.bare_seconds`), in the same process.
"""

from __future__ import annotations

import argparse
import time

from bench_progress import step
from llmgw_twin.control.model import (
    Deployment,
    EngineName,
    FabricId,
    ModelName,
    NodeId,
    NodeInfo,
    Profile,
    ProfileName,
    Timings,
)
from llmgw_twin.twin.scenario.model import Fault, KillNode, Scenario
from llmgw_twin.twin.world.runner import run_scenario

FABRIC_SIZE = 100


def fleet_scenario(nodes: int, minutes: int) -> Scenario:
    fabrics: list[tuple[FabricId, tuple[NodeId, ...]]] = []
    infos: list[NodeInfo] = []
    for f in range(0, nodes, FABRIC_SIZE):
        fabric = FabricId(f"ib-{f // FABRIC_SIZE:03d}")
        names = tuple(NodeId(f"node{i:05d}") for i in range(f, min(f + FABRIC_SIZE, nodes)))
        fabrics.append((fabric, names))
        infos.extend(NodeInfo(n, fabric, 8, 81920, (EngineName("sim"),)) for n in names)
    profile = Profile(ProfileName("p2n"), EngineName("sim"), 2, 4, "/models/m", 20_000)
    # 95% of the GPUs in use: room for some replacements, not all
    replicas = int(nodes * 0.95)
    duration_ms = minutes * 60_000
    kill_at = duration_ms // 2
    step = 100
    faults = tuple(
        Fault(kill_at, KillNode(infos[i].node), f"kill{i}") for i in range(0, nodes, step)
    )
    return Scenario(
        path="<fleet>",
        name=f"fleet-{nodes}",
        duration_ms=duration_ms,
        nodes=tuple(infos),
        fabrics=tuple(fabrics),
        seed=1,
        timings=Timings(),
        profiles=(profile,),
        deployments=(Deployment(ModelName("m"), profile.name, replicas),),
        faults=faults,
    )


def main() -> None:
    from twin import bare_seconds  # the same heartbeat pattern, without control logic

    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=10_000)
    ap.add_argument("--minutes", type=int, default=10)
    args = ap.parse_args()
    step(f"building a fleet of {args.nodes} nodes")
    scenario = fleet_scenario(args.nodes, args.minutes)
    step(f"the twin: {args.nodes} nodes, {args.minutes} min virtual")
    t0 = time.perf_counter()
    result = run_scenario(scenario)
    wall = time.perf_counter() - t0
    step(f"bare SimPy on the same heartbeat pattern (the twin took {wall:.1f} s)")
    bare = bare_seconds(args.nodes, scenario.duration_ms, scenario.timings, scenario.seed)
    kinds: dict[str, int] = {}
    for ev in result.trace:
        kinds[ev.kind] = kinds.get(ev.kind, 0) + 1
    print(f"fleet: {args.nodes} nodes, {args.nodes * 8} GPUs, {args.minutes} min virtual")
    print(
        f"  passed={result.passed} trace events={len(result.trace)} "
        f"sha256={result.trace_sha256[:16]}"
    )
    print(f"  {', '.join(f'{k}={v}' for k, v in sorted(kinds.items()))}")
    print(f"  twin wall time                       {wall:8.2f} s")
    print(f"  bare SimPy, the same heartbeat pattern {bare:6.2f} s")
    print(f"  twin / bare                          {wall / bare:8.2f}")
    print(f"  virtual / wall speed-up              {args.minutes * 60 / wall:8.1f}x")


if __name__ == "__main__":
    main()
