"""The loader's bounds on single values: every number, string and list is bounded, each refusal
is one `file:line:column` error with exit status 2, and a file with every value at its bound
loads. The totals (fleet GPUs, replicas, shards, the run's work) are in
test_loader_limits_totals.py, reading odd bytes and several files in test_loader_limits_files.py;
both use the helpers here.

Cases built on a bound's value (GPUs per node, shards per replica, the values at their bounds)
take it from `scenario/limits.py`, so that the bound can change without the case changing.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from llmgw_twin import cli
from llmgw_twin.twin.scenario import limits as lim
from llmgw_twin.twin.scenario.loader import ScenarioError, load_scenario, load_scenario_text

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = sorted([*ROOT.glob("scenarios/*.yaml"), *ROOT.glob("scenarios/regressions/*.yaml")])
NODE_LOSS = ROOT / "scenarios" / "node-loss.yaml"

BASE = """\
name: x
duration: 1m
cluster:
  fabrics: {f: [a]}
"""
PROFILE = """\
profiles:
  p: {engine: sim, gpus_per_node: 1, model: /m}
"""


def with_deployments(*replicas: int, nodes: int = 1) -> str:
    lines = [
        "name: x",
        "duration: 1m",
        "cluster:",
        "  fabrics: {f: [a]}",
        "profiles:",
        f"  p: {{engine: sim, nodes: {nodes}, gpus_per_node: 1, model: /m}}",
        "deployments:",
    ]
    lines += [f"  - {{model: m{i}, profile: p, replicas: {r}}}" for i, r in enumerate(replicas)]
    return "\n".join(lines) + "\n"


def many(key: str, item: str, count: int) -> str:
    return f"{key}:\n" + "".join(f"  - {item.format(i=i)}\n" for i in range(count))


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def fleet_of(count: int) -> str:
    return (
        "name: x\nduration: 1m\ncluster:\n  fabrics:\n    f: ["
        + ", ".join(f"n{i}" for i in range(count))
        + "]\n"
    )


Needle = str | tuple[str, int] | None
"""Where an error must point: the start of the first (or n-th) occurrence of the text in the file,
at its `^` if it has one; None for 1:1."""


def position(text: str, needle: Needle) -> tuple[int, int]:
    if needle is None:
        return 1, 1
    word, nth = (needle, 0) if isinstance(needle, str) else needle
    at = -1
    for _ in range(nth + 1):
        at = text.index(word.replace("^", ""), at + 1)
    at += max(word.find("^"), 0)
    return text.count("\n", 0, at) + 1, at - (text.rfind("\n", 0, at) + 1) + 1


def alias_bomb(levels: int) -> str:
    out = BASE + "x0: &a0 [" + ", ".join(["x"] * 10) + "]\n"
    for i in range(1, levels):
        out += f"x{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]\n"
    return out


def profile_with(extra: str) -> str:
    return PROFILE.replace("model: /m", "model: /m, " + extra) + BASE


def node_setting(setting: str) -> str:
    return BASE.replace("{f: [a]}", "{f: [a]}\n  nodes: {a: {" + setting + "}}")


SHARDS_OVER = lim.MAX_SHARDS_PER_REPLICA + 1
"""A profile's `nodes` one over its bound (so also a `rank` one over the highest rank)."""
GPUS_OVER = lim.MAX_GPUS_PER_NODE + 1

# (case id, file text, where the error points, a part of the message); the totals of the fleet,
# of replicas and shards, and the run's work are in test_loader_limits_totals.py
REFUSED: list[tuple[str, str, Needle, str]] = [
    ("seed of 5,000 digits", BASE + "seed: " + "1" * 5000 + "\n", "1111", "5,000 digits"),
    ("seed of 19 digits", BASE + "seed: " + "9" * 19 + "\n", "9999", "at most 18 digits"),
    (
        "count of 4,400 digits",
        BASE + "timings: {quarantine_after: " + "7" * 4400 + "}\n",
        "7777",
        "4,400 digits",
    ),
    (
        "replicas 1e9",
        with_deployments(1_000_000_000),
        "1000000000",
        "must be at most 100,000, got 1,000,000,000",
    ),
    (
        "gpus 1e11",
        node_setting("gpus: 100000000000"),
        "1000",
        f"gpus must be at most {lim.MAX_GPUS_PER_NODE:,}, got 100,000,000,000",
    ),
    ("duration 100000000h", BASE.replace("1m", "100000000h"), "1000", "longer than 720h"),
    ("duration of 19 digits", BASE.replace("1m", "9" * 19 + "ms"), "9999", "at most 18"),
    ("duration 721h", BASE.replace("1m", "721h"), "721h", "longer than 720h (30 days"),
    (
        "timing of 31 days",
        BASE + "timings: {forget_lost_after: 744h}\n",
        "744h",
        "timings.forget_lost_after: '744h' is longer than 720h",
    ),
    (
        "load_time 1000h",
        profile_with("load_time: 1000h"),
        "1000h",
        "load_time: '1000h' is longer",
    ),
    (
        "fault far past the end",
        BASE + "faults:\n  - {at: 1000000h, kill_node: a}\n",
        "1000000h",
        "outside the run",
    ),
    ("gpu memory 5TiB", node_setting("gpu_memory: 5TiB"), "5TiB", "more than 4,194,304MiB"),
    (
        "gpu memory of many digits",
        node_setting("gpu_memory: 1" + "0" * 30 + "MiB"),
        "1000",
        "31 digits (at most 18)",
    ),
    (
        "share of many digits",
        BASE + "timings: {mass_loss_share: 0." + "1" * 100 + "}\n",
        "0.11",
        "101 digits (at most 18)",
    ),
    (
        "name of 200 characters",
        BASE.replace("name: x", "name: " + "x" * 200),
        "xx",
        "name is too long: 200 characters (names have at most 128)",
    ),
    (
        "node name of 129 characters",
        BASE.replace("[a]", "[" + "a" * 129 + "]"),
        "aa",
        "too long: 129 characters (names have at most 128)",
    ),
    (
        "a 1 MB name",
        BASE.replace("name: x", "name: " + "x" * 1_000_000),
        "xx",
        "1,000,000 characters (names have at most 128)",
    ),
    (
        "a 5 MB name",
        BASE.replace("name: x", "name: " + "x" * 5_000_000),
        None,
        f"larger than {lim.MAX_FILE_BYTES:,} bytes",
    ),
    (
        "description of 5,000 characters",
        BASE + "description: " + "d" * 5000 + "\n",
        "dd",
        "description is too long: 5,000 characters (strings have at most 4,096)",
    ),
    (
        "reference of 129 characters",
        BASE + "faults:\n  - {at: 1s, kill_node: " + "a" * 129 + "}\n",
        "aa",
        "(names have at most 128)",
    ),
    (
        "time expression of 300 characters",
        BASE + "faults:\n  - {at: 1s" + "+1s" * 100 + ", kill_node: a}\n",
        "1s+1s",
        "(times have at most 192)",
    ),
    ("more than 100,000 nodes", fleet_of(100_001), "n100000]", "more than 100,000 nodes"),
    (
        f"profile of {SHARDS_OVER:,} shards",
        PROFILE.replace("gpus_per_node: 1", f"nodes: {SHARDS_OVER}, gpus_per_node: 1") + BASE,
        f"nodes: ^{SHARDS_OVER}",
        f"profiles.p.nodes must be at most {lim.MAX_SHARDS_PER_REPLICA:,}",
    ),
    (
        f"profile of {GPUS_OVER:,} GPUs per node",
        PROFILE.replace("gpus_per_node: 1", f"gpus_per_node: {GPUS_OVER}") + BASE,
        f"gpus_per_node: ^{GPUS_OVER}",
        f"gpus_per_node must be at most {lim.MAX_GPUS_PER_NODE:,}",
    ),
    (
        "300 engine args",
        profile_with("args: [" + ", ".join(["-v"] * 300) + "]"),
        ("-v", 256),
        "args has 300 items, more than the 256 allowed",
    ),
    (
        "expectation count",
        BASE + "expect:\n  - {event: node.lost, within: [start, end], count: 2000000}\n",
        "2000000",
        "count must be at most 1,000,000",
    ),
    (
        "rank filter",
        BASE
        + f"expect:\n  - {{event: shard.started, within: [start, end], rank: {SHARDS_OVER - 1}}}\n",
        f"rank: ^{SHARDS_OVER - 1}",
        f"rank must be at most {lim.MAX_SHARDS_PER_REPLICA - 1:,}",
    ),
    (
        "ready_replicas count",
        with_deployments(1) + "expect:\n  - {at: end, ready_replicas: {m0: 100001}}\n",
        "100001",
        "must be at most 100,000",
    ),
    (
        "timings count",
        BASE + "timings: {defrag_max_moves: 1000001}\n",
        "1000001",
        "timings.defrag_max_moves must be at most 1,000,000",
    ),
    (
        "10,001 faults",
        BASE + many("faults", "{{at: 1s, kill_node: a}}", 10_001),
        ("{at: 1s", 10_000),
        "faults has 10,001 items, more than the 10,000 allowed",
    ),
    (
        "1,001 expectations",
        BASE + many("expect", "{{at: end, idle_nodes: [a]}}", 1001),
        ("{at: end", 1000),
        "expect has 1,001 items, more than the 1,000 allowed",
    ),
    (
        "1,001 deployments",
        PROFILE + BASE + many("deployments", "{{model: m{i}, profile: p, replicas: 0}}", 1001),
        "{model: m1000,",
        "deployments has 1,001 items, more than the 1,000 allowed",
    ),
    (
        "1,001 profiles",
        BASE
        + "profiles:\n"
        + "".join(f"  p{i}: {{engine: sim, gpus_per_node: 1, model: /m}}\n" for i in range(1001)),
        "p1000:",
        "1,001 profiles, more than the 1,000 allowed",
    ),
    (
        "heartbeat not shorter than node_suspect_after",
        BASE + "timings: {heartbeat_interval: 30s}\n",
        "30s",
        "heartbeat_interval (30.000s) must be shorter than node_suspect_after (30.000s",
    ),
    ("alias bomb", alias_bomb(7), "&a5", "more than 500,000 values (an alias counts as a copy"),
    ("recursive alias", BASE + "faults: &loop [*loop]\n", "&loop", "recursive aliases are refused"),
    (
        "recursive alias in a mapping",
        BASE + "expect: &e [{at: end, idle_nodes: *e}]\n",
        "&e",
        "recursive aliases are refused",
    ),
    ("nesting 33 deep", BASE + "description: " + nested(33) + "\n", ("[", 32), "nested too deeply"),
    (
        "nesting 5,000 deep",
        BASE + "description: " + nested(5000) + "\n",
        ("[", 32),
        "nested too deeply",
    ),
]


def check_refused(text: str, needle: Needle, part: str) -> None:
    """Loading `text` fails with one error at `needle` whose message holds `part`."""
    with pytest.raises(ScenarioError) as info:
        load_scenario_text(text, "s.yaml")
    err = info.value
    line, column = position(text, needle)
    assert part in err.message
    assert (err.line, err.column) == (line, column), err.message
    assert str(err).startswith(f"s.yaml:{line}:{column}: ")
    assert len(err.message) < 600  # never echoes the offending value whole


def check_cli(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, needle: Needle, part: str
) -> None:
    """`run` on `text`, then a good file: exit status 2, one error line, the good file ran."""
    line, column = position(text, needle)
    path = tmp_path / "bad.yaml"
    path.write_text(text, encoding="utf-8")
    assert cli.main(["run", "-q", str(path), str(NODE_LOSS)]) == 2
    out, err = capsys.readouterr()
    assert err.startswith(f"error: {path}:{line}:{column}: ")
    assert part in err and "Traceback" not in err
    assert err.count("\n") == 1
    assert out.startswith("PASS node-loss")  # the file after it still ran


@pytest.mark.parametrize(
    ("text", "needle", "part"), [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED]
)
def test_each_bound_is_one_error_at_its_value(text: str, needle: Needle, part: str) -> None:
    check_refused(text, needle, part)


CLI_CASES = [
    c
    for c in REFUSED
    if c[0]
    in {
        "seed of 5,000 digits",
        "replicas 1e9",
        "gpus 1e11",
        "duration 100000000h",
        "a 5 MB name",
        "a 1 MB name",
        "heartbeat not shorter than node_suspect_after",
        "alias bomb",
    }
]


@pytest.mark.parametrize(
    ("text", "needle", "part"), [c[1:] for c in CLI_CASES], ids=[c[0] for c in CLI_CASES]
)
def test_the_cli_exits_2_naming_file_line_and_column(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, needle: Needle, part: str
) -> None:
    check_cli(tmp_path, capsys, text, needle, part)


# --- values at their bound are accepted -------------------------------------------------------


def test_values_at_their_bounds_load() -> None:
    hours = lim.MAX_DURATION_MS // 3_600_000
    gang, gpus = lim.MAX_SHARDS_PER_REPLICA, lim.MAX_GPUS_PER_NODE
    # as many replicas of the widest gang as the shard bound allows, less what leaves the one
    # fault below room in the event-step bound (placing each shard is an event step);
    # test_loader_limits_totals.py loads the shard bound itself
    replicas = min(lim.MAX_SHARDS, lim.MAX_EVENT_STEPS - 1) // gang
    text = (
        f"name: {'n' * lim.MAX_NAME_LEN}\n"
        f"description: {'d' * lim.MAX_STRING_LEN}\n"
        f"seed: {'9' * lim.MAX_DIGITS}\n"
        f"duration: {hours}h\n"
        f"timings: {{forget_lost_after: {hours}h, quarantine_after: {lim.MAX_COUNT}}}\n"
        "cluster:\n"
        "  fabrics: {f: [a]}\n"
        f"  nodes: {{default: {{gpus: {gpus}, gpu_memory: {lim.MAX_GPU_MEMORY_MIB}MiB}}}}\n"
        "profiles:\n"
        f"  p: {{engine: sim, nodes: {gang}, gpus_per_node: {gpus}, model: /m, "
        f"load_time: {hours}h}}\n"
        "deployments:\n"
        f"  - {{model: m, profile: p, replicas: {replicas}}}\n"
        "faults:\n"
        f"  - {{id: k, at: end, set_replicas: {{model: m, replicas: {replicas}}}}}\n"
        "expect:\n"
        f"  - {{event: shard.started, within: [start, end+{hours}h], rank: {gang - 1}, "
        f"count: {lim.MAX_COUNT}}}\n"
    )
    s = load_scenario_text(text, "s.yaml")
    assert (len(s.name), len(s.description)) == (lim.MAX_NAME_LEN, lim.MAX_STRING_LEN)
    assert s.seed == 10**lim.MAX_DIGITS - 1
    assert s.duration_ms == lim.MAX_DURATION_MS
    assert (s.nodes[0].gpus, s.nodes[0].gpu_memory_mib) == (gpus, lim.MAX_GPU_MEMORY_MIB)
    assert (s.profiles[0].nodes, s.profiles[0].gpus_per_node) == (gang, gpus)
    assert lim.event_steps(s) == replicas * gang + 1 <= lim.MAX_EVENT_STEPS


def test_a_file_larger_than_the_bound_is_not_read_whole(tmp_path: Path) -> None:
    path = tmp_path / "huge.yaml"
    path.write_bytes(b"name: x\n" + b"#" * (lim.MAX_FILE_BYTES * 2) + b"\n")
    with pytest.raises(ScenarioError) as info:
        load_scenario(path)
    assert (info.value.line, info.value.column) == (1, 1)
    assert f"larger than {lim.MAX_FILE_BYTES:,} bytes" in info.value.message


def test_the_size_bound_counts_utf8_bytes_not_characters() -> None:
    text = BASE + "#" + "é" * (lim.MAX_FILE_BYTES // 2) + "\n"  # fewer characters than bytes
    with pytest.raises(ScenarioError, match="larger than"):
        load_scenario_text(text)


# --- the docs table --------------------------------------------------------------------------


def test_the_limits_table_in_the_docs_matches_the_code() -> None:
    doc = (ROOT / "docs" / "scenarios.md").read_text(encoding="utf-8")
    section = doc[doc.index("## Limits") : doc.index("## Errors")]
    rows = {
        m.group(1): int(m.group(2).replace(",", ""))
        for m in re.finditer(r"^\| ([^|`]+?) \| ([0-9,]+)[^|]*\|", section, re.M)
    }
    assert rows == lim.LIMITS


def test_parsing_stops_at_the_first_value_too_many(monkeypatch: pytest.MonkeyPatch) -> None:
    from llmgw_twin.twin.scenario import yamlnodes

    monkeypatch.setattr(yamlnodes, "MAX_YAML_NODES", 1000)
    text = "x: [\n" + "a,\n" * 5000 + "]\n"  # the mapping, its key, the list, then one a a line
    with pytest.raises(ScenarioError) as info:
        load_scenario_text(text, "s.yaml")
    assert (info.value.line, info.value.column) == (999, 1)
    assert "more than 1,000 values" in info.value.message
