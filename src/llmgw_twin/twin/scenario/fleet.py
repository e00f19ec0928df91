"""The scenario loader's fleet: `cluster`, `profiles` and `deployments`.

Role: read the fabrics and their nodes (with per-node settings over a default), the profiles
and the deployments, each value checked against its bound in `limits.py`.

Invariants:
- Every node is listed under exactly one fabric; per-node settings name listed nodes only.
- The fleet holds at most `MAX_NODES` nodes and `MAX_FLEET_GPUS` GPUs; the first node too many,
  or the GPU count that tips the fleet over, is where the error points.
- A deployment names a defined profile and deploys its model once; output keeps file order.
- All deployments together, each at the largest replica count the file ever gives it (its
  `replicas` or a later `set_replicas`), hold at most `MAX_REPLICAS` replicas and `MAX_SHARDS`
  shards (`ReplicaTotals`); the count that tips them over is where the error points.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from yaml.nodes import Node

from llmgw_twin.control.model import (
    ENGINES,
    MAX_ROLE_COUNT,
    ROLE_NAMES,
    Deployment,
    EngineName,
    FabricId,
    ModelName,
    NodeId,
    NodeInfo,
    Profile,
    ProfileName,
    Role,
)
from llmgw_twin.control.topology import TopologyRules
from llmgw_twin.twin.scenario import yamlnodes as yn
from llmgw_twin.twin.scenario.limits import (
    MAX_ARGS,
    MAX_DEPLOYMENTS,
    MAX_FLEET_GPUS,
    MAX_GPU_MEMORY_MIB,
    MAX_GPUS_PER_NODE,
    MAX_NODES,
    MAX_PROFILES,
    MAX_REPLICAS,
    MAX_SHARDS,
    MAX_SHARDS_PER_REPLICA,
)
from llmgw_twin.twin.scenario.topology import load_rules

NODE_KEYS = ("gpus", "gpu_memory", "engines")
PROFILE_KEYS = (
    "engine",
    "nodes",
    "gpus_per_node",
    "model",
    "load_time",
    "args",
    "start_timeout",
    "nvlink",
    "leaves",
)
DEPLOYMENT_KEYS = ("model", "profile", "replicas", "autoscale", "roles")
ROLE_KEYS = ("profile", "count")

DEFAULT_GPUS = 8
DEFAULT_GPU_MEMORY_MIB = 80 * 1024
DEFAULT_ENGINES: tuple[EngineName, ...] = (EngineName("sim"),)

Fabrics = tuple[tuple[FabricId, tuple[NodeId, ...]], ...]


@dataclass(slots=True)
class _NodeSettings:
    gpus: int = DEFAULT_GPUS
    gpu_memory_mib: int = DEFAULT_GPU_MEMORY_MIB
    engines: tuple[EngineName, ...] = field(default=DEFAULT_ENGINES)
    gpus_node: Node | None = None
    """Where `gpus` was written, for an error about the fleet's GPU count."""

    def updated(self, node: Node, where: str) -> _NodeSettings:
        """These settings with the keys written in `node` replaced."""
        view = yn.MapView(node, where)
        view.check_keys(NODE_KEYS)
        out = _NodeSettings(self.gpus, self.gpu_memory_mib, self.engines, self.gpus_node)
        if (gpus := view.get("gpus")) is not None:
            out.gpus = yn.integer(gpus, f"{where}.gpus", minimum=0, maximum=MAX_GPUS_PER_NODE)
            out.gpus_node = gpus
        if (memory := view.get("gpu_memory")) is not None:
            out.gpu_memory_mib = yn.size_mib(memory, f"{where}.gpu_memory", MAX_GPU_MEMORY_MIB)
        if (engines := view.get("engines")) is not None:
            out.engines = _engines(engines, f"{where}.engines")
        return out


def _engines(node: Node, where: str) -> tuple[EngineName, ...]:
    out: list[EngineName] = []
    for i, item in enumerate(yn.items(node, where)):
        engine = yn.choice(item, f"{where}[{i}]", ENGINES, "engine")
        if engine in out:
            raise yn.Invalid.at(item, f"{where}: engine '{engine}' is listed twice")
        out.append(EngineName(engine))
    return tuple(out)


def load_cluster(node: Node) -> tuple[Fabrics, tuple[NodeInfo, ...]]:
    view = yn.MapView(node, "cluster")
    view.check_keys(("fabrics", "nodes", "controllers", "topology"))
    fabrics_view = yn.MapView(view.require("fabrics"), "cluster.fabrics")
    if not fabrics_view.entries:
        raise yn.Invalid.at(fabrics_view.node, "cluster.fabrics must list at least one fabric")
    fabric_of: dict[str, str] = {}
    first_line: dict[str, int] = {}
    fabrics: list[tuple[FabricId, tuple[NodeId, ...]]] = []
    for entry in fabrics_view.entries:
        fabric = yn.name(entry.key_node, "cluster.fabrics", "fabric name")
        where = f"cluster.fabrics.{fabric}"
        members = yn.items(entry.value, where)
        if not members:
            raise yn.Invalid.at(entry.value, f"fabric '{fabric}' must list at least one node")
        names: list[NodeId] = []
        for i, item in enumerate(members):
            if len(fabric_of) == MAX_NODES:
                raise yn.Invalid.at(
                    item, f"{where}[{i}]: more than {MAX_NODES:,} nodes (the most a fleet may have)"
                )
            node_name = yn.name(item, f"{where}[{i}]", "node name")
            if node_name in fabric_of:
                raise yn.Invalid.at(
                    item,
                    f"node '{node_name}' is listed twice (first under fabric "
                    f"'{fabric_of[node_name]}' at line {first_line[node_name]})",
                )
            fabric_of[node_name] = fabric
            first_line[node_name] = yn.line_of(item)
            names.append(NodeId(node_name))
        fabrics.append((FabricId(fabric), tuple(names)))

    base = _NodeSettings()
    per_node: dict[str, _NodeSettings] = {}
    if (nodes_node := view.get("nodes")) is not None:
        nodes_view = yn.MapView(nodes_node, "cluster.nodes")
        if (default := nodes_view.get("default")) is not None:
            base = base.updated(default, "cluster.nodes.default")
        for entry in nodes_view.entries:
            if entry.key == "default":
                continue
            if entry.key not in fabric_of:
                raise yn.Invalid.at(
                    entry.key_node,
                    f"cluster.nodes: unknown node '{yn.short(entry.key)}' (expected 'default' or "
                    f"a node listed under cluster.fabrics: {yn.preview(list(fabric_of))})",
                )
            per_node[entry.key] = base.updated(entry.value, f"cluster.nodes.{entry.key}")
    infos: list[NodeInfo] = []
    gpus = 0
    for fabric_id, fabric_nodes in fabrics:
        for node_id in fabric_nodes:
            got = per_node.get(node_id, base)
            gpus += got.gpus
            if gpus > MAX_FLEET_GPUS:
                raise yn.Invalid.at(
                    got.gpus_node or view.node,
                    f"cluster: the fleet has more than {MAX_FLEET_GPUS:,} GPUs (at node "
                    f"'{node_id}', {len(infos) + 1:,} of {len(fabric_of):,} nodes)",
                )
            infos.append(NodeInfo(node_id, fabric_id, got.gpus, got.gpu_memory_mib, got.engines))
    return tuple(fabrics), tuple(infos)


def node_defaults(node: Node) -> tuple[int, int, tuple[EngineName, ...]]:
    """`cluster.nodes.default` (read and checked by `load_cluster` already): the GPUs, GPU
    memory (MiB) and engines a node has unless it says otherwise, as a node added at run time
    (`add_node`) does."""
    base = _NodeSettings()
    nodes_node = yn.MapView(node, "cluster").get("nodes")
    if nodes_node is not None:
        default = yn.MapView(nodes_node, "cluster.nodes").get("default")
        if default is not None:
            base = base.updated(default, "cluster.nodes.default")
    return base.gpus, base.gpu_memory_mib, base.engines


def read_engines(node: Node, where: str) -> tuple[EngineName, ...]:
    """A node's `engines` list: known engines, none twice."""
    return _engines(node, where)


MAX_CONTROLLERS = 9
"""The most controller processes a scenario may run on its one store."""


def load_controllers(node: Node) -> int:
    """`cluster.controllers`: how many controller processes share the store (default 1)."""
    count = yn.MapView(node, "cluster").get("controllers")
    if count is None:
        return 1
    return yn.integer(count, "cluster.controllers", minimum=1, maximum=MAX_CONTROLLERS)


def load_profiles(node: Node) -> tuple[Profile, ...]:
    view = yn.MapView(node, "profiles")
    if len(view.entries) > MAX_PROFILES:
        raise yn.Invalid.at(
            view.entries[MAX_PROFILES].key_node,
            f"profiles: {len(view.entries):,} profiles, more than the {MAX_PROFILES:,} allowed",
        )
    out: list[Profile] = []
    for entry in view.entries:
        name = yn.name(entry.key_node, "profiles", "profile name")
        where = f"profiles.{name}"
        p = yn.MapView(entry.value, where)
        p.check_keys(PROFILE_KEYS)
        engine = yn.choice(p.require("engine"), f"{where}.engine", ENGINES, "engine")
        nodes_node = p.get("nodes")
        nodes = (
            1
            if nodes_node is None
            else yn.integer(nodes_node, f"{where}.nodes", minimum=1, maximum=MAX_SHARDS_PER_REPLICA)
        )
        gpus = yn.integer(
            p.require("gpus_per_node"),
            f"{where}.gpus_per_node",
            minimum=1,
            maximum=MAX_GPUS_PER_NODE,
        )
        model_node = p.require("model")
        model = yn.text(model_node, f"{where}.model")
        if not model.strip():
            raise yn.Invalid.at(model_node, f"{where}.model must not be empty")
        load_node = p.get("load_time")
        load_ms = 0 if load_node is None else yn.duration(load_node, f"{where}.load_time")
        timeout_node = p.get("start_timeout")
        timeout_ms = (
            0
            if timeout_node is None
            else yn.duration(timeout_node, f"{where}.start_timeout", positive=True)
        )
        args_node = p.get("args")
        args: tuple[str, ...] = ()
        if args_node is not None:
            items = yn.items(args_node, f"{where}.args", MAX_ARGS)
            args = tuple(yn.text(a, f"{where}.args[{i}]") for i, a in enumerate(items))
        nvlink, leaves = load_rules(p.get("nvlink"), p.get("leaves"), where)
        out.append(
            Profile(
                ProfileName(name),
                EngineName(engine),
                nodes,
                gpus,
                model,
                load_ms,
                args,
                start_timeout_ms=timeout_ms,
                topology=TopologyRules(nvlink, leaves),
            )
        )
    return tuple(out)


@dataclass(slots=True)
class ReplicaTotals:
    """Replicas and shards of all deployments, each at the most it has been set to so far."""

    shards_per_replica: dict[str, int] = field(default_factory=dict)
    """Deployed model -> its profile's `nodes`."""
    most: dict[str, int] = field(default_factory=dict)
    replicas: int = 0
    shards: int = 0

    def raise_to(self, model: str, replicas: int, node: Node, where: str) -> None:
        """Count `replicas` of `model` (written at `node`) if more than counted before."""
        old = self.most.get(model, 0)
        if replicas <= old:
            return
        per = self.shards_per_replica[model]
        total = self.replicas + replicas - old
        shards = self.shards + (replicas - old) * per
        if total > MAX_REPLICAS or shards > MAX_SHARDS:
            raise yn.Invalid.at(
                node,
                f"{where}: {replicas:,} replicas of '{model}' make {total:,} replicas of "
                f"{shards:,} shards in all deployments together, more than the "
                f"{MAX_REPLICAS:,} replicas or {MAX_SHARDS:,} shards allowed (each deployment "
                "counts at the largest replica count the file gives it)",
            )
        self.most[model] = replicas
        self.replicas, self.shards = total, shards

    def widen(self, model: str, per: int, node: Node, where: str) -> None:
        """`model` changes to a profile of `per` shards a replica (written at `node`): its
        replicas are counted at the widest profile the file gives it."""
        old = self.shards_per_replica[model]
        if per <= old:
            return
        shards = self.shards + self.most.get(model, 0) * (per - old)
        if shards > MAX_SHARDS:
            raise yn.Invalid.at(
                node,
                f"{where}: {per} shards a replica of '{model}' make {shards:,} shards in all "
                f"deployments together, more than the {MAX_SHARDS:,} allowed",
            )
        self.shards_per_replica[model] = per
        self.shards = shards


def load_deployments(
    node: Node, profiles: tuple[Profile, ...]
) -> tuple[tuple[Deployment, ...], ReplicaTotals]:
    """The deployments, and their totals for `set_replicas` faults to add to."""
    known_profiles: dict[str, int] = {p.name: p.nodes for p in profiles}  # in file order
    totals = ReplicaTotals()
    out: list[Deployment] = []
    first_line: dict[str, int] = {}
    for i, item in enumerate(yn.items(node, "deployments", MAX_DEPLOYMENTS)):
        where = f"deployments[{i}]"
        view = yn.MapView(item, where)
        view.check_keys(DEPLOYMENT_KEYS)
        model_node = view.require("model")
        model = yn.name(model_node, f"{where}.model", "model name")
        if model in first_line:
            raise yn.Invalid.at(
                model_node,
                f"{where}: model '{model}' is deployed twice (first at line {first_line[model]})",
            )
        first_line[model] = yn.line_of(model_node)
        roles_node = view.get("roles")
        if roles_node is not None:
            if view.has("profile"):
                raise yn.Invalid.at(
                    view.entry("profile").key_node,
                    f"{where}: a deployment of roles names a profile per role, not 'profile'",
                )
            roles = _roles(roles_node, f"{where}.roles", known_profiles)
            profile = roles[0].profile
            shards = sum(r.count * known_profiles[r.profile] for r in roles)
        else:
            profile_node = view.require("profile")
            profile = ProfileName(_known(profile_node, f"{where}.profile", known_profiles))
            roles, shards = (), known_profiles[profile]
        replicas_node = view.require("replicas")
        replicas = yn.integer(replicas_node, f"{where}.replicas", minimum=0, maximum=MAX_REPLICAS)
        totals.shards_per_replica[model] = shards
        totals.raise_to(model, replicas, replicas_node, f"{where}.replicas")
        out.append(Deployment(ModelName(model), profile, replicas, roles))
    return tuple(out), totals


def _known(node: Node, where: str, known_profiles: dict[str, int]) -> str:
    profile = yn.text(node, where)
    if profile not in known_profiles:
        raise yn.Invalid.at(
            node,
            f"{where}: unknown profile '{yn.short(profile)}' "
            f"(expected one of: {yn.preview(list(known_profiles))})",
        )
    return profile


def _roles(node: Node, where: str, known_profiles: dict[str, int]) -> tuple[Role, ...]:
    """A role group's roles: `prefill` and `decode`, each a profile and a count per group."""
    view = yn.MapView(node, where)
    view.check_keys(ROLE_NAMES)
    out = []
    for name in ROLE_NAMES:
        if not view.has(name):
            raise yn.Invalid.at(
                node, f"{where}: missing role '{name}' (a group needs {', '.join(ROLE_NAMES)})"
            )
        role = yn.MapView(view.require(name), f"{where}.{name}")
        role.check_keys(ROLE_KEYS)
        profile = _known(role.require("profile"), f"{where}.{name}.profile", known_profiles)
        count_node = role.get("count")
        count = 1
        if count_node is not None:
            count = yn.integer(count_node, f"{where}.{name}.count", 1, MAX_ROLE_COUNT)
        out.append(Role(name, ProfileName(profile), count))
    return tuple(out)
