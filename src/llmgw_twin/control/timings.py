"""The control plane's settings: `Timings`, every period, grace, budget and threshold the core
runs by, and their validation.

Part of the control plane's vocabulary (`control/model.py`, which re-exports `Timings`, so it is
imported from there). A scenario's `timings:` and the controller's config set the fields by their
names (`docs/scenarios.md`); the defaults are the production defaults, and `docs/faults.md` gives
the reasoning behind each.

Invariants: a `Timings` is frozen and valid once built (`__post_init__` refuses a period or
threshold at or below zero, a negative grace or budget, a share outside (0, 1] and a misordered
pair, `misordered()`); times are integer milliseconds (`*_ms`), so virtual time never drifts.
Nothing in this module does I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from llmgw_twin.control.model import Profile


@dataclass(frozen=True, slots=True)
class Timings:
    """Control-plane settings. Defaults are the production defaults; `docs/faults.md` gives the
    reasoning behind each."""

    heartbeat_interval_ms: int = 10_000
    node_suspect_after_ms: int = 30_000
    node_lost_after_ms: int = 60_000
    reconcile_interval_ms: int = 1_000
    # mass-loss guard: the controller's own partition is not the fleet's death
    mass_loss_share: float = 0.5
    """Hold failing and reaping when more than this share of the fleet is silent at once."""
    mass_loss_quorum: float = 0.5
    """Resume judging once at least this share of the fleet is heard again."""
    mass_loss_min_nodes: int = 4
    """Fleets smaller than this are never held: one node's silence is too little to tell."""
    mass_loss_hold_max_ms: int = 600_000
    """A hold lasts at most this long: then the controller accepts the loss, takes the silent
    nodes' replicas out of service and declares the nodes lost at the eviction pace."""
    # the pace of disruption (control/pace.py)
    eviction_window_ms: int = 60_000
    eviction_budget: int = 16
    """The most replicas taken down in the fleet within an eviction window, for silence (a node
    declared lost) or by a drain or defragmentation move; 0: no limit."""
    eviction_fabric_budget: int = 8
    """The same within one fabric; 0: no limit."""
    # crash loops
    restart_backoff_ms: int = 10_000
    """The delay before the second replacement of a model within the failure window; it doubles
    with each further failure, up to `restart_backoff_max_ms`. The first replacement waits for
    nothing."""
    restart_backoff_max_ms: int = 300_000
    failure_window_ms: int = 600_000
    """Failures older than this no longer count toward back-off or quarantine."""
    quarantine_after: int = 3
    """Failures of one profile's shards on one node, within the window, that quarantine it."""
    quarantine_for_ms: int = 1_800_000
    failure_half_life_ms: int = 3_600_000
    """How fast a failure's weight in a node's failure score decays: each of the engine's own
    failures adds 1, halved every half-life, so a slow loop adds up where the window forgets."""
    quarantine_score: float = 4.0
    """The failure score of one profile on one node that quarantines it (besides
    `quarantine_after` within the window, which catches fast loops sooner)."""
    # readiness
    start_grace_ms: int = 60_000
    """A replica must be ready within twice its load time plus this (unless its profile sets
    `start_timeout`), or it is failed and replaced elsewhere."""
    probe_interval_ms: int = 5_000
    """How often an agent probes a serving leader's health endpoint."""
    unresponsive_grace_ms: int = 20_000
    """How long a leader may fail its probes (out of routing meanwhile) before its replica is
    failed and replaced."""
    forget_lost_after_ms: int = 86_400_000
    """A node lost this long (and holding nothing) is forgotten: a decommissioned node does not
    stay in the registry forever. If it comes back, it joins as a new node."""
    node_history_half_life_ms: int = 600_000
    """How fast a node's instability (its losses, reboots and unheard spells) decays: placement
    prefers the steadier of two nodes that tie on packing (docs/placement.md)."""
    # defragmentation (docs/placement.md)
    defrag_max_moves: int = 4
    """The most running replicas one defragmentation moves to make room for an unplaceable
    one (each make-before-break); 0 switches defragmentation off."""
    defrag_moves_across_fabrics: int = 2
    """Of one defragmentation's moves, how many may take a replica to another fabric (wholly:
    no replica ever spans two) when no plan within fabrics exists; 0 keeps every move in its
    fabric."""
    defrag_interval_ms: int = 60_000
    """The least time between the starts of two defragmentations."""
    # several controllers (docs/high-availability.md)
    lease_ms: int = 15_000
    """How long a leader's lease lasts in the store's time without renewal. The leader renews it
    every third of it and steps down on its own clock a fifth before it could expire; a standby
    tries to take an expired lease every fifth of it."""

    def __post_init__(self) -> None:
        for name in (
            "heartbeat_interval_ms",
            "node_suspect_after_ms",
            "node_lost_after_ms",
            "reconcile_interval_ms",
            "restart_backoff_ms",
            "restart_backoff_max_ms",
            "failure_window_ms",
            "quarantine_after",
            "quarantine_for_ms",
            "failure_half_life_ms",
            "quarantine_score",
            "probe_interval_ms",
            "forget_lost_after_ms",
            "node_history_half_life_ms",
            "lease_ms",
            "mass_loss_hold_max_ms",
            "eviction_window_ms",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")
        for name in (
            "start_grace_ms",
            "unresponsive_grace_ms",
            "mass_loss_min_nodes",
            "defrag_max_moves",
            "defrag_moves_across_fabrics",
            "defrag_interval_ms",
            "eviction_budget",
            "eviction_fabric_budget",
        ):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must not be negative")
        if problems := self.misordered():
            raise ValueError(problems[0])
        for name in ("mass_loss_share", "mass_loss_quorum"):
            if not 0 < getattr(self, name) <= 1:
                raise ValueError(f"{name} must be a share above 0 and at most 1")

    def misordered(self) -> list[str]:
        """The orderings between settings that do not hold, each as an error naming its keys
        (empty: all hold). A heartbeat must come before the silence that makes a node suspect,
        and suspicion before loss, or a healthy node turns suspect between two heartbeats; a
        back-off's first step may not exceed its cap."""
        out = []
        if self.heartbeat_interval_ms >= self.node_suspect_after_ms:
            out.append(
                "heartbeat_interval must be shorter than node_suspect_after: a healthy node "
                "would turn suspect between two heartbeats"
            )
        if self.node_suspect_after_ms >= self.node_lost_after_ms:
            out.append("node_suspect_after must be shorter than node_lost_after")
        if self.restart_backoff_ms > self.restart_backoff_max_ms:
            out.append("restart_backoff must not exceed restart_backoff_max")
        return out

    def start_deadline_ms(self, profile: Profile) -> int:
        """How long a replica of `profile` may take from placement to ready."""
        if profile.start_timeout_ms > 0:
            return profile.start_timeout_ms
        return 2 * profile.load_time_ms + self.start_grace_ms
