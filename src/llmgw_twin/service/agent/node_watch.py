"""What a running agent keeps reading of its node: failed GPUs and the fabric links.

Role: the inventory (`inventory.py`) is read in full at start, for the registration; hardware
changes after that. `NodeWatch` re-reads the same files (or NVML) every `poll_interval_ms` and
turns what changed into the agent core's events: `GpuFailed` for a GPU that fell off the bus
(its config space reads all ones, NVML has no handle for it, or its PCI function is gone), and
`FabricLink` when the InfiniBand ports go down or come back. The agent then stops the engines
on a failed GPU (`engines_on`): a CUDA process on a GPU that stopped answering dies, or hangs in
the driver, and either way the shard is no use.

Invariants:
- A GPU once failed stays failed here (the core has no way back either): only an operator
  clears it, at the controller, and a node still reporting it failed is failed again.
- GPUs are matched by PCI address against the start inventory, so a GPU whose function
  vanished is found failed at its start index, and the other GPUs keep theirs.
- Reading never raises over what it finds (the inventory's rule); the blocking read is for a
  thread (`read`), the comparison is pure (`changes`).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from llmgw_twin.control.agent import LocalShard
from llmgw_twin.control.model import ShardKey
from llmgw_twin.control.protocol import AgentEvent, FabricLink, GpuFailed
from llmgw_twin.control.states import Phase
from llmgw_twin.service.agent.inventory import (
    Inventory,
    fabric_links_up,
    fell_off_the_bus,
    read_inventory,
)

POLL_MS_MIN = 10
POLL_MS_MAX = 1_000
ENGINE_PHASES = frozenset({Phase.ENGINE, Phase.RUNNING, Phase.SERVING, Phase.UNRESPONSIVE})
"""Phases in which a shard's engine process runs (as far as the agent has seen)."""


def poll_interval_ms(heartbeat_interval_ms: int) -> int:
    """A fortieth of the heartbeat interval (250 ms at the default 10 s), between 10 ms and 1 s:
    a change (a link up again, a GPU gone) is reported within a fraction of the controller's
    reconcile interval, as the twin's agent reports it at once, so every node of a fabric that
    comes back is heard by the same reconcile; a node reads a few small files each time."""
    return max(POLL_MS_MIN, min(POLL_MS_MAX, heartbeat_interval_ms // 40))


class NodeWatch:
    def __init__(self, root: Path, use_nvml: bool) -> None:
        self._root, self._use_nvml = root, use_nvml
        start = self._inventory()
        self._at_start = {g.pci_address: g.index for g in start.gpus if g.pci_address != "unknown"}
        self._by_sysfs = start.gpu_source != "nvml"
        """Read from sysfs: each GPU of the start is looked at by its own PCI function, a file
        or two, rather than the whole inventory again (49 files for 8 GPUs, several times a
        heartbeat on every node)."""
        devices = root / "sys/bus/pci/devices"
        self._functions = [(i, devices / address) for address, i in self._at_start.items()]
        """Each start GPU's index and its PCI function's sysfs directory."""
        self.failed: set[int] = set(start.failed_gpus)
        """Every GPU found failed so far, by index."""
        self.links_up: bool | None = fabric_links_up(root)
        """The InfiniBand ports' state as last read; None: the node has none."""

    def _inventory(self) -> Inventory:
        # the fabric's name is not watched (the links are): a given name skips deriving it
        return read_inventory(self._root, fabric="-", use_nvml=self._use_nvml)

    def read(self) -> tuple[set[int], bool | None]:
        """The failed GPUs and the link state now (blocking: file reads, maybe NVML)."""
        if self._by_sysfs:
            failed = {i for i, d in self._functions if not d.is_dir() or fell_off_the_bus(d)}
            return failed, fabric_links_up(self._root)
        inv = self._inventory()
        answering = {g.pci_address for g in inv.gpus}
        gone = {i for address, i in self._at_start.items() if address not in answering}
        return set(inv.failed_gpus) | gone, fabric_links_up(self._root)

    def changes(self, failed: set[int], links_up: bool | None) -> list[AgentEvent]:
        """The core events for what changed since the last read."""
        events: list[AgentEvent] = [GpuFailed(g) for g in sorted(failed - self.failed)]
        self.failed |= failed
        if links_up is not None and links_up != self.links_up:
            events.append(FabricLink(links_up))
        self.links_up = links_up if links_up is not None else self.links_up
        return events


def engines_on(failed: Iterable[int], shards: Iterable[LocalShard]) -> list[ShardKey]:
    """The shards whose engine runs on a failed GPU."""
    bad = set(failed)
    return [
        s.spec.key for s in shards if s.phase in ENGINE_PHASES and not bad.isdisjoint(s.spec.gpus)
    ]
