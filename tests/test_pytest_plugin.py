"""The pytest plugin: scenario files collected as tests, failing with the scenario's own words.

Each test runs pytest on a folder of copies of the project's scenario files (pytester, in
process unless the entry point itself is the point), and reads its output or its JUnit XML.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from dataclasses import replace
from pathlib import Path

import pytest

from llmgw_twin.pytest_plugin import explain
from llmgw_twin.twin.scenario.loader import TOP_KEYS, ScenarioError, load_scenario_text
from llmgw_twin.twin.scenario.model import EventExpectation
from llmgw_twin.twin.world.expect import anchored
from llmgw_twin.twin.world.runner import InvariantResult, run_scenario
from llmgw_twin.units import fmt_ms

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = ROOT / "scenarios"
DOC = (ROOT / "docs" / "ci.md").read_text(encoding="utf-8")
NODE_LOSS = (SCENARIOS / "node-loss.yaml").read_text(encoding="utf-8")
CRASH_NODE = (SCENARIOS / "crash-node.yaml").read_text(encoding="utf-8")
WINDOW = "within: [kill+50s, kill+61s]"
assert NODE_LOSS.count(WINDOW) == 1
TOO_EARLY = NODE_LOSS.replace(WINDOW, "within: [kill+10s, kill+20s]")
"""node-loss, its node.lost expected 50s before the twin can declare it (as docs/ci.md says)."""
WALL_MS = re.compile(r"virtual in \d+ ms")


@pytest.fixture(autouse=True)
def own_root(pytester: pytest.Pytester) -> None:
    """Each run's root is its own folder (an ini file there): without one, pytest takes the
    nearest folder above with a `setup.py` for the root, a stray one in the temp dir's parents
    too, and every collected id would name the path from it."""
    pytester.makeini("[pytest]\n")


def write(pytester: pytest.Pytester, name: str, text: str) -> Path:
    path = pytester.path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def collected(result: pytest.RunResult) -> list[str]:
    return [line for line in result.outlines if "::" in line]


def junit(path: Path) -> dict[str, ET.Element]:
    root = ET.parse(path).getroot()  # noqa: S314 -- the report this test's own run wrote
    return {tc.attrib["name"]: tc for tc in root.iter("testcase")}


def properties(case: ET.Element) -> dict[str, str]:
    return {p.attrib["name"]: p.attrib["value"] for p in case.iter("property")}


def llmgw_twin(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    beside = Path(sys.executable).parent / "llmgw-twin"  # the venv's, else the one on PATH
    exe = str(beside) if beside.exists() else shutil.which("llmgw-twin")
    assert exe, "llmgw-twin is not installed"
    return subprocess.run(
        [exe, *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )


def test_the_installed_entry_point_collects_a_scenario_as_one_item_named_by_it(
    pytester: pytest.Pytester,
) -> None:
    # a fresh interpreter: the plugin comes from the installed package's entry point alone
    write(pytester, "my-scenarios/fleet.yml", NODE_LOSS)  # .yml, and a stem unlike the name
    write(pytester, "my-scenarios/crash-node.yaml", CRASH_NODE)
    result = pytester.runpytest_subprocess("my-scenarios", "-v", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(
        [
            "my-scenarios/crash-node.yaml::crash-node PASSED*",
            "my-scenarios/fleet.yml::node-loss PASSED*",
        ],
        consecutive=False,
    )


def test_a_failing_expectation_fails_with_its_text_the_events_around_it_and_a_replay(
    pytester: pytest.Pytester,
) -> None:
    write(pytester, "my-scenarios/node-loss.yaml", TOO_EARLY)
    result = pytester.runpytest("my-scenarios")
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    scenario = load_scenario_text(TOO_EARLY)
    exp = scenario.expectations[0]
    assert isinstance(exp, EventExpectation) and exp.kind == "node.lost"
    clock = anchored(exp.text, scenario.faults)  # as the file wrote them: kill+10s (2m10.000s)
    window = f"[{clock(exp.start_ms)}, {clock(exp.end_ms)}]"
    assert clock is not fmt_ms and window.startswith("[kill+")
    line = line_of(TOO_EARLY, "  - event: node.lost")
    assert f"expectation failed (line {line}): {exp.text}" in out
    assert f"none in {window}; nearest at" in out
    assert "replay: llmgw-twin run my-scenarios/node-loss.yaml --seed 1" in out
    lines = result.outlines
    # the kill before the window, the loss after it: the one event the expectation counts
    kill = next(i for i, s in enumerate(lines) if "fault.injected" in s and "kill_node" in s)
    gap = next(i for i, s in enumerate(lines) if "(no events in the window)" in s)
    lost = next(i for i, s in enumerate(lines) if re.match(r"\s*>\s+\+\S+\s+node\.lost\b", s))
    assert kill < gap < lost and "node=node02" in lines[lost]
    assert "Traceback" not in out and "ScenarioFailed" not in out and "def runtest" not in out
    # the replay command reproduces the failure outside pytest, with the full timeline
    replay = llmgw_twin(["run", "my-scenarios/node-loss.yaml", "--seed", "1"], pytester.path)
    assert replay.returncode == 1, replay.stderr
    assert f"FAIL  line {line:<4} {exp.text}" in replay.stdout
    assert replay.stdout.strip().splitlines()[-1].startswith("FAIL node-loss: 3/4 expectations")


def test_the_failure_shown_in_docs_ci_md_is_what_a_run_prints(pytester: pytest.Pytester) -> None:
    write(pytester, "my-scenarios/node-loss.yaml", TOO_EARLY)
    write(pytester, "my-scenarios/crash-node.yaml", CRASH_NODE)
    result = pytester.runpytest("my-scenarios", "--junitxml=report.xml")
    result.assert_outcomes(passed=1, failed=1)
    failure = junit(pytester.path / "report.xml")["node-loss"].find("failure")
    assert failure is not None and failure.text
    # the doc's pasted output: the failure is what stands between its title and the next line
    shown = re.search(r"_ scenario node-loss _+\n(.*?)\n-+ generated xml file", DOC, re.DOTALL)
    assert shown is not None
    assert WALL_MS.sub("", shown.group(1)) == WALL_MS.sub("", failure.text)


def line_of(text: str, line: str) -> int:
    return 1 + text.splitlines().index(line)


UNKNOWN_KEY = NODE_LOSS.replace("    replicas: 2\n", "    replica: 2\n")
MISSPELT = NODE_LOSS.replace("expect:\n", "expectations:\n")


@pytest.mark.parametrize(
    ("broken", "says", "at"),
    [
        pytest.param(
            UNKNOWN_KEY,
            "unknown key 'replica' in deployments[0]",
            (line_of(UNKNOWN_KEY, "    replica: 2"), 5),
            id="unknown-key",
        ),
        pytest.param(
            MISSPELT,
            "unknown key 'expectations' in the scenario",
            (line_of(MISSPELT, "expectations:"), 1),
            id="misspelt-top-key",
        ),
        pytest.param(
            NODE_LOSS.replace("    node: node02\n", "    node: [node02\n", 1),
            "invalid YAML",
            None,
            id="broken-yaml",
        ),
        pytest.param(
            NODE_LOSS.replace("duration: 6m\n", ""),
            "duration",
            (1, 1),  # a missing key is reported at the mapping that lacks it
            id="missing-required-key",
        ),
    ],
)
def test_an_invalid_scenario_fails_with_the_loaders_file_line_and_column(
    pytester: pytest.Pytester, broken: str, says: str, at: tuple[int, int] | None
) -> None:
    write(pytester, "my-scenarios/bad.yaml", broken)
    write(pytester, "my-scenarios/crash-node.yaml", CRASH_NODE)
    result = pytester.runpytest("my-scenarios", "-v")
    result.assert_outcomes(passed=1, failed=1)  # the bad file does not stop the others
    with pytest.raises(ScenarioError) as refused:
        load_scenario_text(broken, "my-scenarios/bad.yaml")
    err = refused.value
    assert says in err.message
    if at is not None:
        assert (err.line, err.column) == at
    out = result.stdout.str()
    assert "my-scenarios/bad.yaml::bad FAILED" in out  # named by the file's stem
    assert f"my-scenarios/bad.yaml:{err.line}:{err.column}: {err.message}" in result.outlines
    assert "Traceback" not in out and "ScenarioInvalid" not in out


def test_the_invalid_example_in_docs_ci_md_is_the_loaders_message() -> None:
    with pytest.raises(ScenarioError) as refused:
        load_scenario_text(UNKNOWN_KEY, "my-scenarios/bad.yaml")
    assert f"\n{refused.value}\n" in DOC


def test_the_scenario_keys_docs_ci_md_lists_are_the_loaders() -> None:
    listed = re.search(r"top-level keys among the scenario's keys \((.*?)\)", DOC, re.DOTALL)
    assert listed is not None
    assert re.findall(r"`([a-z_]+)`", listed.group(1)) == list(TOP_KEYS)


def doc_yaml_blocks() -> list[str]:
    return re.findall(r"```yaml\n(.*?)```", DOC, flags=re.DOTALL)


def test_yaml_files_that_are_not_scenarios_are_not_collected(pytester: pytest.Pytester) -> None:
    github, gitlab = doc_yaml_blocks()  # the CI jobs docs/ci.md shows, beside the scenarios
    assert "runs-on:" in github and "script:" in gitlab
    write(pytester, "fleet/github-workflow.yml", github)
    write(pytester, "fleet/.gitlab-ci.yml", gitlab)
    write(pytester, "fleet/gitlab-ci.yml", gitlab)
    compose = "name: fleet\nservices:\n  controller: {image: llmgw-twin}\nvolumes: {db: {}}\n"
    write(pytester, "fleet/docker-compose.yml", compose)
    # two scenario keys, but most keys are a Helm chart's
    helm = "name: fleet\ncluster: prod\nimage: {tag: 1}\nservice: {port: 80}\ningress: {}\n"
    write(pytester, "fleet/values.yaml", helm)
    write(pytester, "fleet/list.yaml", "- name: a\n  duration: 1m\n  cluster: {}\n")
    write(pytester, "fleet/empty.yaml", "")
    write(pytester, "fleet/scalar.yaml", "just text\n")
    (pytester.path / "fleet" / "binary.yaml").write_bytes(b"\xff\xfe\x00name: x\x00")
    write(pytester, "fleet/deep/node-loss.yaml", NODE_LOSS)
    result = pytester.runpytest("fleet", "--collect-only", "-q")
    assert collected(result) == ["fleet/deep/node-loss.yaml::node-loss"]


@pytest.mark.parametrize(
    "off",
    [["--llmgw-no-collect"], ["-p", "no:llmgw_twin"], "ini"],
    ids=["flag", "no-plugin", "ini"],
)
def test_collection_can_be_turned_off(pytester: pytest.Pytester, off: list[str] | str) -> None:
    write(pytester, "my-scenarios/node-loss.yaml", NODE_LOSS)
    plain = pytester.runpytest("my-scenarios", "--collect-only", "-q")
    assert collected(plain) == ["my-scenarios/node-loss.yaml::node-loss"]
    if off == "ini":
        pytester.makeini("[pytest]\nllmgw_collect = false\n")
    args = [] if off == "ini" else list(off)
    result = pytester.runpytest("my-scenarios", "--collect-only", "-q", *args)
    assert collected(result) == []
    assert result.ret == pytest.ExitCode.NO_TESTS_COLLECTED


def test_junit_xml_holds_each_scenario_its_failure_message_and_properties(
    pytester: pytest.Pytester,
) -> None:
    write(pytester, "my-scenarios/node-loss.yaml", NODE_LOSS)
    too_early = TOO_EARLY.replace("name: node-loss\n", "name: node-loss-too-early\n")
    write(pytester, "my-scenarios/too-early.yaml", too_early)
    bad = NODE_LOSS.replace("    replicas: 2\n", "    x: 2\n")
    write(pytester, "my-scenarios/bad.yaml", bad)
    result = pytester.runpytest("my-scenarios", "--junitxml=out/report.xml")
    result.assert_outcomes(passed=1, failed=2)
    cases = junit(pytester.path / "out" / "report.xml")
    assert set(cases) == {"node-loss", "node-loss-too-early", "bad"}

    passing = cases["node-loss"]
    assert passing.find("failure") is None
    assert properties(passing) == {
        "file": "my-scenarios/node-loss.yaml",
        "scenario": "node-loss",
        "seed": "1",
        "replay": "llmgw-twin run my-scenarios/node-loss.yaml --seed 1",
        "trace_sha256": run_scenario(load_scenario_text(NODE_LOSS)).trace_sha256,
    }

    failed = cases["node-loss-too-early"].find("failure")
    assert failed is not None and failed.text
    message = failed.attrib["message"]
    assert message.startswith("FAIL node-loss-too-early: 3/4 expectations")
    assert "replay: llmgw-twin run my-scenarios/too-early.yaml --seed 1" in message
    exp = load_scenario_text(too_early).expectations[0]
    line = line_of(too_early, "  - event: node.lost")
    assert f"expectation failed (line {line}): {exp.text}" in message
    assert "node.lost" in failed.text and "Traceback" not in failed.text
    assert properties(cases["node-loss-too-early"])["scenario"] == "node-loss-too-early"

    invalid = cases["bad"].find("failure")
    assert invalid is not None
    where = f"my-scenarios/bad.yaml:{line_of(bad, '    x: 2')}:5: unknown key 'x' in deployments[0]"
    assert invalid.attrib["message"].startswith(where)
    assert properties(cases["bad"]) == {"file": "my-scenarios/bad.yaml"}


def test_llmgw_seed_overrides_every_files_seed(pytester: pytest.Pytester) -> None:
    scenario = load_scenario_text(NODE_LOSS)
    at_seven = run_scenario(scenario, seed=7).trace_sha256
    assert at_seven != run_scenario(scenario).trace_sha256  # the seed shows in the trace
    write(pytester, "my-scenarios/node-loss.yaml", NODE_LOSS)
    write(
        pytester, "my-scenarios/too-early.yaml", TOO_EARLY.replace("name: node-loss\n", "name: e\n")
    )
    result = pytester.runpytest("my-scenarios", "--llmgw-seed", "7", "--junitxml=report.xml")
    result.assert_outcomes(passed=1, failed=1)
    cases = junit(pytester.path / "report.xml")
    assert properties(cases["node-loss"])["seed"] == "7"
    assert properties(cases["node-loss"])["trace_sha256"] == at_seven
    assert "replay: llmgw-twin run my-scenarios/too-early.yaml --seed 7" in result.stdout.str()


def test_an_invariant_violation_is_explained_with_the_events_at_its_time() -> None:
    result = run_scenario(load_scenario_text(NODE_LOSS))
    lost = next(ev for ev in result.trace if ev.kind == "node.lost")
    violation = f"t={lost.t_ms}ms replica llama-70b-r1 is ready with a shard on a lost node"
    broken = tuple(
        replace(i, violations=(violation,) * 7) if i.name == "ready_is_whole" else i
        for i in result.invariants
    )
    assert all(isinstance(i, InvariantResult) for i in broken)
    text = explain(replace(result, invariants=broken), 3, "llmgw-twin run x.yaml --seed 1")
    lines = text.splitlines()
    assert lines[0].startswith("FAIL node-loss: 4/4 expectations, 5/6 invariants hold")
    assert lines[1] == "replay: llmgw-twin run x.yaml --seed 1"
    assert "invariant failed: ready_is_whole (7 violation(s))" in lines
    assert lines.count(f"  {violation}") == 5 and "  ... 2 more" in lines
    assert f"  events near {fmt_ms(lost.t_ms)} (4 in the window, marked |):" in lines
    inside = [s for s in lines if s.startswith("   | ")]
    assert [s.split()[2] for s in inside] == [
        "node.lost",
        "replica.failed",
        "replica.reaped",
        "replica.placed",
    ]
    assert "expectation failed" not in text  # every expectation held
