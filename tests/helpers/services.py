"""Helpers for the service tests: deadlines, free loopback ports, process-group checks."""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from llmgw_twin.control.model import (
    EngineName,
    FabricId,
    ModelName,
    NodeId,
    NodeInfo,
    ProfileName,
    ReplicaId,
    ShardSpec,
    Timings,
)
from llmgw_twin.service.agent.processes import group_alive

T = TypeVar("T")

FAST = Timings(
    heartbeat_interval_ms=200,
    node_suspect_after_ms=3_000,
    node_lost_after_ms=6_000,
    reconcile_interval_ms=50,
)
"""Service-test timings: reconcile every 50 ms, so a test waits for conditions, not seconds."""


async def eventually(
    probe: Callable[[], Awaitable[T | None]], within_s: float, what: str, every_s: float = 0.05
) -> T:
    """Poll `probe` until it returns something other than None; fail once `within_s` passes."""
    deadline = time.monotonic() + within_s
    while True:
        got = await probe()
        if got is not None:
            return got
        if time.monotonic() >= deadline:
            raise AssertionError(f"deadline of {within_s}s passed waiting for {what}")
        await asyncio.sleep(every_s)


def wait_sync(probe: Callable[[], T | None], within_s: float, what: str) -> T:
    """`eventually` for synchronous probes (real-process tests outside an event loop)."""
    deadline = time.monotonic() + within_s
    while True:
        got = probe()
        if got is not None:
            return got
        if time.monotonic() >= deadline:
            raise AssertionError(f"deadline of {within_s}s passed waiting for {what}")
        time.sleep(0.05)


def free_ports(count: int) -> list[int]:
    """Ports free on 127.0.0.1 now (held open together, so they are distinct)."""
    socks = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


_handed_out: set[int] = set()


def free_range(size: int) -> tuple[int, int]:
    """A run of `size` consecutive ports free on 127.0.0.1 now and not handed out before by this
    process; the search starts at a place drawn from the pid, so parallel test processes differ."""
    span = 20_000
    start = (os.getpid() * 97) % span
    for i in range(0, span, size):
        first = 30_000 + (start + i) % (span - size)
        ports = range(first, first + size)
        if _handed_out.isdisjoint(ports) and all(_bindable(p) for p in ports):
            _handed_out.update(ports)
            return first, first + size - 1
    raise AssertionError(f"no run of {size} free ports")


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def gone(pgids: list[int]) -> bool:
    return not any(group_alive(g) for g in pgids)


def node_info(name: str, fabric: str = "ib-a", gpus: int = 8) -> NodeInfo:
    return NodeInfo(NodeId(name), FabricId(fabric), gpus, 81920, (EngineName("sim"),))


def shard(
    replica: str,
    rank: int,
    nodes: tuple[str, ...],
    gpus: tuple[int, ...] = (0,),
    engine: str = "sim",
    load_time_ms: int = 0,
    rendezvous_port: int = 29500,
) -> ShardSpec:
    return ShardSpec(
        replica=ReplicaId(replica),
        model=ModelName("tiny"),
        profile=ProfileName("tiny"),
        engine=EngineName(engine),
        model_path="/models/tiny",
        rank=rank,
        shard_count=len(nodes),
        node=NodeId(nodes[rank]),
        gpus=gpus,
        leader=NodeId(nodes[0]),
        nodes=tuple(NodeId(n) for n in nodes),
        rendezvous_port=rendezvous_port,
        load_time_ms=load_time_ms,
    )
