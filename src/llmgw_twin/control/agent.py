"""The node agent core: converge the node's shards to the controller's assignment.

Pure: it is told what arrived (an assignment, a sidecar or engine state change, a heartbeat
timer) and answers with commands for its shell (start a sidecar, start an engine, stop a shard,
send a report). Its rules:

- a shard's sidecar starts first, as soon as the shard is accepted (a sidecar holds no GPU);
  its engine starts only once that sidecar is up;
- a shard the controller no longer wants is stopped, whatever stage it reached;
- a new shard whose GPUs are still held by a shard being stopped starts its engine only once
  the shell says that shard's processes have ended (`ShardStopped`), so no GPU is ever held by
  two engines on this node, however long a stop takes; its sidecar starts meanwhile (unless
  the stopping shard has its very key), so the replacement costs the stop or the sidecar's
  start, whichever is longer, not both;
- a shard is reported from the moment it is accepted (`preparing` until its engine starts), so
  a restarted controller finds every shard it placed, started or not;
- every change of an engine's state is reported at once, and the whole shard set again with
  every heartbeat, so the controller never waits a heartbeat interval to learn of it;
- asked to report (a restarted controller asks), it registers again with everything it runs;
- a failed GPU is reported with every heartbeat from then on (and after a reboot, since the
  inventory finds it failed again), and so is the state of the node's fabric links;
- a serving leader whose health probe fails is reported `unresponsive`, and `serving` again once
  it answers; a running worker likewise, `running` again once it answers;
- an exited engine stays reported (with its exit code) until the controller drops the shard.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import assert_never

from llmgw_twin.control import states
from llmgw_twin.control.model import NodeInfo, ShardKey, ShardReport, ShardSpec, ShardState
from llmgw_twin.control.protocol import (
    AgentCommand,
    AgentEvent,
    AgentStep,
    Assigned,
    EngineExited,
    EngineJoined,
    EngineServing,
    EngineStarted,
    EngineUnresponsive,
    FabricLink,
    GpuFailed,
    Heartbeat,
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
from llmgw_twin.control.states import Phase

_REPORTED = {
    Phase.WAITING: ShardState.PREPARING,
    Phase.SIDECAR: ShardState.PREPARING,
    Phase.LAUNCHING: ShardState.PREPARING,
    Phase.ENGINE: ShardState.STARTING,
    Phase.RUNNING: ShardState.RUNNING,
    Phase.SERVING: ShardState.SERVING,
    Phase.UNRESPONSIVE: ShardState.UNRESPONSIVE,
    Phase.EXITED: ShardState.EXITED,
}


@dataclass(slots=True)
class LocalShard:
    spec: ShardSpec
    phase: Phase
    argv: tuple[str, ...] = ()
    endpoint: str | None = None
    exit_code: int | None = None
    reason: str | None = None
    sidecar_up: bool = False
    """In `SIDECAR`: its sidecar answers, and its engine waits for its GPUs."""
    report: ShardReport | None = field(default=None, compare=False, repr=False)
    """What the heartbeat says of it, made when first asked and forgotten at each `move` (its
    argv, endpoint, exit code and reason change only together with its phase)."""

    def holds_gpus(self) -> bool:
        """From the engine's launch on: an exited shard's processes are stopped only when the
        controller drops it, and until then its GPUs are not free. A sidecar holds none."""
        return self.phase not in (Phase.WAITING, Phase.SIDECAR)

    def move(self, new: Phase) -> None:
        """Change phase along `states.SHARD_PHASE`; an illegal move raises."""
        self.phase = states.transition(states.SHARD_PHASE, self.phase, new)
        self.report = None


def _report_of(shard: LocalShard) -> ShardReport:
    report = shard.report
    if report is None:
        state = _REPORTED[shard.phase]
        report = ShardReport(
            shard.spec, state, shard.endpoint, shard.exit_code, shard.argv, shard.reason
        )
        shard.report = report
    return report


class AgentCore:
    def __init__(
        self,
        info: NodeInfo,
        incarnation: int = 0,
        shards: tuple[LocalShard, ...] = (),
        failed_gpus: tuple[int, ...] = (),
        fabric_up: bool = True,
        heartbeat_interval_ms: int = 0,
    ) -> None:
        """`failed_gpus` and `fabric_up`: what the node's inventory finds at start (a failed GPU
        stays failed across a reboot, as hardware does); `heartbeat_interval_ms`: told to the
        controller when registering, so a misfit with its timings is said (0: not said)."""
        self.info = info
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self.incarnation = incarnation
        self.node = info.node
        self._shards: dict[ShardKey, LocalShard] = {s.spec.key: s for s in shards}
        self._failed_gpus: set[int] = set(failed_gpus)
        self._fabric_up = fabric_up
        self._stopping: dict[tuple[ShardKey, int], ShardSpec] = {}
        """Shards told to stop whose processes may still hold their GPUs."""
        self._heartbeat: Heartbeat | None = None
        self._version = 0
        """The report's version: bumped each time the report changes (a quiet heartbeat repeats
        the last report, the same object, and its version)."""
        self.leader_epoch = 0
        """The highest controller epoch whose command this agent has seen: commands of a lower
        one (a deposed leader's) are refused."""
        self._stop_seq = 0

    def shards(self) -> list[LocalShard]:
        return [self._shards[k] for k in sorted(self._shards)]

    def heartbeat(self) -> Heartbeat:
        """The node's whole shard set; the same object until something changes, so a receiver
        can tell an unchanged heartbeat at the cost of one comparison."""
        if self._heartbeat is None:
            reports = tuple(_report_of(s) for s in self.shards() if s.phase in _REPORTED)
            failed = tuple(sorted(self._failed_gpus))
            self._version += 1
            self._heartbeat = Heartbeat(
                self.node, reports, failed, self._fabric_up, self.incarnation, self._version
            )
        return self._heartbeat

    def registration(self) -> NodeRegistered:
        """What the agent sends when it starts, and whenever the controller asks."""
        report = self.heartbeat()
        return NodeRegistered(
            self.info,
            report.shards,
            self.incarnation,
            report.failed_gpus,
            report.fabric_up,
            self.heartbeat_interval_ms,
            version=report.version,
        )

    def handle(self, event: AgentEvent) -> AgentStep:
        if isinstance(event, Assigned | ReportRequested):
            if event.epoch < self.leader_epoch:
                return AgentStep(refused=event.epoch)  # a deposed leader's: fenced
            self.leader_epoch = event.epoch
        out: list[AgentCommand] = []
        changed = False
        match event:
            case Assigned(shards=wanted):
                changed = self._converge(wanted, out)
            case SidecarUp(key=key):
                shard = self._shards.get(key)
                if shard is not None and shard.phase is Phase.SIDECAR:
                    shard.sidecar_up = True
                    self._move_on(out)
            case EngineStarted(key=key, argv=argv):
                changed = self._advance(key, Phase.ENGINE)
                if changed:
                    self._shards[key].argv = argv
            case EngineJoined(key=key):
                changed = self._advance(key, Phase.RUNNING)
            case EngineServing(key=key, endpoint=endpoint):
                changed = self._advance(key, Phase.SERVING)
                if changed:
                    self._shards[key].endpoint = endpoint
            case EngineUnresponsive(key=key):
                changed = self._advance(key, Phase.UNRESPONSIVE)
            case EngineExited(key=key, exit_code=code, reason=reason):
                changed = self._advance(key, Phase.EXITED)
                if changed:
                    shard = self._shards[key]
                    shard.endpoint, shard.exit_code, shard.reason = None, code, reason
                    # its GPUs stay held: the leader exited, but its workers or children may
                    # still hold GPU memory until the shard is stopped as a whole
            case ShardStopped(key=key, token=token):
                if self._stopping.pop((key, token), None) is not None:
                    self._move_on(out)
            case GpuFailed(gpu=gpu):
                changed = gpu not in self._failed_gpus
                self._failed_gpus.add(gpu)
            case FabricLink(up=up):
                changed = up != self._fabric_up
                self._fabric_up = up
            case HeartbeatDue():
                out.append(SendReport(self.heartbeat()))
            case ReportRequested():
                out.append(SendReport(self.registration()))
            case _:
                assert_never(event)
        if changed:
            self._heartbeat = None
            out.append(SendReport(self.heartbeat()))
        return AgentStep(tuple(out))

    def _advance(self, key: ShardKey, to: Phase) -> bool:
        """Move a shard on a notice from its shell; a notice the phase table does not allow from
        where the shard is (a late one, for a shard stopped or exited since) changes nothing."""
        shard = self._shards.get(key)
        if shard is None or not states.can_move(states.SHARD_PHASE, shard.phase, to):
            return False
        shard.move(to)
        return True

    def _converge(self, wanted: tuple[ShardSpec, ...], out: list[AgentCommand]) -> bool:
        want = {s.key: s for s in wanted}
        changed = False
        for key in sorted(self._shards):
            have, spec = self._shards[key].spec, want.get(key)
            if spec is not have and spec != have:  # dropped, or changed (`is`: the usual case)
                shard = self._shards.pop(key)
                if shard.phase is not Phase.WAITING:
                    self._stop_seq += 1
                    self._stopping[(key, self._stop_seq)] = shard.spec
                    out.append(StopShard(key, self._stop_seq))
                changed = True
        for key in sorted(want):
            if key not in self._shards:
                self._shards[key] = LocalShard(want[key], Phase.WAITING)
                changed = True
        self._move_on(out)
        return changed

    def _move_on(self, out: list[AgentCommand]) -> None:
        """Start every new shard's sidecar, and the engine of every shard whose sidecar is up
        and whose GPUs no engine holds (nor a shard being stopped): in key order, so of two
        that want one GPU the first launches and the other waits for it."""
        held = {g for s in self._shards.values() if s.holds_gpus() for g in s.spec.gpus}
        held.update(g for spec in self._stopping.values() for g in spec.gpus)
        # a shard of the same key still stopping: nothing of the new one starts before its
        # processes ended, so none of their late notices can be taken for the new shard's
        reused = {key for key, _token in self._stopping}
        for key in sorted(self._shards):
            shard = self._shards[key]
            if shard.phase is Phase.WAITING and key not in reused:
                shard.move(Phase.SIDECAR)
                out.append(StartSidecar(shard.spec))
            elif (
                shard.phase is Phase.SIDECAR
                and shard.sidecar_up
                and held.isdisjoint(shard.spec.gpus)
            ):
                shard.move(Phase.LAUNCHING)
                held.update(shard.spec.gpus)
                out.append(StartEngine(shard.spec))
