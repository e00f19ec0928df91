"""The project's own sim engine: a stand-in engine with a real multi-node launch shape.

Rank 0 (the leader) binds a rendezvous port, waits for every worker to join, and serves an
OpenAI-compatible API on its HTTP port once its load time has passed. Workers connect to the
leader's rendezvous point and serve nothing. The twin models exactly this behaviour; the argv
built here is what production runs.

Invariants: the argv below is the contract with the runnable sim engine (`llmgw-twin
sim-engine`); the leader is ready when GET /health answers 200; workers open no port, and one
given a ready file (`LaunchContext.ready_file`) is ready once it wrote it (loaded and joined,
as the twin's worker), else while its process runs. A pace file (`LaunchContext.pace_file`, a
straggler's pace in real mode) goes to every rank; the twin's launches name neither.

Load metrics: the leader's `/metrics` says `llmgw_sim:requests_waiting` and
`llmgw_sim:kv_cache_usage_ratio` (0 to 1), from its engine model (`--perf-model`); without one
both are 0.
"""

from __future__ import annotations

from dataclasses import replace

from llmgw_twin import __version__
from llmgw_twin.control.model import ShardSpec
from llmgw_twin.engines.base import (
    ALL_INTERFACES,
    Launch,
    LaunchContext,
    LoadMetrics,
    Program,
    Readiness,
    http_leader_launch,
    widest_of,
)

PROGRAM = Program(
    default_binary="llmgw-twin",
    command=("sim-engine",),
    help_args=("sim-engine", "--help"),
    min_help_chars=300,
    help_sections=("usage:", "options:"),
)


QUEUE_METRIC = "llmgw_sim:requests_waiting"
KV_CACHE_METRIC = "llmgw_sim:kv_cache_usage_ratio"
LOAD_METRICS = LoadMetrics(queue=(QUEUE_METRIC,), kv_cache=(KV_CACHE_METRIC,))


class SimAdapter:
    name = "sim"
    pinned_version = __version__
    programs: tuple[Program, ...] = (PROGRAM,)
    load_metrics = LOAD_METRICS

    def launch(self, spec: ShardSpec, ctx: LaunchContext) -> Launch:
        argv = [
            ctx.binary or "llmgw-twin",
            "sim-engine",
            "--model",
            spec.model_path,
            "--served-model-name",
            spec.model,
            "--nnodes",
            str(spec.shard_count),
            "--node-rank",
            str(spec.rank),
            "--rendezvous",
            f"{ctx.leader_host}:{spec.rendezvous_port}",
            "--load-time-ms",
            str(spec.load_time_ms),
        ]
        if spec.rank > 0 and ctx.bind_host != ALL_INTERFACES:
            # its traffic leaves from the node's own address, as on a real network (real mode's
            # fabric proxies tell by it which node dials: docs/real-mode.md)
            argv += ["--source-host", ctx.bind_host]
        if ctx.pace_file is not None:
            argv += ["--pace-file", ctx.pace_file]
        ready_file = ctx.ready_file if spec.rank > 0 else None
        if ready_file is not None:
            argv += ["--ready-file", ready_file]
        launch = http_leader_launch(spec, ctx, argv)
        if ready_file is None:
            return launch
        return replace(launch, readiness=Readiness.FILE, ready_file=ready_file)

    def widest(self) -> tuple[Launch, ...]:
        ctx = LaunchContext(
            leader_host="node01",
            bind_host="10.0.0.2",
            pace_file="/var/lib/llmgw-agent/pace",
            ready_file="/var/lib/llmgw-agent/node01.ready/m-r1-1",
        )
        return widest_of(self, ctx)
