"""Traffic as users send it: rate shapes, token lengths and recorded traces
(`scenario/arrivals.py`, `scenario/workload.py`), and the engine model and SLOs in the twin; the
contract's form unchanged."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import pytest

from llmgw_twin.twin.scenario.arrivals import arrivals
from llmgw_twin.twin.scenario.loader import ScenarioError, load_scenario, load_scenario_text
from llmgw_twin.twin.scenario.model import Scenario, Traffic
from llmgw_twin.twin.world.runner import RunResult, run_scenario

HEAD = """name: shapes
duration: {duration}
cluster: {{fabrics: {{ib-a: [node01, node02]}}}}
profiles:
  p: {{engine: sim, gpus_per_node: 1, model: m, load_time: 1s}}
deployments: [{{model: a, profile: p, replicas: {replicas}}}]
"""


def _load(body: str, tmp: Path, duration: str = "1m", replicas: int = 1) -> Scenario:
    path = tmp / "s.yaml"
    path.write_text(HEAD.format(duration=duration, replicas=replicas) + body, encoding="utf-8")
    return load_scenario(path)


def _times(s: Scenario, seed: int | str = 1) -> list[int]:
    return [a.at_ms for a in arrivals(s.traffic[0], s.duration_ms, seed)]


def test_the_contract_form_keeps_its_spacing_and_an_even_workload_matches_it(
    tmp_path: Path,
) -> None:
    old = _load("traffic: {model: a, rate: 7/s, tokens: 5}\n", tmp_path)
    assert old.traffic[0].workload is None
    t = old.traffic[0]
    want = [t.arrival_ms(i) for i in range(t.requests_until(old.duration_ms))]
    assert _times(old) == want
    assert {a.output_tokens for a in arrivals(t, old.duration_ms, 1)} == {5}
    even = _load("traffic: {model: a, rate: 7/s, tokens: 5, arrivals: even}\n", tmp_path)
    assert even.traffic[0].workload is not None
    assert _times(even) == want


def test_poisson_arrivals_follow_the_seed(tmp_path: Path) -> None:
    s = _load("traffic: {model: a, rate: 20/s, arrivals: poisson}\n", tmp_path)
    first, again, other = _times(s, "x"), _times(s, "x"), _times(s, "y")
    assert first == again != other
    assert first == sorted(first) and first[0] >= 0 and first[-1] <= s.duration_ms
    assert 1_000 < len(first) < 1_400  # 1,200 expected over a minute


def test_a_burst_multiplies_the_rate_in_its_window(tmp_path: Path) -> None:
    s = _load(
        "traffic: {model: a, rate: 10/s, bursts: [{at: 20s, for: 10s, factor: 5}]}\n", tmp_path
    )
    times = _times(s)
    assert sum(1 for t in times if 20_000 <= t < 30_000) == 500
    assert sum(1 for t in times if 30_000 <= t < 40_000) == 100


def test_a_diurnal_profile_shapes_the_rate_over_its_period(tmp_path: Path) -> None:
    s = _load(
        "traffic: {model: a, rate: 10/s, diurnal: {period: 20s, levels: [2, 0, 0.5, 1]}}\n",
        tmp_path,
    )
    times = _times(s)
    per = [sum(1 for t in times if q * 5_000 <= t < (q + 1) * 5_000) for q in range(4)]
    assert per == [100, 0, 25, 50]


def test_token_lengths_are_drawn_within_their_bounds(tmp_path: Path) -> None:
    s = _load(
        "traffic:\n  model: a\n  rate: 50/s\n"
        "  input_tokens: {lognormal: {median: 300, sigma: 1}, min: 10, max: 2000}\n"
        "  output_tokens: {uniform: [5, 9]}\n",
        tmp_path,
    )
    got = list(arrivals(s.traffic[0], s.duration_ms, 3))
    assert {a.output_tokens for a in got} == {5, 6, 7, 8, 9}
    prompts = sorted(a.input_tokens for a in got)
    assert prompts[0] >= 10 and prompts[-1] <= 2000 and 200 < prompts[len(prompts) // 2] < 450


def _trace(tmp: Path, name: str, text: str) -> None:
    (tmp / name).write_text(text, encoding="utf-8")


def test_a_csv_or_jsonl_trace_is_replayed_as_recorded(tmp_path: Path) -> None:
    _trace(tmp_path, "t.csv", "arrival_ms,input_tokens,output_tokens\n0,10,2\n5,20,3\n90000,1,1\n")
    s = _load("traffic: {model: a, trace: t.csv}\n", tmp_path)
    got = list(arrivals(s.traffic[0], s.duration_ms, 0))
    assert [(a.at_ms, a.input_tokens, a.output_tokens) for a in got] == [(0, 10, 2), (5, 20, 3)]
    _trace(
        tmp_path,
        "m.jsonl",
        '{"timestamp": 0, "input_length": 7, "output_length": 4, "hash_ids": [1]}\n\n'
        '{"timestamp": 1500, "input_length": 8, "output_length": 1}\n',
    )
    s = _load("traffic: {model: a, trace: m.jsonl}\n", tmp_path)
    got = list(arrivals(s.traffic[0], s.duration_ms, 0))
    assert [(a.at_ms, a.input_tokens) for a in got] == [(0, 7), (1500, 8)]


@pytest.mark.parametrize(
    ("text", "line", "says"),
    [
        ("arrival_ms,input_tokens,output_tokens\n0,1,1\n3,x,1\n", 3, "column input_tokens"),
        ("arrival_ms,input_tokens,output_tokens\n5,1,1\n3,1,1\n", 3, "before the row above"),
        ("arrival_ms,input_tokens,output_tokens\n0,1,0\n", 2, "output_tokens"),
        ("arrival_ms,input_tokens,output_tokens\n0,1\n", 2, "do not match the header"),
        ("when,input_tokens,output_tokens\n0,1,1\n", 1, "no arrival time column"),
        ("arrival_ms,input_tokens,output_tokens\n-1,1,1\n", 2, "not a number 0 or more"),
    ],
)
def test_a_malformed_trace_is_refused_with_its_file_and_line(
    tmp_path: Path, text: str, line: int, says: str
) -> None:
    _trace(tmp_path, "bad.csv", text)
    with pytest.raises(ScenarioError) as err:
        _load("traffic: {model: a, trace: bad.csv}\n", tmp_path)
    assert f"traffic.trace: bad.csv:{line}: " in str(err.value) and says in str(err.value)
    assert err.value.line == 7  # the trace's key in the scenario


def test_a_jsonl_line_that_is_not_an_object_names_its_line(tmp_path: Path) -> None:
    _trace(tmp_path, "bad.jsonl", '{"arrival_ms": 0, "input_tokens": 1, "output_tokens": 1}\n[1]\n')
    with pytest.raises(ScenarioError, match=r"bad\.jsonl:2: not a JSON object"):
        _load("traffic: {model: a, trace: bad.jsonl}\n", tmp_path)


def test_a_trace_is_read_only_up_to_the_run_and_never_held_whole(tmp_path: Path) -> None:
    rows = "".join(f"{i * 10},{i % 500},{1 + i % 7}\n" for i in range(200_000))
    _trace(tmp_path, "big.csv", "arrival_ms,input_tokens,output_tokens\n" + rows + "oops\n")
    tracemalloc.start()
    s = _load("traffic: {model: a, trace: big.csv}\n", tmp_path, duration="30m")
    count = sum(1 for _ in arrivals(s.traffic[0], s.duration_ms, 0))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert count == 180_001 and peak < 4 * 2**20  # the file is 2.5 MB; rows are not kept
    short = _load("traffic: {model: a, trace: big.csv}\n", tmp_path, duration="1m")
    assert short.traffic[0].workload is not None and short.traffic[0].workload.trace is not None
    assert short.traffic[0].workload.trace.requests == 6_001  # the bad last line is never read


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ("traffic: {model: a, rate: 1/s, trace: t.csv}\n", "'rate' cannot be set with 'trace'"),
        ("traffic: {model: a, rate: 1/s, tokens: 3, output_tokens: 4}\n", "keep one"),
        ("traffic: {model: a, rate: 1/s, arrivals: bursty}\n", "unknown arrivals"),
        ("traffic: {model: a, rate: 1/s, diurnal: {levels: [0, 0]}}\n", "at least one level"),
        ("traffic: {model: a, rate: 1/s, input_tokens: {uniform: [9, 3]}}\n", "HIGH is below"),
        ("traffic: {model: a, trace: t.txt}\n", "must be a .csv or .jsonl"),
        ("traffic: {model: a, trace: none.csv}\n", "cannot read the trace"),
        ("engine_model: {q: sim/any/any}\n", "unknown profile 'q'"),
        ("engine_model: {p: nope}\n", "no engine performance entry 'nope'"),
        ("engine_model: {p: {max_batch: 3}}\n", "without 'base' it needs"),
        ("expect:\n  - slo: {model: a, ttft_p99: 1s}\n", "no traffic is sent to 'a'"),
        (
            "traffic: {model: a, rate: 1/s}\nexpect:\n  - slo: {model: a, attainment: 90%}\n",
            "needs 'ttft'",
        ),
    ],
)
def test_the_additions_refuse_what_they_cannot_mean(tmp_path: Path, body: str, says: str) -> None:
    _trace(tmp_path, "t.csv", "arrival_ms,input_tokens,output_tokens\n0,1,1\n")
    with pytest.raises(ScenarioError, match=says):
        _load(body, tmp_path)


BURST = """engine_model:
  p: {base: sim/any/any, max_batch: 4, kv_tokens: 2000}
traffic:
  model: a
  rate: 5/s
  input_tokens: 100
  output_tokens: 50
  bursts: [{at: 30s, for: 10s, factor: 8}]
expect:
  - slo: {model: a, ttft_p99: 2s, attainment: 95%}
    within: [5s, 29s]
  - slo: {model: a, ttft_p99: 2s}
    within: [30s, 45s]
"""


def test_a_burst_queues_in_the_batch_and_the_slo_sees_it(tmp_path: Path) -> None:
    s = _load(BURST, tmp_path)
    result = run_scenario(s)
    quiet, burst = result.expectations
    assert quiet.passed and not burst.passed, (quiet.message, burst.message)
    assert "over 2000 ms" in burst.message
    assert result.latency is not None and result.requests is not None
    figures = result.latency["a"]
    served = figures["served"]
    assert isinstance(served, int) and 0 < served <= result.requests["a"]["served"]  # some queue
    queued = figures["queued_ms"]
    assert isinstance(queued, dict) and queued["max"] > 1000
    again = run_scenario(s)
    assert again.latency == result.latency and again.trace_sha256 == result.trace_sha256


def test_more_replicas_bring_the_tail_down(tmp_path: Path) -> None:
    def p99(replicas: int) -> float:
        result = run_scenario(_load(BURST, tmp_path, replicas=replicas))
        assert result.latency is not None
        ttft = result.latency["a"]["ttft_ms"]
        assert isinstance(ttft, dict)
        return float(ttft["p99"])

    assert p99(2) < p99(1)


def test_a_batch_under_its_capacity_answers_every_request(tmp_path: Path) -> None:
    result = run_scenario(
        _load(
            "engine_model: {p: vllm/llama-3-8b/h100}\n"
            "traffic: {model: a, rate: 20/s, arrivals: poisson, input_tokens: 300, "
            "output_tokens: {uniform: [1, 200]}}\n",
            tmp_path,
            duration="3m",
        )
    )
    assert result.requests is not None and result.latency is not None
    counts = result.requests["a"]
    assert counts["failed"] == counts["failed_no_replica"] > 0  # before the replica serves
    assert counts["retried"] == 0 and counts["ejections"] == 0
    served = result.latency["a"]["served"]
    assert (
        isinstance(served, int) and counts["served"] - 50 <= served <= counts["served"]
    )  # the rest
    # are still in the batch when the run ends


def test_without_the_additions_nothing_is_reported_beyond_the_counts(tmp_path: Path) -> None:
    result = run_scenario(_load("traffic: {model: a, rate: 5/s}\n", tmp_path))
    assert result.latency is None and result.requests is not None


def test_the_engine_model_changes_no_event_but_the_sim_engine_flag(tmp_path: Path) -> None:
    plain = run_scenario(_load("traffic: {model: a, rate: 5/s}\n", tmp_path))
    modelled = run_scenario(
        _load("engine_model: {p: sim/any/any}\n" + BURST[BURST.index("traffic") :], tmp_path)
    )

    def without_flag(result: RunResult) -> list[dict[str, object]]:
        out = []
        for ev in result.trace:
            d = ev.as_dict()
            argv = d.get("argv")
            if isinstance(argv, list | tuple) and "--perf-model" in argv:
                i = list(argv).index("--perf-model")
                d["argv"] = [*argv[:i], *argv[i + 2 :]]
            out.append(d)
        return out

    assert plain.trace_sha256 != modelled.trace_sha256
    assert without_flag(plain) == without_flag(modelled)


def test_arrivals_of_an_item_without_workload_are_its_contract_times() -> None:
    t = Traffic(model="a", count=3, every_ms=1000, tokens=4)  # type: ignore[arg-type]
    assert [a.at_ms for a in arrivals(t, 2_000, 0)] == [0, 333, 666, 1000, 1333, 1666, 2000]


def test_a_scenario_text_finds_its_trace_beside_the_working_folder(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match="cannot read the trace"):
        load_scenario_text(
            HEAD.format(duration="1m", replicas=1) + "traffic: {model: a, trace: nowhere.csv}\n"
        )


def test_the_latency_report_is_the_same_across_processes_and_hash_seeds() -> None:
    import json
    import os
    import subprocess
    import sys

    path = Path(__file__).resolve().parents[1] / "scenarios/burst-queues.yaml"
    reports = []
    for hash_seed in ("1", "2"):
        out = subprocess.run(
            [sys.executable, "-m", "llmgw_twin.cli", "run", "--json", str(path)],
            env={**os.environ, "PYTHONHASHSEED": hash_seed},
            capture_output=True,
            text=True,
            check=True,
            timeout=300,
        )
        report = json.loads(out.stdout)
        reports.append((report["trace_sha256"], report["requests"], report["latency"]))
    assert reports[0] == reports[1] and reports[0][2]["llama-8b"]["served"] > 500


def test_the_html_report_shows_latency_only_when_there_is_some(tmp_path: Path) -> None:
    from llmgw_twin.twin.report.html import render_html

    with_it = render_html(run_scenario(_load(BURST, tmp_path)))
    assert '<section id="latency">' in with_it and 'data-figure="ttft_ms.p99"' in with_it
    without = render_html(run_scenario(_load("traffic: {model: a, rate: 5/s}\n", tmp_path)))
    assert '<section id="latency">' not in without


def test_a_scaled_run_scales_the_engine_and_the_objectives_with_it() -> None:
    from llmgw_twin.twin.scenario.timescale import scale_scenario

    path = Path(__file__).resolve().parents[1] / "scenarios/burst-queues.yaml"
    s = load_scenario(path)
    tenth = scale_scenario(s, 0.1)
    (model,) = tenth.engine_model
    assert model.perf.iteration_us == s.engine_model[0].perf.iteration_us / 10
    (profile,) = tenth.profiles
    assert profile.args.count("--perf-model") == 1
    assert profile.args[-1].startswith("iteration_us=650,")
    first = tenth.expectations[0]
    assert first.ttft_p99_ms == 100 and first.start_ms == 3_000  # type: ignore[union-attr]
    result = run_scenario(tenth)
    assert result.passed, [o.message for o in result.expectations if not o.passed]


def test_ttft_over_time_shows_the_burst(tmp_path: Path) -> None:
    from llmgw_twin.twin.report.html import render_html

    result = run_scenario(_load(BURST, tmp_path))
    assert result.latency is not None
    over = result.latency["a"]["over_time"]
    assert isinstance(over, dict) and over["span_ms"] == 1_251  # a minute and its last ms in 48
    ttft = over["ttft_p99_ms"]
    assert isinstance(ttft, list) and len(ttft) == 48
    before, during = max(ttft[4:23]), max(ttft[24:33])  # the burst: 30s to 40s
    assert during > 10 * before
    assert 'data-figure="ttft_over_time"' in render_html(result)


def test_a_scaled_run_scales_a_traces_times(tmp_path: Path) -> None:
    from llmgw_twin.twin.scenario.timescale import scale_scenario

    _trace(tmp_path, "t.csv", "arrival_ms,input_tokens,output_tokens\n0,1,1\n1000,1,1\n55000,1,1\n")
    s = _load("traffic: {model: a, trace: t.csv}\n", tmp_path)
    tenth = scale_scenario(s, 0.1)
    assert [a.at_ms for a in arrivals(tenth.traffic[0], tenth.duration_ms, 0)] == [0, 100, 5500]
