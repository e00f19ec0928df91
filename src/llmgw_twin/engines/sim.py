"""The project's own sim engine: a stand-in engine with a real multi-node launch shape.

Rank 0 (the leader) binds a rendezvous port, waits for every worker to join, and serves an
OpenAI-compatible API on its HTTP port once its load time has passed. Workers connect to the
leader's rendezvous point and serve nothing. The twin models exactly this behaviour; the argv
built here is what production runs.

Invariants: the argv below is the contract with the runnable sim engine (`llmgw-twin
sim-engine`); the leader is ready when GET /health answers 200; workers open no port.
"""

from __future__ import annotations

from llmgw_twin import __version__
from llmgw_twin.control.model import ShardSpec
from llmgw_twin.engines.base import Launch, LaunchContext, Program, Readiness, widest_of

PROGRAM = Program(
    default_binary="llmgw-twin",
    command=("sim-engine",),
    help_args=("sim-engine", "--help"),
    min_help_chars=300,
    help_sections=("usage:", "options:"),
)


class SimAdapter:
    name = "sim"
    pinned_version = __version__
    programs: tuple[Program, ...] = (PROGRAM,)

    def launch(self, spec: ShardSpec, ctx: LaunchContext) -> Launch:
        leader = spec.rank == 0
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
        if leader:
            argv += ["--host", ctx.bind_host, "--port", str(ctx.http_port)]
        argv += list(spec.args)
        env = (("CUDA_VISIBLE_DEVICES", ",".join(str(g) for g in spec.gpus)),)
        return Launch(
            argv=tuple(argv),
            env=env,
            serves_http=leader,
            port=ctx.http_port if leader else None,
            health_path="/health" if leader else None,
            readiness=Readiness.HTTP_200 if leader else Readiness.PROCESS,
        )

    def widest(self) -> tuple[Launch, ...]:
        return widest_of(self, LaunchContext(leader_host="node01"))
