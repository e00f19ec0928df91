"""The mass-loss guard: when most of the fleet falls silent at once, the silence is the
controller's own (its link, its switch), not the fleet's death.

Judged at every reconcile tick, from the health tracker's counts only (O(1)): when more than
`mass_loss_share` of the known, not-lost nodes are silent (suspect) and the fleet has at least
`mass_loss_min_nodes`, the guard holds. While it holds the controller declares no node lost and
fails no replica for silence, keeps routes to replicas on silent nodes, and places nothing new on
them; it resumes once at least `mass_loss_quorum` of the nodes it counted at the start of the
hold are alive again, and then counts the still-silent nodes' silence from that moment (real
losses during the hold are handled after it, one lost window later).

Invariant: `held` is true exactly between a `fleet.hold` event and the next `fleet.resumed`.
"""

from __future__ import annotations

from dataclasses import dataclass

from llmgw_twin.control.model import Timings


@dataclass(slots=True)
class MassLossGuard:
    timings: Timings
    held: bool = False
    since_ms: int = 0
    fleet: int = 0
    """The not-lost nodes counted when the hold began."""

    def should_hold(self, alive: int, suspect: int) -> bool:
        fleet = alive + suspect
        if self.held or fleet < max(1, self.timings.mass_loss_min_nodes):
            return False
        return suspect > self.timings.mass_loss_share * fleet

    def hold(self, now_ms: int, alive: int, suspect: int) -> None:
        self.held, self.since_ms, self.fleet = True, now_ms, alive + suspect

    def should_resume(self, alive: int) -> bool:
        return self.held and alive >= self.timings.mass_loss_quorum * self.fleet

    def resume(self) -> None:
        self.held = False
