"""The loader's bounds: every number, string, list and the run's work is bounded, each refusal is
one `file:line:column` error with exit status 2; a BOM or CR/CRLF line ends change nothing; one
bad file does not stop a multi-file run."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from llmgw_twin import cli
from llmgw_twin.twin import loader_limits as lim
from llmgw_twin.twin.loader import ScenarioError, load_scenario, load_scenario_text
from llmgw_twin.twin.runner import run_scenario
from llmgw_twin.twin.scenario import Scenario

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


# (case id, file text, where the error points, a part of the message)
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
    ("gpus 1e11", node_setting("gpus: 100000000000"), "1000", "gpus must be at most 1,024"),
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
        "larger than 2,097,152 bytes",
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
        "more than 1,000,000 GPUs",
        fleet_of(1000).replace("cluster:", "cluster:\n  nodes: {default: {gpus: 1024}}"),
        "1024",
        "more than 1,000,000 GPUs (at node 'n976', 977 of 1,000 nodes)",
    ),
    (
        "profile of 2,000 shards",
        PROFILE.replace("gpus_per_node: 1", "nodes: 2000, gpus_per_node: 1") + BASE,
        "2000",
        "profiles.p.nodes must be at most 1,024",
    ),
    (
        "profile of 2,000 GPUs per node",
        PROFILE.replace("gpus_per_node: 1", "gpus_per_node: 2000") + BASE,
        "2000",
        "gpus_per_node must be at most 1,024",
    ),
    (
        "300 engine args",
        profile_with("args: [" + ", ".join(["-v"] * 300) + "]"),
        ("-v", 256),
        "args has 300 items, more than the 256 allowed",
    ),
    (
        "replicas in total",
        with_deployments(60_000, 60_000),
        ("60000", 1),
        "make 120,000 replicas of 120,000 shards",
    ),
    (
        "shards in total",
        with_deployments(1000, nodes=1024),
        "replicas: ^1000",
        "1,000 replicas of 'm0' make 1,000 replicas of 1,024,000 shards",
    ),
    (
        "set_replicas in total",
        with_deployments(50_000, 50_000)
        + "faults:\n  - {at: 10s, set_replicas: {model: m1, replicas: 50001}}\n",
        "50001",
        "faults[0].set_replicas.replicas: 50,001 replicas of 'm1' make 100,001 replicas",
    ),
    (
        "expectation count",
        BASE + "expect:\n  - {event: node.lost, within: [start, end], count: 2000000}\n",
        "2000000",
        "count must be at most 1,000,000",
    ),
    (
        "rank filter",
        BASE + "expect:\n  - {event: shard.started, within: [start, end], rank: 1024}\n",
        "1024",
        "rank must be at most 1,023",
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
        "heartbeat not shorter than node_lost_after",
        BASE + "timings: {heartbeat_interval: 60s}\n",
        "60s",
        "heartbeat_interval must be shorter than node_lost_after",
    ),
    (
        "steps: a long run of fast heartbeats",
        BASE.replace("1m", "720h")
        + "timings: {heartbeat_interval: 1ms, node_lost_after: 1s, reconcile_interval: 1ms}\n",
        "720h",
        "the run would take 5,184,000,000 steps, more than the 200,000,000 allowed",
    ),
    (
        "steps: a big fleet for 30 days",
        fleet_of(2000).replace("1m", "720h"),
        "720h",
        "the run would take 520,992,000 steps",
    ),
    (
        "event steps: set_replicas toggling big gangs",
        with_deployments(97, nodes=1024)
        + "faults:\n"
        + "".join(
            f"  - {{at: 1s, set_replicas: {{model: m0, replicas: {97 * (i % 2)}}}}}\n"
            for i in range(10)
        ),
        "- {at: 1s",
        "deployments and faults would take 1,092,618 steps (every shard placed and what each "
        "fault touches), more than the 1,000,000 allowed",
    ),
    (
        "event steps: controller restarts on a big fleet",
        fleet_of(25_000) + many("faults", "{{at: 1s, restart_controller: {{down_for: 1s}}}}", 41),
        "- {at: 1s",
        "would take 1,025,000 steps",
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


@pytest.mark.parametrize(
    ("text", "needle", "part"), [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED]
)
def test_each_bound_is_one_error_at_its_value(text: str, needle: Needle, part: str) -> None:
    with pytest.raises(ScenarioError) as info:
        load_scenario_text(text, "s.yaml")
    err = info.value
    line, column = position(text, needle)
    assert part in err.message
    assert (err.line, err.column) == (line, column), err.message
    assert str(err).startswith(f"s.yaml:{line}:{column}: ")
    assert len(err.message) < 600  # never echoes the offending value whole


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
        "heartbeat not shorter than node_lost_after",
        "alias bomb",
        "steps: a long run of fast heartbeats",
    }
]


@pytest.mark.parametrize(
    ("text", "needle", "part"), [c[1:] for c in CLI_CASES], ids=[c[0] for c in CLI_CASES]
)
def test_the_cli_exits_2_naming_file_line_and_column(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, needle: Needle, part: str
) -> None:
    line, column = position(text, needle)
    path = tmp_path / "bad.yaml"
    path.write_text(text, encoding="utf-8")
    assert cli.main(["run", "-q", str(path), str(NODE_LOSS)]) == 2
    out, err = capsys.readouterr()
    assert err.startswith(f"error: {path}:{line}:{column}: ")
    assert part in err and "Traceback" not in err
    assert err.count("\n") == 1
    assert out.startswith("PASS node-loss")  # the file after it still ran


# --- values at their bound are accepted -------------------------------------------------------


def test_values_at_their_bounds_load() -> None:
    text = (
        "name: " + "n" * 128 + "\n"
        "description: " + "d" * 4096 + "\n"
        "seed: " + "9" * 18 + "\n"
        "duration: 720h\n"
        "timings: {forget_lost_after: 720h, quarantine_after: 1000000}\n"
        "cluster:\n"
        "  fabrics: {f: [a]}\n"
        "  nodes: {default: {gpus: 1024, gpu_memory: 4TiB}}\n"
        "profiles:\n"
        "  p: {engine: sim, nodes: 1024, gpus_per_node: 1024, model: /m, load_time: 720h}\n"
        "deployments:\n"
        "  - {model: m, profile: p, replicas: 976}\n"
        "faults:\n"
        "  - {id: k, at: end, set_replicas: {model: m, replicas: 976}}\n"
        "expect:\n"
        "  - {event: shard.started, within: [start, end+720h], rank: 1023, count: 1000000}\n"
    )
    s = load_scenario_text(text, "s.yaml")
    assert (len(s.name), len(s.description), s.seed) == (128, 4096, 10**18 - 1)
    assert s.duration_ms == lim.MAX_DURATION_MS
    assert (s.nodes[0].gpus, s.nodes[0].gpu_memory_mib) == (1024, lim.MAX_GPU_MEMORY_MIB)
    assert s.deployments[0].replicas * s.profiles[0].nodes == 999_424


def test_the_largest_fleet_loads() -> None:
    s = load_scenario_text(fleet_of(lim.MAX_NODES), "big.yaml")
    assert len(s.nodes) == lim.MAX_NODES


def test_the_benchmarked_run_is_within_the_step_bound() -> None:
    # 10,000 nodes for 24 hours at the default timings, one deployment (docs/performance.md)
    work = lim.steps(86_400_000, 10_000, 1, 10_000, 1_000)
    assert work == 86_572_800
    assert work * 2 < lim.MAX_STEPS


def test_a_file_larger_than_the_bound_is_not_read_whole(tmp_path: Path) -> None:
    path = tmp_path / "huge.yaml"
    path.write_bytes(b"name: x\n" + b"#" * (lim.MAX_FILE_BYTES * 2) + b"\n")
    with pytest.raises(ScenarioError) as info:
        load_scenario(path)
    assert (info.value.line, info.value.column) == (1, 1)
    assert "larger than 2,097,152 bytes" in info.value.message


def test_the_size_bound_counts_utf8_bytes_not_characters() -> None:
    text = BASE + "#" + "é" * (lim.MAX_FILE_BYTES // 2) + "\n"  # fewer characters than bytes
    with pytest.raises(ScenarioError, match="larger than"):
        load_scenario_text(text)


# --- BOM, CRLF and CR ------------------------------------------------------------------------

VARIANTS = {
    "bom": lambda t: "\ufeff" + t,
    "crlf": lambda t: t.replace("\n", "\r\n"),
    "cr": lambda t: t.replace("\n", "\r"),
    "bom+crlf": lambda t: "\ufeff" + t.replace("\n", "\r\n"),
}


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_bom_and_line_ends_load_the_same_scenario(path: Path, variant: str) -> None:
    plain = path.read_text(encoding="utf-8")
    assert load_scenario_text(VARIANTS[variant](plain), str(path)) == load_scenario(path)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_bom_and_line_ends_run_to_the_same_trace(tmp_path: Path, variant: str) -> None:
    plain = NODE_LOSS.read_text(encoding="utf-8")
    odd = tmp_path / "odd.yaml"
    odd.write_bytes(VARIANTS[variant](plain).encode("utf-8"))
    a, b = run_scenario(load_scenario(NODE_LOSS)), run_scenario(load_scenario(odd))
    assert a.trace_sha256 == b.trace_sha256
    assert a.passed and b.passed


BROKEN = {
    "unknown key": (NODE_LOSS.read_text(encoding="utf-8").replace("replicas: 2", "replica: 2")),
    "bad yaml": BASE + "expect: [\n  {at: end\n",
    "control character": BASE + "description: a\x07b\n",
    "bad duration": BASE + "faults:\n  - at: 5 minutes\n    kill_node: a\n",
    "multi-line string": BASE + "description: |\n  one\n  two\nseed: x\n",
}


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("case", list(BROKEN))
def test_bom_and_line_ends_fail_at_the_same_line_and_column(case: str, variant: str) -> None:
    def error(text: str) -> tuple[int, int, str]:
        with pytest.raises(ScenarioError) as info:
            load_scenario_text(text, "s.yaml")
        return info.value.line, info.value.column, info.value.message

    assert error(VARIANTS[variant](BROKEN[case])) == error(BROKEN[case])


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_a_bad_byte_is_placed_the_same_with_bom_and_line_ends(tmp_path: Path, variant: str) -> None:
    def where(data: bytes) -> tuple[int, int]:
        path = tmp_path / "f.yaml"
        path.write_bytes(data)
        with pytest.raises(ScenarioError) as info:
            load_scenario(path)
        assert "not UTF-8" in info.value.message
        return info.value.line, info.value.column

    plain = (BASE + "description: café ").encode("utf-8") + b"\xff\n"
    odd = VARIANTS[variant](BASE + "description: café ").encode("utf-8") + b"\xff\n"
    assert where(plain) == where(odd) == (5, 19)


def test_a_file_written_to_the_contract_page_still_loads() -> None:
    contract = ROOT.parent / "shared" / "SCENARIOS.md"
    if not contract.exists():
        pytest.skip("the contract page is not beside this checkout")
    example = contract.read_text(encoding="utf-8").split("```yaml\n", 1)[1].split("```", 1)[0]
    s = load_scenario_text(example, "contract.yaml")
    assert isinstance(s, Scenario) and s.name == "node-loss"
    assert run_scenario(s).passed


# --- several files: one bad file stops nothing -----------------------------------------------


def test_a_bad_file_between_good_ones_stops_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(BASE + "seed: " + "1" * 5000 + "\n")
    missing = tmp_path / "missing.yaml"
    args = ["run", "-q", str(NODE_LOSS), str(bad), str(missing), str(NODE_LOSS)]
    assert cli.main(args) == 2
    out, err = capsys.readouterr()
    assert out.count("PASS node-loss") == 2
    assert err.splitlines() == [
        f"error: {bad}:5:7: seed: a number of 5,000 digits is too long (at most 18 digits)",
        f"error: {missing}:1:1: cannot read file: No such file or directory",
    ]


def test_an_unexpected_exception_is_one_line_for_that_file_only(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from llmgw_twin.twin import loader, runner

    real_load, real_run = loader.load_scenario, runner.run_scenario
    poisoned = tmp_path / "poisoned.yaml"
    poisoned.write_text(NODE_LOSS.read_text())
    crashing = tmp_path / "crashing.yaml"
    crashing.write_text(NODE_LOSS.read_text().replace("name: node-loss", "name: crashing"))

    def load(path: str | Path) -> Scenario:
        if Path(path) == poisoned:
            raise MemoryError("planted")
        return real_load(path)

    def run(scenario: Scenario, seed: int | None = None) -> runner.RunResult:
        if scenario.name == "crashing":
            raise KeyError("planted too")
        return real_run(scenario, seed)

    monkeypatch.setattr(loader, "load_scenario", load)
    monkeypatch.setattr(runner, "run_scenario", run)
    assert cli.main(["run", "-q", str(poisoned), str(crashing), str(NODE_LOSS)]) == 2
    out, err = capsys.readouterr()
    assert out.startswith("PASS node-loss")
    lines = err.splitlines()
    assert lines == [
        f"error: {poisoned}:1:1: internal error while loading this file "
        "(MemoryError: planted); please report it",
        f"error: {crashing}:1:1: internal error while running this file "
        "(KeyError: 'planted too'); please report it",
    ]


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
    from llmgw_twin.twin import yamlnodes

    monkeypatch.setattr(yamlnodes, "MAX_YAML_NODES", 1000)
    text = "x: [\n" + "a,\n" * 5000 + "]\n"  # the mapping, its key, the list, then one a a line
    with pytest.raises(ScenarioError) as info:
        load_scenario_text(text, "s.yaml")
    assert (info.value.line, info.value.column) == (999, 1)
    assert "more than 1,000 values" in info.value.message
