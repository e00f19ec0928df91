"""Real mode starts ahead the processes a fault brings up, each told to serve from the fault's
instant: an agent of a `restart_node` up to 3 s before it (never before its node went down), the
next controller of a `restart_controller` up to 3 s before it (never before the restart before),
serving once the outage is over; the restart then kills the old controller and makes the
standby the current one, or starts one at once when the standby died.

The cluster here records what it is asked to start, so what is checked is the schedule and
the instants handed to `--not-before`, not a process's speed."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from typing import Any

from llmgw_twin.control.model import NodeId
from llmgw_twin.realmode.faults import BOOT_LEAD_S, RealFaults
from llmgw_twin.twin.scenario.loader import load_scenario_text

SCENARIO = """
name: boot-ahead
duration: 1m
cluster:
  fabrics:
    ib-a: [node01, node02]
faults:
  - {id: off, at: 10s, kill_node: node02}
  - {id: on, at: 12s, restart_node: node02}
  - {id: c1, at: 20s, restart_controller: {down_for: 4s}}
  - {id: c2, at: 22s, restart_controller: {down_for: 1s}}
"""


class Recorded:
    """A cluster that records each start (kind, node, not_before_ns, standby)."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.starts: list[tuple[str, str | None, int | None, bool]] = []
        self.standbys: list[Any] = []
        self.killed = 0

    def start_agent(self, node: NodeId, not_before_ns: int | None = None) -> None:
        self.starts.append(("agent", node, not_before_ns, False))

    def start_controller(
        self, config: Path, not_before_ns: int | None = None, *, standby: bool = False
    ) -> None:
        assert config == self.workdir / "controller.yaml"
        self.starts.append(("controller", None, not_before_ns, standby))

    def kill_controller(self) -> None:
        self.killed += 1

    def promote_standby(self) -> bool:
        return bool(self.standbys) and self.standbys.pop(0).poll() is None


def test_agents_and_controllers_are_started_ahead_and_serve_from_the_instant(
    tmp_path: Path,
) -> None:
    scenario = load_scenario_text(SCENARIO)
    cluster = Recorded(tmp_path)

    async def go() -> list[float]:
        loop = asyncio.get_running_loop()
        faults = RealFaults(cluster, scenario, lambda: 0, lambda _line: None)  # type: ignore[arg-type]
        t0 = loop.time() - 60  # the whole schedule is due: each start runs at once
        faults.boot_ahead(t0)
        offsets = sorted(h.when() - t0 for h in faults._pending)
        for _ in range(3):
            await asyncio.sleep(0)
        faults.cancel()
        return offsets

    offsets = asyncio.run(go())
    assert BOOT_LEAD_S == 3.0
    # node02 was down 2 s only; the first controller 3 s ahead; the second just after the first
    # restart (so the standbys start in the order of their restarts)
    assert [round(o, 3) for o in offsets] == [10.0, 17.0, 20.001]
    by_kind = {k: [s for s in cluster.starts if s[0] == k] for k in ("agent", "controller")}
    ((_, node, agent_ns, agent_standby),) = by_kind["agent"]
    assert node == "node02" and not agent_standby and agent_ns is not None
    first, second = by_kind["controller"]
    assert first[3] and second[3]  # both standbys
    assert first[2] is not None and second[2] is not None
    # serving from: node02 at its restart (12 s), each controller at the end of its outage
    assert first[2] - agent_ns == 12_000_000_000  # 20 s + 4 s - 12 s
    assert second[2] - agent_ns == 11_000_000_000  # 22 s + 1 s - 12 s


def test_a_restart_uses_the_standby_or_starts_one_when_it_died(tmp_path: Path) -> None:
    scenario = load_scenario_text(SCENARIO)
    restart = next(f for f in scenario.faults if f.id == "c1")
    cluster = Recorded(tmp_path)

    async def restart_once() -> None:
        faults = RealFaults(cluster, scenario, lambda: 0, lambda _line: None)  # type: ignore[arg-type]
        await faults.inject(restart, None)  # type: ignore[arg-type]

    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        cluster.standbys = [alive]
        asyncio.run(restart_once())
        assert cluster.killed == 1 and cluster.starts == []  # the standby serves next
        assert cluster.standbys == []
    finally:
        alive.kill()
        alive.wait()
    cluster.standbys = [alive]  # dead now: a controller is started at once
    asyncio.run(restart_once())
    assert cluster.killed == 2
    ((kind, _node, not_before, standby),) = cluster.starts
    assert kind == "controller" and not standby and not_before is not None
