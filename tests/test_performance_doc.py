"""docs/performance.md cannot go stale unnoticed: every table follows, in its section, the
command that produced it, every benchmark it names exists, and `make bench`
(benchmarks/all.py) has a place for each of its benchmarks there and judges the goals from the
figures. No benchmark runs here: `all.py`'s runs are replaced by made-up ones."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "performance.md"
NAMED = re.compile(r"benchmarks/[\w./-]+?\.py")


def load_all() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_all", ROOT / "benchmarks" / "all.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_all"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


ALL = load_all()


def sections(text: str) -> list[tuple[str, list[str]]]:
    """The doc cut at its `## ` headings (outside fenced blocks), each with its lines."""
    out: list[tuple[str, list[str]]] = [("(top)", [])]
    fenced = False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        if not fenced and line.startswith("## "):
            out.append((line, []))
        else:
            out[-1][1].append(line)
    return out


def tables_without_command(text: str) -> list[str]:
    """The first line of each table that no fenced block naming benchmarks/ precedes in its
    section, with the section's heading."""
    bad: list[str] = []
    for heading, lines in sections(text):
        fenced, command_seen, in_table = False, False, False
        fence_text: list[str] = []
        for line in lines:
            if line.startswith("```"):
                if fenced and NAMED.search("\n".join(fence_text)):
                    command_seen = True
                fenced, fence_text = not fenced, []
                continue
            if fenced:
                fence_text.append(line)
                continue
            starts = line.startswith("|") and not in_table
            in_table = line.startswith("|")
            if starts and not command_seen:
                bad.append(f"{heading}: {line}")
    return bad


def test_every_table_follows_the_command_that_produced_it() -> None:
    assert tables_without_command(DOC.read_text()) == []


def test_a_table_without_its_command_is_found() -> None:
    doc = "## A\n\n| a | b |\n| --- | --- |\n| 1 | 2 |\n"
    assert tables_without_command(doc) == ["## A: | a | b |"]
    named = "## A\n\n```sh\n.venv/bin/python benchmarks/twin.py\n```\n\n| a | b |\n"
    assert tables_without_command(named) == []
    # a command in another section does not count, nor a fence that names no benchmark
    other = "## A\n\n```sh\nbenchmarks/twin.py\n```\n\n## B\n\n```\nls\n```\n\n| a |\n"
    assert tables_without_command(other) == ["## B: | a |"]


def test_every_benchmark_named_exists() -> None:
    text = DOC.read_text()
    named = sorted(set(NAMED.findall(text)))
    assert "benchmarks/twin.py" in named
    assert [n for n in named if not (ROOT / n).is_file()] == []
    for bench in ALL.BENCHES:
        assert (ROOT / bench.argv[0]).is_file(), bench.name


def test_every_benchmark_of_make_bench_has_its_place_in_the_doc() -> None:
    text = DOC.read_text()
    for name in ["goals", *(b.name for b in ALL.BENCHES)]:
        begin, end = ALL.markers(name)
        assert text.count(begin) == 1 and text.count(end) == 1, name
        body = text[text.index(begin) + len(begin) : text.index(end)].strip()
        bench = next((b for b in ALL.BENCHES if b.name == name), None)
        if body and bench is not None:  # written by a run: its own command comes first
            assert body.startswith("```sh\n" + ALL.command(bench) + "\n```"), name
    assert "benchmarks/all.py" in (ROOT / "Makefile").read_text()


def test_a_block_is_replaced_between_its_own_markers_only() -> None:
    doc = (
        "a\n<!-- bench:x -->\nold\n<!-- /bench:x -->\n"
        "b\n<!-- bench:y -->\nkept\n<!-- /bench:y -->\n"
    )
    new = ALL.replace_block(doc, "x", "new")
    assert new == doc.replace("old", "new")
    assert ALL.replace_block(new, "x", "old") == doc
    with pytest.raises(KeyError):
        ALL.replace_block(doc, "z", "")


def fleet(hour: float, day: float, bare_hour: float) -> dict[str, object]:
    row = {"nodes": 1000, "per_beat_s": None, "bare_median_s": None}
    return {
        "fleet": [
            {**row, "virtual_ms": 3_600_000, "twin_min_s": hour, "twin_median_s": hour}
            | {"bare_min_s": bare_hour},
            {**row, "virtual_ms": 86_400_000, "twin_min_s": day, "twin_median_s": day}
            | {"bare_min_s": None},
        ]
    }


ROUTER_HEAD = (
    "| answer | in flight | direct p50 / p99 | router p50 / p99 | added p50 / p99 "
    "| direct req/s | router req/s | router / direct | failed |"
)
ROUTER_OUT = (
    "2 sim engines\n\n"
    + ROUTER_HEAD
    + """
| --- | --- | --- | --- | --- | --- | --- | --- | --- |
| whole | 1 | 2.8 / 4.2 ms | 3.4 / 5.0 ms | +0.6 / +0.8 ms | 347 | 300 | 0.86 | 0 / 0 |
| whole | 8 | 12.2 / 30.1 ms | 13.0 / 31.0 ms | +{added} / +1.0 ms | 534 | 500 | {ratio} | 0 / 0 |
"""
)


def fake_run(name: str, figures: dict[str, object], stdout: str = "out\n", rc: int = 0) -> object:
    bench = next(b for b in ALL.BENCHES if b.name == name)
    return ALL.Run(bench, rc, stdout, "", 1.0, (0.5, 0.5, 0.5), figures)


def verdicts(runs: dict[str, object]) -> dict[str, bool | None]:
    return {goal.name: met for goal, _, met in ALL.judge_goals(runs)}


def test_goals_are_judged_from_the_figures() -> None:
    good = {
        "twin": fake_run("twin", fleet(1.0, 1.9, 2.5)),
        "startup": fake_run("startup", {"ratio_of_medians": 20.0}),
        "router": fake_run("router", {}, ROUTER_OUT.format(added="0.9", ratio="0.94")),
    }
    got = verdicts(good)
    assert got["a 1,000-node day against its hour"] is True
    assert got["a 1,000-node hour against bare SimPy"] is True
    assert got["a 10,000-node day"] is None  # its benchmark did not run: not measured
    assert all(got[g.name] for g in ALL.GOALS if g.bench in good)
    bad = {
        "twin": fake_run("twin", fleet(1.0, 2.5, 1.5)),
        "startup": fake_run("startup", {"ratio_of_medians": 40.0}),
        "router": fake_run("router", {}, ROUTER_OUT.format(added="1.2", ratio="0.70")),
    }
    assert not any(verdicts(bad)[g.name] for g in ALL.GOALS if g.bench in bad)
    failed = {"twin": fake_run("twin", {}, rc=1)}
    assert verdicts(failed)["a 1,000-node day against its hour"] is False


def test_make_bench_writes_the_figures_and_fails_on_a_missed_goal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = tmp_path / "performance.md"
    doc.write_text(
        "## Goals\n\n<!-- bench:goals -->\n<!-- /bench:goals -->\n\n## Twin\n\n"
        "<!-- bench:twin -->\nstale\n<!-- /bench:twin -->\n"
    )
    monkeypatch.setattr(ALL, "DOC", doc)
    figures = {"twin": fleet(1.0, 5.0, 2.5)}
    monkeypatch.setattr(ALL, "run_bench", lambda b: fake_run(b.name, figures[b.name], "figs\n"))
    assert ALL.main(["--only", "twin"]) == 1
    assert "goal missed: a 1,000-node day against its hour" in capsys.readouterr().err
    text = doc.read_text()
    assert "stale" not in text and "figs" in text
    assert ALL.command(next(b for b in ALL.BENCHES if b.name == "twin")) in text
    assert "| a 1,000-node day against its hour | at most x2 | x5.0" in text
    assert tables_without_command(text) == []
    figures["twin"] = fleet(1.0, 1.5, 2.5)
    assert ALL.main(["--only", "twin"]) == 0
    # a goal measured in an earlier run keeps its row when its benchmark does not run
    figures["startup"] = {"ratio_of_medians": 30.0}
    doc.write_text(
        doc.read_text().replace(
            "<!-- /bench:twin -->",
            "<!-- /bench:twin -->\n<!-- bench:startup -->\n<!-- /bench:startup -->",
        )
    )
    assert ALL.main(["--only", "startup"]) == 1
    text = doc.read_text()
    assert "| a 1,000-node day against its hour | at most x2 | x1.5" in text  # kept
    assert "x30.0 of a bare" in text
    assert ALL.main(["--only", "twin"]) == 0
    assert "x30.0 of a bare" in doc.read_text()  # kept in turn, still missed


def test_an_unknown_benchmark_or_a_missing_marker_is_a_usage_mistake(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert ALL.main(["--only", "nonesuch"]) == 2
    doc = tmp_path / "performance.md"
    doc.write_text("<!-- bench:goals -->\n<!-- /bench:goals -->\n")
    monkeypatch.setattr(ALL, "DOC", doc)
    monkeypatch.setattr(ALL, "run_bench", lambda b: pytest.fail("ran a benchmark"))
    assert ALL.main(["--only", "twin"]) == 2
