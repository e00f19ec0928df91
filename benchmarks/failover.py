"""A leader killed under a large fleet with traffic, side by side with a single controller's
restart on the same fleet, in the twin (virtual time), in one run.

    .venv/bin/python benchmarks/failover.py [--nodes 1000] [--down 2s]

Two runs of one fleet (`--nodes` 8-GPU nodes in fabrics of 100, 2-node replicas filling 95% of
the GPUs, traffic to the model): (a) two controllers on one store, the leader killed for good at
5m; (b) one controller, its process restarted after `--down` at 5m. For each: how long after the
fault a controller led again and committed its first step (`controller.started`), how many
shards started after the fault (replicas restarted: the goal is 0), how many of the requests
that arrived after the fault failed (the goal is 0), and the wall time of the run. The figures
go into docs/performance.md with this command.
"""

from __future__ import annotations

import argparse
import re
import time
from dataclasses import replace

from fleet import fleet_scenario
from llmgw_twin.control.model import ModelName
from llmgw_twin.twin.scenario.model import (
    Fault,
    KillController,
    RequestsExpectation,
    RestartController,
    Scenario,
    Traffic,
)
from llmgw_twin.twin.world.runner import RunResult, run_scenario
from llmgw_twin.units import fmt_ms, parse_duration

FAULT_MS = 5 * 60_000
RUN_MS = 8 * 60_000


def _scenario(nodes: int, controllers: int, fault: Fault) -> Scenario:
    base = fleet_scenario(nodes, RUN_MS // 60_000)
    traffic = (Traffic(ModelName("m"), 20, 1_000, 32),)  # 20 requests a second
    after = RequestsExpectation(ModelName("m"), 0, FAULT_MS, RUN_MS, text="after the fault")
    return replace(
        base,
        name=f"failover-{controllers}",
        faults=(fault,),
        traffic=traffic,
        controllers=controllers,
        expectations=(after,),
    )


def _figures(result: RunResult, wall_s: float) -> dict[str, str]:
    after = [e for e in result.trace if e.t_ms >= FAULT_MS]
    led = next((e.t_ms for e in after if e.kind == "controller.leader"), None)
    started = next((e.t_ms for e in after if e.kind == "controller.started"), None)
    restarted = sum(1 for e in after if e.kind == "shard.started")
    judged = re.match(r"(\d+) of (\d+) requests", result.expectations[0].message)
    assert judged is not None, result.expectations[0].message
    return {
        "led again": "-" if led is None else f"+{fmt_ms(led - FAULT_MS)}",
        "first commit": "-" if started is None else f"+{fmt_ms(started - FAULT_MS)}",
        "shards restarted": str(restarted),
        "failed after": f"{judged.group(1)} of {judged.group(2)}",
        "wall": f"{wall_s:.1f} s",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--down", default="2s", help="the single controller's outage")
    args = parser.parse_args()
    down_ms = parse_duration(args.down)
    runs = {
        "2 controllers, leader killed": _scenario(
            args.nodes, 2, Fault(FAULT_MS, KillController("leader"), "kill")
        ),
        f"1 controller, restarted after {args.down}": _scenario(
            args.nodes, 1, Fault(FAULT_MS, RestartController(down_ms), "restart")
        ),
    }
    rows = []
    for name, scenario in runs.items():
        t0 = time.perf_counter()
        result = run_scenario(scenario)
        rows.append((name, _figures(result, time.perf_counter() - t0)))
    keys = list(rows[0][1])
    width = max(len(n) for n, _ in rows)
    print(f"{'':<{width}}  " + "  ".join(f"{k:>16}" for k in keys))
    for name, figures in rows:
        print(f"{name:<{width}}  " + "  ".join(f"{figures[k]:>16}" for k in keys))


if __name__ == "__main__":
    main()
