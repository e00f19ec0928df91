"""When the twin reconciles a controller's core: only when the core needs it.

Each core has one chain of relays on its reconcile grid, each scheduled from the last on the
process's own clock (late after a stall), so that a reconcile that runs runs at the instant of
the grid it always did. A relay runs the core's reconcile (and the twin's routing probe) only
when an input changed something since the last one (a step of `handle`, a coasting node landed)
or the core has a deadline by now (`Controller.reconcile_would_act`, `control/wake.py`: a relay
of a clock skewed slower comes before its grid instant, and a reconcile then acts on what is
due by then).

While nothing is under way the core knows its earliest deadline (`Controller.quiet_until_ms`),
and the next relay is the first instant of the grid at or after it: a quiet fleet costs one
event per deadline (the store clock's write, every heartbeat interval), not one per grid
instant. An input that changes something brings the chain forward to the next instant of the
grid, this one if it has not reconciled yet (`_soon`). A process whose clock is skewed keeps a
relay on every instant (its timers' rounding is per relay). A skipped reconcile is one that
would have changed nothing; what moves is where a relay falls among the events of its
millisecond (an input landing on an instant of the grid is reconciled in that instant; a relay
brought forward comes after what was already due in its instant), which changed the trace of 1
of 300 fuzzed seeds (two standbys claiming a lease in one millisecond) and of no scenario file,
and whether a request arriving in the very millisecond its replica becomes ready finds it
(`tests/test_twin_traffic.py`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from llmgw_twin.control.controller import Controller
from llmgw_twin.control.protocol import Step
from llmgw_twin.twin.world.leader import ControllerProcess


@dataclass(slots=True)
class _Chain:
    core: Controller
    generation: int
    want: int | None
    """The local time the core asked to be reconciled at."""
    changed: bool
    """An input changed something since the last reconcile."""
    at: int
    """The local time of the next relay."""
    token: int
    fired: int | None = None
    """The local time of the last relay that reconciled."""


class Reconciles:
    def __init__(self, tick: Callable[[ControllerProcess], None]) -> None:
        self._tick = tick
        self._chains: dict[str, _Chain] = {}
        self._tokens = 0
        self._ticking: Controller | None = None
        self.skipped = 0
        """Relays that found nothing to do (for the benchmarks)."""

    def _chain(self, proc: ControllerProcess) -> _Chain | None:
        chain = self._chains.get(proc.name)
        if chain is None or chain.core is not proc.core or chain.generation != proc.generation:
            return None
        return chain

    def stepped(self, proc: ControllerProcess, step: Step) -> None:
        """`proc`'s core returned `step`: a reconcile's own says when the next is needed; any
        other with a wake-up (an input that changed something, or the core's start) makes the
        next relay reconcile."""
        core = proc.core
        if step.wake_at_ms is None or core is None:
            return
        if self._ticking is core:
            chain = self._chain(proc)
            if chain is not None:
                chain.want = step.wake_at_ms
            return
        chain = self._chain(proc)
        if chain is None:  # a core's start: the first reconcile when it asks
            first = step.wake_at_ms
            self._schedule(proc, _Chain(core, proc.generation, first, False, first, 0))
            return
        self._soon(proc, chain)

    def changed(self, proc: ControllerProcess, core: Controller) -> None:
        """Something was told to `core` outside `handle` (a coasting node landed)."""
        chain = self._chain(proc)
        if chain is not None and chain.core is core:
            self._soon(proc, chain)

    def _soon(self, proc: ControllerProcess, chain: _Chain) -> None:
        """An input changed something: the next instant of the grid reconciles (this one, if
        it has not reconciled yet), the chain brought forward if it waited past it."""
        chain.changed = True
        now = proc.local()
        soon = chain.core.reconcile_at_or_after(now)
        assert soon is not None  # a started core has a grid
        if soon == chain.fired:
            soon = chain.core.reconcile_at_or_after(now + 1)
            assert soon is not None
        if soon < chain.at:
            chain.at = soon
            self._schedule(proc, chain)

    def _schedule(self, proc: ControllerProcess, chain: _Chain) -> None:
        self._tokens += 1
        chain.token = token = self._tokens
        self._chains[proc.name] = chain
        proc.later(chain.at - proc.local(), lambda: self._relay(proc, token))

    def _relay(self, proc: ControllerProcess, token: int) -> None:
        chain = self._chain(proc)
        if chain is None or chain.token != token:
            return  # a later core, or superseded by a sooner relay
        now = proc.local()
        core = chain.core
        if chain.changed or core.reconcile_would_act(now):
            chain.changed = False
            chain.fired = now
            chain.want = None
            self._ticking = core
            try:
                self._tick(proc)
            finally:
                self._ticking = None
            if self._chain(proc) is not chain:
                return  # the reconcile cost it the lead: a new core starts its own chain
            due = core.reconcile_due_ms
        else:
            self.skipped += 1
            due = core.reconcile_at_or_after(now + 1)
        assert due is not None  # a started core has a grid
        quiet = core.quiet_until_ms()
        if quiet is not None and proc.unskewed:
            # nothing under way: the next relay is the first instant of the grid a reconcile
            # could act at (an input sooner brings it forward, `_soon`)
            jump = core.reconcile_at_or_after(max(due, quiet))
            assert jump is not None
            due = jump
        chain.at = due if chain.want is None else min(due, chain.want)
        self._schedule(proc, chain)
