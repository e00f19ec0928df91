"""The agent's run-state file: which shard processes it runs, so that the next agent finds them.

Role: an agent killed with SIGKILL (or crashed) leaves its shards running, each sidecar and
engine in a session of its own. The run-state file says what they are: per shard, its spec, the
sidecar's and the engine's pid (each its process group's id) with its start time, argv and
ports, how its readiness is read, and whether it was ready. A starting agent reads it before it
registers (`decide`): a shard whose sidecar and engine both still run (the same pid with the
same start time: `processes.proc_stat`) is adopted; one partly gone is ended; one whose
processes cannot be read is left alone. Where the file is: `run_state` in the agent's config
(default `<node>.run.json` in the systemd unit's state directory, else beside the config).

Invariants:
- The file is written whole every time a shard's processes change (a sidecar or an engine
  started, an engine ready, a stop begun, a stop done): a temp file beside it, fsync, rename,
  fsync of the directory, so a reader finds the state before or after, never half of one.
- One agent per file: `<file>.lock` is held (`flock`) for the agent's life, and a second agent
  of the node refuses to start; a killed agent's lock goes with its process.
- A record names a process by pid *and* start time, and the boot it ran in (`boot_id`): a pid
  reused by another process, or a file from an earlier boot, never names that process.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import fcntl
import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from llmgw_twin import codec
from llmgw_twin.control.agent import LocalShard
from llmgw_twin.control.model import ShardKey, ShardSpec
from llmgw_twin.control.states import Phase
from llmgw_twin.engines.base import Launch
from llmgw_twin.service.agent.launcher import Probe
from llmgw_twin.service.agent.processes import Adopted, PortPool, Proc, proc_stat, stop_group

log = logging.getLogger("llmgw_twin.agent")

VERSION = 1
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


@dataclass(frozen=True, slots=True)
class ProcRecord:
    """One process of a shard: its pid (the leader of its own session: its group's id too)."""

    pid: int
    start_ticks: int
    """Its start time in clock ticks after boot (/proc/PID/stat, field 22)."""
    argv: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ShardRecord:
    spec: ShardSpec
    sidecar: ProcRecord | None
    engine: ProcRecord | None
    sidecar_port: int | None = None
    http_port: int | None = None
    """The engine's HTTP port from the agent's range (None: the rank listens elsewhere)."""
    engine_port: int | None = None
    """Where the engine's readiness is read and a leader serves (its `Launch.port`)."""
    probe: tuple[str, ...] = ()
    """The sidecar's probe arguments."""
    by_process: bool = False
    """The rank opens no port: it is judged by its process staying up (`worker_settle`)."""
    engine_started_ms: int | None = None
    """Wall-clock milliseconds at the engine's start: its `ready_timeout` goes on from there."""
    ready: bool = False
    endpoint: str | None = None
    stopping: bool = False
    """Its stop had begun: a new agent ends it rather than adopting it."""


@dataclass(frozen=True, slots=True)
class RunState:
    boot_id: str
    agent_pid: int
    incarnation: int
    shards: tuple[ShardRecord, ...] = ()
    version: int = VERSION


def boot_id() -> str:
    try:
        return BOOT_ID.read_text().strip()
    except OSError:
        return ""


class RunStateError(Exception):
    """The run-state file cannot be locked, read or written: the agent does not start."""


class RunStateFile:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.lock_path = path.with_name(path.name + ".lock")
        self._lock_fd: int | None = None

    def lock(self) -> None:
        """Hold `<file>.lock` for this process's life, or `RunStateError` if an agent holds it."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as e:
            raise RunStateError(f"{self.lock_path}: cannot open the run-state lock: {e}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise RunStateError(
                f"{self.lock_path}: another agent of this node runs (it holds the lock)"
            ) from None
        self._lock_fd = fd

    def close(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def read(self) -> RunState | None:
        """The state an earlier agent left, or None: no file, or one that does not decode
        (kept as `<file>.unreadable` for the operator, and nothing of it is touched)."""
        try:
            text = self.path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as e:
            raise RunStateError(f"{self.path}: cannot read the run state: {e}") from None
        try:
            return codec.loads(RunState, text)
        except codec.CodecError as e:
            aside = self.path.with_name(self.path.name + ".unreadable")
            log.error(
                "%s: not a run state (%s); moved to %s, and nothing it names is touched",
                self.path,
                e,
                aside,
            )
            with contextlib.suppress(OSError):
                os.replace(self.path, aside)
            return None

    def write(self, state: RunState) -> None:
        """Replace the file with `state`, atomically and durably (raises OSError)."""
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        data = codec.dumps(state).encode()
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.path)
        dir_fd = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


class Found(enum.Enum):
    ALIVE = "alive"
    """The very process recorded: the same pid, started at the same tick, not a zombie."""
    GONE = "gone"
    """No such process, or its zombie: it ended."""
    REUSED = "reused"
    """The pid names another process now (started at another tick): it ended, and that one is
    not ours."""
    UNKNOWN = "unknown"
    """/proc does not say (unreadable)."""


def find(rec: ProcRecord | None) -> Found:
    if rec is None:
        return Found.GONE
    try:
        stat = proc_stat(rec.pid)
    except OSError:
        return Found.UNKNOWN
    if stat is None:
        return Found.GONE
    if stat[2] != rec.start_ticks:
        return Found.REUSED
    return Found.GONE if stat[0] in "ZX" else Found.ALIVE


class Action(enum.Enum):
    ADOPT = "adopt"
    END = "end"
    """Stop what is left of it (its groups, each only while `group_is_ours`); not reported."""
    LEAVE = "leave"
    """Touch nothing, report nothing; its ports stay reserved."""


@dataclass(frozen=True, slots=True)
class Decision:
    record: ShardRecord
    action: Action
    why: str


def decide(record: ShardRecord) -> Decision:
    """What a starting agent does with a shard an earlier agent recorded."""
    side, engine = find(record.sidecar), find(record.engine)
    seen = f"sidecar {_described(record.sidecar, side)}, engine {_described(record.engine, engine)}"
    if Found.UNKNOWN in (side, engine):
        return Decision(record, Action.LEAVE, f"{seen}: cannot be verified, left alone")
    if record.stopping:
        return Decision(record, Action.END, f"{seen}: it was being stopped")
    if side is Found.ALIVE and engine is Found.ALIVE:
        return Decision(record, Action.ADOPT, seen)
    return Decision(record, Action.END, seen)


def _described(rec: ProcRecord | None, found: Found) -> str:
    if rec is None:
        return "never started"
    if found is Found.REUSED:
        return f"pid {rec.pid} gone (the pid is another process's now, left alone)"
    return f"pid {rec.pid} {found.value}"


@dataclass(slots=True)
class ShardProcs:
    spec: ShardSpec
    sidecar_port: int | None = None
    http_port: int | None = None
    launch: Launch | None = None
    """None for an adopted shard (its engine is started already)."""
    argv: tuple[str, ...] = ()
    """The engine's argv to execute, as `checked_launch` passed it."""
    probe: Probe | None = None
    sidecar: Proc | None = None
    engine: Proc | None = None
    task: asyncio.Task[None] | None = None
    sidecar_argv: tuple[str, ...] = ()
    sidecar_ticks: int | None = None
    engine_ticks: int | None = None
    """The processes' start times: with the pids, what the run-state file names them by."""
    engine_port: int | None = None
    engine_started_ms: int | None = None
    """Wall-clock milliseconds at the engine's start."""
    ready: bool = False
    endpoint: str | None = None
    adopted: bool = False

    def record(self, stopping: bool = False) -> ShardRecord | None:
        """What the run-state file keeps of it: None once none of its processes may run."""
        side = _proc_record(self.sidecar, self.sidecar_ticks, self.sidecar_argv)
        engine = _proc_record(self.engine, self.engine_ticks, self.argv)
        if side is None and engine is None:
            return None
        probe = self.probe or Probe((), False)
        return ShardRecord(
            self.spec,
            side,
            engine,
            self.sidecar_port,
            self.http_port,
            self.engine_port,
            probe.args,
            probe.by_process,
            self.engine_started_ms,
            self.ready,
            self.endpoint,
            stopping,
        )

    @classmethod
    def of(cls, rec: ShardRecord) -> ShardProcs:
        """An earlier agent's shard, as this one takes it over (to watch it, or to end it)."""
        side, engine = rec.sidecar, rec.engine
        return cls(
            rec.spec,
            rec.sidecar_port,
            rec.http_port,
            argv=engine.argv if engine else (),
            probe=Probe(rec.probe, rec.by_process),
            sidecar=Adopted(side.pid, side.start_ticks) if side else None,
            engine=Adopted(engine.pid, engine.start_ticks) if engine else None,
            sidecar_argv=side.argv if side else (),
            sidecar_ticks=side.start_ticks if side else None,
            engine_ticks=engine.start_ticks if engine else None,
            engine_port=rec.engine_port,
            engine_started_ms=rec.engine_started_ms,
            ready=rec.ready,
            endpoint=rec.endpoint,
            adopted=True,
        )

    def local(self) -> LocalShard:
        """The core's view of an adopted shard: serving (or running) if it was ready."""
        if not self.ready:
            phase = Phase.ENGINE
        else:
            phase = Phase.SERVING if self.spec.rank == 0 else Phase.RUNNING
        endpoint = self.endpoint if phase is Phase.SERVING else None
        return LocalShard(self.spec, phase, self.argv, endpoint)


def _proc_record(proc: Proc | None, ticks: int | None, argv: tuple[str, ...]) -> ProcRecord | None:
    if proc is None or ticks is None or proc.returncode is not None:
        return None
    return ProcRecord(proc.pid, ticks, argv)


class Keeper:
    """The run-state file of one agent: locked for its life, read once at its start, written
    whenever its shards' processes change."""

    def __init__(self, path: Path, incarnation: int) -> None:
        self.file = RunStateFile(path)
        self.incarnation = incarnation
        self.left: list[ShardRecord] = []
        """An earlier agent's shards that cannot be verified: untouched, kept in the file."""
        self._failing = False

    def load(self) -> list[Decision]:
        """Lock the file, and decide each shard an earlier agent of this boot recorded."""
        self.file.lock()
        state = self.file.read()
        if state is not None and state.boot_id != boot_id():
            log.info(
                "run state of an earlier boot: its %d shard(s) ended with it", len(state.shards)
            )
            return []
        decisions = [decide(rec) for rec in state.shards] if state is not None else []
        self.left = [d.record for d in decisions if d.action is Action.LEAVE]
        return decisions

    def adopt(self, ports: PortPool) -> tuple[list[ShardProcs], list[ShardProcs]]:
        """Lock the file and decide each shard an earlier agent of this boot recorded: the
        adopted ones and the ones to end (`end`); the ports of all of them are reserved."""
        adopted: dict[ShardKey, ShardProcs] = {}
        ending: list[ShardProcs] = []
        for decision in self.load():
            rec = decision.record
            name = f"shard {rec.spec.replica}/{rec.spec.rank} of an earlier agent"
            for port in (rec.sidecar_port, rec.http_port):
                ports.reserve(port)
            if decision.action is Action.ADOPT and rec.spec.key not in adopted:
                adopted[rec.spec.key] = ShardProcs.of(rec)
                log.info("%s adopted: %s", name, decision.why)
            elif decision.action is Action.LEAVE:
                log.warning("%s: %s", name, decision.why)
            else:
                ending.append(ShardProcs.of(rec))
                log.warning("%s ended: %s", name, decision.why)
        return list(adopted.values()), ending

    @staticmethod
    async def end(procs: ShardProcs, grace_s: float) -> list[int | None]:
        """Stop what is left of an earlier agent's shard: each group only while it is still
        the recorded one's (`processes.group_is_ours`)."""
        stops = [stop_group(p, grace_s) for p in (procs.engine, procs.sidecar) if p is not None]
        return list(await asyncio.gather(*stops))

    def save(
        self, running: Iterable[ShardProcs], stopping: Iterable[ShardProcs], raising: bool = False
    ) -> None:
        """Write every shard any process of which may still run (OSError only if `raising`)."""
        records = [p.record() for p in running] + [p.record(stopping=True) for p in stopping]
        shards = tuple(r for r in records if r is not None) + tuple(self.left)
        try:
            self.file.write(RunState(boot_id(), os.getpid(), self.incarnation, shards))
        except OSError as e:
            if raising:
                raise
            if not self._failing:
                log.error("writing the run state %s failed: %s", self.file.path, e)
            self._failing = True
            return
        if self._failing:
            log.info("the run state %s is written again", self.file.path)
            self._failing = False
