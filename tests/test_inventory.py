"""The node inventory: GPUs, InfiniBand ports and the fabric, read from sysfs-shaped trees.

Trees come from `write_sysfs_root` and from `_real_node`, a hand-written copy of a real node's
layout (symlinks into `/sys/devices`, kernel-formatted values, the distractors a real node has).
NVML is a fake `pynvml` module put into `sys.modules`; the real one is never needed.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from llmgw_twin.control.model import EngineName, FabricId, NodeId, NodeInfo
from llmgw_twin.service.agent import inventory
from llmgw_twin.service.agent.fakesysfs import fabric_prefix_for, write_sysfs_root
from llmgw_twin.service.agent.inventory import (
    GpuDevice,
    IbPort,
    Inventory,
    fabric_id_for_prefix,
    normalize_subnet_prefix,
    read_inventory,
    to_node_info,
)

DEFAULT_PREFIX = "fe80:0000:0000:0000"
DEFAULT_FABRIC = "ib-fe80-0000-0000-0000"
_MIB = 1024 * 1024


def _put(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _link(link: Path, target: str) -> None:
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(target)


def _pci(root: Path, parent: str, address: str, vendor: str, device: str, klass: str) -> Path:
    """A PCI function as the kernel lays it out: a directory under /sys/devices, linked from
    /sys/bus/pci/devices."""
    d = root / "sys/devices" / parent / address
    for name, value in (("vendor", vendor), ("device", device), ("class", klass)):
        _put(d / name, value + "\n")
    _put(d / "numa_node", "0\n")
    _link(root / "sys/bus/pci/devices" / address, f"../../../devices/{parent}/{address}")
    return d


def _ib(root: Path, hca: Path, name: str, ports: dict[int, dict[str, str]]) -> None:
    """An RDMA device under its PCI function, linked from /sys/class/infiniband."""
    d = hca / "infiniband" / name
    _put(d / "node_type", "1: CA\n")
    _put(d / "node_guid", "a088:c203:0012:3456\n")
    _link(d / "device", "../../../" + hca.name)
    for port, files in ports.items():
        for rel, value in files.items():
            _put(d / "ports" / str(port) / rel, value + "\n")
    rel_hca = hca.relative_to(root / "sys")
    _link(root / "sys/class/infiniband" / name, f"../../{rel_hca}/infiniband/{name}")


def _port(state: str, phys: str, rate: str, layer: str, gid0: str) -> dict[str, str]:
    return {
        "state": state,
        "phys_state": phys,
        "rate": rate,
        "link_layer": layer,
        "lid": "0x1f",
        "gids/0": gid0,
        "gids/1": "0000:0000:0000:0000:0000:0000:0000:0000",
    }


def _real_node(root: Path) -> Path:
    """Three GPUs (two 3D controllers, one VGA) among NVIDIA and other distractors; mlx5_0 ACTIVE
    on the default prefix, mlx5_1 DOWN, mlx5_2 an ACTIVE RoCE (Ethernet) port, mlx5_10 ACTIVE."""
    sw = "pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:00.0"
    _pci(root, "pci0000:00", "0000:00:00.0", "0x8086", "0x09a2", "0x060000")  # host bridge
    _pci(root, "pci0000:00", "0000:07:00.0", "0x10de", "0x22a3", "0x068000")  # NVSwitch
    _pci(root, "pci0000:15", "0000:15:01.0", "0x1000", "0xc030", "0x060400")  # PCIe switch
    _pci(root, sw, "0000:9a:00.0", "0x10de", "0x2330", "0x030200")
    _pci(root, sw, "0000:18:00.0", "0x10de", "0x2330", "0x030200")
    _pci(root, sw, "0000:18:00.1", "0x10de", "0x22ba", "0x040300")  # the GPU's audio function
    _pci(root, "pci0000:3a", "0000:3a:00.0", "0x10de", "0x26b9", "0x030000")  # VGA class
    _pci(root, "pci0000:00", "0000:03:00.0", "0x8086", "0x1593", "0x020000")  # Ethernet NIC
    gid = "fe80:0000:0000:0000:a088:c203:0012:3456"
    roce_gid = "fe80:0000:0000:0000:ba3f:91ff:fe2c:0001"  # from the NIC's MAC, not a subnet
    up = ("4: ACTIVE", "5: LinkUp")
    for i, name, port in (
        (0, "mlx5_0", _port(*up, "400 Gb/sec (4X NDR)", "InfiniBand", gid)),
        (1, "mlx5_1", _port("1: DOWN", "3: Disabled", "10 Gb/sec (4X SDR)", "InfiniBand", gid)),
        (2, "mlx5_2", _port(*up, "100 Gb/sec (2X HDR)", "Ethernet", roce_gid)),
        (10, "mlx5_10", _port(*up, "200 Gb/sec (4X HDR)", "InfiniBand", gid)),
    ):
        hca = _pci(root, sw, f"0000:{0x19 + i:02x}:00.0", "0x15b3", "0x1021", "0x020700")
        _ib(root, hca, name, {1: port})
    return root


def test_a_real_shaped_node_gives_its_gpus_ports_and_fabric(tmp_path: Path) -> None:
    inv = read_inventory(_real_node(tmp_path))
    assert inv.gpu_source == "sysfs"
    assert inv.gpus == (
        GpuDevice(0, "0000:18:00.0", "NVIDIA [10de:2330]"),
        GpuDevice(1, "0000:3a:00.0", "NVIDIA [10de:26b9]"),
        GpuDevice(2, "0000:9a:00.0", "NVIDIA [10de:2330]"),
    )
    fe80 = "fe80:0000:0000:0000"
    assert inv.ib_ports == (
        IbPort("mlx5_0", 1, "ACTIVE", "LinkUp", 400.0, "InfiniBand", fe80),
        IbPort("mlx5_1", 1, "DOWN", "Disabled", 10.0, "InfiniBand", fe80),
        IbPort("mlx5_2", 1, "ACTIVE", "LinkUp", 100.0, "Ethernet", fe80),
        IbPort("mlx5_10", 1, "ACTIVE", "LinkUp", 200.0, "InfiniBand", fe80),
    )
    assert inv.fabric == DEFAULT_FABRIC
    assert len(inv.warnings) == 1
    assert "is the InfiniBand default" in inv.warnings[0]


def test_a_written_node_reads_back_whole(tmp_path: Path) -> None:
    prefix = fabric_prefix_for("ib-a")
    write_sysfs_root(tmp_path, gpus=8, fabric_prefix=prefix, ib_devices=2, node="n1")
    inv = read_inventory(tmp_path, use_nvml=False)
    assert inv.warnings == ()
    assert inv.gpu_source == "sysfs"
    assert [g.index for g in inv.gpus] == list(range(8))
    addresses = [g.pci_address for g in inv.gpus]
    assert addresses == sorted(addresses)
    assert all(a.endswith(".0") for a in addresses)  # the audio function at .1 is not a GPU
    assert {(g.name, g.memory_mib, g.uuid) for g in inv.gpus} == {
        ("NVIDIA [10de:2330]", None, None)
    }
    assert inv.ib_ports == tuple(
        IbPort(f"mlx5_{j}", 1, "ACTIVE", "LinkUp", 400.0, "InfiniBand", prefix) for j in range(2)
    )
    assert inv.fabric == fabric_id_for_prefix(prefix)
    assert inv.fabric == "ib-" + prefix.replace(":", "-")


def test_nodes_of_one_fabric_share_it_and_other_fabrics_differ(tmp_path: Path) -> None:
    def fabric_of(node: str, fabric: str) -> FabricId | None:
        root = tmp_path / node
        write_sysfs_root(root, gpus=2, fabric_prefix=fabric_prefix_for(fabric), node=node)
        return read_inventory(root).fabric

    a1, a2, b1 = fabric_of("n1", "ib-a"), fabric_of("n2", "ib-a"), fabric_of("n3", "ib-b")
    assert a1 == a2 == fabric_id_for_prefix(fabric_prefix_for("ib-a"))
    assert b1 != a1
    guids = {
        (tmp_path / n / "sys/class/infiniband/mlx5_0/node_guid").read_text() for n in ("n1", "n2")
    }
    assert len(guids) == 2  # nodes differ as real ones do, but share the prefix


def test_fabric_prefix_for_is_deterministic_and_never_the_default() -> None:
    names = [f"ib-{i}" for i in range(500)]
    prefixes = [fabric_prefix_for(n) for n in names]
    assert prefixes == [fabric_prefix_for(n) for n in names]
    assert len(set(prefixes)) == len(names)
    assert all(p.startswith("fec0:") and normalize_subnet_prefix(p) == p for p in prefixes)
    with pytest.raises(ValueError, match="name"):
        fabric_prefix_for("")


def test_the_operators_fabric_wins(tmp_path: Path) -> None:
    write_sysfs_root(tmp_path, gpus=1, fabric_prefix=fabric_prefix_for("ib-a"))
    assert read_inventory(tmp_path, fabric="rack7").fabric == "rack7"
    inv = read_inventory(_real_node(tmp_path / "real"), fabric=" ib-east ")
    assert inv.fabric == "ib-east"
    assert inv.warnings == ()  # the default-prefix warning matters only when deriving
    with pytest.raises(ValueError, match="empty"):
        read_inventory(tmp_path, fabric="  ")


def _set_gid(root: Path, device: str, prefix: str) -> None:
    gid = root / "sys/class/infiniband" / device / "ports/1/gids/0"
    gid.write_text(prefix + ":0000:0000:0000:0001\n")


def test_disagreeing_prefixes_pick_the_majority_and_say_so(tmp_path: Path) -> None:
    write_sysfs_root(tmp_path, gpus=0, fabric_prefix="fec0:0:0:2", ib_devices=3)
    _set_gid(tmp_path, "mlx5_1", "fec0:0000:0000:0001")
    inv = read_inventory(tmp_path)
    assert inv.fabric == "ib-fec0-0000-0000-0002"  # two ports against one, though 1 < 2
    assert len(inv.warnings) == 1
    assert "disagree" in inv.warnings[0]
    assert "fec0:0000:0000:0001 on mlx5_1/1" in inv.warnings[0]
    assert "fec0:0000:0000:0002 on mlx5_0/1, mlx5_2/1" in inv.warnings[0]


def test_a_tie_between_prefixes_picks_the_smallest(tmp_path: Path) -> None:
    write_sysfs_root(tmp_path, gpus=0, fabric_prefix="fec0:0:0:b", ib_devices=2)
    _set_gid(tmp_path, "mlx5_1", "fec0:0000:0000:000a")
    inv = read_inventory(tmp_path)
    assert inv.fabric == "ib-fec0-0000-0000-000a"
    assert any("disagree" in w for w in inv.warnings)


def test_only_active_infiniband_ports_name_the_fabric(tmp_path: Path) -> None:
    write_sysfs_root(tmp_path, gpus=4, fabric_prefix="fec0:0:0:1", state="1: DOWN")
    inv = read_inventory(tmp_path)
    (port,) = inv.ib_ports
    assert (port.state, port.phys_state, port.subnet_prefix) == ("DOWN", "Polling", DEFAULT_PREFIX)
    assert inv.fabric is None
    assert any(w.startswith("no fabric") for w in inv.warnings)
    ethernet = tmp_path / "eth"
    write_sysfs_root(ethernet, gpus=0, fabric_prefix="fec0:0:0:1")
    (ethernet / "sys/class/infiniband/mlx5_0/ports/1/link_layer").write_text("Ethernet\n")
    assert read_inventory(ethernet).fabric is None


@pytest.mark.parametrize("with_pci_dir", [True, False])
def test_a_node_without_ib_or_gpu_is_still_a_node(tmp_path: Path, with_pci_dir: bool) -> None:
    if with_pci_dir:
        write_sysfs_root(tmp_path, gpus=0, fabric_prefix=None, ib_devices=4)
        assert not (tmp_path / "sys/class/infiniband").exists()
    inv = read_inventory(tmp_path)
    assert (inv.gpus, inv.ib_ports, inv.fabric, inv.gpu_source) == ((), (), None, "none")
    assert any(w.startswith("no fabric") for w in inv.warnings)
    assert any("sys/bus/pci/devices: missing" in w for w in inv.warnings) != with_pci_dir
    with pytest.raises(ValueError, match="name the node's fabric in the onboarding config"):
        to_node_info(inv, "cpu1", 0, ["sim"])
    named = read_inventory(tmp_path, fabric="mgmt")
    assert to_node_info(named, "cpu1", 0, ["sim"]) == NodeInfo(
        NodeId("cpu1"), FabricId("mgmt"), 0, 0, (EngineName("sim"),)
    )


def test_to_node_info_takes_the_smallest_known_memory_and_checks_engines() -> None:
    gpus = (GpuDevice(0, "0000:18:00.0", "H", 81559), GpuDevice(1, "0000:28:00.0", "H", 81000))
    inv = Inventory(gpus, (), FabricId("ib-a"), "nvml")
    info = to_node_info(inv, "n1", 40960, ["vllm", "sim", "vllm"])
    engines = (EngineName("vllm"), EngineName("sim"))  # duplicates dropped, order kept
    assert info == NodeInfo(NodeId("n1"), FabricId("ib-a"), 2, 81000, engines)
    unknown = Inventory(
        (GpuDevice(0, "0000:18:00.0", "NVIDIA [10de:2330]"),), (), FabricId("f"), "sysfs"
    )
    assert to_node_info(unknown, "n1", 40960, ["sim"]).gpu_memory_mib == 40960
    with pytest.raises(ValueError, match="unknown engine"):
        to_node_info(inv, "n1", 1, ["tensorrt"])
    with pytest.raises(ValueError, match="negative"):
        to_node_info(inv, "n1", -1, ["sim"])


def test_garbled_files_give_warnings_not_exceptions(tmp_path: Path) -> None:
    write_sysfs_root(tmp_path, gpus=3, fabric_prefix="fec0:0:0:1", ib_devices=3, extra_pci=False)
    pci = tmp_path / "sys/bus/pci/devices"
    (pci / "0000:18:00.0/class").write_text("0xZZ\n")
    (pci / "0000:28:00.0/vendor").write_bytes(b"\xff\xfe\x00")
    (pci / "0000:38:00.0/device").unlink()
    (pci / "not-an-address").mkdir()
    ib = tmp_path / "sys/class/infiniband"
    port0, port1 = ib / "mlx5_0/ports/1", ib / "mlx5_1/ports/1"
    (port0 / "rate").write_text("fast\n")
    (port0 / "state").write_text("???\n")
    (port0 / "gids/0").write_text("not-a-gid\n")
    (port1 / "link_layer").write_text("Carrier pigeon\n")
    (port1 / "phys_state").unlink()
    (port1 / "phys_state").mkdir()  # unreadable as a file
    (ib / "mlx5_1/ports/x").mkdir()
    (ib / "mlx5_2/ports/1/rate").write_text("9" * 10_000)  # longer than any sysfs value
    (ib / "mlx5_3").mkdir()  # a device without ports
    inv = read_inventory(tmp_path)
    assert [g.pci_address for g in inv.gpus] == ["0000:38:00.0"]
    assert inv.gpus[0].name == "NVIDIA [10de:?]"
    assert inv.ib_ports == (
        IbPort("mlx5_0", 1, "UNKNOWN", "LinkUp", 0.0, "InfiniBand", None),
        IbPort("mlx5_1", 1, "ACTIVE", "UNKNOWN", 400.0, "Unknown", "fec0:0000:0000:0001"),
        IbPort("mlx5_2", 1, "ACTIVE", "LinkUp", 0.0, "InfiniBand", "fec0:0000:0000:0001"),
    )
    assert inv.fabric == "ib-fec0-0000-0000-0001"  # mlx5_2 is still whole enough to say
    expected = [
        "/sys/bus/pci/devices/0000:18:00.0/class: not a hex number",
        "/sys/bus/pci/devices/0000:28:00.0/vendor: not text",
        "/sys/bus/pci/devices/0000:38:00.0/device: missing",
        "/sys/bus/pci/devices/not-an-address: not a PCI address",
        "/sys/class/infiniband/mlx5_0/ports/1/state: not a port state",
        "/sys/class/infiniband/mlx5_0/ports/1/rate: not a rate",
        "/sys/class/infiniband/mlx5_0/ports/1/gids/0: not a GID",
        "/sys/class/infiniband/mlx5_1/ports/1/link_layer: unexpected",
        "/sys/class/infiniband/mlx5_1/ports/1/phys_state: unreadable",
        "/sys/class/infiniband/mlx5_1/ports/x: not a port number",
        "/sys/class/infiniband/mlx5_2/ports/1/rate: not a rate",
        "/sys/class/infiniband/mlx5_3/ports: missing",
    ]
    for start in expected:
        assert sum(w.startswith(start) for w in inv.warnings) == 1, start
    assert len(inv.warnings) == len(expected)


def test_warnings_do_not_depend_on_where_the_tree_lies(tmp_path: Path) -> None:
    for where in ("a", "b/c"):
        write_sysfs_root(tmp_path / where, gpus=1, fabric_prefix=None)
    assert read_inventory(tmp_path / "a") == read_inventory(tmp_path / "b/c")


def test_write_sysfs_root_is_deterministic_and_careful(tmp_path: Path) -> None:
    def tree(root: Path) -> dict[str, bytes]:
        return {
            p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()
        }

    for where in ("x", "y"):
        write_sysfs_root(tmp_path / where, gpus=20, fabric_prefix="fec0:1:2:3", ib_devices=20)
    assert tree(tmp_path / "x") == tree(tmp_path / "y")
    assert not any(p.is_symlink() for p in (tmp_path / "x").rglob("*"))
    inv = read_inventory(tmp_path / "x")
    assert len(inv.gpus) == 20 and len(inv.ib_ports) == 20  # past one PCI domain's slots
    assert len({g.pci_address for g in inv.gpus}) == 20
    with pytest.raises(FileExistsError):
        write_sysfs_root(tmp_path / "x", gpus=1, fabric_prefix=None)
    with pytest.raises(ValueError, match="host"):
        write_sysfs_root(Path("/"), gpus=1, fabric_prefix=None)
    with pytest.raises(ValueError, match="subnet prefix"):
        write_sysfs_root(tmp_path / "z", gpus=1, fabric_prefix="fe80::")
    with pytest.raises(ValueError, match="negative"):
        write_sysfs_root(tmp_path / "z", gpus=-1, fabric_prefix=None)
    assert not (tmp_path / "z").exists()


def test_fabric_ids_are_normalized() -> None:
    assert fabric_id_for_prefix("FE80:0:0:0") == DEFAULT_FABRIC
    assert normalize_subnet_prefix(" fec0:a:BC:1234 ") == "fec0:000a:00bc:1234"
    for bad in ("fe80::", "fe80:0:0", "fe80:0:0:0:0", "fe80:0:0:12345", ""):
        with pytest.raises(ValueError):
            fabric_id_for_prefix(bad)


# NVML, through a fake `pynvml`.


class FakeNVMLError(Exception):
    pass


def _fake_pynvml(
    calls: list[str],
    *,
    init_error: str | None = None,
    lost: int | None = None,
    as_bytes: bool = False,
) -> types.ModuleType:
    """Two GPUs; `init_error` makes nvmlInit fail as it does without a driver; `lost` makes one
    GPU's handle fail; `as_bytes` answers strings as older bindings do."""

    def text(s: str) -> Any:
        return s.encode() if as_bytes else s

    def record(name: str, result: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any) -> Any:
            calls.append(name)
            return result(*args)

        return call

    def init() -> None:
        if init_error is not None:
            raise FakeNVMLError(init_error)

    def handle(i: int) -> int:
        if i == lost:
            raise FakeNVMLError("GPU is lost")
        return i

    bus_ids = ["00000000:18:00.0", "00000000:28:00.0"]  # NVML's form: 8-digit domain
    mod = types.ModuleType("pynvml")
    mod.__dict__.update(
        NVMLError=FakeNVMLError,
        nvmlInit=record("init", init),
        nvmlShutdown=record("shutdown", lambda: None),
        nvmlDeviceGetCount=record("count", lambda: 2),
        nvmlDeviceGetHandleByIndex=record("handle", handle),
        nvmlDeviceGetName=lambda h: text("NVIDIA H100 80GB HBM3"),
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(total=85_520_809_984 - h * _MIB),
        nvmlDeviceGetPciInfo=lambda h: types.SimpleNamespace(busId=text(bus_ids[h])),
        nvmlDeviceGetUUID=lambda h: text(f"GPU-0000000{h}-1111-2222-3333-444444444444"),
    )
    return mod


@pytest.fixture
def host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A written node that the inventory takes for this host's root, so NVML is asked."""
    write_sysfs_root(tmp_path, gpus=2, fabric_prefix="fec0:0:0:1")
    monkeypatch.setattr(inventory, "HOST_ROOT", tmp_path)
    return tmp_path


@pytest.mark.parametrize("as_bytes", [False, True])
def test_nvml_gives_names_memory_and_uuids(
    host: Path, monkeypatch: pytest.MonkeyPatch, as_bytes: bool
) -> None:
    calls: list[str] = []
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(calls, as_bytes=as_bytes))
    inv = read_inventory(host)
    assert inv.gpu_source == "nvml"
    assert inv.gpus == tuple(
        GpuDevice(
            i,
            f"0000:{0x18 + 0x10 * i:02x}:00.0",
            "NVIDIA H100 80GB HBM3",
            81559 - i,
            f"GPU-0000000{i}-1111-2222-3333-444444444444",
        )
        for i in range(2)
    )
    assert inv.warnings == ()
    assert calls == ["init", "count", "handle", "handle", "shutdown"]
    assert to_node_info(inv, "n1", 1, ["sim"]).gpu_memory_mib == 81558


def test_nvml_init_error_falls_back_to_sysfs(host: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    fake = _fake_pynvml(calls, init_error="Driver Not Loaded")
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    inv = read_inventory(host)
    assert inv.gpu_source == "sysfs"
    assert [g.pci_address for g in inv.gpus] == ["0000:18:00.0", "0000:28:00.0"]
    assert inv.warnings == (
        "NVML not used: nvmlInit failed (FakeNVMLError: Driver Not Loaded); using sysfs",
    )
    assert calls == ["init"]  # no shutdown for an init that failed
    assert inv.fabric == "ib-fec0-0000-0000-0001"


def test_without_pynvml_sysfs_answers(host: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` fail
    inv = read_inventory(host)
    assert inv.gpu_source == "sysfs" and len(inv.gpus) == 2
    assert len(inv.warnings) == 1
    assert inv.warnings[0].startswith("NVML not used: module pynvml cannot be imported")


def test_a_lost_gpu_is_left_out_and_the_count_mismatch_said(
    host: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml([], lost=0))
    inv = read_inventory(host)
    assert inv.gpu_source == "nvml"
    assert [(g.index, g.pci_address) for g in inv.gpus] == [(1, "0000:28:00.0")]
    assert inv.warnings[0] == "NVML GPU 0: no handle (FakeNVMLError: GPU is lost); left out"
    assert inv.warnings[1].startswith("NVML reports 1 GPU(s) but sysfs lists 2")


def test_nvml_is_not_asked_off_the_host_or_when_turned_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(calls))
    write_sysfs_root(tmp_path, gpus=2, fabric_prefix=None)
    assert read_inventory(tmp_path).gpu_source == "sysfs"  # a fake root is not this host
    monkeypatch.setattr(inventory, "HOST_ROOT", tmp_path)
    assert read_inventory(tmp_path, use_nvml=False).gpu_source == "sysfs"
    assert calls == []


def test_on_the_real_root_nvml_is_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(calls))
    inv = read_inventory()  # this machine's own /sys: only the NVML part is predictable
    assert inv.gpu_source == "nvml"
    assert [g.uuid for g in inv.gpus] == [
        f"GPU-0000000{i}-1111-2222-3333-444444444444" for i in range(2)
    ]
    assert calls[0] == "init" and calls[-1] == "shutdown"
