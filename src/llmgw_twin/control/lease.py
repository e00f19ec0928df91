"""The leader lease: one controller leads at a time, each leader in a strictly higher epoch.

The lease lives in the store and its expiry is decided by the store's clock alone, never by a
controller's: a controller asks the store to `claim` or `renew` it, and the store answers from
the row it holds and its own time. `Lease` is the row; `claim` and `renew` are the decisions,
as data (the store applies a claim in one transaction with the row's read, and a renewal as
one conditional write of the row).

Fencing is what makes a deposed leader harmless, not the lease alone: every commit a leader
makes is conditional on the store's epoch still being its own (`Store.commit(..., epoch=E)`),
and every command it sends carries its epoch, so an agent that has seen a higher one refuses it.
The leader also steps down on its own clock before the lease could expire in the store's time
(`Leadership`), so that it stops acting before anyone else may start.

Invariants: epochs only grow; a lease held by another and not expired is never taken; a
renewal never changes the epoch.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Lease:
    holder: str
    epoch: int
    expires_ms: int
    """In the store's time."""


def claim(current: Lease | None, who: str, now_ms: int, lease_ms: int) -> Lease | None:
    """The lease after `who` asks to lead at the store's `now_ms`, or None when another holds
    it. A lease that expired is taken; so is one held under `who`'s own name (a new process of
    that controller: the old one is gone, and the new epoch fences whatever it left in flight)."""
    if current is None:
        return Lease(who, 1, now_ms + lease_ms)
    if current.holder != who and now_ms < current.expires_ms:
        return None
    return Lease(who, current.epoch + 1, now_ms + lease_ms)


def renew(current: Lease | None, who: str, epoch: int, now_ms: int, lease_ms: int) -> Lease | None:
    """The lease after its leader renews it, or None when the leader was deposed (another
    epoch holds the store). An expired lease nobody took is renewed: no one acted meanwhile."""
    if current is None or current.holder != who or current.epoch != epoch:
        return None
    return Lease(who, epoch, now_ms + lease_ms)


@dataclass(frozen=True, slots=True)
class LeaseTimes:
    """When a leader renews and steps down, and a standby retries, from `Timings.lease_ms`."""

    lease_ms: int

    @property
    def renew_every_ms(self) -> int:
        """A third of the lease: two renewals may fail before the leader steps down."""
        return max(1, self.lease_ms // 3)

    @property
    def step_down_after_ms(self) -> int:
        """On the leader's own clock, from the start of its last successful renewal: four fifths
        of the lease, so a clock up to a fifth slow still stops before the store's expiry."""
        return max(1, self.lease_ms * 4 // 5)

    @property
    def retry_every_ms(self) -> int:
        """How often a standby asks for the lease: a fifth of it."""
        return max(1, self.lease_ms // 5)
