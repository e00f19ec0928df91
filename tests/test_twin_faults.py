"""The twin's version 1.1 faults and the hardware state agents find: a hung engine is found by its
leader's probe, a crashed node's peers see their connections close (a killed node's do not), a
fabric outage is a link state every agent in the fabric reports, and a failed GPU is failed still
after a reboot. Each test reads what the agents actually sent the controller."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import simpy

from llmgw_twin.control.model import NodeId, NodeInfo, ShardReport, ShardState, Timings
from llmgw_twin.control.protocol import ControllerEvent, Heartbeat, NodeRegistered
from llmgw_twin.realmode.refusals import check_real_supported
from llmgw_twin.twin.scenario.loader import ScenarioError, load_scenario_text
from llmgw_twin.twin.scenario.model import CrashNode, HangEngine
from llmgw_twin.twin.world import runner
from llmgw_twin.twin.world.controller import ControllerShell
from llmgw_twin.twin.world.network import MGMT_LINK_MS, Network
from llmgw_twin.twin.world.node import PEER_LOST_EXIT_CODE
from llmgw_twin.twin.world.runner import RunResult, run_scenario
from llmgw_twin.twin.world.sim import World


@dataclass(frozen=True, slots=True)
class Sent:
    """One report as the controller received it."""

    t_ms: int
    node: NodeId
    shards: tuple[ShardReport, ...]
    failed_gpus: tuple[int, ...]
    fabric_up: bool
    registration: bool


@dataclass(slots=True)
class Recorded:
    result: RunResult
    world: World
    sent: list[Sent] = field(default_factory=list)

    def of(self, node: str, start: int = 0, end: int | None = None) -> list[Sent]:
        return [
            s
            for s in self.sent
            if s.node == node and s.t_ms >= start and (end is None or s.t_ms <= end)
        ]

    def states(self, node: str, replica: str, rank: int) -> list[tuple[int, ShardState]]:
        """When `node` reported the shard in which state (only the changes)."""
        out: list[tuple[int, ShardState]] = []
        for s in self.of(node):
            for r in s.shards:
                if (r.spec.replica, r.spec.rank) != (replica, rank):
                    continue
                if not out or out[-1][1] is not r.state:
                    out.append((s.t_ms, r.state))
        return out


Run = Callable[[str], Recorded]


@pytest.fixture
def run(monkeypatch: pytest.MonkeyPatch) -> Run:
    """Run a scenario text, recording every report an agent delivered to the controller."""
    box: dict[str, World] = {}
    sent: list[Sent] = []

    class RecordingWorld(World):
        def __init__(
            self,
            env: simpy.Environment,
            nodes: tuple[NodeInfo, ...],
            network: Network,
            timings: Timings,
            rng: random.Random,
            to_controller: Callable[[ControllerEvent], None],
            bulk: bool = True,
        ) -> None:
            def record(msg: ControllerEvent) -> None:
                if isinstance(msg, Heartbeat):
                    sent.append(
                        Sent(self.now, msg.node, msg.shards, msg.failed_gpus, msg.fabric_up, False)
                    )
                elif isinstance(msg, NodeRegistered):
                    sent.append(
                        Sent(
                            self.now,
                            msg.info.node,
                            msg.shards,
                            msg.failed_gpus,
                            msg.fabric_up,
                            True,
                        )
                    )
                to_controller(msg)

            super().__init__(env, nodes, network, timings, rng, record, bulk)
            box["world"] = self

    monkeypatch.setattr(runner, "World", RecordingWorld)
    receive_heartbeat = ControllerShell.receive_heartbeat

    def heartbeat(shell: ControllerShell, msg: Heartbeat) -> bool:
        """The timer's heartbeats come in by their own door (`twin/world/heartbeats.py`)."""
        sent.append(
            Sent(shell.world.now, msg.node, msg.shards, msg.failed_gpus, msg.fabric_up, False)
        )
        return receive_heartbeat(shell, msg)

    monkeypatch.setattr(ControllerShell, "receive_heartbeat", heartbeat)

    def go(text: str) -> Recorded:
        sent.clear()
        # one event per heartbeat, so that every heartbeat is recorded
        result = run_scenario(load_scenario_text(text, "t.yaml"), bulk=False)
        return Recorded(result, box["world"], list(sent))

    return go


def scenario(faults: str, duration: str = "4m", fabrics: str = "") -> str:
    return f"""\
name: t
seed: 3
duration: {duration}
timings: {{probe_interval: 5s, unresponsive_grace: 20s}}
cluster:
  fabrics:
{fabrics or "    ib-a: [node01, node02, node03, node04]"}
profiles:
  p2: {{engine: sim, nodes: 2, gpus_per_node: 8, load_time: 10s, model: /m}}
deployments:
  - {{model: m, profile: p2, replicas: 1}}
faults:
{faults}"""


S, M = 1_000, 60_000
LATENCY = 2 * MGMT_LINK_MS
"""Node -> management switch -> controller."""


# --- hang_engine ---------------------------------------------------------------------------------


def test_a_hung_worker_makes_its_leader_report_unresponsive_one_probe_later(run: Run) -> None:
    got = run(scenario("  - {id: hang, at: 1m, hang_engine: {node: node02, replica_of: m}}\n"))
    # m-r1 is node01 (leader) + node02 (worker), serving from 11s
    leader = got.states("node01", "m-r1", 0)
    assert [state for _, state in leader][:3] == [
        ShardState.PREPARING,
        ShardState.STARTING,
        ShardState.SERVING,
    ]
    t_unresponsive = next(t for t, state in leader if state is ShardState.UNRESPONSIVE)
    assert (
        1 * M + 5 * S <= t_unresponsive <= 1 * M + 5 * S + LATENCY
    )  # one probe interval (+latency)
    # the hung worker's own agent finds it silent at its probe too: unresponsive, not exited
    worker = got.states("node02", "m-r1", 1)
    assert all(state is not ShardState.EXITED for _, state in worker)
    after = [(t, state) for t, state in worker if t >= 1 * M]
    assert [state for _, state in after] == [ShardState.UNRESPONSIVE]
    assert 1 * M + 5 * S <= after[0][0] <= 1 * M + 5 * S + LATENCY
    # the controller saw it (degraded), failed it after the grace and stopped both hung engines
    kinds = [(e.kind, e.get("replica")) for e in got.result.trace]
    assert ("replica.degraded", "m-r1") in kinds
    assert not [e for e in got.world.engines() if e.spec.replica == "m-r1"]


def test_a_hung_leader_is_found_on_its_own_node(run: Run) -> None:
    got = run(scenario("  - {id: hang, at: 1m, hang_engine: {node: node01, replica_of: m}}\n"))
    leader = got.states("node01", "m-r1", 0)
    assert (ShardState.UNRESPONSIVE in [state for _, state in leader]) is True
    t_unresponsive = next(t for t, state in leader if state is ShardState.UNRESPONSIVE)
    assert 1 * M + 5 * S <= t_unresponsive <= 1 * M + 5 * S + LATENCY
    # nothing on the worker's node ever says unresponsive: the probe is the leader's
    assert ShardState.UNRESPONSIVE not in [s for _, s in got.states("node02", "m-r1", 1)]


def test_an_engine_hung_while_loading_never_serves_and_is_never_probed(run: Run) -> None:
    got = run(scenario("  - {id: hang, at: 5s, hang_engine: {node: node01, replica_of: m}}\n"))
    leader = [state for _, state in got.states("node01", "m-r1", 0)]
    assert ShardState.SERVING not in leader
    assert ShardState.UNRESPONSIVE not in leader
    assert ShardState.EXITED not in leader  # it never exits by itself


def test_hang_engine_is_checked_like_kill_engine() -> None:
    with pytest.raises(ScenarioError) as info:
        load_scenario_text(
            scenario("  - {at: 1m, hang_engine: {node: node02, replica_of: llama}}\n"), "t.yaml"
        )
    assert "faults[0].hang_engine.replica_of: 'llama' is not a deployed model" in str(info.value)
    with pytest.raises(ScenarioError) as info:
        load_scenario_text(scenario("  - {at: 1m, hang_engine: {node: node02}}\n"), "t.yaml")
    assert "missing required key 'replica_of' in faults[0].hang_engine" in str(info.value)
    s = load_scenario_text(
        scenario("  - {at: 1m, hang_engine: {node: node02, replica_of: m}}\n"), "t.yaml"
    )
    assert s.faults[0].action == HangEngine(NodeId("node02"), s.deployments[0].model)


# --- crash_node ----------------------------------------------------------------------------------


def test_a_crashed_node_takes_its_peers_engines_down_at_once(run: Run) -> None:
    got = run(scenario("  - {id: crash, at: 1m, crash_node: node02}\n"))
    exits = [
        (s.t_ms, r.exit_code)
        for s in got.of("node01", 1 * M)
        for r in s.shards
        if r.spec.replica == "m-r1" and r.state is ShardState.EXITED
    ]
    assert exits and exits[0] == (1 * M + LATENCY, PEER_LOST_EXIT_CODE)
    # node02 itself went silent, as a killed node does
    assert not got.of("node02", 1 * M)
    fault = next(e for e in got.result.trace if e.kind == "fault.injected")
    assert (fault.get("action"), fault.get("node")) == ("crash_node", "node02")


def test_a_killed_node_leaves_its_peers_engines_running(run: Run) -> None:
    got = run(scenario("  - {id: kill, at: 1m, kill_node: node02}\n"))
    leader = got.states("node01", "m-r1", 0)
    # the leader keeps serving into the silence until the controller gives node02 up
    assert ShardState.EXITED not in [state for t, state in leader if t <= 1 * M + 30 * S]


def test_a_crashed_node_boots_again_on_restart(run: Run) -> None:
    got = run(
        scenario(
            "  - {id: crash, at: 1m, crash_node: node02}\n"
            "  - {at: crash+1m, restart_node: node02}\n"
        )
    )
    back = got.of("node02", 2 * M)
    assert back and back[0].registration and back[0].t_ms == 2 * M + LATENCY
    joined = [e.t_ms for e in got.result.trace if e.kind == "node.joined" and e.get("node")]
    assert len(joined) == 5  # four at boot, node02 again


def test_crash_node_is_checked_like_kill_node() -> None:
    with pytest.raises(ScenarioError) as info:
        load_scenario_text(scenario("  - {at: 1m, crash_node: node09}\n"), "t.yaml")
    assert "faults[0].crash_node: unknown node 'node09'" in str(info.value)
    s = load_scenario_text(scenario("  - {at: 1m, crash_node: node02}\n"), "t.yaml")
    assert s.faults[0].action == CrashNode(NodeId("node02"))


# --- fabric link state ---------------------------------------------------------------------------

TWO_FABRICS = "    ib-a: [node01, node02]\n    ib-b: [node03, node04]"


def test_fabric_down_is_reported_by_every_node_of_the_fabric_until_it_is_back(run: Run) -> None:
    got = run(
        scenario(
            "  - {id: down, at: 1m, fabric_down: {fabric: ib-a, for: 1m}}\n", "4m", TWO_FABRICS
        )
    )
    for node in ("node01", "node02"):
        assert all(s.fabric_up for s in got.of(node, 0, 1 * M))
        during = got.of(node, 1 * M + 1, 2 * M)
        assert during and during[0].t_ms == 1 * M + LATENCY  # reported at once
        assert not any(s.fabric_up for s in during)
        after = got.of(node, 2 * M + 1)
        assert after and after[0].t_ms == 2 * M + LATENCY and all(s.fabric_up for s in after)
    for node in ("node03", "node04"):
        assert all(s.fabric_up for s in got.of(node))


def test_a_node_that_boots_during_an_outage_finds_its_links_down(run: Run) -> None:
    got = run(
        scenario(
            "  - {id: kill, at: 30s, kill_node: node02}\n"
            "  - {id: down, at: 1m, fabric_down: {fabric: ib-a, for: 1m}}\n"
            "  - {at: 1m30s, restart_node: node02}\n",
            "4m",
            TWO_FABRICS,
        )
    )
    boot = got.of("node02", 90 * S)
    assert boot[0].registration and not boot[0].fabric_up
    assert all(not s.fabric_up for s in got.of("node02", 90 * S, 2 * M))
    assert got.of("node02", 2 * M + 1)[0].fabric_up


# --- failed GPUs ---------------------------------------------------------------------------------


@pytest.mark.parametrize("down", ["kill_node", "crash_node"])
def test_a_failed_gpu_is_failed_again_after_a_reboot(run: Run, down: str) -> None:
    got = run(
        scenario(
            "  - {id: gpu, at: 30s, fail_gpu: {node: node03, gpu: 3}}\n"
            f"  - {{id: off, at: 1m, {down}: node03}}\n"
            "  - {at: 1m30s, restart_node: node03}\n"
        )
    )
    assert all(s.failed_gpus == () for s in got.of("node03", 0, 30 * S))
    assert all(s.failed_gpus == (3,) for s in got.of("node03", 30 * S + 1, 1 * M))
    boot = got.of("node03", 90 * S)
    assert boot[0].registration and boot[0].failed_gpus == (3,)
    assert all(s.failed_gpus == (3,) for s in boot)


# --- everything together -------------------------------------------------------------------------

MIXED = """\
  - {id: hang, at: 40s, hang_engine: {node: node02, replica_of: m}}
  - {id: crash, at: 2m, crash_node: node03}
  - {id: down, at: 2m30s, fabric_down: {fabric: ib-a, for: 30s}}
  - {at: 3m, restart_node: node03}
"""


def test_the_new_faults_are_deterministic() -> None:
    first = run_scenario(load_scenario_text(scenario(MIXED), "t.yaml"))
    again = run_scenario(load_scenario_text(scenario(MIXED), "t.yaml"))
    assert first.trace_sha256 == again.trace_sha256
    actions = [e.get("action") for e in first.trace if e.kind == "fault.injected"]
    assert actions == ["hang_engine", "crash_node", "fabric_down", "restart_node"]


def test_real_mode_injects_every_fault_the_twin_models() -> None:
    faults = (
        "{at: 1m, hang_engine: {node: node02, replica_of: m}}",
        "{at: 1m, fail_gpu: {node: node01, gpu: 3}}",
        "{at: 1m, fabric_down: {fabric: ib-a, for: 30s}}",
    )
    s = load_scenario_text(scenario("".join(f"  - {f}\n" for f in faults)), "t.yaml")
    check_real_supported(s)  # each is done to real processes and files (realmode/faults.py)


def test_real_mode_injects_a_crash() -> None:
    s = load_scenario_text(scenario("  - {at: 1m, crash_node: node02}\n"), "t.yaml")
    check_real_supported(s)  # a crash is a SIGKILL of the node's processes: nothing refused


def test_real_mode_hands_the_controller_every_setting_of_the_scenario(tmp_path: Path) -> None:
    from llmgw_twin.realmode.cluster import RealCluster
    from llmgw_twin.service.controller.config import load_controller_config

    text = scenario("").replace(
        "timings: {probe_interval: 5s, unresponsive_grace: 20s}",
        "timings: {mass_loss_share: 60%, probe_interval: 2s, quarantine_after: 5, start_grace: 0s}",
        1,
    )
    assert "quarantine_after: 5" in text
    s = load_scenario_text(text, "t.yaml")
    path = RealCluster(s, tmp_path, 1).write_controller_config()
    assert load_controller_config(path).timings == s.timings
