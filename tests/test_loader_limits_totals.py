"""The loader's bounds on totals: the fleet's GPUs, all deployments' replicas and shards, and the
run's periodic and event work. Each refusal is one `file:line:column` error, and a file at a
bound loads.

The per-node and per-replica bounds (`MAX_GPUS_PER_NODE`, `MAX_SHARDS_PER_REPLICA`) are far below
the totals, so a case on the fleet's GPUs, the shards or the event steps is built from as many of
the biggest nodes or widest replicas as it takes, its numbers derived from `scenario/limits.py`, and
stays within every other bound (the file size among them) so that the error is the one the case
is about. The two fleets of plain nodes (2,000 for 30 days, 25,000 with restarts) are literal.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from llmgw_twin.twin.scenario import limits as lim
from llmgw_twin.twin.scenario.loader import load_scenario_text
from test_loader_limits import BASE, Needle, check_cli, check_refused, fleet_of, many
from test_loader_limits import with_deployments as deployments

GANG = lim.MAX_SHARDS_PER_REPLICA
"""The widest replica a profile may ask for: a "big gang"."""
BIG_NODE = lim.MAX_GPUS_PER_NODE
"""The most GPUs a node may have."""
HOURS = lim.MAX_DURATION_MS // 3_600_000

FULL_FLEET = lim.MAX_FLEET_GPUS // BIG_NODE
"""Nodes of `BIG_NODE` GPUs that the fleet bound holds: one more is too many."""
GANGS_OVER = lim.MAX_SHARDS // GANG + 1
"""Replicas of `GANG` shards that are more shards than the bound."""
HALF = lim.MAX_REPLICAS // 2
REST = lim.MAX_REPLICAS - HALF
"""Two deployments of `HALF` and `REST` replicas are at the replica bound."""
TOGGLES = 10
TOGGLED = lim.MAX_EVENT_STEPS // ((TOGGLES + 1) * GANG) + 1
"""Replicas of `GANG` shards that, placed and then removed or re-added `TOGGLES` times, are more
event steps than the bound."""


def big_nodes(count: int) -> str:
    return fleet_of(count).replace(
        "cluster:", f"cluster:\n  nodes: {{default: {{gpus: {BIG_NODE}}}}}"
    )


def toggling(replicas: int) -> str:
    return "faults:\n" + "".join(
        f"  - {{at: 1s, set_replicas: {{model: m0, replicas: {replicas * (i % 2)}}}}}\n"
        for i in range(TOGGLES)
    )


# (case id, file text, where the error points, a part of the message)
TOTALS: list[tuple[str, str, Needle, str]] = [
    (
        f"more than {lim.MAX_FLEET_GPUS:,} GPUs",
        big_nodes(FULL_FLEET + 1000),
        f"gpus: ^{BIG_NODE}",
        f"more than {lim.MAX_FLEET_GPUS:,} GPUs (at node 'n{FULL_FLEET}', {FULL_FLEET + 1:,} of "
        f"{FULL_FLEET + 1000:,} nodes)",
    ),
    (
        "replicas in total",
        deployments(HALF + 1, HALF + 1),
        (f"{HALF + 1}", 1),
        f"make {2 * HALF + 2:,} replicas of {2 * HALF + 2:,} shards",
    ),
    (
        "shards in total",
        deployments(GANGS_OVER, nodes=GANG),
        f"replicas: ^{GANGS_OVER}",
        f"{GANGS_OVER:,} replicas of 'm0' make {GANGS_OVER:,} replicas of "
        f"{GANGS_OVER * GANG:,} shards",
    ),
    (
        "set_replicas in total",
        deployments(HALF, REST)
        + f"faults:\n  - {{at: 10s, set_replicas: {{model: m1, replicas: {REST + 1}}}}}\n",
        f"replicas: ^{REST + 1}}}",
        f"faults[0].set_replicas.replicas: {REST + 1:,} replicas of 'm1' make "
        f"{lim.MAX_REPLICAS + 1:,} replicas",
    ),
    (
        "steps: a long run of fast heartbeats",
        BASE.replace("1m", f"{HOURS}h")
        + "timings: {heartbeat_interval: 1ms, node_lost_after: 1s, reconcile_interval: 1ms}\n",
        f"{HOURS}h",
        # one heartbeat and one reconcile every millisecond
        f"the run would take {2 * lim.MAX_DURATION_MS:,} steps, more than the "
        f"{lim.MAX_STEPS:,} allowed",
    ),
    (
        "steps: a big fleet for 30 days",
        fleet_of(2000).replace("1m", "720h"),
        "720h",
        "the run would take 520,992,000 steps",
    ),
    (
        "event steps: set_replicas toggling big gangs",
        deployments(TOGGLED, nodes=GANG) + toggling(TOGGLED),
        "- {at: 1s",
        # every shard placed, then each toggle removes or re-adds them all (and counts 1)
        f"deployments and faults would take {(TOGGLES + 1) * TOGGLED * GANG + TOGGLES:,} steps "
        f"(every shard placed and what each fault touches), more than the "
        f"{lim.MAX_EVENT_STEPS:,} allowed",
    ),
    (
        "event steps: controller restarts on a big fleet",
        fleet_of(25_000) + many("faults", "{{at: 1s, restart_controller: {{down_for: 1s}}}}", 41),
        "- {at: 1s",
        "would take 1,025,000 steps",
    ),
]


def test_each_total_is_reachable_within_the_other_bounds() -> None:
    # what the cases above rely on: were one of these false, that total could not be reached
    # without first hitting another bound, and its case would have to change
    assert FULL_FLEET + 1 <= lim.MAX_NODES  # 15,626 of 100,000 nodes
    assert GANGS_OVER <= lim.MAX_REPLICAS  # 15,626 of 100,000 replicas
    assert TOGGLED <= lim.MAX_REPLICAS and TOGGLED * GANG <= lim.MAX_SHARDS


@pytest.mark.parametrize(
    ("text", "needle", "part"), [c[1:] for c in TOTALS], ids=[c[0] for c in TOTALS]
)
def test_each_total_is_one_error_at_its_value(text: str, needle: Needle, part: str) -> None:
    assert len(text.encode("utf-8")) <= lim.MAX_FILE_BYTES
    check_refused(text, needle, part)


CLI_CASES = [
    c for c in TOTALS if c[0] in {"steps: a long run of fast heartbeats", "shards in total"}
]


@pytest.mark.parametrize(
    ("text", "needle", "part"), [c[1:] for c in CLI_CASES], ids=[c[0] for c in CLI_CASES]
)
def test_the_cli_exits_2_naming_file_line_and_column(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, needle: Needle, part: str
) -> None:
    check_cli(tmp_path, capsys, text, needle, part)


# --- totals at their bound are accepted -------------------------------------------------------


def test_the_largest_fleet_loads() -> None:
    s = load_scenario_text(fleet_of(lim.MAX_NODES), "big.yaml")
    assert len(s.nodes) == lim.MAX_NODES


def test_the_most_gpus_load() -> None:
    s = load_scenario_text(big_nodes(FULL_FLEET), "big.yaml")
    assert len(s.nodes) == FULL_FLEET
    assert lim.MAX_FLEET_GPUS - BIG_NODE < sum(n.gpus for n in s.nodes) <= lim.MAX_FLEET_GPUS


def test_the_most_shards_load() -> None:
    # placing each shard deployed at the start is an event step, and MAX_SHARDS is
    # MAX_EVENT_STEPS: a file at the shard bound can be at the event-step bound too, and then has
    # no step left for a single fault
    s = load_scenario_text(deployments(GANGS_OVER - 1, nodes=GANG), "s.yaml")
    shards = s.deployments[0].replicas * s.profiles[0].nodes
    assert lim.MAX_SHARDS - GANG < shards <= lim.MAX_SHARDS
    assert lim.event_steps(s) == shards <= lim.MAX_EVENT_STEPS


def test_the_benchmarked_run_is_within_the_step_bound() -> None:
    # 10,000 nodes for 24 hours at the default timings, one deployment (docs/performance.md)
    work = lim.steps(86_400_000, 10_000, 1, 10_000, 1_000)
    assert work == 86_572_800
    assert work * 2 < lim.MAX_STEPS
