"""What an agent registers with: its node as the inventory shows it, placed in the topology.

The inventory (`inventory.py`) reads the GPUs, the fabric and, from NVML, the NVLink domain; the
onboarding config names the leaf and spine switches, which nothing on the node tells, and may
name the domain too (docs/topology.md).
"""

from __future__ import annotations

import logging
from dataclasses import replace

from llmgw_twin.control.model import NodeInfo
from llmgw_twin.control.topology import DomainId, NodeTopology
from llmgw_twin.service.agent.config import AgentSettings
from llmgw_twin.service.agent.inventory import read_inventory, to_node_info

log = logging.getLogger("llmgw_twin.agent")


def read_node_info(settings: AgentSettings) -> NodeInfo:
    """The node as its inventory shows it under the configured root."""
    inv = read_inventory(settings.root, fabric=settings.fabric, use_nvml=settings.use_nvml)
    for warning in inv.warnings:
        log.warning("inventory: %s", warning)
    info = to_node_info(inv, settings.node, settings.gpu_memory_mib, settings.engine_names)
    return replace(info, topology=node_topology(settings.topology, inv.nvlink_domain))


def node_topology(named: NodeTopology | None, read: DomainId | None) -> NodeTopology | None:
    """Where the node sits: the onboarding config names its leaf and spine (nothing on the node
    tells them); its NVLink domain is the config's if it names one (said when NVML tells
    another), else what NVML tells."""
    if named is None:
        return None if read is None else NodeTopology(nvlink_domain=read)
    if named.nvlink_domain is None:
        return replace(named, nvlink_domain=read)
    if read is not None and read != named.nvlink_domain:
        log.warning(
            "inventory: NVML puts the GPUs in NVLink domain %s, the config names %s: "
            "the config's is taken",
            read,
            named.nvlink_domain,
        )
    return named
