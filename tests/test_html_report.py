"""`run --html`: the page of a run, opened in headless Chromium and compared with the same run's
JSON report and its loaded scenario (lanes, faults, windows, results, shard argv, requests)."""

from __future__ import annotations

import dataclasses
import json
import shlex
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import ConsoleMessage, Locator, Page, Request

from helpers.browser import page as browser_page
from llmgw_twin.cli import main
from llmgw_twin.control.model import NodeId
from llmgw_twin.twin.report.html import render_html, window
from llmgw_twin.twin.scenario.loader import load_scenario
from llmgw_twin.twin.scenario.model import Fault, KillNode, Scenario
from llmgw_twin.twin.world.runner import run_scenario

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = ROOT / "scenarios"


@dataclass
class Viewer:
    """One browser page for the module, with what each opened file made it log and fetch."""

    page: Page
    console: list[ConsoleMessage] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)

    def open(self, path: Path) -> Page:
        self.console.clear()
        self.errors.clear()
        self.requests.clear()
        self.page.goto(path.as_uri())
        self.page.wait_for_load_state("load")
        return self.page

    def assert_clean(self, path: Path) -> None:
        assert [m.text for m in self.console if m.type in ("error", "warning")] == []
        assert self.errors == []
        assert self.requests == [path.as_uri()]


@pytest.fixture(scope="module")
def viewer() -> Iterator[Viewer]:
    with browser_page() as p:
        v = Viewer(p)

        def console(m: ConsoleMessage) -> None:
            v.console.append(m)

        def request(r: Request) -> None:
            v.requests.append(r.url)

        p.on("console", console)
        p.on("pageerror", lambda e: v.errors.append(str(e)))
        p.on("request", request)
        yield v


@dataclass
class Run:
    rc: int
    report: dict[str, Any]
    page: Path
    scenario: Scenario

    def events(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.report["events"] if e["kind"] == kind]


def run_cli(scenario_file: Path, out: Path, capsys: pytest.CaptureFixture[str]) -> Run:
    """The CLI on one file, with --json (the run's own report) and --html (its page)."""
    rc = main(["run", "--json", str(scenario_file), "--html", str(out)])
    captured = capsys.readouterr()
    assert captured.err == ""
    report = json.loads(captured.out)
    return Run(rc, report, out, load_scenario(str(scenario_file)))


def lane(page: Page, key: str) -> Locator:
    found = page.locator(f'[data-lane="{key}"]')
    assert found.count() == 1, key
    return found


def attr(loc: Locator, name: str) -> str:
    value = loc.get_attribute(name)
    assert value is not None, name
    return value


def span(loc: Locator) -> tuple[int, int]:
    """A segment's start and end (virtual ms), from its data attributes."""
    return int(attr(loc, "data-start-ms")), int(attr(loc, "data-end-ms"))


def x_at(page: Page, t_ms: int, duration_ms: int) -> float:
    """Where virtual time `t_ms` falls on the screen, from the axis track's box."""
    box = page.locator("#axis .track").bounding_box()
    assert box is not None
    return box["x"] + box["width"] * t_ms / duration_ms


def center_x(loc: Locator) -> float:
    box = loc.bounding_box()
    assert box is not None
    return box["x"] + box["width"] / 2


def check_common(viewer: Viewer, run: Run) -> Page:
    """What every page must show of its run: header, lanes, faults, windows, results, argv."""
    page = viewer.open(run.page)
    report, sc = run.report, run.scenario
    dur = report["virtual_ms"]
    verdict = "pass" if report["passed"] else "fail"
    assert attr(page.locator("#summary"), "data-verdict") == verdict
    assert page.locator("#verdict").inner_text() == verdict.upper()
    assert page.locator("#scenario-name").inner_text() == report["scenario"]
    fields = {
        "file": report["file"],
        "seed": str(report["seed"]),
        "trace-sha256": report["trace_sha256"],
        "events": str(len(report["events"])),
    }
    for name, want in fields.items():
        assert page.locator(f'dd[data-field="{name}"]').inner_text() == want

    # a lane per node of the scenario and per replica of the trace, and no others
    nodes = [n.node for n in sc.nodes]
    for node in nodes:
        lane(page, f"node:{node}")
    assert page.locator('[data-lane^="node:"]').count() == len(nodes)
    replicas = {e[k] for e in report["events"] for k in ("replica", "to") if k in e}
    for replica in replicas:
        lane(page, f"replica:{replica}")
    assert page.locator('[data-lane^="replica:"]').count() == len(replicas)

    # each fault on the axis at its instant, and in the lane of the node it hit
    injected = run.events("fault.injected")
    assert len(injected) == len(sc.faults) > 0
    for ev in injected:
        marker = page.locator(f'#axis .fault[data-fault="{ev["fault"]}"]')
        assert attr(marker, "data-t-ms") == str(ev["t_ms"])
        assert attr(marker, "data-action") == ev["action"]
        assert abs(center_x(marker) - x_at(page, ev["t_ms"], dur)) <= 2
        if "node" in ev:
            hit = lane(page, f"node:{ev['node']}").locator(f'.fault[data-fault="{ev["fault"]}"]')
            assert hit.count() == 1
            assert abs(center_x(hit) - x_at(page, ev["t_ms"], dur)) <= 2

    # a window per expectation where the file puts it, with the run's result, and a row
    assert page.locator(".xwin").count() == len(sc.expectations) == len(report["expectations"])
    for i, (exp, judged) in enumerate(zip(sc.expectations, report["expectations"], strict=True)):
        result = "pass" if judged["passed"] else "fail"
        win = page.locator(f'.xwin[data-expectation="{i}"]')
        start, end = window(exp, dur)
        assert attr(win, "data-result") == result
        box = win.bounding_box()
        assert box is not None
        assert abs(box["x"] - x_at(page, start, dur)) <= 2 or start == end
        if end - start > dur / 50:
            assert abs(box["x"] + box["width"] - x_at(page, end, dur)) <= 2
        row = page.locator(f'.xrow[data-expectation="{i}"]')
        assert attr(row, "data-result") == result
        assert judged["text"] in row.inner_text()
        assert attr(row, "data-line") == str(judged["line"])

    # a row per invariant with its result and its checks
    assert page.locator(".invrow").count() == len(report["invariants"])
    for inv in report["invariants"]:
        row = page.locator(f'.invrow[data-invariant="{inv["name"]}"]')
        want = "off" if not inv["enabled"] else "violated" if inv["violations"] else "ok"
        assert attr(row, "data-result") == want
        assert attr(row.locator("[data-checks]"), "data-checks") == str(inv["checks"])

    # every shard in its node's lane, its argv in its hover text; one hovered for real
    started = run.events("shard.started")
    assert started
    for ev in started:
        node_lane = lane(page, f"node:{ev['node']}")
        seg = node_lane.locator(f'[data-shard="{ev["replica"]}/{ev["rank"]}"]')
        assert seg.count() == 1
        assert shlex.join(ev["argv"]) in attr(seg, "data-tip")
        assert attr(seg, "data-t-ms") == str(ev["t_ms"])
    first = started[0]
    seg = lane(page, f"node:{first['node']}").locator(
        f'[data-shard="{first["replica"]}/{first["rank"]}"]'
    )
    seg.hover()
    tip = page.locator("#tip")
    tip.wait_for(state="visible")
    assert "--model" in first["argv"]
    assert shlex.join(first["argv"]) in tip.inner_text()
    viewer.assert_clean(run.page)
    return page


def test_node_loss_page(viewer: Viewer, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = run_cli(SCENARIOS / "node-loss.yaml", tmp_path / "report.html", capsys)
    assert run.rc == 0
    page = check_common(viewer, run)
    # the controller's view of each node's health: lost from the node.lost event to the end
    for ev in run.events("node.lost"):
        lost = lane(page, f"node:{ev['node']}").locator('[data-row="health"] [data-state="lost"]')
        assert span(lost) == (ev["t_ms"], run.report["virtual_ms"])
    # each reaped replica's lane ends at its reap, with a mark there
    for ev in run.events("replica.reaped"):
        rep = lane(page, f"replica:{ev['replica']}")
        ends = [int(attr(s, "data-end-ms")) for s in rep.locator(".seg").all()]
        assert max(ends) == ev["t_ms"]
        assert rep.locator(f'.mark[data-kind="replica.reaped"][data-t-ms="{ev["t_ms"]}"]').count()
    assert page.locator("#requests").count() == 0  # no traffic in this scenario


def test_gpu_failure_page(
    viewer: Viewer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = run_cli(SCENARIOS / "gpu-failure.yaml", tmp_path / "gpu.html", capsys)
    assert run.rc == 0
    page = check_common(viewer, run)
    failed = run.events("gpu.failed")
    assert failed
    for ev in failed:
        gpus = lane(page, f"node:{ev['node']}").locator('[data-row="gpus"]')
        seg = gpus.locator(f'[data-gpu="{ev["gpu"]}"]')
        assert attr(seg, "data-start-ms") == str(ev["t_ms"])


def test_controller_restart_page(
    viewer: Viewer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = run_cli(SCENARIOS / "controller-restart-healthy.yaml", tmp_path / "r.html", capsys)
    assert run.rc == 0
    page = check_common(viewer, run)
    (crash,) = [e for e in run.events("fault.injected") if e["action"] == "restart_controller"]
    back = crash["t_ms"] + crash["down_for_ms"]
    ctl = lane(page, "controller")
    assert ctl.locator(f'.fault[data-fault="{crash["fault"]}"]').count() == 1
    down = ctl.locator('[data-row="state"] [data-state="down"]')
    assert (attr(down, "data-start-ms"), attr(down, "data-end-ms")) == (
        str(crash["t_ms"]),
        str(back),
    )
    adopted = run.events("replica.adopted")
    assert adopted
    for ev in adopted:
        rep = lane(page, f"replica:{ev['replica']}")
        down = rep.locator('[data-state="down"]')
        assert span(down) == (crash["t_ms"], back)
        adopting = rep.locator('[data-state="adopting"]')
        assert span(adopting) == (back, ev["t_ms"])


def test_fabric_down_page(
    viewer: Viewer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = run_cli(SCENARIOS / "fabric-down.yaml", tmp_path / "f.html", capsys)
    page = check_common(viewer, run)
    ups = {e["node"]: e["t_ms"] for e in run.events("node.link_up")}
    downs = run.events("node.link_down")
    assert downs
    for ev in downs:
        link = lane(page, f"node:{ev['node']}").locator('[data-row="link"] [data-state="down"]')
        assert span(link) == (ev["t_ms"], ups[ev["node"]])


def test_a_failing_run_shows_what_failed(
    viewer: Viewer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = (SCENARIOS / "node-loss.yaml").read_text()
    hopeful = text.replace("within: [kill+50s, kill+61s]", "within: [kill, kill+20s]")
    assert hopeful != text
    (tmp_path / "hopeful.yaml").write_text(hopeful)
    run = run_cli(tmp_path / "hopeful.yaml", tmp_path / "hopeful.html", capsys)
    assert run.rc == 1 and not run.report["passed"]
    results = {o["passed"] for o in run.report["expectations"]}
    assert results == {True, False}  # the page must tell the failing one from the others
    check_common(viewer, run)


def test_traffic_counts(viewer: Viewer, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = run_cli(SCENARIOS / "node-loss-traffic.yaml", tmp_path / "t.html", capsys)
    page = check_common(viewer, run)
    requests = run.report["requests"]
    assert requests
    for model, counts in requests.items():
        row = page.locator(f'#requests .reqrow[data-model="{model}"]')
        for key, value in counts.items():
            assert row.locator(f'td[data-count="{key}"]').inner_text() == str(value)


def test_hostile_names_are_escaped(viewer: Viewer, tmp_path: Path) -> None:
    """The loader refuses such names, so the scenario is changed after loading: the page must
    still hold them as text, never as markup."""
    evil = "<script>window.pwned=1</script>\"'&<b>"
    sc = load_scenario(str(SCENARIOS / "node-loss.yaml"))
    node = NodeId("node02" + evil)
    nodes = tuple(dataclasses.replace(n, node=node) if n.node == "node02" else n for n in sc.nodes)
    fabrics = tuple((f, tuple(node if n == "node02" else n for n in ns)) for f, ns in sc.fabrics)
    faults = tuple(Fault(f.at_ms, KillNode(node), "kill" + evil, f.line) for f in sc.faults)
    hostile = dataclasses.replace(
        sc,
        name="name" + evil,
        description="</style></script>" + evil,
        nodes=nodes,
        fabrics=fabrics,
        faults=faults,
    )
    text = render_html(run_scenario(hostile))
    assert "<script>window.pwned" not in text
    assert evil not in text and "</style></script>" not in text
    out = tmp_path / "hostile.html"
    out.write_text(text, encoding="utf-8")
    page = viewer.open(out)
    assert page.evaluate("typeof window.pwned") == "undefined"
    assert page.locator("#scenario-name").inner_text() == "name" + evil
    assert page.locator(".desc").inner_text() == "</style></script>" + evil
    keys = page.eval_on_selector_all("[data-lane]", "els => els.map(e => e.dataset.lane)")
    assert f"node:{node}" in keys
    assert attr(page.locator("#axis .fault"), "data-fault") == "kill" + evil
    assert page.locator("script").count() == 1  # the page's own
    viewer.assert_clean(out)


def test_same_run_same_page(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    one, two = tmp_path / "one.html", tmp_path / "two.html"
    for out in (one, two):
        assert main(["run", "-q", str(SCENARIOS / "gpu-failure.yaml"), "--html", str(out)]) == 0
    assert one.read_bytes() == two.read_bytes()
    capsys.readouterr()


def test_several_files_go_to_a_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    files = [SCENARIOS / "node-loss.yaml", SCENARIOS / "gpu-failure.yaml"]
    assert main(["run", "-q", *map(str, files), "--html", str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gpu-failure.html", "node-loss.html"]
    for f in files:
        assert f'data-field="file">{f}<' in (tmp_path / f"{f.stem}.html").read_text()
    capsys.readouterr()


@pytest.mark.parametrize(
    ("files", "target", "says"),
    [
        (["node-loss.yaml"], "missing/report.html", "is not a directory"),
        (["node-loss.yaml", "gpu-failure.yaml"], "report.html", "need an existing directory"),
        (["node-loss.yaml", "node-loss.yaml"], ".", "the same page"),
        (["node-loss.yaml", "--real"], ".", "twin run only"),
    ],
)
def test_html_refused_before_running(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], files: list[str], target: str, says: str
) -> None:
    args = [a if a.startswith("--") else str(SCENARIOS / a) for a in files]
    assert main(["run", *args, "--html", str(tmp_path / target)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # nothing ran
    (line,) = captured.err.splitlines()
    assert line.startswith("error: --html ") and says in line
    assert list(tmp_path.iterdir()) == []


def test_a_page_that_cannot_be_written(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "-q", str(SCENARIOS / "node-loss.yaml"), "--html", "/dev/full"]) == 2
    captured = capsys.readouterr()
    assert captured.out.startswith("PASS node-loss")  # the run itself is still reported
    (line,) = captured.err.splitlines()
    assert line.startswith("error: --html: cannot write /dev/full: ")
    assert "Traceback" not in captured.err


def _png_pixels(png: bytes) -> list[tuple[int, int, int]]:
    """The RGB of every pixel of an 8-bit RGB or RGBA PNG (what Chromium's screenshots are)."""
    import struct
    import zlib

    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, width, height, channels = 8, b"", 0, 0, 0
    while pos < len(png):
        (size,) = struct.unpack(">I", png[pos : pos + 4])
        kind, body = png[pos + 4 : pos + 8], png[pos + 8 : pos + 8 + size]
        if kind == b"IHDR":
            width, height, depth, color = struct.unpack(">IIBB", body[:10])
            assert depth == 8 and color in (2, 6), (depth, color)
            channels = 3 if color == 2 else 4
        elif kind == b"IDAT":
            idat += body
        pos += size + 12
    raw, stride, out = zlib.decompress(idat), width * channels, []
    prev = bytearray(stride)
    for y in range(height):
        filt = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - channels] if i >= channels else 0
            b, c = prev[i], prev[i - channels] if i >= channels else 0
            if filt == 1:
                line[i] = (line[i] + a) & 255
            elif filt == 2:
                line[i] = (line[i] + b) & 255
            elif filt == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif filt == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        out += [tuple(line[x * channels : x * channels + 3]) for x in range(width)]
        prev = line
    return out  # type: ignore[return-value]


def test_lanes_and_labels_read_without_scrolling(
    viewer: Viewer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each expectation's lane is labelled with its line and its text (shortened, whole on
    hover), every label shows whole within the first screen, replica subtitles are not cut,
    and a failing end-state is a mark wide enough to see, red in the screenshot."""
    text = (SCENARIOS / "node-loss.yaml").read_text()
    failing = text.replace("ready_replicas: {llama-70b: 2}", "ready_replicas: {llama-70b: 3}")
    assert failing != text
    (tmp_path / "end.yaml").write_text(failing)
    run = run_cli(tmp_path / "end.yaml", tmp_path / "end.html", capsys)
    assert run.rc == 1
    page = viewer.open(run.page)
    page.screenshot(path=str(tmp_path / "end.png"))  # what a reader sees first
    width = page.viewport_size["width"] if page.viewport_size else 1400
    for i, judged in enumerate(run.report["expectations"]):
        label = page.locator(f'.xlane[data-expectation="{i}"] .label')
        said = label.inner_text()
        assert said.startswith("PASS" if judged["passed"] else "FAIL"), said
        assert f"line {judged['line']}: " in said
        words = " ".join(judged["text"].split())
        shown = said.split(f"line {judged['line']}: ", 1)[1].rstrip("\u2026")
        assert words.startswith(shown) and len(shown) >= min(len(words), 40), (shown, words)
        assert attr(label, "data-tip") == f"line {judged['line']}: {judged['text']}"
        box = label.bounding_box()
        assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= width
        # nothing of it hidden: the label holds its text without clipping it
        assert label.evaluate(
            "e => e.scrollWidth <= e.clientWidth && e.scrollHeight <= e.clientHeight"
        )
    for sub in page.locator('[data-lane^="replica:"] .label small').all():
        assert sub.inner_text(), "a replica lane has its subtitle"
        assert sub.evaluate("e => e.scrollWidth <= e.clientWidth"), sub.inner_text()
        lane_label = sub.locator("xpath=..")
        assert lane_label.evaluate("e => e.scrollWidth <= e.clientWidth"), sub.inner_text()

    end = len(run.report["expectations"]) - 1
    assert run.report["expectations"][end]["passed"] is False
    mark = page.locator(f'.xwin[data-expectation="{end}"]')
    box, track = mark.bounding_box(), page.locator("#axis .track").bounding_box()
    assert box is not None and track is not None
    assert box["width"] >= 10, box  # not a 1-pixel sliver
    assert box["x"] + box["width"] <= track["x"] + track["width"] + 1  # inside the chart
    pixels = _png_pixels(mark.screenshot())
    red = [p for p in pixels if p[0] > 150 and p[1] < 120 and p[2] < 120]
    assert len(red) >= len(pixels) // 4, (len(red), len(pixels))
    viewer.assert_clean(run.page)
