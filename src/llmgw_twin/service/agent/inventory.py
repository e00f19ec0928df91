"""The node inventory a production agent reads at start: GPUs, InfiniBand ports and the fabric.

Everything is read under one root directory (default `/`), so tests, and real mode with many
simulated nodes on one machine, hand in a sysfs-shaped tree instead of the host's:
`<root>/sys/bus/pci/devices` for GPUs, `<root>/sys/class/infiniband` for ports. NVML (module
`pynvml` from `nvidia-ml-py`) is asked only when the root is the host's own (`HOST_ROOT`): it
describes the machine this process runs on and nothing else. It is imported lazily and optional.
NVML also tells the multi-node NVLink domain the GPUs are in (`nvlink.py`); sysfs does not. The
sysfs side (GPUs on PCI, InfiniBand ports, the reader that keeps the warnings) is
`inventory_sysfs.py`; its public names are importable from here too.

Invariants:
- Reading never raises over what it finds on disk or hears from NVML: a missing, unreadable or
  garbled file becomes a warning in `Inventory.warnings` and a neutral value (`None`,
  `"UNKNOWN"`, `0.0`), and the entry is kept or skipped as documented per field.
- The result depends only on the files (and NVML's answers), never on directory listing order:
  sysfs GPUs are ordered by PCI address and indexed 0..n-1, NVML GPUs keep NVML's index, ports
  are sorted by device name (natural order: mlx5_2 before mlx5_10) and port number. Paths in
  warnings are shown relative to the root, so the same tree gives the same warnings anywhere.
- The fabric is the operator's name when given; otherwise it is derived from the subnet prefix
  (the upper 64 bits of GID 0) of ACTIVE ports whose link layer is InfiniBand, as
  `ib-` + the prefix's four 4-digit groups joined by `-` (`ib-fe80-0000-0000-0000`).
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from llmgw_twin.control.model import ENGINES, EngineName, FabricId, NodeId, NodeInfo
from llmgw_twin.control.topology import DomainId, NodeTopology
from llmgw_twin.service.agent.inventory_sysfs import (
    GPU_CLASS_CODES,
    NVIDIA_VENDOR_ID,
    GpuDevice,
    IbPort,
    _ib_ports,
    _pci_address,
    _Reader,
    _sysfs_gpus,
    fell_off_the_bus,
)
from llmgw_twin.service.agent.nvlink import read_domain

__all__ = [
    "DEFAULT_SUBNET_PREFIX",
    "GPU_CLASS_CODES",
    "HOST_ROOT",
    "NVIDIA_VENDOR_ID",
    "GpuDevice",
    "GpuSource",
    "IbPort",
    "Inventory",
    "fabric_id_for_prefix",
    "fabric_links_up",
    "fell_off_the_bus",
    "normalize_subnet_prefix",
    "read_inventory",
    "to_node_info",
]

HOST_ROOT = Path("/")
"""The root that is this machine: only there does NVML describe the GPUs under the root."""

DEFAULT_SUBNET_PREFIX = "fe80:0000:0000:0000"
"""The InfiniBand default (link-local) prefix: every subnet manager left unconfigured uses it."""

GpuSource = Literal["nvml", "sysfs", "none"]

_MIB = 1024 * 1024
_PREFIX = re.compile(r"[0-9a-fA-F]{1,4}(?::[0-9a-fA-F]{1,4}){3}")


@dataclass(frozen=True, slots=True)
class Inventory:
    """What a node has, as read at agent start."""

    gpus: tuple[GpuDevice, ...]
    ib_ports: tuple[IbPort, ...]
    fabric: FabricId | None
    gpu_source: GpuSource  # where `gpus` came from; "none" when there are none
    warnings: tuple[str, ...] = ()
    failed_gpus: tuple[int, ...] = ()
    """Indexes of GPUs that are there but do not answer (fallen off the bus): not in `gpus`,
    but counted, so every other GPU keeps its index."""
    nvlink_domain: DomainId | None = None
    """The multi-node NVLink domain all its GPUs are in, as NVML tells (`nvlink.py`); None
    from sysfs, which does not tell."""


def normalize_subnet_prefix(text: str) -> str:
    """`"FE80:0:0:0"` -> `"fe80:0000:0000:0000"`; ValueError unless four hex groups."""
    text = text.strip()
    if not _PREFIX.fullmatch(text):
        raise ValueError(f"not a subnet prefix (four hex groups, e.g. fe80:0:0:0): {text!r}")
    return ":".join(f"{int(group, 16):04x}" for group in text.split(":"))


def fabric_id_for_prefix(prefix: str) -> FabricId:
    """The fabric id the inventory derives from a subnet prefix: `ib-fe80-0000-0000-0000`."""
    return FabricId("ib-" + normalize_subnet_prefix(prefix).replace(":", "-"))


def read_inventory(
    root: Path = Path("/"), *, fabric: str | None = None, use_nvml: bool = True
) -> Inventory:
    """Read the GPUs, InfiniBand ports and fabric of the node whose filesystem is at `root`.

    `fabric` is the operator's name for the node's fabric (from the onboarding config); it wins
    over anything derived. NVML is tried only when `use_nvml` and `root` is `HOST_ROOT`; if it
    cannot be imported or initialised, or reports no GPU, GPUs are read from sysfs instead and a
    warning says why.
    """
    if fabric is not None and not fabric.strip():
        raise ValueError("the operator's fabric name is empty")
    reader = _Reader(Path(root))
    sysfs_gpus, failed = _sysfs_gpus(reader)
    gpus: list[GpuDevice] | None = None
    if use_nvml and Path(root).resolve() == HOST_ROOT.resolve():
        gpus = _nvml_gpus(reader)
        if gpus is not None:
            failed = reader.lost  # NVML's indexes; sysfs's lost ones are moot
        if gpus is not None and len(gpus) != len(sysfs_gpus):
            reader.warn(
                f"NVML reports {len(gpus)} GPU(s) but sysfs lists {len(sysfs_gpus)} NVIDIA GPU "
                "function(s): a GPU may have fallen off the bus or be bound to another driver"
            )
    source: GpuSource = "sysfs" if gpus is None else "nvml"
    gpus = sysfs_gpus if gpus is None else gpus
    ports = _ib_ports(reader)
    chosen = FabricId(fabric.strip()) if fabric is not None else _derive_fabric(reader, ports)
    source = source if gpus or failed else "none"
    warnings = tuple(reader.warnings)
    domain = reader.nvlink_domain if source == "nvml" else None
    return Inventory(tuple(gpus), tuple(ports), chosen, source, warnings, tuple(failed), domain)


def fabric_links_up(root: Path) -> bool | None:
    """Whether the node can reach its fabric now: some InfiniBand port is ACTIVE. None when the
    node has no InfiniBand port at all (nothing to judge: a single-node machine, a test root)."""
    reader = _Reader(root)
    ports = [p for p in _ib_ports(reader) if p.link_layer in ("InfiniBand", "Unknown")]
    if not ports:
        return None
    return any(p.state == "ACTIVE" for p in ports)


def to_node_info(
    inv: Inventory, node: str, gpu_memory_mib_default: int, engines: Iterable[str]
) -> NodeInfo:
    """What the agent registers with: the GPU count, per-GPU memory and the fabric.

    Per-GPU memory is the smallest that NVML reported (placement must never overestimate a
    GPU), or `gpu_memory_mib_default` when none is known (sysfs does not tell).
    """
    if not node:
        raise ValueError("a node needs a name")
    if inv.fabric is None:
        raise ValueError(
            f"node {node}: no fabric: no ACTIVE InfiniBand port has a subnet prefix and the "
            "onboarding config names none; name the node's fabric in the onboarding config"
        )
    if gpu_memory_mib_default < 0:
        raise ValueError("gpu_memory_mib_default must not be negative")
    names = tuple(dict.fromkeys(engines))
    unknown = [e for e in names if e not in ENGINES]
    if unknown:
        raise ValueError(f"node {node}: unknown engine(s) {unknown}; known: {list(ENGINES)}")
    known = [g.memory_mib for g in inv.gpus if g.memory_mib is not None]
    memory = min(known) if known else gpu_memory_mib_default
    count = len(inv.gpus) + len(inv.failed_gpus)  # a failed GPU keeps its index, reported failed
    engine_names = tuple(EngineName(e) for e in names)
    topology = None if inv.nvlink_domain is None else NodeTopology(nvlink_domain=inv.nvlink_domain)
    return NodeInfo(NodeId(node), inv.fabric, count, memory, engine_names, topology)


def _nvml_gpus(r: _Reader) -> list[GpuDevice] | None:
    """GPUs as NVML reports them, or None (with a warning saying why) to fall back to sysfs."""
    try:
        nvml: Any = importlib.import_module("pynvml")
    except Exception as e:  # ImportError, or a broken install failing as it loads
        r.warn(f"NVML not used: module pynvml cannot be imported ({_describe(e)}); using sysfs")
        return None
    try:
        nvml.nvmlInit()
    except Exception as e:  # NVMLError (no driver, no library) or anything the binding raises
        r.warn(f"NVML not used: nvmlInit failed ({_describe(e)}); using sysfs")
        return None
    try:
        gpus = _nvml_devices(r, nvml)
        if gpus is not None:
            r.nvlink_domain = read_domain(nvml, r.handles, r.warn)
        return gpus
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception as e:
            r.warn(f"nvmlShutdown failed ({_describe(e)})")


def _nvml_devices(r: _Reader, nvml: Any) -> list[GpuDevice] | None:
    try:
        count = int(nvml.nvmlDeviceGetCount())
    except Exception as e:
        r.warn(f"NVML not used: nvmlDeviceGetCount failed ({_describe(e)}); using sysfs")
        return None
    if count <= 0:
        r.warn("NVML not used: it reports no GPU; using sysfs")
        return None
    gpus: list[GpuDevice] = []
    for index in range(count):
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
        except Exception as e:  # e.g. a GPU lost from the bus: unusable, so left out
            r.warn(f"NVML GPU {index}: no handle ({_describe(e)}); left out")
            r.lost.append(index)
            continue
        r.handles.append((index, handle))
        answers: dict[str, Any] = {}
        for what, call in (
            ("name", nvml.nvmlDeviceGetName),
            ("memory", nvml.nvmlDeviceGetMemoryInfo),
            ("PCI address", nvml.nvmlDeviceGetPciInfo),
            ("UUID", nvml.nvmlDeviceGetUUID),
        ):
            try:
                answers[what] = call(handle)
            except Exception as e:  # that field stays unknown; the GPU is still there
                r.warn(f"NVML GPU {index}: {what} unknown ({_describe(e)})")
        total = getattr(answers.get("memory"), "total", None)
        memory_mib = total // _MIB if isinstance(total, int) else None
        address = _pci_address(_as_str(getattr(answers.get("PCI address"), "busId", None)))
        name = _as_str(answers.get("name")) or "NVIDIA GPU"
        pci = address[1] if address is not None else "unknown"
        gpus.append(GpuDevice(index, pci, name, memory_mib, _as_str(answers.get("UUID")) or None))
    return gpus


def _as_str(value: Any) -> str | None:
    """NVML strings arrive as `str` from recent bindings and as `bytes` from older ones."""
    if isinstance(value, bytes):
        value = value.decode("ascii", "replace")
    return value.strip("\x00 ") if isinstance(value, str) else None


def _describe(e: BaseException) -> str:
    text = str(e)
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def _derive_fabric(r: _Reader, ports: list[IbPort]) -> FabricId | None:
    """The prefix most ACTIVE InfiniBand ports share (ties: the smallest), as a fabric id."""
    by_prefix: dict[str, list[str]] = {}
    for p in ports:
        if p.state == "ACTIVE" and p.link_layer == "InfiniBand" and p.subnet_prefix:
            by_prefix.setdefault(p.subnet_prefix, []).append(f"{p.device}/{p.port}")
    if not by_prefix:
        r.warn(
            "no fabric: no ACTIVE InfiniBand port has a subnet prefix; "
            "name the node's fabric in the onboarding config"
        )
        return None
    ranked = sorted(by_prefix.items(), key=lambda kv: (-len(kv[1]), kv[0]))
    prefix = ranked[0][0]
    if len(ranked) > 1:
        seen = "; ".join(f"{pfx} on {', '.join(names)}" for pfx, names in ranked)
        r.warn(
            f"ACTIVE InfiniBand ports disagree on the subnet prefix ({seen}); chose {prefix}, "
            "held by the most ports (ties: the smallest); name the fabric in the onboarding "
            "config to settle it"
        )
    if prefix == DEFAULT_SUBNET_PREFIX:
        r.warn(
            f"subnet prefix {prefix} is the InfiniBand default: fabrics left at the default "
            "cannot be told apart; give each fabric's subnet manager its own prefix or name "
            "the fabric in the onboarding config"
        )
    return fabric_id_for_prefix(prefix)
