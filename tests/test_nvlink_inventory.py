"""The NVLink domain an agent reads from NVML (`service/agent/nvlink.py`), through a fake
`pynvml` whose fabric call fills the caller's struct as the real binding's C call does, and how
it meets the domain an onboarding config names (`service/agent/node_info.py`)."""

from __future__ import annotations

import ctypes
import logging
import sys
import types
import uuid
from pathlib import Path
from typing import Any

import pytest

from llmgw_twin.control.topology import NodeTopology
from llmgw_twin.service.agent import inventory
from llmgw_twin.service.agent.config import load_agent_config
from llmgw_twin.service.agent.fakesysfs import fabric_prefix_for, write_sysfs_root
from llmgw_twin.service.agent.inventory import read_inventory, to_node_info
from llmgw_twin.service.agent.node_info import node_topology, read_node_info

CLUSTER = uuid.UUID("00a1b2c3-0000-4d5e-8f90-1234567890ab")  # zero bytes inside: read whole


class FakeNVMLError(Exception):
    def __init__(self, value: int, text: str) -> None:
        super().__init__(text)
        self.value = value


class FabricInfo(ctypes.Structure):
    """`nvmlGpuFabricInfo_t`'s layout: the cluster UUID a char array, as the binding has it."""

    _fields_ = [
        ("clusterUuid", ctypes.c_char * 16),
        ("status", ctypes.c_uint),
        ("cliqueId", ctypes.c_uint),
        ("state", ctypes.c_uint),
    ]


# per GPU: (state, status, cluster, clique), or an NVML error number the call raises
Answer = tuple[int, int, uuid.UUID, int] | int


def fake_nvml(answers: list[Answer], *, with_fabric_call: bool = True) -> types.ModuleType:
    def fabric_info(handle: int, ref: Any) -> int:
        answer = answers[handle]
        if isinstance(answer, int):
            raise FakeNVMLError(answer, "Not Supported" if answer == 3 else "Unknown Error")
        info = ref._obj  # what ctypes.byref points at, as the C call would write it
        state, status, cluster, clique = answer
        ctypes.memmove(ctypes.addressof(info), cluster.bytes, 16)
        info.status, info.cliqueId, info.state = status, clique, state
        return 0

    mod = types.ModuleType("pynvml")
    mod.__dict__.update(
        NVMLError=FakeNVMLError,
        NVML_SUCCESS=0,
        NVML_ERROR_NOT_SUPPORTED=3,
        NVML_GPU_FABRIC_STATE_COMPLETED=3,
        nvmlInit=lambda: None,
        nvmlShutdown=lambda: None,
        nvmlDeviceGetCount=lambda: len(answers),
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetName=lambda h: "NVIDIA GB200",
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(total=189_000 * 1024 * 1024),
        nvmlDeviceGetPciInfo=lambda h: types.SimpleNamespace(busId=f"00000000:{h + 1:02x}:00.0"),
        nvmlDeviceGetUUID=lambda h: f"GPU-{h}",
    )
    if with_fabric_call:
        mod.__dict__.update(
            nvmlDeviceGetGpuFabricInfo=fabric_info, c_nvmlGpuFabricInfo_t=FabricInfo
        )
    return mod


@pytest.fixture
def host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A node taken for this host, so NVML is asked (four GPUs on sysfs, as NVML has them)."""
    write_sysfs_root(tmp_path, gpus=4, fabric_prefix=fabric_prefix_for("ib-a"))
    monkeypatch.setattr(inventory, "HOST_ROOT", tmp_path)
    return tmp_path


def read(host: Path, monkeypatch: pytest.MonkeyPatch, answers: list[Answer]) -> Any:
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(answers))
    return read_inventory(host)


DONE = (3, 0, CLUSTER, 7)


def test_gpus_joined_to_one_fabric_give_the_node_its_domain(
    host: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    inv = read(host, monkeypatch, [DONE] * 4)
    assert inv.nvlink_domain == f"{CLUSTER}.7"  # as the nvidia.com/gpu.clique label names it
    assert inv.warnings == ()
    info = to_node_info(inv, "n1", 0, ["sim"])
    assert info.topology == NodeTopology(nvlink_domain=inv.nvlink_domain)


def test_gpus_in_no_multi_node_fabric_give_none_and_say_nothing(
    host: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    inv = read(host, monkeypatch, [3] * 4)  # NVML_ERROR_NOT_SUPPORTED: an HGX board
    assert inv.nvlink_domain is None and inv.warnings == ()
    assert to_node_info(inv, "n1", 0, ["sim"]).topology is None
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml([DONE] * 4, with_fabric_call=False))
    inv = read_inventory(host)  # a binding too old for the call
    assert inv.nvlink_domain is None and inv.warnings == ()


def test_a_gpu_not_joined_yet_leaves_the_node_in_none_and_says_so(
    host: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    inv = read(host, monkeypatch, [DONE, DONE, (2, 0, CLUSTER, 7), DONE])
    assert inv.nvlink_domain is None
    assert any(
        "GPU 2: its NVLink fabric is not ready (state in progress" in w for w in inv.warnings
    )
    assert any("not all in one NVLink domain" in w for w in inv.warnings)


def test_gpus_that_disagree_leave_the_node_in_none_naming_each(
    host: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    inv = read(host, monkeypatch, [DONE, DONE, (3, 0, CLUSTER, 8), 999])
    assert inv.nvlink_domain is None
    said = "\n".join(inv.warnings)
    assert "NVML GPU 3: NVLink fabric unknown (FakeNVMLError: Unknown Error)" in said
    assert f"GPU 0: {CLUSTER}.7" in said and f"GPU 2: {CLUSTER}.8" in said
    assert "GPU 3: none" in said


def test_a_fabric_that_failed_is_not_taken(host: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    inv = read(host, monkeypatch, [(3, 1, CLUSTER, 7)] * 4)  # completed, status an error
    assert inv.nvlink_domain is None
    assert len(inv.warnings) == 4 and "status 1" in inv.warnings[0]


def test_the_config_names_leaf_and_spine_and_nvml_the_domain(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "n1"
    write_sysfs_root(root, gpus=4, fabric_prefix=fabric_prefix_for("ib-a"), node="n1")
    monkeypatch.setattr(inventory, "HOST_ROOT", root)
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml([DONE] * 4))
    config = tmp_path / "n1.yaml"
    base = (
        "node: n1\ncontroller: http://controller.test\nlisten: {host: 127.0.0.1, port: 9}\n"
        f"root: {root}\nuse_nvml: true\nports: {{first: 20000, last: 20007}}\n"
    )
    config.write_text(base + "topology: {leaf: leaf-1, spine: spine-1}\n")
    info = read_node_info(load_agent_config(config))
    assert info.topology == NodeTopology("leaf-1", "spine-1", f"{CLUSTER}.7")  # type: ignore[arg-type]
    config.write_text(base + "topology: {leaf: leaf-1, nvlink_domain: rack-3}\n")
    with caplog.at_level(logging.WARNING, logger="llmgw_twin.agent"):
        info = read_node_info(load_agent_config(config))
    assert info.topology == NodeTopology("leaf-1", None, "rack-3")  # type: ignore[arg-type]
    assert f"NVML puts the GPUs in NVLink domain {CLUSTER}.7, the config names rack-3" in (
        caplog.text
    )


def test_node_topology_without_either() -> None:
    assert node_topology(None, None) is None
    named = NodeTopology(leaf="l1")  # type: ignore[arg-type]
    assert node_topology(named, None) == named
