"""`llmgw-twin replay`: a controller's event log and a window made into a scenario whose twin run
makes the same control decisions (docs/live-twin.md, "Replay").

The logs here are the twin's own: a scenario of scenarios/ is run, its report (as `run --json`
writes it, and as JSON lines) is replayed over the whole log and over a window that starts with
the fleet running, and the written scenario's run must pass every pinned decision and make the
same failures, losses and placements (kind, model, node, fabric) as the log."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

from llmgw_twin.cli import main
from llmgw_twin.control.model import TraceEvent
from llmgw_twin.live.replay_log import EventLog, save_log
from llmgw_twin.twin.report.text import to_json
from llmgw_twin.twin.scenario.loader import load_scenario
from llmgw_twin.twin.world.runner import RunResult, run_scenario

SCENARIOS = Path(__file__).resolve().parent.parent / "scenarios"
DECIDED = ("replica.failed", "node.lost", "replica.placed", "replica.reaped")


def _logged(name: str) -> tuple[Path, RunResult]:
    path = SCENARIOS / f"{name}.yaml"
    return path, run_scenario(load_scenario(path))


def _report(tmp_path: Path, result: RunResult) -> Path:
    out = tmp_path / "report.json"
    out.write_text(json.dumps(to_json(result, 0)))
    return out


def _decided(events: list[TraceEvent], start_ms: int) -> Counter[tuple[Any, ...]]:
    return Counter(
        (ev.kind, ev.get("model"), ev.get("node"), ev.get("fabric"))
        for ev in events
        if ev.kind in DECIDED and ev.t_ms >= start_ms
    )


def _replay(args: list[str]) -> int:
    return main(["replay", *args])


@pytest.mark.parametrize(
    "name",
    [
        "node-loss",
        "engine-crash",
        "gpu-failure",
        "drain-node",
        "controller-restart-node-died",
        "controller-restart-mid-failover",
        "partition",
        "fabric-down",
        "cut-fabric-link",
        "scale-up-down",
        "set-profile",
        "crash-loop",
        "add-node",
        "infra-failure-no-backoff",
        "crash-node",
        "hang-engine",
        "agent-restart",
        "restart-storm",
        "mass-loss-hold-ends",
        "drain-no-room",
        "defrag-make-before-break",
        "delay-heartbeats",
    ],
)
@pytest.mark.parametrize("start", [None, "45s"])
def test_a_replayed_log_makes_the_same_decisions(
    tmp_path: Path, name: str, start: str | None
) -> None:
    path, logged = _logged(name)
    out = tmp_path / "replay.yaml"
    window = ["--from", start] if start else []
    assert (
        _replay([str(_report(tmp_path, logged)), "--fleet", str(path), *window, "-o", str(out)])
        == 0
    )
    data = yaml.safe_load(out.read_text())
    assert ("initial" in data) == (start is not None)
    replayed = run_scenario(load_scenario(out))
    assert replayed.passed, [o.message for o in replayed.expectations if not o.passed]
    start_ms = 45_000 if start else 0
    originals = [ev for ev in logged.trace if ev.kind != "fault.injected"]
    shifted = [TraceEvent(ev.t_ms + start_ms, ev.kind, ev.subjects) for ev in replayed.trace]
    assert _decided(shifted, start_ms) == _decided(originals, start_ms)


def test_the_fleet_at_the_window_start_is_the_one_the_log_shows(tmp_path: Path) -> None:
    path, logged = _logged("drain-node")
    out = tmp_path / "replay.yaml"
    report = _report(tmp_path, logged)
    assert _replay([str(report), "--fleet", str(path), "--from", "2m40s", "-o", str(out)]) == 0
    initial = yaml.safe_load(out.read_text())["initial"]
    assert initial["nodes"] == {"node01": {"cordoned": True}}  # drained: cordoned still
    shards = {r["id"]: r["shards"] for r in initial["replicas"]}
    assert sorted(shards) == ["big-r2", "big-r3", "chat-r2", "chat-r3", "chat-r4", "chat-r5"]
    # the lowest free GPUs of each node, in placement order, as the placement picked them: a
    # leader's port in the log is 8000 plus its first GPU
    for rid, held in shards.items():
        started = next(
            ev
            for ev in logged.trace
            if ev.kind == "shard.started" and ev.get("replica") == rid and ev.get("rank") == 0
        )
        argv = list(started.get("argv"))  # type: ignore[call-overload]
        assert held[0]["gpus"][0] == int(argv[argv.index("--port") + 1]) - 8000, rid
    assert shards["big-r3"] == [
        {"rank": 0, "node": "node03", "gpus": [0, 1, 2, 3]},
        {"rank": 1, "node": "node04", "gpus": [0, 1, 2, 3]},
    ]
    faults = yaml.safe_load(out.read_text())["faults"]
    assert [next(k for k in f if k not in ("id", "at")) for f in faults] == ["kill_node"]


def test_json_lines_give_the_same_scenario_as_the_report(tmp_path: Path) -> None:
    path, logged = _logged("controller-restart-node-died")
    report = _report(tmp_path, logged)
    nested = tmp_path / "log.jsonl"
    nested.write_text(save_log(EventLog(logged.trace, "x")))
    flat = tmp_path / "flat.jsonl"
    flat.write_text("".join(json.dumps(ev.as_dict()) + "\n" for ev in logged.trace))
    page = tmp_path / "page.json"
    page.write_text(
        json.dumps(
            {
                "events": json.loads(f"[{','.join(nested.read_text().splitlines()[1:])}]"),
                "next": len(logged.trace),
                "dropped": 0,
            }
        )
    )
    texts = []
    for log in (report, nested, flat, page):
        out = tmp_path / f"{log.stem}.yaml"
        assert _replay([str(log), "--fleet", str(path), "--from", "50s", "-o", str(out)]) == 0
        data = yaml.safe_load(out.read_text())
        del data["description"]  # names the file read
        texts.append(data)
    assert texts[0]["faults"] and texts[0]["expect"]
    assert all(t == texts[0] for t in texts[1:])


def test_check_lists_each_decision_the_twin_did_not_make(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path, logged = _logged("node-loss")
    out = tmp_path / "replay.yaml"
    report = _report(tmp_path, logged)
    assert _replay([str(report), "--fleet", str(path), "-o", str(out), "--check"]) == 0
    printed = capsys.readouterr().out
    assert "kill_node: node02 lost at" in printed
    assert "check: the twin made 6 of the 6 logged decision(s)" in printed
    # a replica that was still loading when the window opened loads afresh in the twin, so its
    # start deadline falls later than the log's: the check says which decisions are missing
    path, logged = _logged("start-deadline")
    report = _report(tmp_path, logged)
    window = ["--from", "45s"]
    assert _replay([str(report), "--fleet", str(path), *window, "-o", str(out), "--check"]) == 1
    printed = capsys.readouterr().out
    assert "check: the twin made 0 of the 3 logged decision(s)" in printed
    assert "not made: replica.failed model=slow replica=slow-r1 at +1m16s" in printed
    # and the replay said so when it wrote the file
    assert "caution: replica slow-r1 was loading when the window opened" in printed
    assert "# caution: replica slow-r1 was loading" in out.read_text()


def test_a_window_end_is_a_t_ms_a_wall_clock_time_or_a_duration(tmp_path: Path) -> None:
    path, logged = _logged("node-loss")
    report = _report(tmp_path, logged)
    bodies = []
    # a twin's t_ms count from 0, so 45 s is also 1970-01-01T00:00:45Z
    for start, end in (("45s", "3m"), ("45000", "180000"), ("1970-01-01T00:00:45Z", "3m")):
        out = tmp_path / "replay.yaml"
        window = ["--from", start, "--to", end]
        assert _replay([str(report), "--fleet", str(path), *window, "-o", str(out)]) == 0
        bodies.append(out.read_text())
    assert bodies[0] == bodies[1] == bodies[2]
    data = yaml.safe_load(bodies[0])
    assert data["duration"] == "2m27s"  # the window and the tolerance after it
    # a window that closes before the loss shows no fault and pins no loss
    out = tmp_path / "early.yaml"
    assert _replay([str(report), "--fleet", str(path), "--to", "2m", "-o", str(out)]) == 0
    data = yaml.safe_load(out.read_text())
    assert "faults" not in data
    assert all(e["event"] == "replica.placed" for e in data["expect"])


def test_a_gpu_the_log_names_decides_which_gpus_a_shard_holds(tmp_path: Path) -> None:
    path, logged = _logged("gpu-failure")
    # the same log, had GPU 3 failed: the replica that failed with it held GPU 3, so the
    # replay's initial state must give it GPU 3 (here it holds 0-3 anyway) -- and had GPU 6
    # failed under it, the replica must hold 6, not the lowest four
    events = [
        ev.as_dict() | ({"gpu": 6} if ev.kind == "gpu.failed" else {})
        for ev in logged.trace
        if ev.kind != "fault.injected"
    ]
    log = tmp_path / "log.jsonl"
    log.write_text("".join(json.dumps(e) + "\n" for e in events))
    out = tmp_path / "replay.yaml"
    assert _replay([str(log), "--fleet", str(path), "--from", "1m", "-o", str(out)]) == 0
    data = yaml.safe_load(out.read_text())
    held = {
        r["id"]: s["gpus"]
        for r in data["initial"]["replicas"]
        for s in r["shards"]
        if s["node"] == "node01"
    }
    assert held == {"llama-70b-r1": [0, 1, 2, 6]}
    assert [f["fail_gpu"] for f in data["faults"]] == [{"node": "node01", "gpu": 6}]
    assert run_scenario(load_scenario(out)).passed


def test_shrink_drops_the_faults_no_decision_needs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # two partitions: a blip (suspect, heard again: no decision) and a cut (lost, moved)
    path, logged = _logged("partition")
    out = tmp_path / "replay.yaml"
    report = _report(tmp_path, logged)
    assert _replay([str(report), "--fleet", str(path), "-o", str(out), "--shrink"]) == 0
    assert "shrunk: 1 fault(s) dropped" in capsys.readouterr().out
    data = yaml.safe_load(out.read_text())
    assert [f["partition"]["nodes"] for f in data["faults"]] == [["node03"]]
    assert run_scenario(load_scenario(out)).passed


def _lines(result: RunResult) -> list[str]:
    return [json.dumps(ev.as_dict()) for ev in result.trace if ev.kind != "fault.injected"]


FLEET_EDIT = {"node04": "node09", "big": "huge"}


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        ("sha", "the report's events do not match its trace_sha256"),
        ("cut-line", "the log's last line is cut off"),
        ("bad-line", ":3: not a JSON line"),
        ("version", "a log of version 2; this llmgw-twin reads version 1"),
        ("short", "the log holds 60 event(s), its header says 61: it was cut"),
        ("dropped", "event(s) were dropped before it"),
        ("head", "the log does not start at the controller's first event"),
        ("kind", "event kind 'replica.teleported' is not one this llmgw-twin knows"),
        ("order", "events out of time order"),
        ("node", "the log names node node04"),
        ("model", "the log names model big"),
        ("no-fleet", "a log file needs --fleet FILE"),
        ("window", "--to (t_ms 60000) is before --from (t_ms 120000)"),
        ("tolerance", "--tolerance: unknown unit 'x'"),
    ],
)
def test_a_log_that_is_not_whole_or_not_ours_is_one_line_and_no_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], damage: str, message: str
) -> None:
    path, logged = _logged("drain-node")
    lines = _lines(logged)
    log = tmp_path / "log.jsonl"
    fleet = path
    args: list[str] = []
    text = "\n".join(lines) + "\n"
    if damage == "sha":
        report = to_json(logged, 0)
        report["events"] = report["events"][:-1]
        log.write_text(json.dumps(report))
        text = log.read_text()
    elif damage == "cut-line":
        text = text[:-30]
    elif damage == "bad-line":
        text = "\n".join([*lines[:2], "{oops", *lines[2:]]) + "\n"
    elif damage == "version":
        text = json.dumps({"llmgw_twin_event_log": 2, "first": 0}) + "\n" + text
    elif damage == "short":
        text = json.dumps({"llmgw_twin_event_log": 1, "next": 61}) + "\n" + "\n".join(lines[:60])
    elif damage == "dropped":
        page = {"events": [json.loads(x) for x in lines], "next": 500, "dropped": 440}
        text = json.dumps(page) + "\n"
    elif damage == "head":
        text = "\n".join(lines[9:]) + "\n"
    elif damage == "kind":
        text = text.replace('"kind": "node.drained"', '"kind": "replica.teleported"')
    elif damage == "order":
        text = "\n".join([*lines[:-2], lines[-1], lines[-2]]) + "\n"
    elif damage in ("node", "model"):
        fleet = tmp_path / "fleet.yaml"
        raw = path.read_text()
        old = "node04" if damage == "node" else "big"
        fleet.write_text(raw.replace(old, FLEET_EDIT[old]))
    elif damage == "window":
        args = ["--from", "2m", "--to", "1m"]
    elif damage == "tolerance":
        args = ["--tolerance", "5x"]
    log.write_text(text)
    out = tmp_path / "replay.yaml"
    out.write_text("the file from before\n")
    fleet_args = [] if damage == "no-fleet" else ["--fleet", str(fleet)]
    assert _replay([str(log), *fleet_args, *args, "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    assert message in err[0]
    assert out.read_text() == "the file from before\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        {"log.jsonl", "replay.yaml", *(["fleet.yaml"] if damage in ("node", "model") else [])}
    )


REBOOTS = """\
name: reboots
seed: 2
duration: 5m
timings: {heartbeat_interval: 5s, node_suspect_after: 15s, node_lost_after: 30s}
cluster:
  fabrics: {ib-a: [node01, node02, node03, node04]}
  nodes:
    default: {gpus: 8, engines: [sim]}
profiles:
  one: {engine: sim, gpus_per_node: 8, load_time: 10s, model: /m/one}
deployments:
  - {model: one, profile: one, replicas: 3}
faults:
  - {id: boot, at: 1m, restart_node: node01}
  - {id: agent, at: 2m30s, restart_agent: {node: node02, down_for: 20s}}
"""


def test_a_reboot_and_an_agent_restart_are_told_apart(tmp_path: Path) -> None:
    # a node that registers with its shards gone rebooted; one that registers with them after
    # a silence had its agent restart, and its replica lives on
    path = tmp_path / "reboots.yaml"
    path.write_text(REBOOTS)
    logged = run_scenario(load_scenario(path))
    out = tmp_path / "replay.yaml"
    report = _report(tmp_path, logged)
    assert _replay([str(report), "--fleet", str(path), "--from", "30s", "-o", str(out)]) == 0
    faults = yaml.safe_load(out.read_text())["faults"]
    assert [(f["at"], f.get("restart_node")) for f in faults[:1]] == [("30s", "node01")]
    agent = faults[1]["restart_agent"]
    assert agent["node"] == "node02"
    # heard last between 2m25s and 2m30s, suspect 15 s later; registered again at 2m50s2ms
    assert faults[1]["at"] == "1m56s1ms" and agent["down_for"] == "23s999ms"
    replayed = run_scenario(load_scenario(out))
    assert replayed.passed
    assert _decided(list(replayed.trace), 0) == _decided(
        [TraceEvent(ev.t_ms - 30_000, ev.kind, ev.subjects) for ev in logged.trace], 0
    )


def test_a_fleet_with_role_groups_is_refused_with_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path, logged = _logged("role-group-decode-lost")
    out = tmp_path / "replay.yaml"
    assert _replay([str(_report(tmp_path, logged)), "--fleet", str(path), "-o", str(out)]) == 2
    assert "deploys chat in role groups, which replay does not reproduce yet" in (
        capsys.readouterr().err
    )
    assert not out.exists()
