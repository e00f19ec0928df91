"""Importing a topology from ibnetdiscover output and Topograph's node labels: the cluster
section printed loads as a scenario, with each node where the sample file puts it."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmgw_twin.cli import main
from llmgw_twin.control.topology import NodeTopology
from llmgw_twin.twin.scenario.loader import load_scenario_text
from llmgw_twin.twin.scenario.topo_import import (
    TopologyImportError,
    from_ibnetdiscover,
    from_topograph,
    render,
)

DATA = Path(__file__).parent / "data" / "topology"


def places(cluster_yaml: str) -> dict[str, NodeTopology | None]:
    text = f"name: imported\nduration: 1m\n{cluster_yaml}"
    return {n.node: n.topology for n in load_scenario_text(text, "imported.yaml").nodes}


def test_ibnetdiscover_leaves_spines_and_nodes() -> None:
    got = from_ibnetdiscover((DATA / "ibnetdiscover.txt").read_text())
    assert got.nodes == ["node01", "node02", "node03", "node04", "node05"]  # no SHARP node
    # node02 has two rails: it is under its first adapter's leaf
    assert got.leaves == {
        "leaf-1": ["node01", "node02"],
        "leaf-2": ["node03", "node04"],
        "leaf-3": ["node05"],
    }
    assert got.spines == {"spine-1": ["leaf-1", "leaf-2"], "spine-2": ["leaf-3"]}
    topo = places(render(got, "ib-a"))
    assert topo["node03"] == NodeTopology("leaf-2", "spine-1", None)  # type: ignore[arg-type]


def test_topograph_labels_old_and_new_keys() -> None:
    got = from_topograph((DATA / "topograph-nodes.json").read_text())
    topo = places(render(got, "ib-x"))
    assert topo["gb-node01"] == NodeTopology("sw-leaf-01", "sw-spine-01", "nvl72-rack1")  # type: ignore[arg-type]
    assert topo["gb-node04"] == NodeTopology("sw-leaf-03", "sw-spine-02", "nvl72-rack2")  # type: ignore[arg-type]
    assert topo["cpu-node01"] is None


def test_a_plain_label_mapping_and_odd_names() -> None:
    got = from_topograph(
        "n1: {nvidia.com/gpu.clique: 'a1b2.7', network.topology.nvidia.com/leaf: 'sw 1'}\n"
        "n2: {nvidia.com/gpu.clique: 'a1b2.7'}\n"
    )
    assert got.domains == {"a1b2.7": ["n1", "n2"]}
    assert got.leaves == {"sw_1": ["n1"]}


@pytest.mark.parametrize(
    ("fn", "text"),
    [(from_ibnetdiscover, "hello\n"), (from_topograph, "[1, 2]\n"), (from_topograph, "{}\n")],
)
def test_other_files_are_refused(fn: object, text: str) -> None:
    with pytest.raises(TopologyImportError):
        fn(text)  # type: ignore[operator]


def test_the_command_prints_the_section(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["topology", "import", "ibnetdiscover", str(DATA / "ibnetdiscover.txt")]
    assert main([*argv, "--fabric", "ib-b"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("cluster:\n  fabrics:\n    ib-b: [node01,")
    places(out)
    assert main(["topology", "import", "topograph", str(DATA / "ibnetdiscover.txt")]) == 2
    assert "topology import" in capsys.readouterr().err
