"""The node inventory a production agent reads at start: GPUs, InfiniBand ports and the fabric.

Everything is read under one root directory (default `/`), so tests, and real mode with many
simulated nodes on one machine, hand in a sysfs-shaped tree instead of the host's:
`<root>/sys/bus/pci/devices` for GPUs, `<root>/sys/class/infiniband` for ports. NVML (module
`pynvml` from `nvidia-ml-py`) is asked only when the root is the host's own (`HOST_ROOT`): it
describes the machine this process runs on and nothing else. It is imported lazily and optional.
NVML also tells the multi-node NVLink domain the GPUs are in (`nvlink.py`); sysfs does not.

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
import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from llmgw_twin.control.model import ENGINES, EngineName, FabricId, NodeId, NodeInfo
from llmgw_twin.control.topology import DomainId, NodeTopology
from llmgw_twin.service.agent.nvlink import read_domain

HOST_ROOT = Path("/")
"""The root that is this machine: only there does NVML describe the GPUs under the root."""

NVIDIA_VENDOR_ID = 0x10DE
GPU_CLASS_CODES = frozenset({0x0300, 0x0302})
"""PCI base class + subclass (the class file's upper 16 bits): VGA-compatible, 3D controller.
NVIDIA's other functions (HDMI audio 0x0403, NVSwitch 0x0680, bridges 0x0604) are not GPUs."""

DEFAULT_SUBNET_PREFIX = "fe80:0000:0000:0000"
"""The InfiniBand default (link-local) prefix: every subnet manager left unconfigured uses it."""

GpuSource = Literal["nvml", "sysfs", "none"]

_READ_LIMIT = 4096  # sysfs attributes fit in a page; a larger file is not an attribute
_MIB = 1024 * 1024
_PCI_ADDRESS = re.compile(r"([0-9a-f]{4,8}):([0-9a-f]{2}):([0-9a-f]{2})\.([0-7])")
_STATE = re.compile(r"(?:(\d+)\s*:\s*)?([A-Za-z_<>][A-Za-z_<> ]*)")
_RATE = re.compile(r"(\d+(?:\.\d+)?)\s*Gb/sec\b.*")
_PREFIX = re.compile(r"[0-9a-fA-F]{1,4}(?::[0-9a-fA-F]{1,4}){3}")


@dataclass(frozen=True, slots=True)
class GpuDevice:
    """One GPU: its index on this node, where it sits on PCI, and what is known of it."""

    index: int
    pci_address: str  # sysfs form, lower case: "0000:18:00.0"
    name: str
    memory_mib: int | None = None  # None when unknown (sysfs does not say)
    uuid: str | None = None  # "GPU-..." from NVML; None from sysfs


@dataclass(frozen=True, slots=True)
class IbPort:
    """One port of an RDMA device as `/sys/class/infiniband/<device>/ports/<port>` shows it."""

    device: str
    port: int
    state: str  # "ACTIVE", "DOWN", "INIT", "ARMED", ... or "UNKNOWN" when unreadable
    phys_state: str  # "LinkUp", "Polling", "Disabled", ... or "UNKNOWN"
    rate_gbps: float  # 0.0 when unreadable
    link_layer: str  # "InfiniBand", "Ethernet" (RoCE) or "Unknown"
    subnet_prefix: str | None  # upper 64 bits of GID 0, "fe80:0000:0000:0000"; None if none


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


class _Reader:
    """Reads small text files under the root and keeps the warnings."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.warnings: list[str] = []
        self.lost: list[int] = []
        """NVML indexes whose handle failed: counted, reported failed."""
        self.handles: list[tuple[int, Any]] = []
        """NVML's handle of each GPU that gave one, by index."""
        self.nvlink_domain: DomainId | None = None

    def warn(self, message: str) -> None:
        self.warnings.append(message)

    def show(self, path: Path) -> str:
        try:
            return "/" + path.relative_to(self.root).as_posix()
        except ValueError:
            return str(path)

    def text(self, path: Path) -> str | None:
        """The file's stripped ASCII text, or None (with a warning) when it cannot be had."""
        try:
            with path.open("rb") as f:
                raw = f.read(_READ_LIMIT)
        except FileNotFoundError:
            self.warn(f"{self.show(path)}: missing")
            return None
        except OSError as e:
            self.warn(f"{self.show(path)}: unreadable ({e.strerror or type(e).__name__})")
            return None
        try:
            return raw.decode("ascii").strip()
        except UnicodeDecodeError:
            self.warn(f"{self.show(path)}: not text")
            return None

    def hex_value(self, path: Path) -> int | None:
        """A sysfs hex attribute such as `0x10de`."""
        text = self.text(path)
        if text is None:
            return None
        try:
            return int(text, 16)
        except ValueError:
            self.warn(f"{self.show(path)}: not a hex number: {text[:40]!r}")
            return None

    def listdir(self, path: Path, *, missing_ok: bool) -> list[Path]:
        try:
            return sorted(path.iterdir())
        except FileNotFoundError:
            if not missing_ok:
                self.warn(f"{self.show(path)}: missing")
        except OSError as e:
            self.warn(f"{self.show(path)}: not a readable directory ({type(e).__name__})")
        return []


def _natural(name: str) -> tuple[tuple[int, str], ...]:
    """`mlx5_10` after `mlx5_2`: split on digit runs (text at even positions, numbers at odd)."""
    parts = re.split(r"(\d+)", name)
    return tuple((int(p), "") if i % 2 else (0, p) for i, p in enumerate(parts))


def _pci_address(text: str | None) -> tuple[tuple[int, ...], str] | None:
    """`0000:18:00.0` or NVML's `00000000:18:00.0` -> (sort key, sysfs form), else None."""
    match = _PCI_ADDRESS.fullmatch(text.lower()) if text else None
    if match is None:
        return None
    key = tuple(int(part, 16) for part in match.groups())
    return key, "{:04x}:{:02x}:{:02x}.{:x}".format(*key)


def fell_off_the_bus(d: Path) -> bool:
    """The function's config space reads all ones, as a device that stopped answering does
    (without a readable `config`, as in older trees, it is taken as answering)."""
    try:
        with (d / "config").open("rb") as f:
            head = f.read(2)
    except OSError:
        return False
    return head == b"\xff\xff"


def _sysfs_gpus(r: _Reader) -> tuple[list[GpuDevice], list[int]]:
    """NVIDIA VGA/3D-controller functions under `sys/bus/pci/devices`, by PCI address, and the
    indexes of those fallen off the bus (left out of the first list, their index kept)."""
    found: list[tuple[tuple[int, ...], str, str, Path]] = []
    for entry in r.listdir(r.root / "sys/bus/pci/devices", missing_ok=False):
        address = _pci_address(entry.name)
        if address is None:
            r.warn(f"{r.show(entry)}: not a PCI address; skipped")
            continue
        if r.hex_value(entry / "vendor") != NVIDIA_VENDOR_ID:
            continue
        class_code = r.hex_value(entry / "class")
        if class_code is None or class_code >> 8 not in GPU_CLASS_CODES:
            continue
        device_id = r.hex_value(entry / "device")
        name = f"NVIDIA [10de:{device_id:04x}]" if device_id is not None else "NVIDIA [10de:?]"
        found.append((*address, name, entry))
    found.sort()
    gpus, lost = [], []
    for i, (_, pci, name, entry) in enumerate(found):
        if fell_off_the_bus(entry):
            r.warn(f"GPU {i} ({pci}): its config space reads all ones (fallen off the bus)")
            lost.append(i)
        else:
            gpus.append(GpuDevice(i, pci, name))
    return gpus, lost


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


def _ib_ports(r: _Reader) -> list[IbPort]:
    """Every port of every device under `sys/class/infiniband`; none when there is no such dir."""
    ports: list[IbPort] = []
    for device in r.listdir(r.root / "sys/class/infiniband", missing_ok=True):
        for port_dir in r.listdir(device / "ports", missing_ok=False):
            if not port_dir.name.isdigit():
                r.warn(f"{r.show(port_dir)}: not a port number; skipped")
                continue
            ports.append(_ib_port(r, device.name, int(port_dir.name), port_dir))
    ports.sort(key=lambda p: (_natural(p.device), p.port))
    return ports


def _ib_port(r: _Reader, device: str, port: int, d: Path) -> IbPort:
    link_layer = r.text(d / "link_layer")
    if link_layer not in (None, "InfiniBand", "Ethernet", "Unknown"):
        r.warn(f"{r.show(d / 'link_layer')}: unexpected {link_layer[:40]!r}")
        link_layer = None
    state, phys_state, rate = (
        _parse(r, d / name, pattern, what)
        for name, pattern, what in (
            ("state", _STATE, "port state"),  # `4: ACTIVE` -> `ACTIVE`
            ("phys_state", _STATE, "port state"),  # `5: LinkUp` -> `LinkUp`
            ("rate", _RATE, "rate"),  # `400 Gb/sec (4X NDR)` -> `400`
        )
    )
    return IbPort(
        device,
        port,
        state or "UNKNOWN",
        phys_state or "UNKNOWN",
        float(rate) if rate else 0.0,
        link_layer or "Unknown",
        _subnet_prefix(r, d / "gids" / "0"),
    )


def _parse(r: _Reader, path: Path, pattern: re.Pattern[str], what: str) -> str | None:
    """The pattern's last group in the file's text, or None (with a warning)."""
    text = r.text(path)
    match = pattern.fullmatch(text) if text is not None else None
    if text is not None and match is None:
        r.warn(f"{r.show(path)}: not a {what}: {text[:40]!r}")
    return match.group(match.re.groups).strip() if match is not None else None


def _subnet_prefix(r: _Reader, path: Path) -> str | None:
    """The upper 64 bits of a GID, or None for the all-zero (empty) entry."""
    text = r.text(path)
    if text is None:
        return None
    try:
        raw = ipaddress.IPv6Address(text).packed
    except ValueError:
        r.warn(f"{r.show(path)}: not a GID: {text[:60]!r}")
        return None
    if not any(raw):
        return None
    return ":".join(raw[i : i + 2].hex() for i in range(0, 8, 2))


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
