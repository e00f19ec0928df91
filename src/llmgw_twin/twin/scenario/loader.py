"""The scenario loader: a YAML file in, a checked `Scenario` out, or one precise error.

Role: read the format described in docs/scenarios.md. The file is composed into YAML nodes (never
constructed), and each section is read through `yamlnodes`, so every value keeps its position.

Invariants:
- Any bad input -- unreadable file, broken YAML, wrong shape, unknown key, unknown name, time
  outside the run, a value or a total past its bound (`limits.py`) -- raises `ScenarioError`
  naming file, line and column; nothing else escapes.
- A leading UTF-8 byte order mark is dropped and CRLF and CR line ends read as LF before
  anything else, so such a file loads, and fails, exactly as the plain one: same `Scenario`,
  same line and column in every error.
- A loaded scenario's run is bounded: at most `MAX_STEPS` heartbeats and reconciles.
- Every name a value refers to (node, fabric, profile, deployed model, fault id) exists.
- Every time is resolved to integer milliseconds inside [0, duration]; faults come out sorted by
  time, ties in file order. Everything else keeps file order, so loading is deterministic.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any, assert_never

from yaml.nodes import Node

from llmgw_twin.control.model import Timings
from llmgw_twin.twin.scenario import yamlnodes as yn
from llmgw_twin.twin.scenario.autoscale import load_autoscale
from llmgw_twin.twin.scenario.expect import load_expectations
from llmgw_twin.twin.scenario.faults import Known, load_faults
from llmgw_twin.twin.scenario.fleet import (
    ReplicaTotals,
    load_cluster,
    load_controllers,
    load_deployments,
    load_profiles,
    node_defaults,
)
from llmgw_twin.twin.scenario.initial import load_initial
from llmgw_twin.twin.scenario.limits import (
    MAX_COUNT,
    MAX_EVENT_STEPS,
    MAX_FILE_BYTES,
    MAX_STEPS,
    event_steps,
    steps,
)
from llmgw_twin.twin.scenario.model import INVARIANTS, Fault, Scenario
from llmgw_twin.twin.scenario.shapes import prescan_added
from llmgw_twin.twin.scenario.topology import load_topology
from llmgw_twin.twin.scenario.traffic import load_traffic
from llmgw_twin.twin.scenario.workload import load_engine_model, with_perf_args
from llmgw_twin.units import (
    SettingKey,
    fmt_ms,
    parse_share,
    setting_keys,
    timings_refusal,
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
    "traffic",
    "engine_model",
    "expect",
    "invariants",
    "initial",
)
TIMING_KEYS: tuple[SettingKey, ...] = setting_keys(Timings)
"""Every `Timings` field, by its name without `_ms` (docs/scenarios.md lists them)."""
_BOM = "\ufeff"


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
    """Read and check the scenario file at `path`; more than `MAX_FILE_BYTES` is never read."""
    shown = str(path)
    try:
        with Path(path).open("rb") as file:
            data = file.read(MAX_FILE_BYTES + 1)
    except OSError as err:
        raise ScenarioError(shown, 1, 1, f"cannot read file: {err.strerror or err}") from None
    if len(data) > MAX_FILE_BYTES:
        raise ScenarioError(shown, 1, 1, _too_large())
    try:
        source = data.decode("utf-8")
    except UnicodeDecodeError as err:
        # Position as the loader counts it: the valid text before the bad byte, normalised.
        before = _normalised(data[: err.start].decode("utf-8"))
        line = before.count("\n") + 1
        column = len(before) - (before.rfind("\n") + 1) + 1
        raise ScenarioError(
            shown, line, column, f"cannot read file: not UTF-8 text ({err.reason})"
        ) from None
    return load_scenario_text(source, shown)


def load_scenario_text(text: str, path: str = "<string>") -> Scenario:
    """Check the scenario in `text`; `path` is only used to name it in errors and the result."""
    if len(text) > MAX_FILE_BYTES or len(text.encode("utf-8", "surrogatepass")) > MAX_FILE_BYTES:
        raise ScenarioError(path, 1, 1, _too_large())
    try:
        return _scenario(_normalised(text), path)
    except yn.Invalid as err:
        raise ScenarioError(path, err.line, err.column, err.message) from None


def _normalised(text: str) -> str:
    """`text` without a leading byte order mark, its line ends LF only."""
    return text.removeprefix(_BOM).replace("\r\n", "\n").replace("\r", "\n")


def _too_large() -> str:
    return f"the file is larger than {MAX_FILE_BYTES:,} bytes (the most a scenario may be)"


def _scenario(text: str, path: str) -> Scenario:
    root = yn.compose(text)
    if root is None:
        raise yn.Invalid(
            1, 1, "the file is empty (expected a mapping with name, duration, cluster)"
        )
    yn.check_graph(root)
    top = yn.MapView(root, "the scenario")
    top.check_keys(TOP_KEYS)
    name = yn.name(top.require("name"), "name", "scenario name")
    description_node = top.get("description")
    description = "" if description_node is None else yn.text(description_node, "description")
    seed_node = top.get("seed")
    seed = 0 if seed_node is None else yn.integer(seed_node, "seed")
    duration_node = top.require("duration")
    duration_ms = yn.duration(duration_node, "duration", positive=True)
    timings_node = top.get("timings")
    timings = Timings() if timings_node is None else _timings(timings_node)
    fabrics, nodes = load_cluster(top.require("cluster"))
    topology_node = yn.MapView(top.require("cluster"), "cluster").get("topology")
    nodes, topology = load_topology(topology_node, nodes)
    controllers = load_controllers(top.require("cluster"))
    # nodes added at run time, read first: any fault or expectation may name them
    added = prescan_added(top.get("faults"), fabrics, nodes, node_defaults(top.require("cluster")))
    profiles_node = top.get("profiles")
    profiles = () if profiles_node is None else load_profiles(profiles_node)
    deployments_node = top.get("deployments")
    deployments, totals = (
        ((), ReplicaTotals())
        if deployments_node is None
        else load_deployments(deployments_node, profiles)
    )
    autoscale = (
        () if deployments_node is None else load_autoscale(deployments_node, deployments, totals)
    )
    work = steps(
        duration_ms,
        len(nodes) + len(added),
        len(deployments),
        timings.heartbeat_interval_ms,
        timings.reconcile_interval_ms,
    )
    if work > MAX_STEPS:
        raise yn.Invalid.at(
            duration_node,
            f"duration: the run would take {work:,} steps, more than the {MAX_STEPS:,} allowed "
            f"({len(nodes) + len(added):,} node(s) heartbeating every "
            f"{fmt_ms(timings.heartbeat_interval_ms)} "
            f"and a reconcile every {fmt_ms(timings.reconcile_interval_ms)} "
            f"for {fmt_ms(duration_ms)}; see Limits in docs/scenarios.md)",
        )

    known = Known(
        duration_ms=duration_ms,
        node_gpus={n.node: n.gpus for n in (*nodes, *added.values())},
        fabrics=dict.fromkeys(f for f, _ in fabrics),
        models=dict.fromkeys(d.model for d in deployments),
        totals=totals,
        controllers=controllers,
        added=added,
        profiles={p.name: p.nodes for p in profiles},
        topology=topology,
        grouped=dict.fromkeys(d.model for d in deployments if d.roles),
    )
    faults_node = top.get("faults")
    faults: tuple[Fault, ...] = ()
    if faults_node is not None:
        faults, known = load_faults(faults_node, known)
    traffic_node = top.get("traffic")
    base_dir = Path(path).parent
    traffic = () if traffic_node is None else load_traffic(traffic_node, known, base_dir)
    engine_node = top.get("engine_model")
    engine_model = () if engine_node is None else load_engine_model(engine_node, known)
    profiles = with_perf_args(profiles, engine_model)  # the sim engine serves with it too
    known = replace(known, traffic=dict.fromkeys(t.model for t in traffic))
    expect_node = top.get("expect")
    expectations = () if expect_node is None else load_expectations(expect_node, known)
    invariants_node = top.get("invariants")
    invariants_off = () if invariants_node is None else _invariants_off(invariants_node)
    initial_node = top.get("initial")
    initial = (
        None if initial_node is None else load_initial(initial_node, nodes, profiles, deployments)
    )
    scenario = Scenario(
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
        traffic=traffic,
        engine_model=engine_model,
        invariants_off=invariants_off,
        controllers=controllers,
        initial=initial,
        autoscale=autoscale,
    )
    if (events := event_steps(scenario)) > MAX_EVENT_STEPS:
        raise yn.Invalid.at(
            faults_node or deployments_node or duration_node,
            f"the run's deployments and faults would take {events:,} steps (every shard placed "
            f"and what each fault touches), more than the {MAX_EVENT_STEPS:,} allowed; see Limits "
            "in docs/scenarios.md",
        )
    return scenario


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
    if suspect >= lost:
        raise yn.Invalid.at(
            written.get("node_suspect_after", node),
            f"timings: node_suspect_after ({fmt_ms(suspect)}) must be shorter than "
            f"node_lost_after ({fmt_ms(lost)})",
        )
    try:
        return replace(defaults, **values)
    except ValueError as err:
        # Timings' own checks (one value against another): point at the first value it names,
        # or at node_lost_after when the value named is the suspicion it set
        text, at = timings_refusal(str(err), TIMING_KEYS, values, written)
        raise yn.Invalid.at(written[at] if at else node, f"timings: {text}") from None


def _setting(value: Node, where: str, key: SettingKey) -> int | float:
    """One settings value of the kind its key says."""
    match key.kind:
        case "duration":
            return yn.duration(value, where, positive=key.minimum > 0)
        case "count":
            return yn.integer(value, where, minimum=key.minimum, maximum=MAX_COUNT)
        case "share":
            try:
                return parse_share(yn.text(value, where))
            except ValueError as err:
                raise yn.Invalid.at(value, f"{where}: {err}") from None
        case _:
            assert_never(key.kind)


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
