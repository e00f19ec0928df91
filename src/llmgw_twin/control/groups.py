"""Role groups: a deployment of roles (prefill and decode) whose groups are placed, admitted and
failed over as one (docs/topology.md).

A deployment with `roles` wants `replicas` groups, and each group every role's `count` replicas
of that role's own profile. A group is the replicas that carry its id (`ReplicaRecord.group`,
kept in each replica's row, so a restarted controller finds its groups again); its id is
`{model}-g{seq}`, the creation number of its first replica.

- Placed together, admitted only whole: a group none of whose replicas is placed is placed in
  one step with every member in one fabric (the fabric placement ranks first for its largest
  member, else the first other fabric by name where all fit), or not at all: nothing of it is
  booked, and no engine of it starts, until every member fits.
- Failed over per role: a member that fails is reaped as any replica is, and its replacement
  joins the same group and is placed only in the group's fabric. The group serves while every
  role has a ready member: a spare carries its role while the failed one is replaced.
- Never a role holding resources for a partner that is gone: after each placement, a group that
  holds placed members but has a role with none placed (its replacement fits nowhere in the
  group's fabric, or waits out a back-off) is dissolved (`group.dissolved`): every member is
  reaped, and the deployment's next group is placed whole where it fits.
- Scaling removes whole groups: the ones not serving first, then the newest.

Invariant, after every placement: each group holds nothing (every member pending) or has a
placed member of every role, all of them in one fabric. Between a member's failure and the next
reconcile a group may hold members without a role for one reconcile interval; the twin checks
the invariant at the end of every run (`no_orphans`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from llmgw_twin.control.model import Deployment, FabricId, ModelName, NodeId, ReplicaState, Role
from llmgw_twin.control.placement import Placement, Unplaceable
from llmgw_twin.control.replicas import ReplicaRecord

if TYPE_CHECKING:
    from llmgw_twin.control.lifecycle import Lifecycle


def group_id(model: ModelName, seq: int) -> str:
    return f"{model}-g{seq}"


def group_of(records: Iterable[ReplicaRecord]) -> dict[str, list[ReplicaRecord]]:
    """The grouped records by group id, each group's members in creation order."""
    out: dict[str, list[ReplicaRecord]] = {}
    for rec in records:
        if rec.group:
            out.setdefault(rec.group, []).append(rec)
    for members in out.values():
        members.sort(key=lambda r: r.seq)
    return out


def serving(dep: Deployment, members: Iterable[ReplicaRecord]) -> bool:
    """Every role has a ready, routable member."""
    ready = {m.role for m in members if m.state is ReplicaState.READY and not m.unroutable}
    return all(role.name in ready for role in dep.roles)


def fabric_of(members: Iterable[ReplicaRecord]) -> FabricId | None:
    """The fabric a group holds (that of its placed members), or None when it holds nothing."""
    return next((m.fabric for m in members if m.placed and m.state.live), None)


class Groups:
    """The role groups of every deployment with roles: a part of `Lifecycle`."""

    def __init__(self, life: Lifecycle) -> None:
        self._life = life

    def reconcile(self, dep: Deployment) -> None:
        """Bring `dep`'s groups to its count, and each group's roles to theirs."""
        life = self._life
        live = [r for r in life.replicas.live(dep.model) if not life.moves.is_copy(r.id)]
        for rec in live:
            if not rec.group or dep.role(rec.role) is None:
                life.reap(rec, "scaled down", scaled_down=True)  # wanted by no role
        groups = group_of(r for r in live if r.state.live)
        surplus = len(groups) - dep.replicas
        if surplus > 0:
            order = sorted(groups, key=lambda g: (serving(dep, groups[g]), -groups[g][0].seq))
            for gid in order[:surplus]:
                for rec in groups.pop(gid):
                    if rec.state.live:
                        life.reap(rec, "scaled down", scaled_down=True)
        for gid in sorted(groups, key=lambda g: groups[g][0].seq):
            members = groups[gid]
            for role in dep.roles:
                have = [m for m in members if m.role == role.name and life.counts(m)]
                for _ in range(role.count - len(have)):
                    if not life.slices.may_create(dep.model):
                        return
                    self.new_member(dep, gid, role)
                for extra in sorted(have, key=lambda m: (m.state is ReplicaState.READY, -m.seq))[
                    : max(len(have) - role.count, 0)
                ]:
                    life.reap(extra, "scaled down", scaled_down=True)
        for _ in range(dep.replicas - len(groups)):
            if not life.slices.may_create(dep.model):
                return
            gid = ""
            for role in dep.roles:
                for _ in range(role.count):
                    rec = self.new_member(dep, gid, role)
                    gid = rec.group
            # (a cut slice leaves the group short: the next reconcile completes it above)

    def new_member(self, dep: Deployment, gid: str, role: Role) -> ReplicaRecord:
        """A new pending member of group `gid` in `role` (a new group when `gid` is empty)."""
        life = self._life
        rec = life.new_replica(dep, life.profiles[role.profile])
        rec.group = gid or group_id(dep.model, rec.seq)
        rec.role = role.name
        return rec

    # --- placement ---------------------------------------------------------------------------

    def place(self, pending: Iterable[ReplicaRecord]) -> None:
        """Place the groups that have pending members: a group that holds nothing whole or not
        at all, a member of a group that holds a fabric in that fabric; then dissolve each group
        left with a role of none placed."""
        life = self._life
        todo: dict[ModelName, set[str]] = {}
        for r in pending:
            if r.group:
                todo.setdefault(r.model, set()).add(r.group)
        for model in sorted(todo):
            dep = life.deployments.get(model)
            if dep is None or not dep.roles:
                continue
            groups = group_of(life.replicas.live(model))  # once a model, not once a group
            for gid in sorted(todo[model]):
                members = groups.get(gid, [])
                fabric = fabric_of(members)
                waiting = [r for r in members if not r.placed]
                if fabric is None:
                    self._admit(dep, gid, waiting)
                else:
                    self._fill(waiting, fabric)
                    self._dissolve_if_short(dep, gid, fabric, members)

    def _eligible(self, rec: ReplicaRecord) -> bool:
        return rec.not_before_ms <= self._life.out.now_ms

    def _try(
        self, rec: ReplicaRecord, only: FabricId | None, planned: Mapping[NodeId, int] = {}
    ) -> Placement | Unplaceable:
        """Where `rec` would go (in `only`), spread from its model's replicas on each node and
        the members `planned` with it (a group's members go to different nodes when they can:
        a spare that shares its partner's node dies with it)."""
        life = self._life
        spread = life.replicas.per_node(rec.model)
        if planned:
            spread = {n: spread.get(n, 0) + planned.get(n, 0) for n in {*spread, *planned}}
        return life.capacity.place(
            rec.profile,
            life.replicas.per_fabric(rec.model),
            life.failures.excluded(rec.profile.name),
            spread,
            None,
            only=only,
        )

    def _fill(self, waiting: list[ReplicaRecord], fabric: FabricId) -> None:
        """Members of a group holding `fabric`: each placed there, if it fits now."""
        for rec in sorted(waiting, key=_largest_first):
            if not self._eligible(rec):
                continue
            found = self._try(rec, fabric)
            if isinstance(found, Placement):
                self._life.bind(rec, found)
            else:
                self._unplaceable(rec, f"group {rec.group} holds {fabric}: {found.reason}")

    def _admit(self, dep: Deployment, gid: str, waiting: list[ReplicaRecord]) -> None:
        """A group holding nothing: every member placed in one fabric, or none."""
        if any(not self._eligible(r) for r in waiting):
            return  # a back-off: the whole group waits it out
        wanted = sum(role.count for role in dep.roles)
        if len(waiting) < wanted:
            return  # created over several reconciles (slices): placed once complete
        members = sorted(waiting, key=_largest_first)
        first = self._try(members[0], None)
        fabrics: list[FabricId] = []
        if isinstance(first, Placement):
            fabrics.append(first.fabric)
        fabrics += sorted(f for f in self._life.capacity.fabrics() if f not in fabrics)
        for fabric in fabrics:
            plan = self._plan(members, fabric)
            if plan is not None:
                for rec, placement in plan:
                    self._life.bind(rec, placement)
                return
        need = ", ".join(
            f"{role.count} {role.name} ({self._life.profiles[role.profile].nodes} node(s) x "
            f"{self._life.profiles[role.profile].gpus_per_node} GPU(s))"
            for role in dep.roles
        )
        for rec in members:
            self._unplaceable(rec, f"group {gid} needs {need} in one fabric: no fabric has room")

    def _plan(
        self, members: list[ReplicaRecord], fabric: FabricId
    ) -> list[tuple[ReplicaRecord, Placement]] | None:
        """Every member placed in `fabric`, each booked while the next is tried; nothing is
        left booked."""
        capacity = self._life.capacity
        plan: list[tuple[ReplicaRecord, Placement]] = []
        planned: dict[NodeId, int] = {}
        try:
            for rec in members:
                found = self._try(rec, fabric, planned)
                if not isinstance(found, Placement):
                    return None
                for node, gpus in zip(found.nodes, found.gpus, strict=True):
                    capacity.book(node, gpus)
                    planned[node] = planned.get(node, 0) + 1
                plan.append((rec, found))
        finally:
            for _, placed in plan:
                for node, gpus in zip(placed.nodes, placed.gpus, strict=True):
                    capacity.release(node, gpus)
        return plan

    def _dissolve_if_short(
        self, dep: Deployment, gid: str, fabric: FabricId, members: list[ReplicaRecord]
    ) -> None:
        life = self._life
        held = {m.role for m in members if m.placed}
        short = [role.name for role in dep.roles if role.name not in held]
        if not short:
            return
        reason = f"group {gid} dissolved: no {short[0]} of it fits in {fabric} now"
        life.out.emit("group.dissolved", model=dep.model, group=gid, role=short[0], fabric=fabric)
        for rec in members:
            life.reap(rec, reason)

    def _unplaceable(self, rec: ReplicaRecord, reason: str) -> None:
        if rec.unplaceable_reason != reason:
            rec.unplaceable_reason = reason
            self._life.out.emit(
                "replica.unplaceable", model=rec.model, replica=rec.id, reason=reason, **rec.tags
            )


def _largest_first(rec: ReplicaRecord) -> tuple[int, int, int]:
    p = rec.profile
    return (-p.nodes * p.gpus_per_node, -p.nodes, rec.seq)
