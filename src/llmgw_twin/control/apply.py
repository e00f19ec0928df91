"""How a shell carries out one controller step: the one routine both shells use.

Order matters and is the same in the twin and in the service: the step's durable writes are
committed first (one transaction: nothing leaves the process for a decision a crash could
forget), then its events are published in order (trace, event log, router), then its commands
are sent. The routine itself does no I/O: each shell hands in its own three actions.
"""

from __future__ import annotations

from collections.abc import Callable

from llmgw_twin.control.durable import Write
from llmgw_twin.control.model import TraceEvent
from llmgw_twin.control.protocol import ControllerCommand, Step


def apply_step(
    step: Step,
    *,
    commit: Callable[[tuple[Write, ...]], None],
    publish: Callable[[TraceEvent], None],
    send: Callable[[ControllerCommand], None],
) -> None:
    commit(step.writes)
    for event in step.events:
        publish(event)
    for command in step.commands:
        send(command)
