"""Shared builders for literal snapshots of the control core."""

from __future__ import annotations

from llmgw_twin.control.model import (
    EngineName,
    FabricId,
    ModelName,
    NodeId,
    NodeInfo,
    Profile,
    ProfileName,
    Timings,
)

T = Timings(10_000, 30_000, 60_000, 1_000)
"""Production defaults, spelled out: heartbeat 10s, suspect 30s, lost 60s, reconcile 1s."""
FOUR = (("n1", "ib-a"), ("n2", "ib-a"), ("n3", "ib-b"), ("n4", "ib-b"))
"""Two fabrics of two nodes each."""


def node(name: str, fabric: str, gpus: int = 8, engines: tuple[str, ...] = ("sim",)) -> NodeInfo:
    return NodeInfo(
        NodeId(name), FabricId(fabric), gpus, 81920, tuple(EngineName(e) for e in engines)
    )


def profile(
    name: str = "p", nodes: int = 2, gpus: int = 4, engine: str = "sim", load_ms: int = 20_000
) -> Profile:
    return Profile(ProfileName(name), EngineName(engine), nodes, gpus, f"/models/{name}", load_ms)


def model(name: str) -> ModelName:
    return ModelName(name)
