"""Real mode end to end: scenario files on real processes on loopback, judged like the twin.

Slow by nature (each run lasts its scaled duration), so the suite runs a few short scenarios,
one mixed cluster with a real llama-server, and two runs of one file at once. Each test counts
only the processes of its own run: those carrying its own temporary folder, and the process
groups the run reports it started.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest

from helpers.real_runs import RealRunProcess, alive_groups, marked
from llmgw_twin.cli import main
from llmgw_twin.programs.tiny_gguf import write_tiny_gguf
from llmgw_twin.realmode.runner import RealResult, engine_binaries, run_real
from llmgw_twin.twin.scenario.loader import load_scenario, load_scenario_text

ROOT = Path(__file__).resolve().parent.parent
RUN_WITHIN_S = 180.0
"""A bound on a whole run of a short scenario, start-up and shutdown included, on a busy machine."""


@pytest.fixture
def own_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The run's temporary folder, and so every process it starts, tied to this test: another
    run of the project on the same machine is never counted as ours."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def assert_left_nothing(result: RealResult, marker: Path, before: set[int]) -> None:
    """Nothing of this run is left: none of the process groups it recorded has a live member,
    no process that carries this test's folder is new, and the run's own folder is gone."""
    assert result.left_running == []
    assert result.groups and alive_groups(result.groups) == set()
    assert set(marked(marker)) - before == set()
    assert result.workdir and Path(result.workdir).is_relative_to(marker)
    assert not Path(result.workdir).exists()


def test_run_real_node_loss_passes_leaves_nothing_running_and_compares_with_the_twin(
    capsys: pytest.CaptureFixture[str], own_tmp: Path
) -> None:
    before = set(marked(own_tmp))
    path = str(ROOT / "scenarios" / "node-loss.yaml")
    code = main(["run", "--real", "--time-scale", "0.1", "--compare", "--json", path])
    report = json.loads(capsys.readouterr().out)
    failures = [e["message"] for e in report["expectations"] if not e["passed"]]
    failures += [v for i in report["invariants"] for v in i["violations"]]
    assert code == 0 and report["passed"], "\n".join(failures)
    assert report["left_running"] == []
    assert report["process_groups"] and alive_groups(report["process_groups"]) == set()
    assert set(marked(own_tmp)) - before == set()
    assert Path(report["workdir"]).is_relative_to(own_tmp)
    assert not Path(report["workdir"]).exists()
    lost = [e for e in report["events"] if e["kind"] == "node.lost"]
    assert [e["node"] for e in lost] == ["node02"]
    assert report["answered"].get("llama-70b", 0) > 0  # the router answered real requests
    rows = {r["expectation"].split(" within")[0]: r for r in report["fidelity"]["rows"]}
    assert set(rows) == {
        "event node.lost node=node02",
        "event replica.ready model=llama-70b fabric=ib-b",
    }
    for row in rows.values():  # both runs saw each expected event: the table has both times
        assert row["virtual_ms"] is not None and row["real_ms"] is not None
        assert row["difference_ms"] == row["real_ms"] - row["virtual_ms"]
    # a power-off is a freeze: node02's peer does not notice, so, as in the twin, the ib-a
    # replica fails at loss detection and its one replacement goes to ib-b
    assert report["fidelity"]["differences"] == []
    assert report["fidelity"]["same_decisions"] is True
    assert report["seed"] == 1 and len(report["trace_sha256"]) == 64


def test_node_loss_under_real_traffic_fails_no_request_once_both_replicas_serve(
    own_tmp: Path,
) -> None:
    before = set(marked(own_tmp))
    result = run_real(load_scenario(ROOT / "scenarios" / "node-loss-traffic.yaml"), time_scale=0.1)
    failures = [o.message for o in result.expectations if not o.passed]
    assert result.passed, failures
    assert_left_nothing(result, own_tmp, before)
    assert result.requests is not None
    c = result.requests["llama-70b"]
    assert c["sent"] == 6 * 60 * 5 + 1 and c["served"] + c["failed"] == c["sent"]
    # none failed from the window's start (both replicas serving) to the end, node loss and all;
    # the ones that failed found no replica at all, before the first replicas served
    (window,) = [o for o in result.expectations if o.text.startswith("requests")]
    assert window.message.startswith("0 of ")
    assert c["failed"] == c["failed_no_replica"] and c["failed_in_flight"] == 0


def test_a_controller_restart_under_real_traffic_through_a_router_process_fails_nothing(
    own_tmp: Path,
) -> None:
    before = set(marked(own_tmp))
    scenario = load_scenario(ROOT / "scenarios" / "controller-restart-traffic.yaml")
    result = run_real(scenario, time_scale=0.1)
    assert result.passed, [o.message for o in result.expectations if not o.passed]
    assert result.requests is not None
    c = result.requests["llama-70b"]
    # the requests of the whole window (the 30 s outage inside it) were all served: the router
    # process served from its table while the controller was down and resynced after
    (window,) = [o for o in result.expectations if o.text.startswith("requests")]
    assert window.message.startswith("0 of ")
    sent_in_window = int(window.message.split()[2])
    assert sent_in_window > 0.8 * c["sent"] * (22 - 5) / 24  # the window's share of the run
    assert c["failed"] == c["failed_no_replica"]  # only before the first replicas served
    assert [e.kind for e in result.trace].count("controller.started") == 2
    assert_left_nothing(result, own_tmp, before)


def test_a_partition_is_a_real_network_cut(own_tmp: Path) -> None:
    before = set(marked(own_tmp))
    result = run_real(load_scenario(ROOT / "scenarios" / "partition.yaml"), time_scale=0.1)
    failures = [f"{o.text}: {o.message}" for o in result.expectations if not o.passed]
    failures += [f"{i.name}: {v}" for i in result.invariants for v in i.violations]
    assert result.passed, "\n".join(failures)
    kinds = [(e.kind, e.get("node")) for e in result.trace if e.get("node") == "node03"]
    # cut off, suspected, back; cut off for longer, lost, back: its orphans were stopped
    assert [k for k, _ in kinds if k.startswith("node.")] == [
        "node.joined",
        "node.suspect",
        "node.recovered",
        "node.suspect",
        "node.lost",
        "node.recovered",
    ]
    assert_left_nothing(result, own_tmp, before)


MIXED = """\
name: mixed-real
description: two-node sim replicas on each fabric and a CPU llama.cpp replica of a tiny model
duration: 40s
timings: {{heartbeat_interval: 10s, node_lost_after: 60s, reconcile_interval: 1s}}
cluster:
  fabrics:
    ib-a: [node01, node02, node05]
    ib-b: [node03, node04]
  nodes:
    default: {{gpus: 8, engines: [sim]}}
    node05: {{gpus: 1, engines: [sim, llamacpp]}}
profiles:
  sim-2n: {{engine: sim, nodes: 2, gpus_per_node: 8, load_time: 5s, model: /models/sim}}
  tiny-cpu: {{engine: llamacpp, nodes: 1, gpus_per_node: 1, model: "{gguf}"}}
deployments:
  - {{model: sim, profile: sim-2n, replicas: 2}}
  - {{model: tiny, profile: tiny-cpu, replicas: 1}}
expect:
  - event: replica.ready
    model: tiny
    within: [start, 20s]
  - at: end
    ready_replicas: {{sim: 2, tiny: 1}}
    replicas_in: {{ib-a: 2, ib-b: 1}}
"""


@pytest.mark.skipif(
    "llamacpp" not in engine_binaries(), reason="llama-server is not installed: make llama-server"
)
def test_sim_replicas_and_a_real_llama_server_under_one_controller(
    tmp_path: Path, own_tmp: Path
) -> None:
    gguf = tmp_path / "tiny.gguf"
    write_tiny_gguf(gguf)
    scenario = load_scenario_text(MIXED.format(gguf=gguf), str(tmp_path / "mixed.yaml"))
    before = set(marked(own_tmp))
    result = run_real(scenario, time_scale=0.25)
    failures = [f"{o.text}: {o.message}" for o in result.expectations if not o.passed]
    failures += [f"{i.name}: {v}" for i in result.invariants for v in i.violations]
    assert result.passed, "\n".join(failures)
    placed = [e for e in result.trace if e.kind == "replica.placed" and e.get("model") == "tiny"]
    assert placed and placed[-1].get("nodes") == ("node05",)
    started = [e for e in result.trace if e.kind == "shard.started" and e.get("model") == "tiny"]
    assert started and "llama-server" in str(started[-1].get("argv"))
    assert result.answered.get("tiny", 0) > 0  # real inference, routed by the controller
    assert result.answered.get("sim", 0) > 0
    assert_left_nothing(result, own_tmp, before)


def test_two_real_runs_of_one_scenario_at_once_both_pass_and_leave_nothing(
    tmp_path: Path,
) -> None:
    """Each run tells its processes, ports and addresses apart from the other's (the cluster
    draws them from the run's pid): both pass, and each ends all of its own. Two runs on a small
    machine take turns for its cores: each gets a wider tolerance than a run alone."""
    path = str(ROOT / "scenarios" / "engine-crash.yaml")
    runs = [
        RealRunProcess(tmp_path / name, "--time-scale", "0.1", "--tolerance", "5s", "--json", path)
        for name in ("one", "two")
    ]
    try:
        codes = [run.finish(RUN_WITHIN_S) for run in runs]
    finally:
        for run in runs:
            if run.proc.poll() is None:
                run.proc.kill()
                run.finish(RUN_WITHIN_S)
    reports = [json.loads(run.stdout) for run in runs]
    for run, code, report in zip(runs, codes, reports, strict=True):
        failures = [e["message"] for e in report["expectations"] if not e["passed"]]
        failures += [v for i in report["invariants"] for v in i["violations"]]
        assert code == 0 and report["passed"], "\n".join(failures) + "\n" + run.stderr
        # each run crashed its own engine, and its own replacement became ready
        kinds = [(e["kind"], e.get("replica")) for e in report["events"]]
        assert ("replica.failed", "llama-8b-r1") in kinds
        assert ("replica.ready", "llama-8b-r2") in kinds
        assert report["left_running"] == []
        assert alive_groups(report["process_groups"]) == set()
        assert marked(run.tmpdir) == {}
        assert Path(report["workdir"]).is_relative_to(run.tmpdir)
        assert not Path(report["workdir"]).exists()
    one, two = (set(r["process_groups"]) for r in reports)
    assert one and two and not one & two  # each run recorded only its own processes
