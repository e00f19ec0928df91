"""Reading a scenario file, whatever its bytes: a BOM or CR/CRLF line ends change neither the
scenario, its trace nor where an error points; one bad file (or an unexpected exception) does not
stop a multi-file run."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmgw_twin import cli
from llmgw_twin.twin.scenario.loader import ScenarioError, load_scenario, load_scenario_text
from llmgw_twin.twin.scenario.model import Scenario
from llmgw_twin.twin.world.runner import run_scenario
from test_loader_limits import BASE, NODE_LOSS, ROOT, SCENARIOS

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
    from llmgw_twin.twin.scenario import loader
    from llmgw_twin.twin.world import runner

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
