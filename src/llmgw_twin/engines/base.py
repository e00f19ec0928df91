"""What an engine adapter answers for one shard: its argv, environment, and how it is reached.

The controller hands an agent a `ShardSpec` and knows nothing of engine flags; the agent's shell
asks the adapter for that shard's `Launch`. Adapters are pure functions of the spec and the
`LaunchContext` (where the leader and the other nodes are, which ports and binaries to use): no
I/O, no environment lookups, the same answer for the same inputs.

Invariants every adapter keeps:
- only rank 0 (the leader) serves HTTP; a worker opens no client-facing port;
- the shard's GPUs reach the engine as `CUDA_VISIBLE_DEVICES`, in the order the spec lists them;
- the profile's extra flags (`spec.args`) come last, unchanged, so an operator can override;
- each adapter can say which programs it runs (`programs`) and build the widest command the
  project would ever produce for it (`widest`), which `engine-check` holds against `--help`;
- each adapter names the metrics of its leader's Prometheus `/metrics` that give the engine's
  queue and KV-cache use (`load_metrics`), so the controller's autoscaler reads any engine
  without knowing its name.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from llmgw_twin.control.model import (
    RENDEZVOUS_PORT_BASE,
    EngineName,
    ModelName,
    NodeId,
    ProfileName,
    ReplicaId,
    ShardSpec,
)

DEFAULT_HTTP_PORT = 8000
ALL_INTERFACES = "0.0.0.0"  # noqa: S104  (a leader must be reachable from the router)


@dataclass(frozen=True, slots=True)
class LaunchContext:
    """Where things are, as the agent that launches the shard knows it."""

    leader_host: str
    """Address the leader is reached at by its workers (its fabric address in production)."""
    http_port: int = DEFAULT_HTTP_PORT
    binary: str | None = None
    """The engine binary to run; None takes the adapter's default."""
    worker_binary: str | None = None
    """For engines whose workers run another program (llama.cpp's RPC server); None: default."""
    bind_host: str = ALL_INTERFACES
    """Address a listening rank binds to."""
    node_addresses: tuple[tuple[str, str], ...] = ()
    """(node, address) pairs for nodes reached by another name; a node not listed is reached
    at its own name."""
    worker_ports: tuple[tuple[int, int], ...] = ()
    """(rank, port) pairs for workers that listen (llama.cpp's RPC servers); a rank not listed
    listens on the adapter's default port for the replica."""
    pace_file: str | None = None
    """The node's pace file, for an engine that reads one (the sim engine's `--pace-file`: a
    straggler's pace, set by real mode); None: none."""
    ready_file: str | None = None
    """Where a rank that opens no port may say it is ready (the sim worker's `--ready-file`);
    None: the agent has no place for one, and judges such a rank by its process."""

    def address_of(self, node: str) -> str:
        for name, address in self.node_addresses:
            if name == node:
                return address
        return node

    def worker_port(self, rank: int, default: int) -> int:
        for r, port in self.worker_ports:
            if r == rank:
                return port
        return default


class Readiness(enum.StrEnum):
    """How an agent tells that a launched rank is ready."""

    HTTP_200 = "http-200"
    """GET `health_path` on `port` answers 200 (an error status or refused connection: not yet)."""
    TCP_LISTEN = "tcp-listen"
    """`port` accepts a TCP connection."""
    PROCESS = "process"
    """The process is alive; the rank opens no port of its own, so the leader's health speaks
    for the whole replica."""
    FILE = "file"
    """`ready_file` exists: the rank opens no port, and writes it once it is ready (a sim worker:
    loaded and joined)."""


@dataclass(frozen=True, slots=True)
class Launch:
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    serves_http: bool
    """Only the leader (rank 0) serves HTTP; workers open no client-facing port."""
    port: int | None
    """The port this rank listens on: HTTP for a leader, the RPC port for a llama.cpp worker;
    None when it listens on no fixed port."""
    health_path: str | None
    readiness: Readiness = Readiness.PROCESS
    ready_file: str | None = None
    """The file a `Readiness.FILE` rank writes once it is ready."""


@dataclass(frozen=True, slots=True)
class Program:
    """One program an engine runs, and how to get its full help text."""

    default_binary: str
    command: tuple[str, ...]
    """Words between the binary and its flags (`serve` in `vllm serve`)."""
    help_args: tuple[str, ...]
    """Arguments that print the complete help (every flag), e.g. `serve --help=all`."""
    min_help_chars: int
    """A complete help text is longer than this; a shorter one was cut."""
    help_sections: tuple[str, ...] = ()
    """Lines every complete help text contains, in order; the last one missing means the text
    ended before that section."""


@dataclass(frozen=True, slots=True)
class LoadMetrics:
    """Which series of the leader's Prometheus exposition (`path`) give its load, as data.

    Each tuple lists metric names in order of preference: the first one the exposition has is
    read (an older name after the current one). The series of one name are summed for the
    queue (one per engine core or rank) and their largest taken for the KV-cache use (a share,
    0 to 1). An empty tuple: the engine exports no such figure."""

    queue: tuple[str, ...]
    """Requests waiting for a batch slot or KV cache."""
    kv_cache: tuple[str, ...]
    """The share of the KV cache in use, 0 to 1."""
    path: str = "/metrics"


class EngineAdapter(Protocol):
    name: str
    pinned_version: str
    """The engine version whose argument definitions the adapter was written against."""
    programs: tuple[Program, ...]
    """The leader's program first, then any other program its workers run."""
    load_metrics: LoadMetrics
    """Where the leader's `/metrics` says its queue and KV-cache use."""

    def launch(self, spec: ShardSpec, ctx: LaunchContext) -> Launch: ...

    def widest(self) -> tuple[Launch, ...]:
        """Every rank of the widest replica the project would launch, every optional flag on."""
        ...


def cuda_env(spec: ShardSpec) -> tuple[tuple[str, str], ...]:
    return (("CUDA_VISIBLE_DEVICES", ",".join(str(g) for g in spec.gpus)),)


def http_leader_launch(spec: ShardSpec, ctx: LaunchContext, argv: Sequence[str]) -> Launch:
    """The common shape: rank 0 adds its HTTP address to `argv`, serves on `ctx.http_port` and
    is ready when `/health` answers 200; other ranks open no client port and are up while their
    process runs. The profile's extra flags go last, on every rank."""
    leader = spec.rank == 0
    full = [*argv]
    if leader:
        full += ["--host", ctx.bind_host, "--port", str(ctx.http_port)]
    full += spec.args
    return Launch(
        argv=tuple(full),
        env=cuda_env(spec),
        serves_http=leader,
        port=ctx.http_port if leader else None,
        health_path="/health" if leader else None,
        readiness=Readiness.HTTP_200 if leader else Readiness.PROCESS,
    )


def replica_nodes(spec: ShardSpec) -> tuple[NodeId, ...]:
    """Every rank's node; a spec without them may only be a replica of one node."""
    if spec.nodes:
        if len(spec.nodes) != spec.shard_count or spec.nodes[0] != spec.leader:
            raise ValueError(
                f"{spec.replica}: nodes {spec.nodes} do not match {spec.shard_count} shards "
                f"led by {spec.leader}"
            )
        return spec.nodes
    if spec.shard_count > 1:
        raise ValueError(f"{spec.replica}: a {spec.shard_count}-node replica needs every node")
    return (spec.node,)


def program_flags(argv: Sequence[str], command: Sequence[str]) -> tuple[str, ...]:
    """The flags in `argv` after its binary and command words: `--name` of `--name=value`."""
    rest = list(argv[1 + len(command) :])
    out: list[str] = []
    for word in rest:
        if not word.startswith("-") or word == "-" or _is_number(word):
            continue
        flag = word.split("=", 1)[0]
        if flag not in out:
            out.append(flag)
    return tuple(out)


def _is_number(word: str) -> bool:
    try:
        float(word)
    except ValueError:
        return False
    return True


def widest_spec(
    engine: str,
    rank: int,
    shard_count: int,
    gpus_per_node: int = 8,
    args: tuple[str, ...] = (),
    role: str = "",
) -> ShardSpec:
    """A literal shard of a replica on nodes node01..nodeNN, GPUs 0..g-1 on each (of a role
    group's `role`, if given)."""
    nodes = tuple(NodeId(f"node{i + 1:02d}") for i in range(shard_count))
    return ShardSpec(
        replica=ReplicaId("llama-70b-r1"),
        model=ModelName("llama-70b"),
        profile=ProfileName(f"{engine}-{shard_count}x{gpus_per_node}"),
        engine=EngineName(engine),
        model_path="/models/llama-70b",
        rank=rank,
        shard_count=shard_count,
        node=nodes[rank],
        gpus=tuple(range(gpus_per_node)),
        leader=nodes[0],
        nodes=nodes,
        rendezvous_port=RENDEZVOUS_PORT_BASE,
        load_time_ms=0,
        args=args,
        role=role,
    )


WIDEST_NODES = 4
"""The widest replica engine-check builds: every multi-node flag appears from two nodes on."""


def widest_of(adapter: EngineAdapter, ctx: LaunchContext) -> tuple[Launch, ...]:
    """Each rank of the widest replica: a role group's prefill replica, whose disaggregation
    flags are the engine's too (`ROLE_NAMES`: every role passes the same flags)."""
    return tuple(
        adapter.launch(widest_spec(adapter.name, rank, WIDEST_NODES, role="prefill"), ctx)
        for rank in range(WIDEST_NODES)
    )
