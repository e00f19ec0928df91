"""The node agent core on literal snapshots: start order, stops, GPU hand-over, reports."""

from __future__ import annotations

from llmgw_twin.control.agent import AgentCore
from llmgw_twin.control.model import (
    EngineName,
    FabricId,
    ModelName,
    NodeId,
    NodeInfo,
    ProfileName,
    ReplicaId,
    ShardSpec,
    ShardState,
)
from llmgw_twin.control.protocol import (
    Assigned,
    EngineExited,
    EngineJoined,
    EngineServing,
    EngineStarted,
    GpuFailed,
    HeartbeatDue,
    NodeRegistered,
    ReportRequested,
    SendReport,
    ShardStopped,
    SidecarUp,
    StartEngine,
    StartSidecar,
    StopShard,
)

N = NodeId("n1")
INFO = NodeInfo(N, FabricId("f"), 8, 81920, (EngineName("sim"),))


def spec(replica: str, rank: int = 0, gpus: tuple[int, ...] = (0, 1)) -> ShardSpec:
    return ShardSpec(
        ReplicaId(replica),
        ModelName("m"),
        ProfileName("p"),
        EngineName("sim"),
        "/m",
        rank,
        2,
        N,
        gpus,
        N,
    )


def states(agent: AgentCore) -> dict[tuple[str, int], ShardState]:
    return {(r.spec.replica, r.spec.rank): r.state for r in agent.heartbeat().shards}


def acts(cmds: tuple[object, ...]) -> tuple[object, ...]:
    """The commands that act on processes (reports left out)."""
    return tuple(c for c in cmds if not isinstance(c, SendReport))


def test_sidecar_first_then_engine_then_reports_each_change() -> None:
    agent = AgentCore(INFO)
    a = spec("r1")
    step = agent.handle(Assigned((a,)))
    assert acts(step.commands) == (StartSidecar(a),)
    assert states(agent) == {("r1", 0): ShardState.PREPARING}  # reported from acceptance on
    assert agent.handle(SidecarUp(a.key)).commands == (StartEngine(a),)
    step = agent.handle(EngineStarted(a.key, ("eng",)))
    assert [type(c) for c in step.commands] == [SendReport]
    assert states(agent) == {("r1", 0): ShardState.STARTING}
    agent.handle(EngineServing(a.key, "http://n1:8000"))
    report = agent.heartbeat().shards[0]
    assert (report.state, report.endpoint, report.argv) == (
        ShardState.SERVING,
        "http://n1:8000",
        ("eng",),
    )


def test_engine_never_starts_before_its_sidecar_is_up() -> None:
    agent = AgentCore(INFO)
    a = spec("r1")
    cmds = agent.handle(Assigned((a,))).commands
    assert StartEngine(a) not in cmds
    assert agent.handle(EngineStarted(a.key, ())).commands == ()  # a stray notice is ignored
    assert states(agent) == {("r1", 0): ShardState.PREPARING}


def test_unwanted_shard_is_stopped_and_its_gpus_go_to_the_next_one_once_it_has_ended() -> None:
    agent = AgentCore(INFO)
    old, new = spec("r1", gpus=(0, 1)), spec("r2", gpus=(1, 2))
    agent.handle(Assigned((old,)))
    agent.handle(SidecarUp(old.key))
    agent.handle(EngineStarted(old.key, ()))
    cmds = agent.handle(Assigned((new,))).commands
    stop, sidecar = acts(cmds)
    assert isinstance(stop, StopShard) and stop == StopShard(old.key, stop.token)
    assert sidecar == StartSidecar(new)  # a sidecar holds no GPU: it starts during the stop
    assert states(agent) == {("r2", 0): ShardState.PREPARING}
    assert acts(agent.handle(SidecarUp(new.key)).commands) == ()  # GPU 1 is the old engine's
    done = ShardStopped(old.key, stop.token)
    assert acts(agent.handle(done).commands) == (StartEngine(new),)
    assert acts(agent.handle(done).commands) == ()  # a repeat changes nothing


def test_a_shard_on_other_gpus_starts_while_another_stops() -> None:
    agent = AgentCore(INFO)
    old, new = spec("r1", gpus=(0,)), spec("r2", gpus=(1,))
    agent.handle(Assigned((old,)))
    agent.handle(SidecarUp(old.key))
    cmds = agent.handle(Assigned((new,))).commands
    assert acts(cmds) == (StopShard(old.key), StartSidecar(new))


def test_a_shard_waits_while_its_gpus_are_held_by_another_wanted_shard() -> None:
    agent = AgentCore(INFO)
    a, b = spec("r1", gpus=(0,)), spec("r2", gpus=(0,))
    cmds = agent.handle(Assigned((a, b))).commands
    assert acts(cmds) == (StartSidecar(a), StartSidecar(b))
    assert acts(agent.handle(SidecarUp(a.key)).commands) == (StartEngine(a),)
    assert acts(agent.handle(SidecarUp(b.key)).commands) == ()  # GPU 0 is a's engine's
    agent.handle(EngineStarted(a.key, ()))
    cmds = agent.handle(EngineExited(a.key, 1)).commands
    # the leader exited, but its process group may still hold GPU memory: b waits until the
    # controller drops a and a's processes are stopped
    assert acts(cmds) == ()
    (stop,) = acts(agent.handle(Assigned((b,))).commands)
    assert isinstance(stop, StopShard) and stop.key == a.key
    assert acts(agent.handle(ShardStopped(a.key, stop.token)).commands) == (StartEngine(b),)


def test_a_late_stopped_notice_frees_nothing_of_a_newer_stop_of_the_same_key() -> None:
    agent = AgentCore(INFO)
    a = spec("r1", gpus=(0,))
    a2 = spec("r1", gpus=(1,))  # the same key placed again on another GPU
    b = spec("r2", gpus=(1,))
    agent.handle(Assigned((a,)))
    agent.handle(SidecarUp(a.key))
    # a stops; a2, of the same key, starts nothing before that stop ended, so that no late
    # notice of a's processes can be taken for a2's
    (first,) = acts(agent.handle(Assigned((a2,))).commands)
    assert isinstance(first, StopShard)
    assert acts(agent.handle(SidecarUp(a2.key)).commands) == ()  # not a2's: it has none yet
    assert acts(agent.handle(ShardStopped(a.key, first.token)).commands) == (StartSidecar(a2),)
    assert acts(agent.handle(SidecarUp(a2.key)).commands) == (StartEngine(a2),)
    second, sidecar = acts(agent.handle(Assigned((b,))).commands)  # stop a2; b's sidecar
    assert isinstance(second, StopShard) and second.token != first.token
    assert sidecar == StartSidecar(b)
    assert acts(agent.handle(SidecarUp(b.key)).commands) == ()  # GPU 1 is still a2's
    # the first stop's notice again: GPU 0 is free, GPU 1 (a2's) is not, b keeps waiting
    assert acts(agent.handle(ShardStopped(a.key, first.token)).commands) == ()
    assert acts(agent.handle(ShardStopped(a.key, 0)).commands) == ()  # a stop nobody asked for
    assert acts(agent.handle(ShardStopped(a.key, second.token)).commands) == (StartEngine(b),)


def test_exit_is_reported_until_the_controller_drops_the_shard() -> None:
    agent = AgentCore(INFO)
    a = spec("r1", rank=1)
    agent.handle(Assigned((a,)))
    agent.handle(SidecarUp(a.key))
    agent.handle(EngineStarted(a.key, ()))
    agent.handle(EngineJoined(a.key))
    assert states(agent) == {("r1", 1): ShardState.RUNNING}
    agent.handle(EngineExited(a.key, 137))
    assert agent.heartbeat().shards[0].exit_code == 137
    assert states(agent) == {("r1", 1): ShardState.EXITED}
    step = agent.handle(Assigned(()))
    assert StopShard(a.key) in step.commands
    assert agent.heartbeat().shards == ()


def test_heartbeat_carries_the_whole_shard_set() -> None:
    agent = AgentCore(INFO)
    a, b = spec("r1", gpus=(0,)), spec("r2", gpus=(1,))
    agent.handle(Assigned((a, b)))
    for s in (a, b):
        agent.handle(SidecarUp(s.key))
        agent.handle(EngineStarted(s.key, ()))
    (cmd,) = agent.handle(HeartbeatDue()).commands
    assert isinstance(cmd, SendReport)
    assert [r.spec.replica for r in cmd.report.shards] == ["r1", "r2"]


def test_asked_to_report_it_registers_again_with_everything_it_runs() -> None:
    agent = AgentCore(INFO, incarnation=3)
    a = spec("r1")
    agent.handle(Assigned((a,)))
    agent.handle(SidecarUp(a.key))
    agent.handle(EngineStarted(a.key, ("eng",)))
    (cmd,) = agent.handle(ReportRequested()).commands
    assert isinstance(cmd, SendReport)
    reg = cmd.report
    assert isinstance(reg, NodeRegistered)
    assert (reg.info, reg.incarnation) == (INFO, 3)
    assert [(r.spec, r.state) for r in reg.shards] == [(a, ShardState.STARTING)]


def test_a_failed_gpu_is_reported_from_then_on() -> None:
    agent = AgentCore(INFO)
    (cmd,) = agent.handle(GpuFailed(3)).commands
    assert isinstance(cmd, SendReport) and cmd.report.failed_gpus == (3,)
    assert agent.handle(GpuFailed(3)).commands == ()  # old news
    assert agent.heartbeat().failed_gpus == (3,)
    assert agent.registration().failed_gpus == (3,)
