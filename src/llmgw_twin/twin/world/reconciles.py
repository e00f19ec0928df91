"""When the twin reconciles a controller's core: only when the core needs it.

Each core has one chain of relays on its reconcile grid, scheduled exactly as the reconciles
always were (each from the last, on the process's own clock, late after a stall), so that a
reconcile that runs runs at the same instant and in the same place among that instant's events
as before. A relay runs the core's reconcile (and the twin's routing probe) only when an input
changed something since the last one (a step of `handle`, a coasting node landed) or the core
has a deadline by now (`Controller.reconcile_would_act`, `control/wake.py`: a relay of a clock
skewed slower comes before its grid instant, and a reconcile then acts on what is due by
then); otherwise it costs one event. The next relay is the next of the grid, or the instant the
core asked for (`Step.wake_at_ms`) if sooner. A skipped reconcile is one that would have
changed nothing, so the trace is what it was.
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
        chain.changed = True  # the next relay, on the grid, reconciles

    def changed(self, proc: ControllerProcess, core: Controller) -> None:
        """Something was told to `core` outside `handle` (a coasting node landed)."""
        chain = self._chain(proc)
        if chain is not None and chain.core is core:
            chain.changed = True

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
        chain.at = due if chain.want is None else min(due, chain.want)
        self._schedule(proc, chain)
