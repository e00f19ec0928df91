"""What one call into the controller has decided so far: trace events and durable writes.

Every part of the controller core emits into the one `Outbox` it was handed; the controller
turns it into a `Step` at the end of each call (`flush`), so the events and writes of one
decision always leave together, in the order they were made.
"""

from __future__ import annotations

from llmgw_twin.control.durable import Write
from llmgw_twin.control.model import TraceEvent
from llmgw_twin.control.protocol import ControllerCommand, Step


class Outbox:
    def __init__(self) -> None:
        self.now_ms = 0
        self._events: list[TraceEvent] = []
        self._writes: list[Write] = []
        self._commands: list[ControllerCommand] = []

    def command(self, command: ControllerCommand) -> None:
        """A command decided outside the tick's own assignment pass (a report request)."""
        self._commands.append(command)

    def emit(self, kind: str, **subjects: object) -> None:
        self._events.append(TraceEvent.of(self.now_ms, kind, **subjects))

    def write(self, write: Write) -> None:
        self._writes.append(write)

    def flush(
        self, commands: tuple[ControllerCommand, ...] = (), wake_at_ms: int | None = None
    ) -> Step:
        events, self._events = tuple(self._events), []
        writes, self._writes = tuple(self._writes), []
        if self._commands:
            commands, self._commands = (*commands, *self._commands), []
        return Step(commands, events, wake_at_ms, writes)
