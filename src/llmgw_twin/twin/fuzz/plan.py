"""A fuzz seed's plan: its fleet, timings, deployments and fault schedule, as plain values.

`gen.generate(seed)` draws one; `gen.scenario_text(plan)` writes it as a scenario file; the
shrinker (`shrink.py`) cuts it down. Values only, so that plans cross process and Ray
boundaries.
"""

from __future__ import annotations

from dataclasses import dataclass

from llmgw_twin.control.model import Timings


@dataclass(frozen=True, slots=True)
class PlanNode:
    name: str
    gpus: int


@dataclass(frozen=True, slots=True)
class PlanProfile:
    name: str
    nodes: int
    gpus_per_node: int
    load_ms: int


@dataclass(frozen=True, slots=True)
class PlanDeployment:
    model: str
    profile: str
    replicas: int
    roles: tuple[tuple[str, str, int], ...] = ()
    """A role group's roles: (name, profile, count); `replicas` then counts groups."""


@dataclass(frozen=True, slots=True)
class PlanFault:
    """One fault of the schedule; only the fields its `kind` uses are set."""

    at_ms: int
    kind: str
    node: str = ""
    nodes: tuple[str, ...] = ()
    model: str = ""
    gpu: int = 0
    fabric: str = ""
    for_ms: int = 0
    replicas: int = 0
    controller: str = ""
    side: str = ""
    rate: str = ""
    by_ms: int = 0
    """`delay_heartbeats`: how late each heartbeat sent in the window arrives."""
    gpus: int = 0
    """`add_node`: the added node's GPUs."""
    profile: str = ""
    group: str = ""
    """A topology fault's leaf, spine or NVLink domain."""

    @property
    def end_ms(self) -> int:
        """When the fault is over (partitions, outages, the last late heartbeat landed); its
        instant for the others."""
        return self.at_ms + self.for_ms + self.by_ms


Groups = tuple[tuple[str, tuple[str, ...]], ...]
"""Names to members, in order: a leaf's or a domain's nodes, a spine's leaves."""


@dataclass(frozen=True, slots=True)
class PlanTopology:
    """The plan's `cluster.topology` (`topo.py`)."""

    leaves: Groups
    spines: Groups
    domains: Groups


@dataclass(frozen=True, slots=True)
class Plan:
    seed: int
    timings: Timings
    fabrics: tuple[tuple[str, tuple[PlanNode, ...]], ...]
    profiles: tuple[PlanProfile, ...]
    deployments: tuple[PlanDeployment, ...]
    faults: tuple[PlanFault, ...]
    """The fault phase, sorted by time; the heal (`heal_faults`) comes after it."""
    heal_at_ms: int
    enabled: tuple[str, ...]
    """The fault kinds this seed enabled (swarm testing); `faults` draws only from these."""
    controllers: int = 1
    """Controller processes on the one store (`cluster.controllers`)."""
    topology: PlanTopology | None = None
    """Leaves, spines and NVLink domains, in about a third of the seeds (`topo.py`)."""

    @property
    def nodes(self) -> tuple[PlanNode, ...]:
        return tuple(n for _, members in self.fabrics for n in members)

    def profile(self, name: str) -> PlanProfile:
        return next(p for p in self.profiles if p.name == name)
