"""A node's hardware changing under a running agent: failed GPUs and fabric links, as read.

Trees come from `fakesysfs.write_sysfs_root` and are changed the way hardware changes them
(`fail_gpu`: config space all ones; `set_port_state`); NVML comes from a fake `pynvml`. The
fabric's peer proxies are real listeners on loopback.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
from pathlib import Path

import pytest

from helpers.services import shard
from llmgw_twin.control.agent import LocalShard
from llmgw_twin.control.model import FabricId, NodeId
from llmgw_twin.control.protocol import FabricLink, GpuFailed
from llmgw_twin.control.states import Phase
from llmgw_twin.realmode.cluster import node_address
from llmgw_twin.realmode.fabric import RealFabrics, fabric_address
from llmgw_twin.realmode.proxy import CuttableProxy
from llmgw_twin.service.agent import inventory
from llmgw_twin.service.agent.fakesysfs import (
    fabric_prefix_for,
    fail_gpu,
    set_port_state,
    write_sysfs_root,
)
from llmgw_twin.service.agent.inventory import fabric_links_up, read_inventory, to_node_info
from llmgw_twin.service.agent.node_watch import NodeWatch, engines_on, poll_interval_ms
from llmgw_twin.twin.scenario.loader import load_scenario_text
from test_inventory import _fake_pynvml
from test_proxy import echo_server, roundtrip


def node(root: Path, gpus: int = 4) -> Path:
    write_sysfs_root(root, gpus=gpus, fabric_prefix=fabric_prefix_for("ib-a"), node="n1")
    return root


def test_a_gpu_fallen_off_the_bus_is_counted_failed_and_the_others_keep_their_index(
    tmp_path: Path,
) -> None:
    root = node(tmp_path)
    fail_gpu(root, 2)
    inv = read_inventory(root, fabric="ib-a")
    assert [g.index for g in inv.gpus] == [0, 1, 3]
    assert inv.failed_gpus == (2,)
    assert inv.warnings == (
        "GPU 2 (0000:38:00.0): its config space reads all ones (fallen off the bus)",
    )
    info = to_node_info(inv, "n1", 81920, ["sim"])
    assert info.gpus == 4  # still four GPUs: the controller is told GPU 2 is failed
    with pytest.raises(ValueError, match="no GPU 4"):
        fail_gpu(root, 4)


def test_all_gpus_failed_is_still_a_gpu_node(tmp_path: Path) -> None:
    root = node(tmp_path, gpus=1)
    fail_gpu(root, 0)
    inv = read_inventory(root, fabric="ib-a")
    assert inv.gpus == () and inv.failed_gpus == (0,) and inv.gpu_source == "sysfs"


def test_a_gpu_without_a_handle_from_nvml_is_failed_at_its_index(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = node(tmp_path, gpus=2)
    monkeypatch.setattr(inventory, "HOST_ROOT", root)
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml([], lost=0))
    inv = read_inventory(root)
    assert inv.gpu_source == "nvml" and inv.failed_gpus == (0,)
    assert to_node_info(inv, "n1", 1, ["sim"]).gpus == 2


def test_the_watch_reports_each_change_once_and_a_failed_gpu_for_good(tmp_path: Path) -> None:
    root = node(tmp_path)
    watch = NodeWatch(root, use_nvml=False)
    assert watch.failed == set() and watch.links_up is True
    assert watch.changes(*watch.read()) == []
    fail_gpu(root, 1)
    set_port_state(root, up=False)
    assert fabric_links_up(root) is False
    assert watch.changes(*watch.read()) == [GpuFailed(1), FabricLink(False)]
    assert watch.changes(*watch.read()) == []  # nothing new
    set_port_state(root, up=True)
    assert watch.changes(*watch.read()) == [FabricLink(True)]
    assert watch.failed == {1}
    # a restarted agent finds the GPU failed and the links as they are
    set_port_state(root, up=False)
    again = NodeWatch(root, use_nvml=False)
    assert again.failed == {1} and again.links_up is False


def test_a_gpu_whose_pci_function_vanished_is_failed_at_its_start_index(tmp_path: Path) -> None:
    root = node(tmp_path)
    watch = NodeWatch(root, use_nvml=False)
    shutil.rmtree(root / "sys/bus/pci/devices/0000:28:00.0")  # GPU 1, hot-removed
    # sysfs now numbers the remaining three 0..2; the watch goes by PCI address
    assert watch.changes(*watch.read()) == [GpuFailed(1)]


def test_a_gpu_fallen_off_after_another_vanished_keeps_its_own_index(tmp_path: Path) -> None:
    # sysfs numbers the three left 0..2, so the last GPU is the third of them: the watch still
    # names it by its index at start
    root = node(tmp_path)
    watch = NodeWatch(root, use_nvml=False)
    fail_gpu(root, 3)
    shutil.rmtree(root / "sys/bus/pci/devices/0000:28:00.0")  # GPU 1, hot-removed
    assert watch.changes(*watch.read()) == [GpuFailed(1), GpuFailed(3)]
    assert watch.failed == {1, 3}


def test_a_node_without_infiniband_reports_no_link_change(tmp_path: Path) -> None:
    write_sysfs_root(tmp_path, gpus=1, fabric_prefix=None)
    watch = NodeWatch(tmp_path, use_nvml=False)
    set_port_state(tmp_path, up=False)  # nothing to take down
    assert watch.links_up is None and watch.changes(*watch.read()) == []


def test_the_tree_changers_touch_only_written_trees(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="host"):
        fail_gpu(Path("/"), 0)
    with pytest.raises(FileNotFoundError):
        set_port_state(tmp_path / "none", up=False)


def test_engines_on_failed_gpus_are_those_whose_engine_runs() -> None:
    running = LocalShard(shard("m-r1", 0, ("n1",), gpus=(0, 1)), Phase.SERVING)
    elsewhere = LocalShard(shard("m-r2", 0, ("n1",), gpus=(2, 3)), Phase.SERVING)
    starting = LocalShard(shard("m-r3", 0, ("n1",), gpus=(1,)), Phase.SIDECAR)
    exited = LocalShard(shard("m-r4", 0, ("n1",), gpus=(1,)), Phase.EXITED)
    assert engines_on({1}, [running, elsewhere, starting, exited]) == [running.spec.key]
    assert poll_interval_ms(1_000) == 25 and poll_interval_ms(10_000) == 250
    assert poll_interval_ms(100) == 10 and poll_interval_ms(60_000) == 1_000


def test_a_refusing_proxy_refuses_while_cut_and_listens_again_when_healed() -> None:
    async def scenario() -> None:
        server, port = await echo_server()
        proxy = CuttableProxy("127.0.0.1", port, refuse_when_cut=True)
        pport = await proxy.start()
        reader, writer = await asyncio.open_connection("127.0.0.1", pport)
        writer.write(b"a")
        await writer.drain()
        assert await reader.read(1) == b"a"
        proxy.cut()
        assert await asyncio.wait_for(reader.read(1), 5) == b""  # the open one is closed
        with pytest.raises(ConnectionRefusedError):  # and nothing listens
            await asyncio.open_connection("127.0.0.1", pport)
        proxy.heal()
        await proxy.listening()
        assert await roundtrip(pport, b"back") == b"back"
        await proxy.close()
        server.close()

    asyncio.run(scenario())


IB_A = FabricId("ib-a")
FABRICS = """
name: f
duration: 1m
cluster:
  fabrics: {ib-a: [n1, n2], ib-b: [n3]}
  nodes: {default: {gpus: 2}}
profiles:
  two: {engine: sim, nodes: 2, gpus_per_node: 1, model: /m}
deployments: [{model: m, profile: two, replicas: 1}]
"""


def test_peers_reach_a_node_through_its_fabric_proxies_which_a_cut_closes(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        sc = load_scenario_text(FABRICS, "f.yaml")
        slot = os.getpid() % 50_000  # this process's own blocks, as a real run's
        engines = {NodeId(n): node_address(slot, i) for i, n in enumerate(("n1", "n2", "n3"))}
        roots = {n: node(tmp_path / n, gpus=2) for n in engines}
        fabrics = RealFabrics(sc, roots, engines, slot)
        # n3 has no peer in its fabric: no proxy, reached where its engines are
        assert set(fabrics.addresses) == {"n1", "n2"}
        assert fabrics.peer_addresses(NodeId("n1")) == {
            "n1": engines[NodeId("n1")],  # its own engines bind here
            "n2": fabric_address(slot, 1),
            "n3": engines[NodeId("n3")],
        }

        # stand in for n2's leader on its rendezvous port of GPU 1 (29501)
        async def echo(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            while data := await r.read(64):
                w.write(data)
            w.close()

        leader = await asyncio.start_server(echo, engines[NodeId("n2")], 29501)
        try:
            await fabrics.start()
            address = fabric_address(slot, 1)
            reader, writer = await asyncio.open_connection(address, 29501)
            writer.write(b"hi")
            assert await asyncio.wait_for(reader.read(2), 5) == b"hi"
            assert fabrics.down(IB_A) and not fabrics.down(IB_A)  # overlapping outages
            fabrics.set_ports(IB_A, up=False)
            fabrics.cut(IB_A)
            assert await asyncio.wait_for(reader.read(2), 5) == b""
            with pytest.raises(ConnectionRefusedError):
                await asyncio.open_connection(address, 29501)
            assert (
                fabric_links_up(roots[NodeId("n1")]) is False
                and fabric_links_up(roots[NodeId("n3")]) is True
            )
            assert not fabrics.up(IB_A) and fabrics.up(IB_A)  # back with the last
            fabrics.heal(IB_A)
            for proxy in fabrics.proxies[IB_A]:
                await proxy.listening()
            reader, writer = await asyncio.open_connection(address, 29501)
            writer.write(b"ok")
            assert await asyncio.wait_for(reader.read(2), 5) == b"ok"
            writer.close()
        finally:
            await fabrics.close()
            leader.close()

    asyncio.run(scenario())
