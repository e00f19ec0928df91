"""Sysfs-shaped trees for nodes that are not really there: tests, and real mode on one machine.

`write_sysfs_root(root, ...)` writes under `<root>/sys` what a GPU node's kernel shows and
`inventory.read_inventory` reads: NVIDIA GPUs as PCI 3D controllers, the PCI functions of the
InfiniBand adapters, and `/sys/class/infiniband/<device>/ports/<n>/...` with state, rate, link
layer and GID 0. With `extra_pci` it adds the devices a real node has that are *not* GPUs, so a
reader that counts them is caught: the GPU's HDMI audio function and an NVSwitch (both NVIDIA),
a host bridge and an Ethernet NIC from other vendors. `fabric_prefix_for(name)` maps a fabric's
name to a subnet prefix, so a harness can give every node of one scenario fabric the same prefix
and recover the fabric id with `inventory.fabric_id_for_prefix`.

A written tree can then be changed as hardware changes: `fail_gpu(root, i)` makes GPU i fall off
the bus (its PCI config space reads all ones, as a device that no longer answers does), and
`set_port_state(root, up)` takes every InfiniBand port down (`1: DOWN`, `2: Polling`) or back up.

Invariants:
- Deterministic: every byte written is a function of the arguments (no clock, no randomness, no
  host state), so the same call writes the same tree on every machine.
- Writes only below `<root>/sys`, only plain directories and files, no symlinks (real sysfs links
  `bus/pci/devices/*` and `class/infiniband/*` into `devices/`; a reader that follows links reads
  both alike, and a tree without links can be copied or carried anywhere).
- Refuses to write into the host's `/` or over an existing `<root>/sys`; the changes after it
  touch only a tree that exists and is not the host's.
- Values are formatted as the kernel formats them, newline-terminated.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from llmgw_twin.service.agent.inventory import (
    DEFAULT_SUBNET_PREFIX,
    HOST_ROOT,
    normalize_subnet_prefix,
)

_GPU_DEVICE_ID = 0x2330  # a GH100 part
_HCA_DEVICE_ID = 0x1021  # a ConnectX-7
_MELLANOX_VENDOR_ID = 0x15B3
_BUSES_PER_DOMAIN = 14  # slots at buses 0x18, 0x28, ... 0xf8 in each PCI domain
_GIDS_PER_PORT = 4  # real HCAs have 128 or more entries; the rest read as zeros too


def fabric_prefix_for(name: str) -> str:
    """A deterministic subnet prefix for a fabric named `name`: `fec0:xxxx:xxxx:xxxx`.

    The last three groups are the first 48 bits of the name's SHA-256, so distinct names get
    distinct prefixes (barring a 48-bit collision), and none is the default `fe80::` prefix.
    """
    if not name:
        raise ValueError("a fabric needs a name")
    digest = hashlib.sha256(name.encode("utf-8")).digest()
    return "fec0:" + ":".join(digest[i : i + 2].hex() for i in range(0, 6, 2))


def write_sysfs_root(
    root: Path,
    *,
    gpus: int,
    fabric_prefix: str | None,
    ib_devices: int = 1,
    rate: str = "400 Gb/sec (4X NDR)",
    state: str = "4: ACTIVE",
    extra_pci: bool = True,
    node: str = "node",
) -> None:
    """Write `<root>/sys` for a node with `gpus` GPUs and `ib_devices` one-port IB adapters.

    `fabric_prefix` (`fec0:1:2:3` or `fec0:0001:0002:0003`) is the subnet prefix in GID 0 of
    every ACTIVE port; None means the node has no InfiniBand adapter at all (`ib_devices` is
    then ignored). A port in any other `state` (`1: DOWN`) carries the default `fe80::` prefix,
    as a port no subnet manager has configured does, and `2: Polling` as its physical state.
    `node` seeds the adapters' GUIDs, so that nodes of one fabric differ as real ones do.
    """
    root = Path(root)
    if gpus < 0 or ib_devices < 0:
        raise ValueError("gpus and ib_devices must not be negative")
    if root.resolve() == HOST_ROOT.resolve():
        raise ValueError(f"refusing to write a fake sysfs into the host's root {root}")
    prefix = normalize_subnet_prefix(fabric_prefix) if fabric_prefix is not None else None
    sys_dir = root / "sys"
    if sys_dir.exists():
        raise FileExistsError(f"{sys_dir} exists; give each node a fresh root")
    pci = sys_dir / "bus" / "pci" / "devices"
    pci.mkdir(parents=True)
    for i in range(gpus):
        _pci_function(pci, _slot(i, 0), 0x10DE, _GPU_DEVICE_ID, 0x030200, numa=_numa(i, gpus))
    adapters = ib_devices if prefix is not None else 0
    for j in range(adapters):
        _pci_function(
            pci, _slot(j, 1), _MELLANOX_VENDOR_ID, _HCA_DEVICE_ID, 0x020700, numa=_numa(j, adapters)
        )
    if extra_pci:
        _pci_function(pci, "0000:00:00.0", 0x8086, 0x09A2, 0x060000, numa=0)  # host bridge
        _pci_function(pci, "0000:03:00.0", 0x8086, 0x1593, 0x020000, numa=0)  # Ethernet NIC
        if gpus:
            _pci_function(pci, "0000:07:00.0", 0x10DE, 0x22A3, 0x068000, numa=0)  # NVSwitch
            _pci_function(pci, _slot(0, 0, fn=1), 0x10DE, 0x22BA, 0x040300, numa=0)  # audio
    if prefix is None:
        return
    for j in range(adapters):
        _ib_device(sys_dir / "class" / "infiniband" / f"mlx5_{j}", node, j, prefix, rate, state)


def _slot(i: int, offset: int, fn: int = 0) -> str:
    """The PCI address of the i-th GPU (offset 0) or of the adapter beside it (offset 1)."""
    domain, k = divmod(i, _BUSES_PER_DOMAIN)
    return f"{domain:04x}:{0x18 + 0x10 * k + offset:02x}:00.{fn}"


def _numa(i: int, count: int) -> int:
    """The first half of the devices on NUMA node 0, the second half on node 1."""
    return 0 if i < (count + 1) // 2 else 1


def _pci_function(
    devices: Path, address: str, vendor: int, device: int, class_code: int, *, numa: int
) -> None:
    d = devices / address
    d.mkdir()
    _write(d / "vendor", f"0x{vendor:04x}")
    _write(d / "device", f"0x{device:04x}")
    _write(d / "subsystem_vendor", f"0x{vendor:04x}")
    _write(d / "subsystem_device", f"0x{device:04x}")
    _write(d / "class", f"0x{class_code:06x}")
    _write(d / "revision", "0xa1")
    _write(d / "numa_node", str(numa))
    (d / "config").write_bytes(_config_space(vendor, device, class_code))


def _config_space(vendor: int, device: int, class_code: int) -> bytes:
    """The first 64 bytes of a function's PCI config space, as an unprivileged read returns
    them: vendor and device ids (little-endian), revision, class code; the rest zero."""
    head = vendor.to_bytes(2, "little") + device.to_bytes(2, "little") + bytes(4)
    head += bytes([0xA1]) + class_code.to_bytes(3, "little")
    return head + bytes(64 - len(head))


def _existing_sys(root: Path) -> Path:
    root = Path(root)
    if root.resolve() == HOST_ROOT.resolve():
        raise ValueError(f"refusing to change the host's own sysfs under {root}")
    sys_dir = root / "sys"
    if not sys_dir.is_dir():
        raise FileNotFoundError(f"{sys_dir} does not exist; write the tree first")
    return sys_dir


def fail_gpu(root: Path, index: int) -> None:
    """GPU `index` (the inventory's sysfs index: NVIDIA GPU functions in PCI address order)
    falls off the bus: its directory stays, as the kernel keeps a device that stopped
    answering, but its config space now reads all ones (`0xffff` for the vendor id)."""
    pci = _existing_sys(root) / "bus" / "pci" / "devices"
    gpus = sorted(
        d
        for d in pci.iterdir()
        if (d / "vendor").read_text().strip() == "0x10de"
        and int((d / "class").read_text(), 16) >> 8 in (0x0300, 0x0302)
    )
    if not 0 <= index < len(gpus):
        raise ValueError(f"no GPU {index}: the tree has {len(gpus)}")
    (gpus[index] / "config").write_bytes(b"\xff" * 64)


def set_port_state(root: Path, up: bool) -> None:
    """Every InfiniBand port of the tree goes down (`1: DOWN`, physically `2: Polling`, no LID:
    a link whose cable or switch failed) or comes back (`4: ACTIVE`, `5: LinkUp`); the GID
    table is left as it was, so the subnet prefix a node had is kept while its link is down."""
    ib = _existing_sys(root) / "class" / "infiniband"
    for port in sorted(ib.glob("*/ports/*")) if ib.is_dir() else ():
        guid = (port.parent.parent / "node_guid").read_text().strip()
        _write(port / "state", "4: ACTIVE" if up else "1: DOWN")
        _write(port / "phys_state", "5: LinkUp" if up else "2: Polling")
        _write(port / "lid", _lid(guid) if up else "0x0")
        _write(port / "sm_lid", "0x1" if up else "0x0")


def _ib_device(d: Path, node: str, j: int, prefix: str, rate: str, state: str) -> None:
    guid = _guid(node, j)
    _write(d / "node_type", "1: CA")
    _write(d / "node_guid", guid)
    _write(d / "sys_image_guid", guid)
    _write(d / "node_desc", f"{node} mlx5_{j}")
    _write(d / "fw_ver", "28.39.1002")
    _write(d / "hca_type", "MT4129")
    port = d / "ports" / "1"
    active = state.rsplit(":", maxsplit=1)[-1].strip() in ("ACTIVE", "ACTIVE_DEFER")
    _write(port / "state", state)
    _write(port / "phys_state", "5: LinkUp" if active else "2: Polling")
    _write(port / "rate", rate)
    _write(port / "link_layer", "InfiniBand")
    _write(port / "lid", _lid(guid) if active else "0x0")
    _write(port / "sm_lid", "0x1" if active else "0x0")
    _write(port / "lid_mask_count", "0")
    _write(port / "sm_sl", "0")
    _write(port / "cap_mask", "0xa751e848")
    gid_prefix = prefix if active else DEFAULT_SUBNET_PREFIX
    _write(port / "gids" / "0", f"{gid_prefix}:{guid}")
    for k in range(1, _GIDS_PER_PORT):
        _write(port / "gids" / str(k), ":".join(["0000"] * 8))
    _write(port / "pkeys" / "0", "0xffff")


def _lid(guid: str) -> str:
    """The LID a subnet manager gave the port: unicast, 0x1..0xbfff, derived from its GUID."""
    return f"0x{1 + int(guid[-4:], 16) % 0xBFFE:x}"


def _guid(node: str, j: int) -> str:
    """A node GUID in sysfs form, `xxxx:xxxx:xxxx:xxxx`, from the node's name and adapter."""
    digest = hashlib.sha256(f"{node}/mlx5_{j}".encode()).digest()
    return ":".join(digest[i : i + 2].hex() for i in range(0, 8, 2))


def _write(path: Path, value: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(value + "\n", encoding="utf-8")
