"""The routing core's values: a pick (`Route`), the passive ejection's and a router's waits'
settings (`Ejection`, `RouterTimeouts`), and why a pick found nothing (`NoRoute`). The routing
core (`routing.py`, which names them too) uses them; the twin's router and the service's
forwarding read them.

Pure: times are integer milliseconds.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from llmgw_twin.control.model import ReplicaId


@dataclass(frozen=True, slots=True)
class Route:
    replica: ReplicaId
    endpoint: str
    prefill: Route | None = None
    """For a role group's model: the prefill replica of the same group, which takes the request
    first (`docs/router.md`); this route is then its decode replica, which answers it. Both are
    picks of their own, each told `finished`."""


@dataclass(frozen=True, slots=True)
class Ejection:
    """Passive ejection: `failures` consecutive failed requests eject a replica for `base_ms`,
    doubled at each ejection in a row, at most `max_ms`."""

    failures: int = 3
    base_ms: int = 5_000
    max_ms: int = 60_000

    def __post_init__(self) -> None:
        if self.failures < 1 or self.base_ms < 1 or self.max_ms < self.base_ms:
            raise ValueError(
                "ejection: failures and base_ms must be at least 1, max_ms at least base_ms"
            )

    def backoff_ms(self, level: int) -> int:
        return min(self.base_ms << min(level, 30), self.max_ms)


@dataclass(frozen=True, slots=True)
class RouterTimeouts:
    """How long a router waits on a replica: to connect, for the first byte of its answer, and
    between two chunks of a streamed answer. The service's defaults, and the twin's."""

    connect_ms: int = 2_000
    first_byte_ms: int = 120_000
    between_chunks_ms: int = 60_000

    def __post_init__(self) -> None:
        if min(self.connect_ms, self.first_byte_ms, self.between_chunks_ms) < 1:
            raise ValueError("router timeouts must be at least 1 ms")


class NoRoute(StrEnum):
    """Why `pick` found nothing."""

    NO_REPLICA = "no_ready_replica"  # the table holds no routable replica of the model
    EJECTED = "all_ejected"  # every routable replica failed recently and waits out its back-off
    BUSY = "all_busy"  # every other routable replica is at its outstanding limit
