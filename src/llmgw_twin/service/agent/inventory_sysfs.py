"""The inventory's sysfs side: NVIDIA GPUs on the PCI bus and the ports of RDMA devices.

Role: the sysfs half of `inventory.py` (`read_inventory`, `fabric_links_up`), which re-exports
its public names; `node_watch.py` polls `fell_off_the_bus` through it. NVML, the fabric's
derivation and the `Inventory` itself are `inventory.py`.

Files are read under the root it is handed: `<root>/sys/bus/pci/devices` for GPUs,
`<root>/sys/class/infiniband` for ports. `_Reader` is the one reader of a whole inventory read:
it keeps the warnings, and what NVML answered, for `inventory.py` too.

Invariants:
- Reading never raises over what it finds on disk: a missing, unreadable or garbled file
  becomes a warning and a neutral value (`None`, `"UNKNOWN"`, `0.0`); paths in warnings are
  shown relative to the root, so the same tree gives the same warnings anywhere.
- The result never depends on directory listing order: GPUs are ordered by PCI address and
  indexed 0..n-1 (one fallen off the bus keeps its index), ports are sorted by device name
  (natural order: mlx5_2 before mlx5_10) and port number.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmgw_twin.control.topology import DomainId

NVIDIA_VENDOR_ID = 0x10DE
GPU_CLASS_CODES = frozenset({0x0300, 0x0302})
"""PCI base class + subclass (the class file's upper 16 bits): VGA-compatible, 3D controller.
NVIDIA's other functions (HDMI audio 0x0403, NVSwitch 0x0680, bridges 0x0604) are not GPUs."""

_READ_LIMIT = 4096  # sysfs attributes fit in a page; a larger file is not an attribute
_PCI_ADDRESS = re.compile(r"([0-9a-f]{4,8}):([0-9a-f]{2}):([0-9a-f]{2})\.([0-7])")
_STATE = re.compile(r"(?:(\d+)\s*:\s*)?([A-Za-z_<>][A-Za-z_<> ]*)")
_RATE = re.compile(r"(\d+(?:\.\d+)?)\s*Gb/sec\b.*")


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
