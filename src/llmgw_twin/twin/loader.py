"""The scenario loader: a YAML file in, a checked `Scenario` out, or one precise error.

Role: read the format described in docs/scenarios.md. The file is composed into YAML nodes (never
constructed), and each section is read through `yamlnodes`, so every value keeps its position.

Invariants:
- Any bad input -- unreadable file, broken YAML, wrong shape, unknown key, unknown name, time
  outside the run -- raises `ScenarioError` naming file, line and column; nothing else escapes.
- Every name a value refers to (node, fabric, profile, deployed model, fault id) exists.
- Every time is resolved to integer milliseconds inside [0, duration]; faults come out sorted by
  time, ties in file order. Everything else keeps file order, so loading is deterministic.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, assert_never

from yaml.nodes import Node

from llmgw_twin.core.model import (
    ENGINES,
    Deployment,
    EngineName,
    FabricId,
    ModelName,
    NodeId,
    NodeInfo,
    Profile,
    ProfileName,
    Timings,
)
from llmgw_twin.twin import yamlnodes as yn
from llmgw_twin.twin.loader_expect import load_expectations
from llmgw_twin.twin.loader_faults import Known, load_faults
from llmgw_twin.twin.scenario import INVARIANTS, Fault, Scenario
from llmgw_twin.units import (
    SettingKey,
    fmt_ms,
    in_file_terms,
    parse_share,
    setting_keys,
    settings_named,
)

__all__ = ["ScenarioError", "load_scenario", "load_scenario_text"]

TOP_KEYS = (
    "name",
    "description",
    "seed",
    "duration",
    "timings",
    "cluster",
    "profiles",
    "deployments",
    "faults",
    "expect",
    "invariants",
)
TIMING_KEYS: tuple[SettingKey, ...] = setting_keys(Timings)
"""Every `Timings` field, by its name without `_ms` (docs/scenarios.md lists them)."""
NODE_KEYS = ("gpus", "gpu_memory", "engines")
PROFILE_KEYS = (
    "engine",
    "nodes",
    "gpus_per_node",
    "model",
    "load_time",
    "args",
    "start_timeout",
)
DEPLOYMENT_KEYS = ("model", "profile", "replicas")

DEFAULT_GPUS = 8
DEFAULT_GPU_MEMORY_MIB = 80 * 1024
DEFAULT_ENGINES: tuple[EngineName, ...] = (EngineName("sim"),)


class ScenarioError(Exception):
    """A scenario file that cannot be used: where (1-based line and column) and why."""

    def __init__(self, path: str, line: int, column: int, message: str) -> None:
        super().__init__(path, line, column, message)
        self.path = path
        self.line = line
        self.column = column
        self.message = message

    def __str__(self) -> str:
        return f"{self.path}:{self.line}:{self.column}: {self.message}"


def load_scenario(path: str | Path) -> Scenario:
    """Read and check the scenario file at `path`."""
    shown = str(path)
    try:
        data = Path(path).read_bytes()
    except OSError as err:
        raise ScenarioError(shown, 1, 1, f"cannot read file: {err.strerror or err}") from None
    try:
        source = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        column = err.start - (data.rfind(b"\n", 0, err.start) + 1) + 1
        raise ScenarioError(
            shown, line, column, f"cannot read file: not UTF-8 text ({err.reason})"
        ) from None
    return load_scenario_text(source, shown)


def load_scenario_text(text: str, path: str = "<string>") -> Scenario:
    """Check the scenario in `text`; `path` is only used to name it in errors and the result."""
    try:
        return _scenario(text, path)
    except yn.Invalid as err:
        raise ScenarioError(path, err.line, err.column, err.message) from None


def _scenario(text: str, path: str) -> Scenario:
    root = yn.compose(text)
    if root is None:
        raise yn.Invalid(
            1, 1, "the file is empty (expected a mapping with name, duration, cluster)"
        )
    top = yn.MapView(root, "the scenario")
    top.check_keys(TOP_KEYS)
    name = yn.name(top.require("name"), "name", "scenario name")
    description_node = top.get("description")
    description = "" if description_node is None else yn.text(description_node, "description")
    seed_node = top.get("seed")
    seed = 0 if seed_node is None else yn.integer(seed_node, "seed")
    duration_ms = yn.duration(top.require("duration"), "duration", positive=True)
    timings_node = top.get("timings")
    timings = Timings() if timings_node is None else _timings(timings_node)
    fabrics, nodes = _cluster(top.require("cluster"))
    profiles_node = top.get("profiles")
    profiles = () if profiles_node is None else _profiles(profiles_node)
    deployments_node = top.get("deployments")
    deployments = () if deployments_node is None else _deployments(deployments_node, profiles)

    known = Known(
        duration_ms=duration_ms,
        node_gpus={n.node: n.gpus for n in nodes},
        fabrics=[f for f, _ in fabrics],
        models=[d.model for d in deployments],
    )
    faults_node = top.get("faults")
    faults: tuple[Fault, ...] = ()
    if faults_node is not None:
        faults, known = load_faults(faults_node, known)
    expect_node = top.get("expect")
    expectations = () if expect_node is None else load_expectations(expect_node, known)
    invariants_node = top.get("invariants")
    invariants_off = () if invariants_node is None else _invariants_off(invariants_node)
    return Scenario(
        path=path,
        name=name,
        duration_ms=duration_ms,
        nodes=nodes,
        fabrics=fabrics,
        description=description,
        seed=seed,
        timings=timings,
        profiles=profiles,
        deployments=deployments,
        faults=faults,
        expectations=expectations,
        invariants_off=invariants_off,
    )


def _timings(node: Node) -> Timings:
    view = yn.MapView(node, "timings")
    view.check_keys(tuple(k.key for k in TIMING_KEYS))
    values: dict[str, Any] = {}  # field -> value, each of its key's kind
    written: dict[str, Node] = {}
    for k in TIMING_KEYS:
        value = view.get(k.key)
        if value is not None:
            values[k.attr] = _setting(value, f"timings.{k.key}", k)
            written[k.key] = value
    defaults = Timings()
    lost = int(values.setdefault("node_lost_after_ms", defaults.node_lost_after_ms))
    # Suspicion tracks the loss deadline unless set: halfway there, as the production defaults are.
    suspect = int(values.setdefault("node_suspect_after_ms", max(1, lost // 2)))
    if suspect > lost:
        raise yn.Invalid.at(
            node,
            f"timings: node_suspect_after ({fmt_ms(suspect)}) must not exceed "
            f"node_lost_after ({fmt_ms(lost)})",
        )
    try:
        return replace(defaults, **values)
    except ValueError as err:
        # Timings' own checks (one value against another): point at the first value it names.
        named = [k.key for k in settings_named(str(err), TIMING_KEYS) if k.key in written]
        at = written[named[0]] if named else node
        raise yn.Invalid.at(at, f"timings: {in_file_terms(str(err), TIMING_KEYS)}") from None


def _setting(value: Node, where: str, key: SettingKey) -> int | float:
    """One settings value of the kind its key says."""
    match key.kind:
        case "duration":
            return yn.duration(value, where, positive=key.minimum > 0)
        case "count":
            return yn.integer(value, where, minimum=key.minimum)
        case "share":
            try:
                return parse_share(yn.text(value, where))
            except ValueError as err:
                raise yn.Invalid.at(value, f"{where}: {err}") from None
        case _:
            assert_never(key.kind)


@dataclass(slots=True)
class _NodeSettings:
    gpus: int = DEFAULT_GPUS
    gpu_memory_mib: int = DEFAULT_GPU_MEMORY_MIB
    engines: tuple[EngineName, ...] = field(default=DEFAULT_ENGINES)

    def updated(self, node: Node, where: str) -> _NodeSettings:
        """These settings with the keys written in `node` replaced."""
        view = yn.MapView(node, where)
        view.check_keys(NODE_KEYS)
        out = _NodeSettings(self.gpus, self.gpu_memory_mib, self.engines)
        if (gpus := view.get("gpus")) is not None:
            out.gpus = yn.integer(gpus, f"{where}.gpus", minimum=0)
        if (memory := view.get("gpu_memory")) is not None:
            out.gpu_memory_mib = yn.size_mib(memory, f"{where}.gpu_memory")
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


def _cluster(
    node: Node,
) -> tuple[tuple[tuple[FabricId, tuple[NodeId, ...]], ...], tuple[NodeInfo, ...]]:
    view = yn.MapView(node, "cluster")
    view.check_keys(("fabrics", "nodes"))
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
                    f"cluster.nodes: unknown node '{entry.key}' (expected 'default' or a node "
                    f"listed under cluster.fabrics: {yn.preview(list(fabric_of))})",
                )
            per_node[entry.key] = base.updated(entry.value, f"cluster.nodes.{entry.key}")
    infos = []
    for fabric_id, fabric_nodes in fabrics:
        for node_id in fabric_nodes:
            got = per_node.get(node_id, base)
            infos.append(NodeInfo(node_id, fabric_id, got.gpus, got.gpu_memory_mib, got.engines))
    return tuple(fabrics), tuple(infos)


def _profiles(node: Node) -> tuple[Profile, ...]:
    view = yn.MapView(node, "profiles")
    out: list[Profile] = []
    for entry in view.entries:
        name = yn.name(entry.key_node, "profiles", "profile name")
        where = f"profiles.{name}"
        p = yn.MapView(entry.value, where)
        p.check_keys(PROFILE_KEYS)
        engine = yn.choice(p.require("engine"), f"{where}.engine", ENGINES, "engine")
        nodes_node = p.get("nodes")
        nodes = 1 if nodes_node is None else yn.integer(nodes_node, f"{where}.nodes", minimum=1)
        gpus = yn.integer(p.require("gpus_per_node"), f"{where}.gpus_per_node", minimum=1)
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
            items = yn.items(args_node, f"{where}.args")
            args = tuple(yn.text(a, f"{where}.args[{i}]") for i, a in enumerate(items))
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
            )
        )
    return tuple(out)


def _deployments(node: Node, profiles: tuple[Profile, ...]) -> tuple[Deployment, ...]:
    known_profiles = [p.name for p in profiles]
    out: list[Deployment] = []
    first_line: dict[str, int] = {}
    for i, item in enumerate(yn.items(node, "deployments")):
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
        profile_node = view.require("profile")
        profile = yn.text(profile_node, f"{where}.profile")
        if profile not in known_profiles:
            raise yn.Invalid.at(
                profile_node,
                f"{where}.profile: unknown profile '{profile}' "
                f"(expected one of: {yn.preview(known_profiles)})",
            )
        replicas = yn.integer(view.require("replicas"), f"{where}.replicas", minimum=0)
        out.append(Deployment(ModelName(model), ProfileName(profile), replicas))
    return tuple(out)


def _invariants_off(node: Node) -> tuple[tuple[str, str], ...]:
    view = yn.MapView(node, "invariants")
    view.check_keys(("off",))
    off_node = view.get("off")
    if off_node is None:
        return ()
    off = yn.MapView(off_node, "invariants.off")
    out: list[tuple[str, str]] = []
    for entry in off.entries:
        if entry.key not in INVARIANTS:
            raise yn.Invalid.at(
                entry.key_node,
                f"invariants.off: unknown invariant '{entry.key}' "
                f"(expected one of: {', '.join(INVARIANTS)})",
            )
        reason = yn.text(entry.value, f"invariants.off.{entry.key}")
        if not reason.strip():
            raise yn.Invalid.at(
                entry.value, f"invariants.off.{entry.key} needs a reason for turning it off"
            )
        out.append((entry.key, reason))
    return tuple(out)
