"""Heartbeats held back on purpose: the agent's side of real mode's `delay_heartbeats`.

With `late_heartbeats_file` in its config (real mode writes it, `realmode/late.py`), the agent
reads that file at each heartbeat it sends: the lateness in force at that instant (the last of
its lines, `SINCE_NS DELAY_MS` on `CLOCK_BOOTTIME`, made by then). A heartbeat sent while it is
above 0 is posted that much later, never before a late one sent earlier (in the order sent, as
a slow management path delivers them); one sent on time once the window is over goes at once,
as in the twin, and the late ones still on their way come after it. The agent's reports of a
change are not held back, so a late heartbeat may reach the controller after a newer report,
which then takes it as a sign of life only (its report version is older). Without the setting
nothing is read.

Invariant: a missing, unreadable or malformed file means no lateness (logged once per text): a
late heartbeat is a fault put on the node from outside, never the agent's own error.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

log = logging.getLogger("llmgw_twin.agent")

MAX_DELAY_MS = 24 * 3600 * 1000


def lateness_at(text: str, t_ns: int) -> int:
    """The lateness in force at `t_ns`: the last line's at or before it (0 before any);
    ValueError for a line that is not `SINCE_NS DELAY_MS`."""
    late = 0
    for line in text.splitlines():
        if not line.strip():
            continue
        since, ms = (int(x) for x in line.split())
        if not 0 <= ms <= MAX_DELAY_MS:
            raise ValueError(f"a lateness is 0 to {MAX_DELAY_MS} ms, got {ms}")
        if since > t_ns:
            break
        late = ms
    return late


class LateHeartbeats:
    """The node's lateness file, and when its last late heartbeat is due (to keep the order)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.last_due = 0.0
        """On the event loop's clock: when the latest late heartbeat is to be posted."""
        self._warned: str | None = None

    def now_ms(self) -> int:
        """The lateness in force now (0: heartbeats go on time)."""
        try:
            text = self.path.read_text(encoding="ascii")
        except OSError:
            return 0
        try:
            return lateness_at(text, time.clock_gettime_ns(time.CLOCK_BOOTTIME))
        except ValueError as e:
            if text != self._warned:
                self._warned = text
                log.warning("late heartbeats file %s unreadable, none late: %s", self.path, e)
            return 0

    def due(self, now: float, late_ms: int) -> float:
        """When a heartbeat sent at `now` with `late_ms` of lateness is to be posted: that much
        later, and not before the one sent before it."""
        self.last_due = max(now + late_ms / 1000, self.last_due)
        return self.last_due
