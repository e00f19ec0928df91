"""The bounds a scenario file must keep, so that loading it and running it always end.

Role: one place for every limit the loader enforces (docs/scenarios.md, "Limits", lists each
with its reason, and a test checks that table against `LIMITS`), and `steps`, the estimate of a
run's work that the loader bounds. Nothing here reads YAML; `yamlnodes` and the loader modules
apply these numbers where the values are read, so each refusal points at the offending value.

Invariants:
- Every bound leaves real use open: the twin is benchmarked at 10,000 nodes for 24 hours of
  virtual time, and every bound here is above what such a run needs.
- A file within every bound loads in seconds, and its run asks for at most `MAX_STEPS`
  heartbeats and reconciles and `MAX_EVENT_STEPS` placements and fault effects: no file can ask
  for a run that takes practically forever, or a trace that fills the memory.
"""

from __future__ import annotations

from llmgw_twin import units
from llmgw_twin.twin.scenario.model import (
    FabricDown,
    Partition,
    RestartController,
    Scenario,
    SetProfile,
    SetReplicas,
)
from llmgw_twin.units import MAX_DIGITS, MAX_NAME_LEN

__all__ = [
    "LIMITS",
    "MAX_ARGS",
    "MAX_BURSTS",
    "MAX_COUNT",
    "MAX_DEPLOYMENTS",
    "MAX_DEPTH",
    "MAX_DIGITS",
    "MAX_DURATION_MS",
    "MAX_EVENT_STEPS",
    "MAX_EXPECTATIONS",
    "MAX_FAULTS",
    "MAX_FILE_BYTES",
    "MAX_FLEET_GPUS",
    "MAX_GPUS_PER_NODE",
    "MAX_GPU_MEMORY_MIB",
    "MAX_LEVELS",
    "MAX_NAME_LEN",
    "MAX_NODES",
    "MAX_PROFILES",
    "MAX_RATE_FACTOR",
    "MAX_RATE_PER_S",
    "MAX_REPLICAS",
    "MAX_REQUESTS",
    "MAX_SHARDS",
    "MAX_SHARDS_PER_REPLICA",
    "MAX_STEPS",
    "MAX_STRING_LEN",
    "MAX_TOKENS",
    "MAX_YAML_NODES",
    "event_steps",
    "run_steps",
    "steps",
]

MAX_FILE_BYTES = 2 * 1024 * 1024
"""A scenario file's size in bytes (UTF-8): 100,000 node names listed take about 1.2 MB."""
MAX_YAML_NODES = 500_000
"""Values in the document, each alias counted as a copy of what it names (alias bombs). A
100,000-node fleet is about 100,000 values; per-node settings for most of them would not fit in
`MAX_FILE_BYTES`."""
MAX_DEPTH = 32
"""Nesting of mappings and lists; the format itself needs 6."""
MAX_STRING_LEN = 4096
"""Characters in a string that is not a name: description, model path, engine args, reasons."""
MAX_NODES = 100_000
"""Nodes in the fleet."""
MAX_GPUS_PER_NODE = units.MAX_GPUS_PER_NODE
"""A node's `gpus`, and a profile's `gpus_per_node`: the service's bound too."""
MAX_FLEET_GPUS = 1_000_000
"""GPUs in the whole fleet."""
MAX_GPU_MEMORY_MIB = 4 * 1024 * 1024
"""A GPU's memory: 4 TiB."""
MAX_PROFILES = 1_000
MAX_SHARDS_PER_REPLICA = units.MAX_REPLICA_NODES
"""A profile's `nodes`: the service's bound too."""
MAX_ARGS = 256
"""Extra engine flags in one profile."""
MAX_DEPLOYMENTS = 1_000
MAX_REPLICAS = 100_000
"""Replicas of one deployment, and of all together, each deployment counted at the largest
replica count the file ever gives it (its `replicas`, or a `set_replicas` fault)."""
MAX_SHARDS = 1_000_000
"""Shards of all deployments together: replicas times their profile's `nodes`, counted as for
`MAX_REPLICAS`."""
MAX_FAULTS = 10_000
MAX_EXPECTATIONS = 1_000
"""Items of `expect` (each event expectation is judged against the whole trace)."""
MAX_REQUESTS = 1_000_000
"""Requests all `traffic` items send over the run (each costs the twin a few events)."""
MAX_RATE_PER_S = 10_000
"""Requests per second of one `traffic` item."""
MAX_TOKENS = 1_000_000
"""A traffic item's `tokens` per request (and its prompt's and answer's, drawn or in a trace)."""
MAX_LEVELS = 1_000
"""Levels of a traffic item's `diurnal` profile."""
MAX_BURSTS = 100
"""A traffic item's `bursts` (each one is looked at for every change of the rate)."""
MAX_RATE_FACTOR = 1_000
"""A diurnal level or a burst's factor: the rate it multiplies stays finite work."""
MAX_DURATION_MS = 30 * 24 * 3_600_000
"""Any duration: the run, timings, load times, timeouts, outages. Times lie inside the run."""
MAX_COUNT = 1_000_000
"""A count that is not a size of the fleet: timings counts, an expectation's `count`."""
MAX_STEPS = 200_000_000
"""The most periodic work a run may ask for, by `steps`: 2.3 times the benchmarked 10,000 nodes
for 24 hours (86.6 million steps)."""
MAX_EVENT_STEPS = 1_000_000
"""The most placement and fault work a run may ask for, by `event_steps`. Unlike a quiet
heartbeat, each such step is an event in the trace (kept in memory) and may cost a placement:
a million is a hundred fleet-wide faults on the benchmarked 10,000 nodes."""


def steps(
    duration_ms: int,
    nodes: int,
    deployments: int,
    heartbeat_interval_ms: int,
    reconcile_interval_ms: int,
) -> int:
    """A run's work: every node's heartbeats, and every reconcile with its one health probe per
    deployed model. Quiet heartbeats dominate a steady run's cost (docs/performance.md)."""
    beats = duration_ms * nodes // heartbeat_interval_ms
    reconciles = duration_ms * (1 + deployments) // reconcile_interval_ms
    return beats + reconciles


def event_steps(scenario: Scenario) -> int:
    """The work that is not periodic: placing every shard deployed at the start, and each fault
    by what it touches -- a partition its nodes, a fabric outage its fabric's nodes, a controller
    restart every node and replica (all report, all are adopted), `set_replicas` the shards it
    adds or removes, `set_profile` the shards it stops and starts; any other fault counts 1.
    Without this, many faults on a big fleet could ask for a run far longer than its heartbeats
    say."""
    shards_per = {p.name: p.nodes for p in scenario.profiles}
    per_model = {d.model: shards_per[d.profile] for d in scenario.deployments}
    now = {d.model: d.replicas for d in scenario.deployments}
    most = dict(now)
    fabric_size = {f: len(members) for f, members in scenario.fabrics}
    work = sum(now[m] * per_model[m] for m in now)
    for fault in scenario.faults:  # in time order, so set_replicas deltas are the real ones
        action = fault.action
        if isinstance(action, SetReplicas):
            work += abs(action.replicas - now[action.model]) * per_model[action.model] + 1
            now[action.model] = action.replicas
            most[action.model] = max(most[action.model], action.replicas)
        elif isinstance(action, SetProfile):  # every replica replaced: stopped and started
            old, per_model[action.model] = per_model[action.model], shards_per[action.profile]
            work += now[action.model] * (old + per_model[action.model]) + 1
        elif isinstance(action, Partition):
            work += len(action.nodes)
        elif isinstance(action, FabricDown):
            work += fabric_size[action.fabric]
        elif isinstance(action, RestartController):
            work += len(scenario.all_nodes) + sum(most.values())
        else:
            work += 1
    return work


def run_steps(scenario: Scenario) -> int:
    """A run's periodic work, as `MAX_STEPS` bounds it."""
    return steps(
        scenario.duration_ms,
        len(scenario.all_nodes),
        len(scenario.deployments),
        scenario.timings.heartbeat_interval_ms,
        scenario.timings.reconcile_interval_ms,
    )


LIMITS: dict[str, int] = {
    "file size": MAX_FILE_BYTES,
    "values, aliases expanded": MAX_YAML_NODES,
    "nesting depth": MAX_DEPTH,
    "digits of a number": MAX_DIGITS,
    "name length": MAX_NAME_LEN,
    "string length": MAX_STRING_LEN,
    "nodes": MAX_NODES,
    "GPUs per node": MAX_GPUS_PER_NODE,
    "GPUs in the fleet": MAX_FLEET_GPUS,
    "GPU memory (MiB)": MAX_GPU_MEMORY_MIB,
    "profiles": MAX_PROFILES,
    "shards per replica": MAX_SHARDS_PER_REPLICA,
    "engine args per profile": MAX_ARGS,
    "deployments": MAX_DEPLOYMENTS,
    "replicas": MAX_REPLICAS,
    "shards": MAX_SHARDS,
    "faults": MAX_FAULTS,
    "expectations": MAX_EXPECTATIONS,
    "requests": MAX_REQUESTS,
    "request rate (per s)": MAX_RATE_PER_S,
    "tokens per request": MAX_TOKENS,
    "diurnal levels": MAX_LEVELS,
    "bursts per item": MAX_BURSTS,
    "rate factor": MAX_RATE_FACTOR,
    "duration (ms)": MAX_DURATION_MS,
    "counts": MAX_COUNT,
    "steps": MAX_STEPS,
    "event steps": MAX_EVENT_STEPS,
}
"""Every bound by the name the docs table gives it in its first column."""
