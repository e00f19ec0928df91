"""The twin starts in a scenario's `initial` state (`twin/scenario/initial.py`), as a restarted
controller finds a running fleet.

`InitialShell` writes the state into the controllers' store (`seed_store`) before the first
leader's core is made, as the store of a controller that ran until then would hold it: profiles,
deployments, the node registry, every placed replica with its shard specs, the replica counters,
failed GPUs, cordons, drains and quarantines. `boot_nodes` powers every node on with its shards
running (a `ready` replica's leader serving, its workers joined; a `starting` one's engines
started at the run's start and loading), and its agent registers with them as a restarted agent
does
(`world/adopt.py`). The first controller starts from the store, asks every agent to report, and
adopts what they run: nothing is placed, restarted or failed unless a fault makes it so. A node
`lost` in the snapshot stays off (its controller declares it lost again after `node_lost_after`
and replaces what it held); a `pending` replica is not restored: the deployment's count makes the
controller place one.
"""

from __future__ import annotations

from llmgw_twin.control.controller import Controller
from llmgw_twin.control.durable import (
    PutCordon,
    PutDeployment,
    PutFailedGpu,
    PutNode,
    PutProfile,
    PutQuarantine,
    PutReplica,
    PutSeq,
    QuarantineRow,
    ReplicaRow,
    Write,
)
from llmgw_twin.control.model import ModelName
from llmgw_twin.engines.base import LaunchContext
from llmgw_twin.engines.registry import adapter_for
from llmgw_twin.store.sqlite import Store
from llmgw_twin.twin.scenario.initial_model import Initial
from llmgw_twin.twin.scenario.model import Scenario
from llmgw_twin.twin.world.controller import ControllerShell
from llmgw_twin.twin.world.leader import ControllerProcess
from llmgw_twin.twin.world.node import SimEngine, http_port_for
from llmgw_twin.twin.world.sim import World


def initial_writes(scenario: Scenario, initial: Initial) -> list[Write]:
    """What the store of a controller that ran the fleet into `initial` holds."""
    writes: list[Write] = [PutProfile(p) for p in scenario.profiles]
    writes += [PutDeployment(d) for d in scenario.deployments]
    writes += [PutNode(info) for info in scenario.nodes]
    seqs: dict[ModelName, int] = {}
    for r in initial.replicas:
        seqs[r.model] = max(seqs.get(r.model, 0), r.seq)
        if r.specs:
            assert r.fabric is not None
            row = ReplicaRow(
                r.id, r.model, r.profile, r.seq, 0, r.fabric, len(r.specs), r.specs, r.group
            )
            writes.append(PutReplica(row))
    writes += [PutSeq(m, s) for m, s in sorted(seqs.items())]
    for n in initial.nodes:
        writes += [PutFailedGpu(n.node, g) for g in n.failed_gpus]
        if n.cordoned:
            writes.append(PutCordon(n.node, n.draining))
    for q in initial.quarantines:
        writes.append(PutQuarantine(QuarantineRow(q.node, q.profile, q.for_ms, q.reason)))
    return writes


def seed_store(store: Store, scenario: Scenario, initial: Initial) -> None:
    store.commit(initial_writes(scenario, initial))


class InitialShell(ControllerShell):
    """The controllers of a run from an `initial` state: the store holds that state before the
    first leader's core is made, so it starts from it as a restarted controller does (and sets
    no desired state up of its own: the store has it)."""

    _seeded = False

    def new_core(self, proc: ControllerProcess) -> Controller:
        if not self._seeded:
            assert self.scenario.initial is not None
            seed_store(self.store, self.scenario, self.scenario.initial)
            self._seeded = self._initialized = True
        return super().new_core(proc)


def boot_nodes(scenario: Scenario, initial: Initial, world: World) -> None:
    """Every node not `lost` boots, in name order, with the engines of its shards running."""
    for n in initial.nodes:
        world.failed_gpus.update((n.node, g) for g in n.failed_gpus)
    engines: dict[str, list[SimEngine]] = {}
    loading: list[SimEngine] = []
    for r in initial.placed():
        ready = r.state == "ready"
        for spec in r.specs:
            node = world.nodes[spec.node]
            ctx = LaunchContext(leader_host=spec.leader, http_port=http_port_for(spec))
            argv = adapter_for(spec.engine).launch(spec, ctx).argv
            engine = SimEngine(
                node, spec, argv, 0, loaded=ready, has_joined=ready and spec.rank > 0
            )
            if ready and spec.rank == 0:
                engine.joined = set(range(1, spec.shard_count))
                engine.serving = True
            engines.setdefault(spec.node, []).append(engine)
            if not ready:
                loading.append(engine)
    lost = {n.node for n in initial.nodes if n.state == "lost"}
    for name in sorted(n.node for n in scenario.nodes):
        if name not in lost:
            world.nodes[name].boot_running(engines.get(name, []))
    for engine in loading:
        if engine.node.up:
            engine.node.resume_start(engine)
