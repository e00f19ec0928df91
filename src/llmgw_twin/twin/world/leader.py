"""One controller process of the twin: its core while it leads, its lease, its clock, its faults.

A process is a standby until it claims the lease in the shared store (`Store.claim_lease`, the
store's time deciding expiry); then it builds its core from the store (or, the first leader of
a fresh store, from the scenario's desired state) and leads in the epoch the store gave it. A
leader renews its lease every third of it, and at its deadline on its own clock, a fifth of the
lease before it could expire (`control.lease.LeaseTimes`), asks the store once: it goes on if the
lease is still its epoch's, and steps down otherwise. Every step it carries out is committed
conditionally on its epoch first: a commit the store refuses (`Fenced`: another leads now) or
cannot take (the store is down, or this process is cut from it) deposes it before any of the
step's events or commands leave, so a deposed leader never acts.

Its faults: killed (gone, timers dead), restarted (a new process, which takes its own name's
lease at once in a new epoch), stalled (timers and messages wait; on resuming it runs the late
timers with its memory and tells its core how late it is, as the service's lag monitor does),
cut from the store or the agents, and a clock running at another rate (its core's time and
timers follow its own clock; the store's time does not).
"""

from __future__ import annotations

from collections.abc import Callable
from fractions import Fraction
from math import ceil, floor
from typing import TYPE_CHECKING

from llmgw_twin.control.controller import Controller
from llmgw_twin.control.lease import Lease, LeaseTimes
from llmgw_twin.control.protocol import ControllerLagged
from llmgw_twin.store.sqlite import Fenced

if TYPE_CHECKING:
    from llmgw_twin.twin.world.controller import ControllerShell


class StoreUnreachable(Exception):
    """The store refused a call: it is down, or this process is cut from it."""


class ControllerProcess:
    def __init__(self, name: str, group: ControllerShell) -> None:
        self.name = name
        self.group = group
        self.times = LeaseTimes(group.timings.lease_ms)
        self.up = False
        self.generation = 0
        """Bumped when the process dies or steps down: its timers from before do nothing."""
        self.core: Controller | None = None
        """Its core while it leads (or believes it does); None for a standby."""
        self.epoch = 0
        self.stalled_until: int | None = None
        self._stalled_from = 0
        self._late: list[Callable[[], None]] = []
        """Timers that came due while stalled, in order."""
        self.cut_store = 0
        self.cut_agents = 0
        self._rate = Fraction(1)
        self._unskewed = True
        """Its clock runs at the world's rate: no fraction arithmetic for it (the same sums)."""
        self._base_world = 0
        self._base_local = 0
        self._renewed_local = 0
        """Its own time at the start of its last successful renewal."""
        self._deadline_armed = -1
        """The generation whose step-down check is pending (`_arm_deadline`), or -1."""

    # --- its clock ---------------------------------------------------------------------------

    def local(self) -> int:
        """This process's clock (the world's, unless skewed)."""
        return self.local_at(self.group.world.now)

    def local_at(self, world_ms: int) -> int:
        """This process's clock at the world's `world_ms` (at or after its last skew)."""
        if self._unskewed:
            return self._base_local + world_ms - self._base_world
        return self._base_local + floor((world_ms - self._base_world) * self._rate)

    @property
    def unskewed(self) -> bool:
        return self._unskewed

    def skew(self, rate: Fraction) -> None:
        self.group.world.heartbeats.land_all()  # what it heard so far, on its clock so far
        self._base_local, self._base_world = self.local(), self.group.world.now
        self._rate = rate
        self._unskewed = rate == 1

    def later(self, local_delay_ms: int, fn: Callable[[], None]) -> None:
        """Run `fn` after `local_delay_ms` of this process's time, if it is still the same
        process and leadership then; a timer due while stalled waits for the resume."""
        delay = max(0, local_delay_ms if self._unskewed else ceil(local_delay_ms / self._rate))
        self.group.world.on_timeout(delay, _Timer(self, self.generation, fn))

    # --- life --------------------------------------------------------------------------------

    @property
    def leading(self) -> bool:
        """It believes it leads (whether or not the store still agrees)."""
        return self.up and self.core is not None

    @property
    def listening(self) -> bool:
        """Agents' messages reach it and it acts on them."""
        return self.leading and self.stalled_until is None and not self.cut_agents

    def start(self) -> None:
        self.up = True
        self.generation += 1
        self._try_lead()

    def kill(self) -> None:
        """The process dies with its memory; a lease it held runs out in the store's time."""
        self.group.world.heartbeats.land_all()  # heartbeats to it are lost, not quiet
        if self.core is not None:
            self.group.lost_leader(self)
        self.up = False
        self.generation += 1
        self.core = None
        self.stalled_until = None
        self._late = []

    def stall(self, for_ms: int) -> None:
        if not self.up:
            return
        self.group.world.heartbeats.land_all()  # its core no longer hears them: not quiet
        now = self.group.world.now
        until = max(now + for_ms, self.stalled_until or 0)  # overlapping stalls: the longer
        if self.stalled_until is None:
            self._stalled_from = now
        self.stalled_until = until
        self.group.world.later(until - now, lambda: self._resume(until))

    def _resume(self, until: int) -> None:
        if self.stalled_until != until or not self.up:
            return
        self.stalled_until = None
        late, self._late = self._late, []
        stalled_for = self.group.world.now - self._stalled_from
        if self.core is not None and stalled_for > 0:
            # its event loop ran that late: the lag monitor tells the core, which forgives that
            # much of every node's silence (heartbeats it could not hear meanwhile)
            self.group.step(self, self.core.handle(ControllerLagged(stalled_for), self.local()))
        for fire in late:
            fire()

    # --- the lease ---------------------------------------------------------------------------

    def store_call(self, fn: Callable[[], object]) -> object:
        if self.cut_store or self.group.store_down:
            raise StoreUnreachable(self.name)
        return fn()

    def _try_lead(self) -> None:
        if not self.up or self.core is not None:
            return
        lease_ms = self.times.lease_ms
        store, now = self.group.store, self.group.world.now
        try:
            got = self.store_call(lambda: store.claim_lease(self.name, now, lease_ms))
        except StoreUnreachable:
            got = None
        if isinstance(got, Lease):
            self._lead(got)
        else:
            self.later(self.times.retry_every_ms, self._try_lead)

    def _lead(self, lease: Lease) -> None:
        self.group.world.heartbeats.land_all()  # heartbeats become events for the new core
        self.epoch = lease.epoch
        self.generation += 1
        self._renewed_local = self.local()
        self.group.emit(self, "controller.leader", controller=self.name, epoch=self.epoch)
        self.core = self.group.new_core(self)
        self._arm_deadline()
        self.later(self.times.renew_every_ms, self._renew)
        self.group.took_over(self)

    def _renew(self) -> None:
        if self.core is None:
            return
        refused = self._renew_in_store()
        if isinstance(refused, Fenced):
            self.step_down()
        elif refused is not None:
            self.later(self.times.retry_every_ms, self._renew)  # the deadline may come first
        else:
            self.later(self.times.renew_every_ms, self._renew)

    def _renew_in_store(self) -> Exception | None:
        """Renew the lease (and arm the next deadline); what refused it, else None."""
        started = self.local()
        lease_ms = self.times.lease_ms
        store, now = self.group.store, self.group.world.now
        try:
            self.store_call(lambda: store.renew_lease(self.name, self.epoch, now, lease_ms))
        except (Fenced, StoreUnreachable) as e:
            return e
        self._renewed_local = started
        self._arm_deadline()
        return None

    def _arm_deadline(self) -> None:
        """Check the step-down deadline of the last renewal when it comes: one check pending
        at a time, which, finding a renewal since, waits on for that one's deadline (a leader
        renews three times a lease; a check per renewal was two timers a lease for nothing)."""
        if self._deadline_armed == self.generation:
            return  # (a check of an earlier generation of the process never runs)
        self._deadline_armed = self.generation
        renewed = self._renewed_local
        wait = renewed + self.times.step_down_after_ms - self.local()

        def check() -> None:
            self._deadline_armed = -1
            if self.core is None:
                return
            if self._renewed_local == renewed:
                self._past_deadline()
            else:
                self._arm_deadline()

        self.later(wait, check)

    def _past_deadline(self) -> None:
        """Not renewed in time: it may no longer be the only one acting, so before anything
        else it asks the store once, as the service does (`service/controller/leadership.py`):
        a lease still its epoch's (no one took it) is renewed and it goes on; one taken, or a
        store it cannot reach, and it steps down."""
        if self._renew_in_store() is not None:
            self.step_down()

    def step_down(self) -> None:
        """It stops leading: its core and every timer of its leadership go; it is a standby
        again and asks for the lease from time to time."""
        if self.core is None:
            return
        self.group.world.heartbeats.land_all()  # heartbeats to it are lost, not quiet
        self.group.emit(self, "controller.deposed", controller=self.name, epoch=self.epoch)
        self.group.lost_leader(self, deposed=True)
        self.core = None
        self.generation += 1
        self.later(self.times.retry_every_ms, self._try_lead)


class _Timer:
    """A timer of one controller process (`ControllerProcess.later`): runs `fn` if the process
    is the same one and up, or holds it until a stall ends. An object rather than a closure
    that names itself: such a closure is a reference cycle, garbage only the cycle collector
    frees, and a run makes one per timer (`twin/world/runner.py` runs with that collector
    paused)."""

    __slots__ = ("fn", "generation", "proc")

    def __init__(self, proc: ControllerProcess, generation: int, fn: Callable[[], None]) -> None:
        self.proc = proc
        self.generation = generation
        self.fn = fn

    def __call__(self, _event: object = None) -> None:
        proc = self.proc
        if self.generation != proc.generation or not proc.up:
            return
        if proc.stalled_until is not None:
            proc._late.append(self)
            return
        self.fn()
