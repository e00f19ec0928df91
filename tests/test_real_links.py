"""One node's fabric link and a spine's split, done for real (`realmode/links.py`,
`realmode/fabric.py`): the fabric proxies tell the dialling node by the address its connection
leaves from (a sim worker dials from its node's own, `--source-host`) and admit it only while the
two nodes reach each other. Each scenario runs in the twin and on real processes, which must
make the same control decisions; `leaf-down.yaml`, `spine-down.yaml` and `cut-fabric-link.yaml`
run in the real suite (`tests/test_real_suite.py`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmgw_twin.realmode.refusals import check_real_supported
from llmgw_twin.twin.scenario.loader import load_scenario_text
from test_real_faults import both, decisions, events
from test_real_mode import own_tmp

__all__ = ["own_tmp"]  # a fixture, used by name

CUT_WORKER = """
name: real-cut-worker-link
duration: 2m
cluster:
  fabrics: {ib-a: [node01, node02, node03]}
profiles:
  two: {engine: sim, nodes: 2, gpus_per_node: 8, load_time: 10s, model: /models/two}
deployments: [{model: big, profile: two, replicas: 1}]
faults:
  - {id: cut, at: 40s, cut_fabric_link: {node: node02, for: 30s}}
expect:
  - {event: node.link_down, node: node02, within: [cut, cut+1s]}
  - {event: replica.failed, model: big, within: [cut, cut+2s]}
  - {event: replica.ready, model: big, within: [cut+10s, cut+30s]}
  - {event: node.link_up, node: node02, within: [cut+30s, cut+32s]}
  - {at: end, ready_replicas: {big: 1}}
"""


def test_a_worker_whose_link_is_cut_loses_its_leader_and_the_replica_moves(
    own_tmp: Path,
) -> None:
    """node02 runs rank 1, which dials its leader on node01: the cut must part the connection
    the cut node made, not only those made to it."""
    twin, real = both(CUT_WORKER)
    assert decisions(real.trace, real.scenario.duration_ms) == twin
    (first,) = [e for e in events(real, "replica.placed") if e.get("replica") == "big-r1"]
    assert first.get("nodes") == ("node01", "node02")  # node02 the worker
    (down,) = events(real, "node.link_down")
    (failed,) = events(real, "replica.failed")
    assert failed.get("replica") == "big-r1" and down.t_ms <= failed.t_ms
    placed = [e.get("nodes") for e in events(real, "replica.placed")]
    assert placed[-1] == ("node01", "node03")  # not onto the node whose link is down


SPLIT = """
name: real-spine-split
duration: 2m
cluster:
  fabrics: {ib-a: [node01, node02, node03]}
  nodes: {default: {gpus: 8}, node01: {gpus: 4}}
  topology:
    leaves: {leaf-1: [node01, node02], leaf-2: [node03]}
    spines: {spine-1: [leaf-1, leaf-2]}
profiles:
  two: {engine: sim, nodes: 2, gpus_per_node: 8, load_time: 10s, model: /models/two}
  one: {engine: sim, nodes: 1, gpus_per_node: 4, load_time: 10s, model: /models/one}
deployments:
  - {model: big, profile: two, replicas: 1}
  - {model: small, profile: one, replicas: 1}
faults:
  - {id: split, at: 40s, spine_down: {spine: spine-1, for: 30s}}
expect:
  - {event: replica.failed, model: big, within: [split, split+2s]}
  - {event: replica.placed, model: big, within: [split+2s, split+30s], never: true}
  - {event: replica.ready, model: big, within: [split+30s, split+50s]}
  - {event: node.link_down, within: [start, end], never: true}
  - {event: replica.failed, model: small, within: [start, end], never: true}
  - {at: end, ready_replicas: {big: 1, small: 1}}
"""


def test_a_spine_down_parts_the_replica_across_it_until_it_is_back(own_tmp: Path) -> None:
    """The only room for the two-node replica spans the split: it fails at once, its
    replacement placed there keeps dialling its leader and is ready only once the spine is
    back; the one-node replica and every port are untouched."""
    twin, real = both(SPLIT)
    assert decisions(real.trace, real.scenario.duration_ms) == twin
    (failed,) = events(real, "replica.failed")
    ready = [e for e in events(real, "replica.ready") if e.get("replica") == "big-r2"]
    assert failed.get("model") == "big" and ready
    assert ready[0].t_ms - failed.t_ms >= 2_500  # 30 s at time scale 0.1, less the tolerance


def test_a_fault_that_parts_some_nodes_needs_every_multi_node_profile_on_the_sim_engine() -> None:
    text = CUT_WORKER.replace("engine: sim, nodes: 2", "engine: vllm, nodes: 2")
    with pytest.raises(ValueError, match="only the sim engine's workers dial from their node"):
        check_real_supported(load_scenario_text(text, "t.yaml"))
    check_real_supported(load_scenario_text(CUT_WORKER, "t.yaml"))  # taken as it is
