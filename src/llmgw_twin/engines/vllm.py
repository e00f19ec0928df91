"""vLLM: one `vllm serve` per node; the leader serves HTTP, the other nodes run headless.

Written against vLLM 0.33.0 (`vllm/engine/arg_utils.py`, `vllm/entrypoints/common/cli_args.py`,
`vllm/entrypoints/cli/serve.py`). Multi-node uses vLLM's own multiprocessing launch, no Ray:
every node runs the same command with `--nnodes`, its `--node-rank` and the leader's
`--master-addr`/`--master-port` (torch.distributed's rendezvous); nodes of rank 1 and up add
`--headless`, so they start engine workers and no API server. Tensor parallelism spans the GPUs
of one node (`--tensor-parallel-size` = GPUs per node) and pipeline parallelism spans the nodes
(`--pipeline-parallel-size` = nodes), vLLM's advice for multi-node serving.

Invariants: the model path is the positional `model_tag` (so `--model`, which `vllm serve --help`
hides, is never needed); the leader is ready when GET /health answers 200 (its API server binds
only after every node's workers have joined and loaded); workers open no port of their own.

Role groups (`control/groups.py`): every rank of a prefill or decode replica runs
`--kv-transfer-config` with the NIXL connector.

Load metrics: `/metrics` is always served. Queue: `vllm:num_requests_waiting`; KV-cache use:
`vllm:kv_cache_usage_perc` (a share 0 to 1 despite its name; older releases call it
`vllm:gpu_cache_usage_perc`). Labelled `model_name` and `engine`.
"""

from __future__ import annotations

from llmgw_twin.control.model import ShardSpec
from llmgw_twin.engines.base import (
    Launch,
    LaunchContext,
    LoadMetrics,
    Program,
    http_leader_launch,
    widest_of,
)

PINNED_VERSION = "0.33.0"
BINARY = "vllm"
SERVE = ("serve",)
# `vllm serve --help` prints a summary of groups only; `--help=all` prints every flag.
PROGRAM = Program(
    default_binary=BINARY,
    command=SERVE,
    help_args=(*SERVE, "--help=all"),
    min_help_chars=20_000,
    # its groups, in the order `make_arg_parser` adds them, then the epilog `--help=all` prints
    help_sections=(
        "Frontend:",
        "ModelConfig:",
        "ParallelConfig:",
        "VllmConfig:",
        "When passing JSON CLI arguments",
    ),
)


KV_TRANSFER_CONFIG = '{"kv_connector":"NixlConnector","kv_role":"kv_both"}'
"""vLLM's disaggregated prefill over NIXL: both roles run the same connector as `kv_both`; which
one prefills is the router's choice (its first hop asks the prefill replica for one token)."""

LOAD_METRICS = LoadMetrics(
    queue=("vllm:num_requests_waiting",),
    kv_cache=("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
)


class VllmAdapter:
    name = "vllm"
    pinned_version = PINNED_VERSION
    programs: tuple[Program, ...] = (PROGRAM,)
    load_metrics = LOAD_METRICS

    def launch(self, spec: ShardSpec, ctx: LaunchContext) -> Launch:
        leader = spec.rank == 0
        argv = [
            ctx.binary or BINARY,
            *SERVE,
            spec.model_path,
            "--served-model-name",
            spec.model,
            "--tensor-parallel-size",
            str(len(spec.gpus)),
        ]
        if spec.shard_count > 1:
            argv += [
                "--pipeline-parallel-size",
                str(spec.shard_count),
                "--nnodes",
                str(spec.shard_count),
                "--node-rank",
                str(spec.rank),
                "--master-addr",
                ctx.leader_host,
                "--master-port",
                str(spec.rendezvous_port),
            ]
        if spec.role:  # a role group's replica: the KV cache goes prefill to decode over NIXL
            argv += ["--kv-transfer-config", KV_TRANSFER_CONFIG]
        if not leader:
            argv.append("--headless")
        return http_leader_launch(spec, ctx, argv)

    def widest(self) -> tuple[Launch, ...]:
        return widest_of(self, LaunchContext(leader_host="node01"))
