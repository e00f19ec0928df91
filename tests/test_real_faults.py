"""The faults real mode used to refuse, done for real: a failed GPU, a fabric outage, a hung
engine, each on a small scenario run by the twin and on real processes, which must make the
same control decisions (placements, readiness, failures, reaps, unplaceable replicas, per
replica and fabric; the GPU failures and link changes per node).

Each run lasts its scaled duration (time scale 0.1) plus start-up and shutdown, and counts only
its own processes: those its own temporary folder marks and the groups it reports it started.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from llmgw_twin.control.model import TraceEvent
from llmgw_twin.realmode.runner import RealResult, run_real
from llmgw_twin.twin.scenario.loader import load_scenario_text
from llmgw_twin.twin.scenario.timescale import scale_scenario, widen
from llmgw_twin.twin.world.runner import run_scenario
from test_real_mode import own_tmp

__all__ = ["own_tmp"]  # a fixture, used by name

SCALE = 0.1
TOLERANCE_MS = 2_000
REPLICA_KINDS = ("replica.placed", "replica.ready", "replica.failed", "replica.reaped")
NODE_KINDS = ("gpu.failed", "node.link_down", "node.link_up")


def decisions(trace: Sequence[TraceEvent], end_ms: int) -> dict[str, list[tuple[object, ...]]]:
    """Per replica, what became of it (and where); per node, its GPU failures and link changes;
    whether anything was unplaceable."""
    out: dict[str, list[tuple[object, ...]]] = {}
    for ev in trace:
        if ev.t_ms > end_ms:
            continue
        if ev.kind in REPLICA_KINDS:
            where = ev.get("fabric"), ev.get("nodes") if ev.kind == "replica.placed" else None
            out.setdefault(f"replica {ev.get('replica')}", []).append((ev.kind, *where))
        elif ev.kind in NODE_KINDS:
            out.setdefault(f"node {ev.get('node')}", []).append((ev.kind, ev.get("gpu")))
        elif ev.kind == "replica.unplaceable":
            out["unplaceable"] = [("some",)]
    return out


def both(text: str) -> tuple[dict[str, list[tuple[object, ...]]], RealResult]:
    """The twin's decisions on the scaled file, and the real run of it (which must pass)."""
    scenario = load_scenario_text(text, "t.yaml")
    twin = run_scenario(widen(scale_scenario(scenario, SCALE), TOLERANCE_MS))
    assert twin.passed, [o.message for o in twin.expectations if not o.passed]
    real = run_real(scenario, time_scale=SCALE, tolerance_ms=TOLERANCE_MS)
    failures = [f"{o.text}: {o.message}" for o in real.expectations if not o.passed]
    failures += [f"{i.name}: {v}" for i in real.invariants if i.enabled for v in i.violations]
    assert real.passed, failures
    assert real.left_running == [] and not _alive(real.groups)
    end = real.scenario.duration_ms
    return decisions(twin.trace, end), real


def _alive(groups: list[int]) -> set[int]:
    alive = set()
    for entry in Path("/proc").iterdir():
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z" and int(fields[2]) in groups:
            alive.add(int(fields[2]))
    return alive


def events(result: RealResult, kind: str) -> list[TraceEvent]:
    return [e for e in result.trace if e.kind == kind]


FAIL_GPU = """
name: real-fail-gpu
duration: 2m30s
cluster:
  fabrics: {ib-a: [node01, node02]}
  nodes: {default: {gpus: 2}}
profiles:
  two: {engine: sim, nodes: 2, gpus_per_node: 1, load_time: 10s, model: /models/two}
deployments: [{model: m, profile: two, replicas: 1}]
faults:
  - {id: xid, at: 50s, fail_gpu: {node: node01, gpu: 0}}
  - {id: more, at: 1m40s, set_replicas: {model: m, replicas: 2}}
expect:
  - {event: gpu.failed, node: node01, gpu: 0, within: [xid, xid+1s]}
  - {event: replica.failed, replica: m-r1, within: [xid, xid+1s]}
  - {event: replica.ready, within: [xid+10s, xid+15s]}
  - {event: replica.unplaceable, within: [more, end]}
  - {at: end, ready_replicas: {m: 1}}
"""


def test_a_failed_gpu_kills_its_engine_and_is_never_placed_on_again(own_tmp: Path) -> None:
    twin, real = both(FAIL_GPU)
    assert decisions(real.trace, real.scenario.duration_ms) == twin
    (failed,) = events(real, "gpu.failed")
    assert (failed.get("node"), failed.get("gpu")) == ("node01", 0)
    (lost,) = [e for e in events(real, "replica.failed") if e.get("replica") == "m-r1"]
    # the agent reports the GPU before it kills the engine on it: the failure is the GPU's
    assert lost.get("reason") == "GPU 0 failed on node01" and lost.t_ms == failed.t_ms
    # the replacement went back onto node01 (GPU 1): with GPU 0 failed, node01 has no room
    # for the second replica asked for later, which stays unplaceable
    placed = [e.get("nodes") for e in events(real, "replica.placed")]
    assert placed[-1] == ("node01", "node02") and len(placed) == 2
    assert events(real, "replica.unplaceable")


FABRIC_DOWN = """
name: real-fabric-down
duration: 2m30s
cluster:
  fabrics: {ib-a: [node01, node02], ib-b: [node03]}
  nodes: {default: {gpus: 8}, node03: {gpus: 4}}
profiles:
  two: {engine: sim, nodes: 2, gpus_per_node: 8, load_time: 10s, model: /models/two}
  one: {engine: sim, nodes: 1, gpus_per_node: 4, load_time: 10s, model: /models/one}
deployments:
  - {model: big, profile: two, replicas: 1}
  - {model: small, profile: one, replicas: 1}
faults:
  - {id: down, at: 50s, fabric_down: {fabric: ib-a, for: 40s}}
expect:
  - {event: node.link_down, fabric: ib-a, within: [down, down+1s], count: 2}
  - {event: replica.failed, model: big, within: [down, down+1s]}
  - {event: replica.placed, model: big, within: [down+1s, down+40s], never: true}
  - {event: node.link_up, fabric: ib-a, within: [down+40s, down+42s], count: 2}
  - {event: replica.ready, model: big, within: [down+40s, down+55s]}
  - {event: replica.failed, model: small, within: [start, end], never: true}
  - {at: end, ready_replicas: {big: 1, small: 1}}
"""


def test_a_fabric_outage_cuts_the_peer_links_and_the_ports_until_it_ends(own_tmp: Path) -> None:
    twin, real = both(FABRIC_DOWN)
    assert decisions(real.trace, real.scenario.duration_ms) == twin
    downs = events(real, "node.link_down")
    assert sorted(str(e.get("node")) for e in downs) == ["node01", "node02"]
    (failed,) = [e for e in events(real, "replica.failed") if e.get("model") == "big"]
    # the ports were reported down before the peers were lost: nothing went back onto ib-a
    assert max(e.t_ms for e in downs) <= failed.t_ms
    ups = events(real, "node.link_up")
    assert sorted(str(e.get("node")) for e in ups) == ["node01", "node02"]
    placed = [e for e in events(real, "replica.placed") if e.get("model") == "big"]
    assert placed[-1].t_ms >= min(e.t_ms for e in ups)


HANG = """
name: real-hang
duration: 2m30s
timings: {probe_interval: 5s, unresponsive_grace: 20s}
cluster:
  fabrics: {ib-a: [node01, node02, node03]}
profiles:
  one: {engine: sim, nodes: 1, gpus_per_node: 8, load_time: 10s, model: /models/one}
deployments: [{model: m, profile: one, replicas: 2}]
faults:
  - {id: hang, at: 50s, hang_engine: {node: node01, replica_of: m}}
expect:
  - {event: replica.degraded, replica: m-r1, within: [hang, hang+10s]}
  - {event: replica.failed, replica: m-r1, within: [hang+20s, hang+35s]}
  - {event: replica.ready, replica: m-r3, within: [hang+20s, end]}
  - {event: replica.failed, replica: m-r2, within: [start, end], never: true}
  - {at: end, ready_replicas: {m: 2}, idle_nodes: [node01]}
"""


def test_a_hung_engine_keeps_its_port_and_answers_nothing_until_it_is_replaced(
    own_tmp: Path,
) -> None:
    twin, real = both(HANG)
    assert decisions(real.trace, real.scenario.duration_ms) == twin
    (degraded,) = events(real, "replica.degraded")
    (failed,) = [e for e in events(real, "replica.failed") if e.get("replica") == "m-r1"]
    assert degraded.t_ms < failed.t_ms
    assert "not answering" in str(failed.get("reason"))
    assert not events(real, "replica.recovered")  # stopped, it never answers again
