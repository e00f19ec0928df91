"""Engine adapters on literal shard specs: each rank's argv, environment, port and readiness."""

from __future__ import annotations

import dataclasses

import pytest

from llmgw_twin.control.model import (
    ENGINES,
    EngineName,
    ModelName,
    NodeId,
    ProfileName,
    ReplicaId,
    ShardSpec,
)
from llmgw_twin.engines import llamacpp
from llmgw_twin.engines.base import ALL_INTERFACES as ANY
from llmgw_twin.engines.base import Launch, LaunchContext, Readiness, program_flags
from llmgw_twin.engines.registry import adapter_for, engine_names

NODES = (NodeId("gpu-a1"), NodeId("gpu-a2"), NodeId("gpu-a3"), NodeId("gpu-a4"))


def shard(
    engine: str,
    rank: int,
    shard_count: int,
    gpus: tuple[int, ...] = (4, 5),
    args: tuple[str, ...] = (),
) -> ShardSpec:
    """Rank `rank` of a replica on the first `shard_count` of gpu-a1..gpu-a4, rendezvous 29504."""
    nodes = NODES[:shard_count]
    return ShardSpec(
        replica=ReplicaId("qwen-7b-r3"),
        model=ModelName("qwen-7b"),
        profile=ProfileName("p"),
        engine=EngineName(engine),
        model_path="/models/qwen-7b",
        rank=rank,
        shard_count=shard_count,
        node=nodes[rank],
        gpus=gpus,
        leader=nodes[0],
        nodes=nodes,
        rendezvous_port=29504,
        args=args,
    )


CTX = LaunchContext(leader_host="10.0.0.1", http_port=8004)


def launch(engine: str, rank: int, shard_count: int, ctx: LaunchContext = CTX) -> Launch:
    return adapter_for(engine).launch(shard(engine, rank, shard_count), ctx)


# --- vLLM -------------------------------------------------------------------------------------

VLLM_HEAD = ("vllm", "serve", "/models/qwen-7b", "--served-model-name", "qwen-7b")


def test_vllm_one_node() -> None:
    got = launch("vllm", 0, 1)
    assert got.argv == (
        *VLLM_HEAD,
        "--tensor-parallel-size", "2",
        "--host", ANY, "--port", "8004",
    )  # fmt: skip


@pytest.mark.parametrize("n", [2, 4])
def test_vllm_multi_node_leader_and_worker(n: int) -> None:
    multi = (
        "--tensor-parallel-size", "2", "--pipeline-parallel-size", str(n), "--nnodes", str(n),
    )  # fmt: skip
    rdv = ("--master-addr", "10.0.0.1", "--master-port", "29504")
    assert launch("vllm", 0, n).argv == (
        *VLLM_HEAD, *multi, "--node-rank", "0", *rdv, "--host", ANY, "--port", "8004",
    )  # fmt: skip
    assert launch("vllm", n - 1, n).argv == (
        *VLLM_HEAD, *multi, "--node-rank", str(n - 1), *rdv, "--headless",
    )  # fmt: skip


# --- SGLang -----------------------------------------------------------------------------------

SGLANG_HEAD = (
    "sglang", "serve", "--model-type", "llm",
    "--model-path", "/models/qwen-7b", "--served-model-name", "qwen-7b",
)  # fmt: skip


def test_sglang_one_node() -> None:
    assert launch("sglang", 0, 1).argv == (
        *SGLANG_HEAD, "--tp-size", "2", "--enable-metrics", "--host", ANY, "--port", "8004",
    )  # fmt: skip


@pytest.mark.parametrize("n", [2, 4])
def test_sglang_multi_node_leader_and_worker(n: int) -> None:
    # tensor parallelism spans the replica: 2 GPUs on each of n nodes
    tp = ("--tp-size", str(2 * n), "--nnodes", str(n))
    rdv = ("--dist-init-addr", "10.0.0.1:29504")
    assert launch("sglang", 0, n).argv == (
        *SGLANG_HEAD, *tp, "--node-rank", "0", *rdv, "--enable-metrics",
        "--host", ANY, "--port", "8004",
    )  # fmt: skip
    assert launch("sglang", n - 1, n).argv == (
        *SGLANG_HEAD, *tp, "--node-rank", str(n - 1), *rdv,
    )  # fmt: skip


# --- llama.cpp --------------------------------------------------------------------------------

LLAMA_HEAD = (
    "llama-server", "--model", "/models/qwen-7b", "--alias", "qwen-7b",
    "--n-gpu-layers", "999", "--host", ANY, "--port", "8004", "--metrics",
)  # fmt: skip


def test_llamacpp_one_node() -> None:
    assert launch("llamacpp", 0, 1).argv == LLAMA_HEAD


def test_llamacpp_two_nodes() -> None:
    # rendezvous 29504 is offset 4 from the base: every worker's RPC port is 50052 + 4
    assert launch("llamacpp", 0, 2).argv == (*LLAMA_HEAD, "--rpc", "gpu-a2:50056")
    assert launch("llamacpp", 1, 2).argv == (
        "ggml-rpc-server", "--host", ANY, "--port", "50056",
    )  # fmt: skip


def test_llamacpp_four_nodes_with_addresses_and_ports() -> None:
    ctx = LaunchContext(
        leader_host="10.0.0.1",
        http_port=8004,
        node_addresses=(("gpu-a2", "10.0.0.2"), ("gpu-a4", "10.0.0.4")),
        worker_ports=((3, 50100),),
    )
    assert launch("llamacpp", 0, 4, ctx).argv == (
        *LLAMA_HEAD, "--rpc", "10.0.0.2:50056,gpu-a3:50056,10.0.0.4:50100",
    )  # fmt: skip
    worker = launch("llamacpp", 3, 4, ctx)
    assert worker.argv == ("ggml-rpc-server", "--host", ANY, "--port", "50100")
    assert (worker.serves_http, worker.port, worker.health_path) == (False, 50100, None)
    assert worker.readiness is Readiness.TCP_LISTEN


def test_llamacpp_profile_flags_go_to_the_leader_only() -> None:
    adapter = adapter_for("llamacpp")
    extra = ("--ctx-size", "8192")
    assert adapter.launch(shard("llamacpp", 0, 2, args=extra), CTX).argv[-2:] == extra
    worker = adapter.launch(shard("llamacpp", 1, 2, args=extra), CTX)
    assert "--ctx-size" not in worker.argv


def test_llamacpp_leader_needs_every_node() -> None:
    without_nodes = dataclasses.replace(shard("llamacpp", 0, 2), nodes=())
    with pytest.raises(ValueError, match="needs every node"):
        adapter_for("llamacpp").launch(without_nodes, CTX)


def test_worker_binary_override() -> None:
    ctx = LaunchContext(
        leader_host="h", binary="/opt/llama/llama-server", worker_binary="/opt/llama/rpc"
    )
    assert launch("llamacpp", 0, 2, ctx).argv[0] == "/opt/llama/llama-server"
    assert launch("llamacpp", 1, 2, ctx).argv[0] == "/opt/llama/rpc"


# --- sim: its argv is the runnable sim engine's contract --------------------------------------


def test_sim_argv_is_unchanged() -> None:
    assert launch("sim", 0, 2).argv == (
        "llmgw-twin", "sim-engine", "--model", "/models/qwen-7b", "--served-model-name",
        "qwen-7b", "--nnodes", "2", "--node-rank", "0", "--rendezvous", "10.0.0.1:29504",
        "--load-time-ms", "0", "--host", ANY, "--port", "8004",
    )  # fmt: skip
    assert launch("sim", 1, 2).argv == (
        "llmgw-twin", "sim-engine", "--model", "/models/qwen-7b", "--served-model-name",
        "qwen-7b", "--nnodes", "2", "--node-rank", "1", "--rendezvous", "10.0.0.1:29504",
        "--load-time-ms", "0",
    )  # fmt: skip


# --- what every adapter keeps -----------------------------------------------------------------


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("n", [1, 2, 4])
def test_only_rank_zero_serves_http(engine: str, n: int) -> None:
    leader = launch(engine, 0, n)
    assert (leader.serves_http, leader.port, leader.health_path) == (True, 8004, "/health")
    assert leader.readiness is Readiness.HTTP_200
    for rank in range(1, n):
        worker = launch(engine, rank, n)
        assert not worker.serves_http
        assert worker.health_path is None
        assert "8004" not in worker.argv


@pytest.mark.parametrize("engine", ENGINES)
def test_gpus_reach_the_engine_in_order(engine: str) -> None:
    spec = shard(engine, 1, 2, gpus=(6, 2, 7))
    assert adapter_for(engine).launch(spec, CTX).env == (("CUDA_VISIBLE_DEVICES", "6,2,7"),)


@pytest.mark.parametrize("engine", ["sim", "vllm", "sglang"])
def test_profile_flags_come_last(engine: str) -> None:
    extra = ("--max-model-len", "4096")
    for rank in (0, 1):
        got = adapter_for(engine).launch(shard(engine, rank, 2, args=extra), CTX).argv
        assert got[-2:] == extra


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_binary_override(engine: str) -> None:
    ctx = LaunchContext(leader_host="h", binary="/opt/venv/bin/" + engine)
    assert launch(engine, 1, 2, ctx).argv[:2] == ("/opt/venv/bin/" + engine, "serve")


def test_registry_knows_every_engine() -> None:
    assert engine_names() == tuple(sorted(ENGINES))
    with pytest.raises(KeyError, match="no adapter for engine 'tgi'"):
        adapter_for("tgi")


@pytest.mark.parametrize("engine", ENGINES)
def test_widest_is_a_four_node_replica(engine: str) -> None:
    launches = adapter_for(engine).widest()
    assert len(launches) == 4
    assert [la.serves_http for la in launches] == [True, False, False, False]


def test_program_flags() -> None:
    argv = ("vllm", "serve", "/m", "--a=1", "--b", "-1", "-c", "x", "-", "--a", "2.5")
    assert program_flags(argv, ("serve",)) == ("--a", "--b", "-c")


def test_llamacpp_workers_sharing_a_node_get_distinct_rpc_ports() -> None:
    """Two replicas whose leaders both start at GPU 0 (on different nodes) share a worker node:
    each worker's RPC port comes from its own GPUs, so they differ there."""
    from llmgw_twin.control.controller import Controller
    from llmgw_twin.control.model import Deployment, FabricId, ModelName, NodeInfo, Profile, Timings
    from llmgw_twin.control.protocol import ApplyDeployment, ApplyProfile, NodeRegistered

    ctl = Controller(Timings())
    prof = Profile(ProfileName("p"), EngineName("llamacpp"), 2, 4, "/m.gguf")
    ctl.handle(ApplyProfile(prof), 0)
    for replicas, (name, gpus) in enumerate((("w", 8), ("a", 4), ("b", 4))):
        info = NodeInfo(NodeId(name), FabricId("f"), gpus, 1, (EngineName("llamacpp"),))
        ctl.handle(NodeRegistered(info), replicas)
        ctl.handle(ApplyDeployment(Deployment(ModelName("m"), prof.name, replicas)), replicas)
        ctl.tick(1_000 * (replicas + 1))  # a pairs with w, then b with what is left of w
    workers = [s for s in ctl.assigned(NodeId("w")) if s.rank == 1]
    assert len(workers) == 2 and {s.leader for s in workers} == {"a", "b"}
    ctx = LaunchContext(leader_host="x")
    ports = {llamacpp.rpc_port(s, 1, ctx) for s in workers}
    assert len(ports) == 2
    leader_view = {
        llamacpp.rpc_port(s, 1, ctx) for node in ("a", "b") for s in ctl.assigned(NodeId(node))
    }
    assert leader_view == ports  # each leader dials the port its worker listens on
