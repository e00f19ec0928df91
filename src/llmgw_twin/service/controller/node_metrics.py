"""The controller's per-node series on `/metrics` (docs/metrics.md, "Per node").

One series per node of each family, labelled `node` and `fabric`, read from the core at scrape
time with the rest of the fleet's gauges (`metrics.py`).

Invariants:
- Bounded: at most `NODE_SERIES_MAX` nodes get series. Past that the nodes that need looking at
  come first (not alive, a failed GPU, a fabric link down), then the others by name; how many
  were left out is `llmgw_node_series_omitted`. The fleet-wide gauges count every node.
- A node not heard from (suspect, lost) exports no link series: what it said last is not a
  current value (`llmgw_node_alive` 0 says why it is missing).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import GaugeMetricFamily, Metric

from llmgw_twin.control.model import NodeId, NodeState

if TYPE_CHECKING:
    from llmgw_twin.control.controller import Controller

NODE_SERIES_MAX = 1_000
"""The most nodes with series of their own: a scrape of a 10,000-node fleet stays small."""
LABELS = ["node", "fabric"]


def _needs_a_look(core: Controller, node: NodeId) -> bool:
    return (
        core.node_state(node) is not NodeState.ALIVE
        or bool(core.failed_gpus(node))
        or not core.link_up(node)
    )


def chosen(core: Controller, limit: int = NODE_SERIES_MAX) -> tuple[list[NodeId], int]:
    """The nodes given series (in name order) and how many were left out."""
    nodes = sorted(core.nodes())
    if len(nodes) <= limit:
        return nodes, 0
    first = [n for n in nodes if _needs_a_look(core, n)]
    rest = [n for n in nodes if not _needs_a_look(core, n)]
    kept = sorted((first + rest)[:limit])
    return kept, len(nodes) - len(kept)


def node_series(core: Controller, limit: int = NODE_SERIES_MAX) -> Iterator[Metric]:
    alive = GaugeMetricFamily(
        "llmgw_node_alive", "1 while the node is heard from, 0 suspect or lost", labels=LABELS
    )
    used = GaugeMetricFamily(
        "llmgw_node_gpus_in_use", "The node's GPUs held by a live replica's shard", labels=LABELS
    )
    failed = GaugeMetricFamily(
        "llmgw_node_gpus_failed", "The node's GPUs reported failed, not cleared", labels=LABELS
    )
    link = GaugeMetricFamily(
        "llmgw_node_fabric_link_up",
        "1 when the node's fabric link is up, 0 down; absent while the node is not heard from",
        labels=LABELS,
    )
    nodes, omitted = chosen(core, limit)
    for node in nodes:
        info = core.node_info(node)
        assert info is not None
        labels = [str(node), info.fabric]
        heard = core.node_state(node) is NodeState.ALIVE
        alive.add_metric(labels, int(heard))
        used.add_metric(labels, sum(len(spec.gpus) for spec in core.assigned(node)))
        failed.add_metric(labels, len(core.failed_gpus(node)))
        if heard:
            link.add_metric(labels, int(core.link_up(node)))
    yield from (alive, used, failed, link)
    yield GaugeMetricFamily(
        "llmgw_node_series_omitted",
        f"Nodes without per-node series (at most {limit} nodes have them)",
        value=omitted,
    )
