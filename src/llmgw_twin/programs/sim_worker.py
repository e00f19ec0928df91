"""A sim engine worker (rank 1..N-1): it loads, joins its leader and stays joined.

The process side of `sim_server` for the ranks that serve nothing: the worker dials its leader's
rendezvous port at once (`sim_rendezvous.join`) while it loads, so a broken link is noticed
during the load as after it; it opens no listening port at all.

Invariants:
- Its load is the load time at its node's pace when its process started (`--pace-file`,
  `sim_pace`), counted from that start.
- With `--ready-file`, the file is written once the worker has both loaded and joined (its pid
  in it), and removed when it exits: its agent reads the worker ready by it (`Readiness.FILE`),
  as the twin's worker reports itself joined only once loaded; without one the agent judges it
  by its process.
- With `--pace-file`, its node's pace goes to the leader in the hello and again each time it
  changes (looked at every `PACE_POLL_S`): the leader's answers take on the slowest rank's pace.
- Exit status as `sim_server`'s: 0 a clean stop or the leader's `shutdown`, 1 the leader lost,
  2 refused, 3 the leader not reached in time.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from fractions import Fraction
from typing import Any

from llmgw_twin.programs.sim_pace import PaceFile
from llmgw_twin.programs.sim_rendezvous import (
    PEER_LOSS_NOTICE_S,
    RendezvousError,
    RendezvousTimeout,
    WorkerLink,
    join,
)
from llmgw_twin.programs.sim_server import (
    EXIT_CONFIG,
    EXIT_JOIN_TIMEOUT,
    EXIT_OK,
    EXIT_PEER_LOST,
    EngineConfig,
    _load,
    log,
    start_pace,
)
from llmgw_twin.programs.sim_tasks import Tasks, stop_on_signals

PACE_POLL_S = 0.02
"""How often a worker looks at its node's pace file for a change to tell its leader: a change
reaches the leader this much later at most (on the scaled clock of real mode, ten times as
much of the file's time)."""


async def run_worker(cfg: EngineConfig) -> int:
    worker = _Worker(cfg)
    try:
        return await worker.run()
    finally:
        await worker.tasks.cancel_all()
        _unready(cfg)


class _Worker:
    """One worker's life: its load, its join, its leader, its pace, each a task (`Tasks`)."""

    def __init__(self, cfg: EngineConfig) -> None:
        assert cfg.rendezvous is not None
        self.cfg = cfg
        self.host, self.port = cfg.rendezvous
        self.pace = PaceFile(cfg.pace_file) if cfg.pace_file is not None else None
        self.said = self.pace.now() if self.pace is not None else None
        """The pace the hello says."""
        self.tasks = Tasks()
        self.loaded = False
        self.link: WorkerLink | None = None

    async def run(self) -> int:
        cfg, tasks = self.cfg, self.tasks
        stop = stop_on_signals()
        deadline = asyncio.get_running_loop().time() + cfg.join_timeout_ms / 1000
        tasks.add("load", _load(cfg, start_pace(self.pace)))
        tasks.add(
            "join",
            join(self.host, self.port, rank=cfg.rank, nnodes=cfg.nnodes, model=cfg.served_name,
                 deadline_s=deadline, source_host=cfg.source_host, pace=self.said),
        )  # fmt: skip
        tasks.add("stop", stop.wait())
        while True:
            for name, task in await tasks.next():
                code = self._on(name, task)
                if code is not None:
                    return code

    def _on(self, name: str, task: asyncio.Task[Any]) -> int | None:
        """What one finished task means; an exit status once the worker is done."""
        if name == "stop":
            log.info("stopping")
            if self.link is not None:
                self.link.close()
            return EXIT_OK
        if name == "load":
            self.loaded = True
            log.info("loaded in %d ms", task.result())
            if self.link is not None:
                _ready(self.cfg)
        if name == "join":
            return self._joined(task)
        if name == "leader":
            assert self.link is not None
            self.link.close()
            if task.result():
                log.info("the leader shut down")
                return EXIT_OK
            self.tasks.add("noticed", asyncio.sleep(PEER_LOSS_NOTICE_S))
        if name == "noticed":  # a stop meanwhile is a clean one
            log.error("lost the leader %s:%d", self.host, self.port)
            return EXIT_PEER_LOST
        if name == "pace":
            log.error("the pace watch ended: %r", task.exception())
        return None

    def _joined(self, task: asyncio.Task[Any]) -> int | None:
        try:
            link = self.link = task.result()
        except RendezvousTimeout as e:
            log.error("rendezvous timed out: %s", e)
            return EXIT_JOIN_TIMEOUT
        except RendezvousError as e:
            log.error("%s", e)
            return EXIT_CONFIG
        log.info("joined leader %s:%d as rank %d", self.host, self.port, self.cfg.rank)
        self.tasks.add("leader", link.wait_end())
        if self.pace is not None and self.said is not None:
            self.tasks.add("pace", _tell_pace(link, self.pace, self.said))
        if self.loaded:
            _ready(self.cfg)
        return None


def _ready(cfg: EngineConfig) -> None:
    """Loaded and joined: say so in the ready file, whole or not at all, then in the log."""
    if cfg.ready_file is not None:
        tmp = f"{cfg.ready_file}.{os.getpid()}.tmp"
        try:
            with open(tmp, "w", encoding="ascii") as f:
                f.write(f"{os.getpid()}\n")
            os.replace(tmp, cfg.ready_file)
        except OSError as e:  # the agent then never reads it ready, and stops it in time
            log.error("cannot write the ready file %s: %s", cfg.ready_file, e)
            return
    log.info("ready: loaded and joined")


def _unready(cfg: EngineConfig) -> None:
    """Take back the ready file, if it is still this process's (a stale one is the agent's to
    remove before it starts the next engine of the shard, which may have written its own)."""
    if cfg.ready_file is None:
        return
    with contextlib.suppress(OSError, ValueError):
        with open(cfg.ready_file, encoding="ascii") as f:
            mine = int(f.read()) == os.getpid()
        if mine:
            os.unlink(cfg.ready_file)


async def _tell_pace(link: WorkerLink, pace: PaceFile, told: Fraction) -> None:
    """Tell the leader each change of this node's pace after `told`, said in the hello."""
    while True:
        await asyncio.sleep(PACE_POLL_S)
        now = pace.now()
        if now != told:
            log.info("the node's pace is now %s", now)
            link.send_pace(now)
            told = now
