"""The mass-loss guard: when most of the fleet falls silent at once, the silence is the
controller's own (its link, its switch), not the fleet's death; and when that silence lasts past
a bound, it is the fleet's after all.

Judged at every reconcile tick, from the health tracker's counts only (O(1)): when more than
`mass_loss_share` of the known, not-lost nodes are silent (suspect) and the fleet has at least
`mass_loss_min_nodes`, the guard holds. While it holds the controller declares no node lost and
fails no replica for silence, keeps routes to replicas on silent nodes, and places nothing new on
them; it resumes once at least `mass_loss_quorum` of the nodes it counted at the start of the
hold are alive again, and then counts the still-silent nodes' silence from that moment (real
losses during the hold are handled after it, one lost window later).

A hold ends after `mass_loss_hold_max` even if the fleet stays silent: the guard accepts the loss
(`fleet.loss_accepted`), the silent nodes' replicas leave routing and the nodes are declared lost
at the eviction pace (`control/pace.py`). Once accepted, the same silence is not held again; a
new hold needs the fleet out of mass silence first (enough of it heard or declared lost).

A hold's start is when the silence crossed the share (the last heartbeat of the node whose
silence tipped it, plus `node_suspect_after`): a controller that restarts mid-hold restores the
nodes' silence from the store, holds again from that same start, and so does not stretch the
bound.

Invariant: `held` is true exactly between a `fleet.hold` event and the next `fleet.resumed` or
`fleet.loss_accepted`; `held` and `accepted` are never both true.
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
    accepted: bool = False
    """The last hold ended by its bound: this silence is the fleet's, and is not held again."""

    def mass(self, alive: int, suspect: int) -> bool:
        """More than the share of a big enough fleet is silent."""
        fleet = alive + suspect
        if fleet < max(1, self.timings.mass_loss_min_nodes):
            return False
        return suspect > self.timings.mass_loss_share * fleet

    def tipping_index(self, alive: int, suspect: int) -> int:
        """Which silence (0: the longest) tipped the count over the share: the hold began when
        that node turned suspect."""
        return min(suspect - 1, int(self.timings.mass_loss_share * (alive + suspect)))

    def settle(self, alive: int, suspect: int) -> None:
        """An accepted loss is over once the fleet is out of mass silence."""
        if self.accepted and not self.mass(alive, suspect):
            self.accepted = False

    def should_hold(self, alive: int, suspect: int) -> bool:
        return not self.held and not self.accepted and self.mass(alive, suspect)

    def hold(self, since_ms: int, alive: int, suspect: int) -> None:
        self.held, self.since_ms, self.fleet = True, since_ms, alive + suspect

    def should_resume(self, alive: int) -> bool:
        return self.held and alive >= self.timings.mass_loss_quorum * self.fleet

    def resume(self) -> None:
        self.held = False

    def should_accept(self, now_ms: int) -> bool:
        return self.held and now_ms - self.since_ms >= self.timings.mass_loss_hold_max_ms

    def accept(self) -> None:
        self.held, self.accepted = False, True
