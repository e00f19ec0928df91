"""The topology in the services: an agent registers the leaf, spine and NVLink domain its
onboarding config names (a fake root's inventory reads none), and the controller's config gives a
profile its rules."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmgw_twin.control.topology import NodeTopology, TopologyRules
from llmgw_twin.service.agent.config import ConfigError, load_agent_config
from llmgw_twin.service.agent.fakesysfs import fabric_prefix_for, write_sysfs_root
from llmgw_twin.service.agent.node_info import read_node_info
from llmgw_twin.service.controller.config import load_controller_config

AGENT = (
    "node: n1\n"
    "controller: http://controller.test\n"
    "listen: {host: 127.0.0.1, port: 9}\n"
    "root: n1\n"
    "ports: {first: 20000, last: 20007}\n"
)


def agent_info(tmp_path: Path, extra: str) -> object:
    if not (tmp_path / "n1").exists():
        write_sysfs_root(
            tmp_path / "n1", gpus=2, fabric_prefix=fabric_prefix_for("ib-a"), node="n1"
        )
    path = tmp_path / "n1.yaml"
    path.write_text(AGENT + extra)
    return read_node_info(load_agent_config(path))


def test_the_agent_registers_the_topology_its_config_names(tmp_path: Path) -> None:
    info = agent_info(tmp_path, "topology: {leaf: leaf-1, nvlink_domain: nvl-1}\n")
    assert info.topology == NodeTopology("leaf-1", None, "nvl-1")  # type: ignore[attr-defined, arg-type]
    assert agent_info(tmp_path, "").topology is None  # type: ignore[attr-defined]


def test_the_agent_refuses_an_unknown_level(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="rack"):
        agent_info(tmp_path, "topology: {rack: r1}\n")


def test_the_controller_config_gives_a_profile_its_rules(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(
        "listen: {host: 127.0.0.1, port: 9}\n"
        f"store: {tmp_path / 'c.db'}\n"
        "profiles:\n"
        "  tp: {engine: sim, nodes: 2, gpus_per_node: 4, model: /m, nvlink: same_domain,"
        " leaves: fewest}\n"
        "  plain: {engine: sim, gpus_per_node: 4, model: /m}\n"
    )
    profiles = {str(p.name): p for p in load_controller_config(path).profiles}
    assert profiles["tp"].topology == TopologyRules("same_domain", "fewest")
    assert profiles["plain"].topology == TopologyRules()
    path.write_text(path.read_text().replace("fewest", "most"))
    with pytest.raises(Exception, match="leaves"):
        load_controller_config(path)
