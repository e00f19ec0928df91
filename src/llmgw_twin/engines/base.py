"""What an engine adapter answers for one shard: its argv, environment, and how it is reached.

The controller hands an agent a `ShardSpec` and knows nothing of engine flags; the agent's shell
asks the adapter for that shard's `Launch`. Adapters are pure functions of the spec and the
`LaunchContext` (where the leader is, which ports to use, which binary to run).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from llmgw_twin.control.model import ShardSpec

DEFAULT_HTTP_PORT = 8000


@dataclass(frozen=True, slots=True)
class LaunchContext:
    """Where things are, as the agent that launches the shard knows it."""

    leader_host: str
    """Address the leader is reached at by its workers (its fabric address in production)."""
    http_port: int = DEFAULT_HTTP_PORT
    binary: str | None = None
    """The engine binary to run; None takes the adapter's default."""


@dataclass(frozen=True, slots=True)
class Launch:
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    serves_http: bool
    """Only the leader (rank 0) serves HTTP; workers open no client-facing port."""
    port: int | None
    health_path: str | None


class EngineAdapter(Protocol):
    name: str

    def launch(self, spec: ShardSpec, ctx: LaunchContext) -> Launch: ...
