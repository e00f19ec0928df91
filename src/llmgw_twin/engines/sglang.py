"""SGLang: one `sglang serve` per node, all with the same command but their own `--node-rank`.

Written against SGLang 0.5.23 (`sglang/srt/server_args.py`, whose flags come from the
`A[type, help]` fields of `sglang/srt/arg_groups/fields/*.py`, and `sglang/cli/serve.py`).
Multi-node is SGLang's own launch: every node runs `--nnodes`, its `--node-rank` and
`--dist-init-addr LEADER:PORT` (torch.distributed's rendezvous on the leader). Tensor
parallelism spans the whole replica (`--tp-size` = GPUs per node x nodes; each node runs its
share of the ranks), SGLang's documented multi-node shape. Only node rank 0 runs the HTTP server;
higher ranks run schedulers only.

Invariants: `--model-type llm` pins `sglang serve` to its language-model server, so it never
probes the model (which for a hub id means a network lookup) to choose a backend; the leader is
ready when GET /health answers 200 (503 while the server is starting); workers open no port.

Role groups (`control/groups.py`): every rank of a prefill replica runs `--disaggregation-mode
prefill` with its own `--disaggregation-bootstrap-port`, every rank of a decode replica
`--disaggregation-mode decode`; the transfer backend is SGLang's default.

Load metrics: `/metrics` needs `--enable-metrics`, which the leader always gets. Queue:
`sglang:num_queue_reqs`; KV-cache use: `sglang:token_usage` (0 to 1). Labelled per rank
(`tp_rank` and others): the queues are summed, the largest use taken.
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

PINNED_VERSION = "0.5.23"
BINARY = "sglang"
SERVE = ("serve", "--model-type", "llm")
PROGRAM = Program(
    default_binary=BINARY,
    command=SERVE,
    help_args=(*SERVE, "--help"),
    min_help_chars=20_000,
    help_sections=("usage:", "options:"),
)


LOAD_METRICS = LoadMetrics(queue=("sglang:num_queue_reqs",), kv_cache=("sglang:token_usage",))
BOOTSTRAP_PORT_BASE = 29700
"""A prefill server's KV bootstrap port: this plus its first GPU index, unique on its node as
the rendezvous ports are (`RENDEZVOUS_PORT_BASE`)."""


def bootstrap_port(spec: ShardSpec) -> int:
    return BOOTSTRAP_PORT_BASE + (spec.gpus[0] if spec.gpus else 0)


class SglangAdapter:
    name = "sglang"
    pinned_version = PINNED_VERSION
    programs: tuple[Program, ...] = (PROGRAM,)
    load_metrics = LOAD_METRICS

    def launch(self, spec: ShardSpec, ctx: LaunchContext) -> Launch:
        argv = [
            ctx.binary or BINARY,
            *SERVE,
            "--model-path",
            spec.model_path,
            "--served-model-name",
            spec.model,
            "--tp-size",
            str(len(spec.gpus) * spec.shard_count),
        ]
        if spec.shard_count > 1:
            argv += [
                "--nnodes",
                str(spec.shard_count),
                "--node-rank",
                str(spec.rank),
                "--dist-init-addr",
                f"{ctx.leader_host}:{spec.rendezvous_port}",
            ]
        if spec.role:  # a role group's replica: SGLang's prefill/decode disaggregation
            argv += ["--disaggregation-mode", spec.role]
            if spec.role == "prefill":  # where decode servers fetch the KV cache from
                argv += ["--disaggregation-bootstrap-port", str(bootstrap_port(spec))]
        if spec.rank == 0:
            argv.append("--enable-metrics")  # the autoscaler's queue and KV-cache use
        return http_leader_launch(spec, ctx, argv)

    def widest(self) -> tuple[Launch, ...]:
        return widest_of(self, LaunchContext(leader_host="node01"))
