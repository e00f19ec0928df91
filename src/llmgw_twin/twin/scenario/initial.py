"""The scenario's `initial` section (the project's version 1.2 addition): the state a live fleet
was in, as `llmgw-twin snapshot` writes it, for the twin to start in.

Role: read and check `initial` against the file's cluster, profiles and deployments
(docs/scenarios.md, "initial"). The twin (`twin/world/initial.py`) starts from it as a restarted
controller does: the store holds every replica's placement, each node boots with its shards
running, and the controller adopts them.

Invariants:
- Every node named is a node of `cluster` (not one added by a fault); every profile exists;
  every replica's model is deployed; replica ids are `MODEL-rN` and unique.
- A placed replica (`ready` or `starting`) has one shard per rank of its profile, each on its
  own node, all nodes in one fabric, each node offering the profile's engine, each shard holding
  exactly `gpus_per_node` GPUs of its node, none failed and none held by another shard; a
  `pending` replica has no shards.
"""

from __future__ import annotations

import re

from yaml.nodes import Node

from llmgw_twin.control.model import (
    ROLE_NAMES,
    Deployment,
    FabricId,
    ModelName,
    NodeId,
    NodeInfo,
    Profile,
    ProfileName,
    ReplicaId,
)
from llmgw_twin.twin.scenario import yamlnodes as yn
from llmgw_twin.twin.scenario.initial_model import (
    Initial,
    InitialNode,
    InitialQuarantine,
    InitialReplica,
    shard_specs,
)
from llmgw_twin.twin.scenario.limits import MAX_REPLICAS

INITIAL_KEYS = ("nodes", "quarantines", "replicas")
NODE_KEYS = ("state", "failed_gpus", "cordoned", "draining")
NODE_STATES = ("alive", "suspect", "lost")
QUARANTINE_KEYS = ("node", "profile", "for", "reason")
REPLICA_KEYS = ("id", "model", "profile", "state", "fabric", "shards", "group", "role")
REPLICA_STATES = ("ready", "starting", "pending")
SHARD_KEYS = ("rank", "node", "gpus")
_ID_RE = re.compile(r"(?P<model>.+)-r(?P<seq>[0-9]{1,9})")


def load_initial(
    node: Node,
    infos: tuple[NodeInfo, ...],
    profiles: tuple[Profile, ...],
    deployments: tuple[Deployment, ...],
) -> Initial:
    view = yn.MapView(node, "initial")
    view.check_keys(INITIAL_KEYS)
    by_name = {n.node: n for n in infos}
    nodes = () if (n := view.get("nodes")) is None else _nodes(n, by_name)
    failed = {(x.node, g) for x in nodes for g in x.failed_gpus}
    profile_of = {p.name: p for p in profiles}
    quarantines = (
        () if (q := view.get("quarantines")) is None else _quarantines(q, by_name, profile_of)
    )
    models = {d.model for d in deployments}
    replicas: tuple[InitialReplica, ...] = ()
    if (r := view.get("replicas")) is not None:
        roles = {d.model: {r.name: r.profile for r in d.roles} for d in deployments if d.roles}
        replicas = _Replicas(by_name, profile_of, models, failed, roles).load(r)
    return Initial(nodes, quarantines, replicas)


def _node_name(node: Node, where: str, by_name: dict[NodeId, NodeInfo]) -> NodeId:
    name = yn.name(node, where, "node name")
    if name not in by_name:
        raise yn.Invalid.at(
            node,
            f"{where}: unknown node '{yn.short(name)}' (expected a node of cluster.fabrics: "
            f"{yn.preview(list(by_name))})",
        )
    return NodeId(name)


def _nodes(node: Node, by_name: dict[NodeId, NodeInfo]) -> tuple[InitialNode, ...]:
    out: list[InitialNode] = []
    for entry in yn.MapView(node, "initial.nodes").entries:
        name = _node_name(entry.key_node, "initial.nodes", by_name)
        where = f"initial.nodes.{name}"
        v = yn.MapView(entry.value, where)
        v.check_keys(NODE_KEYS)
        state = "alive"
        if (s := v.get("state")) is not None:
            state = yn.choice(s, f"{where}.state", NODE_STATES, "node state")
        gpus: list[int] = []
        if (f := v.get("failed_gpus")) is not None:
            count = by_name[name].gpus
            for i, item in enumerate(yn.items(f, f"{where}.failed_gpus")):
                g = yn.integer(item, f"{where}.failed_gpus[{i}]", minimum=0)
                if g >= count:
                    raise yn.Invalid.at(
                        item, f"{where}.failed_gpus[{i}]: node {name} has GPUs 0..{count - 1}"
                    )
                if g in gpus:
                    raise yn.Invalid.at(item, f"{where}.failed_gpus: GPU {g} is listed twice")
                gpus.append(g)
        cordoned = (c := v.get("cordoned")) is not None and yn.boolean(c, f"{where}.cordoned")
        draining = (d := v.get("draining")) is not None and yn.boolean(d, f"{where}.draining")
        if draining and c is not None and not cordoned:
            raise yn.Invalid.at(c, f"{where}: a draining node is cordoned (cordoned: false)")
        out.append(InitialNode(name, state, tuple(sorted(gpus)), cordoned or draining, draining))
    return tuple(out)


def _quarantines(
    node: Node, by_name: dict[NodeId, NodeInfo], profile_of: dict[ProfileName, Profile]
) -> tuple[InitialQuarantine, ...]:
    out: list[InitialQuarantine] = []
    seen: set[tuple[str, str]] = set()
    for i, item in enumerate(yn.items(node, "initial.quarantines")):
        where = f"initial.quarantines[{i}]"
        v = yn.MapView(item, where)
        v.check_keys(QUARANTINE_KEYS)
        name = _node_name(v.require("node"), f"{where}.node", by_name)
        profile = _profile(v.require("profile"), f"{where}.profile", profile_of)
        if (name, profile.name) in seen:
            raise yn.Invalid.at(item, f"{where}: {name} is quarantined for {profile.name} twice")
        seen.add((name, profile.name))
        for_ms = yn.duration(v.require("for"), f"{where}.for", positive=True)
        reason = "" if (r := v.get("reason")) is None else yn.text(r, f"{where}.reason")
        out.append(InitialQuarantine(name, profile.name, for_ms, reason))
    return tuple(out)


def _profile(node: Node, where: str, profile_of: dict[ProfileName, Profile]) -> Profile:
    name = yn.text(node, where)
    if name not in profile_of:
        raise yn.Invalid.at(
            node,
            f"{where}: unknown profile '{yn.short(name)}' "
            f"(expected one of: {yn.preview(list(profile_of))})",
        )
    return profile_of[ProfileName(name)]


class _Replicas:
    """Reads `initial.replicas`, booking each shard's GPUs as it goes."""

    def __init__(
        self,
        by_name: dict[NodeId, NodeInfo],
        profile_of: dict[ProfileName, Profile],
        models: set[ModelName],
        failed: set[tuple[NodeId, int]],
        roles: dict[ModelName, dict[str, ProfileName]],
    ) -> None:
        self.by_name, self.profile_of, self.models, self.failed = (
            by_name,
            profile_of,
            models,
            failed,
        )
        self.roles = roles
        """Each model deployed in roles: its roles' profiles."""
        self.held: dict[tuple[NodeId, int], str] = {}
        self.ids: dict[str, int] = {}
        self.group_fabric: dict[str, FabricId] = {}
        """The fabric of each role group's placed members so far."""

    def load(self, node: Node) -> tuple[InitialReplica, ...]:
        items = yn.items(node, "initial.replicas", MAX_REPLICAS)
        return tuple(self._replica(item, f"initial.replicas[{i}]") for i, item in enumerate(items))

    def _replica(self, item: Node, where: str) -> InitialReplica:
        v = yn.MapView(item, where)
        v.check_keys(REPLICA_KEYS)
        model_node = v.require("model")
        model = yn.name(model_node, f"{where}.model", "model name")
        if model not in self.models:
            raise yn.Invalid.at(
                model_node,
                f"{where}.model: '{model}' is not deployed (expected one of: "
                f"{yn.preview(sorted(self.models))})",
            )
        id_node = v.require("id")
        rid = yn.name(id_node, f"{where}.id", "replica id")
        match = _ID_RE.fullmatch(rid)
        if match is None or match["model"] != model:
            raise yn.Invalid.at(id_node, f"{where}.id: '{rid}' is not '{model}-rN' (N a number)")
        if rid in self.ids:
            raise yn.Invalid.at(
                id_node,
                f"{where}.id: replica '{rid}' is listed twice (first at line {self.ids[rid]})",
            )
        self.ids[rid] = yn.line_of(id_node)
        profile = _profile(v.require("profile"), f"{where}.profile", self.profile_of)
        state = yn.choice(v.require("state"), f"{where}.state", REPLICA_STATES, "replica state")
        group, role = self._member(v, where, model, int(match["seq"]))
        if role and (want := self.roles[ModelName(model)][role]) != profile.name:
            raise yn.Invalid.at(
                v.entry("profile").value,
                f"{where}.profile: a {role} replica of '{model}' runs its role's profile {want}",
            )
        shards_node = v.get("shards")
        shards = [] if shards_node is None else yn.items(shards_node, f"{where}.shards")
        if state == "pending":
            if shards:
                raise yn.Invalid.at(
                    shards_node or item, f"{where}: a pending replica has no shards"
                )
            return InitialReplica(
                ReplicaId(rid),
                ModelName(model),
                profile.name,
                int(match["seq"]),
                state,
                None,
                (),
                group,
                role,
            )
        if len(shards) != profile.nodes:
            raise yn.Invalid.at(
                shards_node or item,
                f"{where}.shards: profile {profile.name} has {profile.nodes} shard(s) a replica, "
                f"{len(shards)} listed",
            )
        layout = self._layout(shards, f"{where}.shards", rid, profile)
        fabric = self.by_name[layout[0][0]].fabric
        if (f := v.get("fabric")) is not None and yn.name(f, f"{where}.fabric") != fabric:
            raise yn.Invalid.at(f, f"{where}.fabric: its nodes are in fabric {fabric}")
        if group and self.group_fabric.setdefault(group, fabric) != fabric:
            raise yn.Invalid.at(
                shards_node or item,
                f"{where}: group {group}'s members are in {self.group_fabric[group]}, this one "
                f"in {fabric}: a group is in one fabric",
            )
        specs = shard_specs(ReplicaId(rid), ModelName(model), profile, layout, role)
        return InitialReplica(
            ReplicaId(rid),
            ModelName(model),
            profile.name,
            int(match["seq"]),
            state,
            fabric,
            specs,
            group,
            role,
        )

    def _member(self, v: yn.MapView, where: str, model: str, seq: int) -> tuple[str, str]:
        """A role group's member: its `group` and `role`, both or neither (docs/topology.md).
        A group is named after its first member (`MODEL-gN`, N that member's number), so N is
        at most the member's own: a group the controller makes later cannot take the name."""
        grouped = ModelName(model) in self.roles
        if not (v.has("group") or v.has("role")):
            if grouped:
                raise yn.Invalid.at(
                    v.node,
                    f"{where}: '{model}' is deployed in roles: a replica of it names its group "
                    "and role",
                )
            return "", ""
        if not grouped:
            key = v.entry("group" if v.has("group") else "role").key_node
            raise yn.Invalid.at(key, f"{where}: '{model}' is not deployed in roles")
        group = yn.text(v.require("group"), f"{where}.group")
        number = group[len(model) + 2 :]
        if not group.startswith(f"{model}-g") or not number.isdigit():
            raise yn.Invalid.at(
                v.entry("group").value, f"{where}.group: '{group}' is not '{model}-gN'"
            )
        if int(number) > seq:
            raise yn.Invalid.at(
                v.entry("group").value,
                f"{where}.group: '{group}' is numbered after this replica ({seq}): a group "
                "takes its first member's number",
            )
        role = yn.choice(v.require("role"), f"{where}.role", ROLE_NAMES, "role")
        return group, role

    def _layout(
        self, shards: list[Node], where: str, rid: str, profile: Profile
    ) -> list[tuple[NodeId, tuple[int, ...]]]:
        by_rank: dict[int, tuple[NodeId, tuple[int, ...]]] = {}
        fabric: FabricId | None = None
        for i, item in enumerate(shards):
            at = f"{where}[{i}]"
            v = yn.MapView(item, at)
            v.check_keys(SHARD_KEYS)
            rank_node = v.require("rank")
            rank = yn.integer(rank_node, f"{at}.rank", minimum=0, maximum=profile.nodes - 1)
            if rank in by_rank:
                raise yn.Invalid.at(rank_node, f"{at}.rank: rank {rank} is listed twice")
            node_node = v.require("node")
            name = _node_name(node_node, f"{at}.node", self.by_name)
            info = self.by_name[name]
            if any(n == name for n, _ in by_rank.values()):
                raise yn.Invalid.at(node_node, f"{at}.node: {rid} has two shards on {name}")
            if fabric is not None and info.fabric != fabric:
                raise yn.Invalid.at(
                    node_node,
                    f"{at}.node: {name} is in fabric {info.fabric}, the replica's other shards "
                    f"in {fabric} (a replica is in one fabric)",
                )
            fabric = info.fabric
            if profile.engine not in info.engines:
                raise yn.Invalid.at(
                    node_node, f"{at}.node: {name} offers no {profile.engine} engine"
                )
            by_rank[rank] = (name, self._gpus(v.require("gpus"), f"{at}.gpus", rid, info, profile))
        return [by_rank[r] for r in range(profile.nodes)]

    def _gpus(
        self, node: Node, where: str, rid: str, info: NodeInfo, profile: Profile
    ) -> tuple[int, ...]:
        items = yn.items(node, where)
        if len(items) != profile.gpus_per_node:
            raise yn.Invalid.at(
                node,
                f"{where}: profile {profile.name} takes {profile.gpus_per_node} GPU(s) a node, "
                f"{len(items)} listed",
            )
        gpus: list[int] = []
        for i, item in enumerate(items):
            g = yn.integer(item, f"{where}[{i}]", minimum=0)
            if g >= info.gpus:
                raise yn.Invalid.at(
                    item, f"{where}[{i}]: node {info.node} has GPUs 0..{info.gpus - 1}"
                )
            slot = (info.node, g)
            if slot in self.failed:
                raise yn.Invalid.at(item, f"{where}[{i}]: GPU {g} of {info.node} is failed")
            if slot in self.held or g in gpus:
                other = self.held.get(slot, rid)
                raise yn.Invalid.at(
                    item, f"{where}[{i}]: GPU {g} of {info.node} is held by {other} already"
                )
            gpus.append(g)
        for g in gpus:
            self.held[(info.node, g)] = rid
        return tuple(gpus)
