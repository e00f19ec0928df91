"""The project's own sim engine: a stand-in engine with a real multi-node launch shape.

Rank 0 (the leader) binds a rendezvous port, waits for every worker to join, and serves an
OpenAI-compatible API on its HTTP port once its load time has passed. Workers connect to the
leader's rendezvous point and serve nothing. The twin models exactly this behaviour; the argv
built here is what production runs.
"""

from __future__ import annotations

from llmgw_twin.control.model import ShardSpec
from llmgw_twin.engines.base import Launch, LaunchContext


class SimAdapter:
    name = "sim"

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
            argv += ["--host", "0.0.0.0", "--port", str(ctx.http_port)]  # noqa: S104
        argv += list(spec.args)
        env = (("CUDA_VISIBLE_DEVICES", ",".join(str(g) for g in spec.gpus)),)
        return Launch(
            argv=tuple(argv),
            env=env,
            serves_http=leader,
            port=ctx.http_port if leader else None,
            health_path="/health" if leader else None,
        )
