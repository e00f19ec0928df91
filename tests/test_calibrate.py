"""`llmgw-twin calibrate`: the fit recovers known coefficients from exact measurements, the
prediction of a load the model itself produced is exact, and the command drives a real server
(the sim engine with a known `--perf-model`) end to end."""

from __future__ import annotations

import json
import subprocess
import sys
from fractions import Fraction

from helpers.engines import Engine
from helpers.services import free_ports
from llmgw_twin.engines.perf.model import BatchEngine, EnginePerf, Served
from llmgw_twin.engines.perf.table import perf_arg
from llmgw_twin.programs.calibrate_fit import (
    Fitted,
    Measured,
    errors,
    fit,
    predict,
    within_goals,
)

TRUE = EnginePerf("true", Fraction(8000), Fraction(40), Fraction(1500), 4, 8192)
OVERHEAD_US = 2_000


def _lone(prompt: int) -> Measured:
    ttft = TRUE.iteration(prompt, 0) + OVERHEAD_US
    return Measured(0, prompt, 2, ttft, ttft + TRUE.iteration(0, 1))


def _batch(k: int, tokens: int) -> Measured:
    first = TRUE.iteration(8 * k, 0)
    step = TRUE.iteration(0, k)
    return Measured(0, 8, tokens, first, first + (tokens - 1) * step, decoding_with=k)


def test_the_fit_recovers_the_coefficients_of_exact_measurements() -> None:
    got = fit(
        [_lone(p) for p in (16, 64, 256, 512)],
        [_batch(k, 32) for k in (1, 2, 3, 4)],
        TRUE.max_batch,
        TRUE.kv_tokens,
        "x/y/z",
    )
    perf = got.perf
    got_abc = (perf.iteration_us, perf.prefill_us_per_token, perf.decode_us_per_token)
    assert got_abc == (Fraction(8000), Fraction(40), Fraction(1500))
    assert got.overhead_us == OVERHEAD_US and perf.name == "x/y/z" and perf.source == "calibrated"


def test_a_negative_estimate_is_clamped_and_the_rest_refitted() -> None:
    flat = [Measured(0, p, 2, 1000, 1000 + 500) for p in (16, 64, 256)]  # no prefill cost
    decodes = [Measured(0, 8, 11, 1000, 1000 + 10 * (500 - 10 * k), k) for k in (1, 2, 4)]
    perf = fit(flat, decodes, 4, 4096).perf
    assert min(perf.iteration_us, perf.prefill_us_per_token, perf.decode_us_per_token) >= 0


def test_the_model_predicts_its_own_load_exactly() -> None:
    engine = BatchEngine(TRUE)
    plan = [(i * 37_000, 10 + (i * 53) % 400, 3 + (i * 7) % 30) for i in range(40)]
    for key, (at, p, o) in enumerate(plan):
        engine.submit(key, at, p, o)
    served: dict[int, Served] = {}
    while (nxt := engine.next_done_us()) is not None:
        served.update((s.key, s) for s in engine.advance(nxt))
    load = [
        Measured(at, p, o, served[k].ttft_us + OVERHEAD_US, served[k].e2e_us + OVERHEAD_US)
        for k, (at, p, o) in enumerate(plan)
    ]
    errs = errors(load, predict(Fitted(TRUE, OVERHEAD_US), load))
    assert [e.relative for e in errs] == [0.0] * 4 and within_goals(errs)
    slower = EnginePerf("slow", Fraction(16000), Fraction(80), Fraction(3000), 4, 8192)
    assert not within_goals(errors(load, predict(Fitted(slower, OVERHEAD_US), load)))


def test_the_command_calibrates_a_running_server() -> None:
    (port,) = free_ports(1)
    argv = (
        sys.executable,
        "-m",
        "llmgw_twin.cli",
        "sim-engine",
        "--model",
        "tiny",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--perf-model",
        perf_arg(TRUE),
    )
    engine = Engine(argv, "sim engine")
    try:
        engine.wait_log("serving")
        run = subprocess.run(
            [
                sys.executable,
                "-m",
                "llmgw_twin.cli",
                "calibrate",
                "--url",
                f"http://127.0.0.1:{port}",
                "--model",
                "tiny",
                "--max-batch",
                "4",
                "--kv-tokens",
                "8192",
                "--prompts",
                "16,256",
                "--repeat",
                "1",
                "--decode-tokens",
                "8",
                "--held-out",
                "8",
                "--rate",
                "20",
                "-o",
                "json",
            ],
            capture_output=True,
            text=True,
            timeout=240,
            check=False,
        )
    finally:
        engine.close()
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout)
    assert report["entry"]["perf_model"].startswith("iteration_us=")
    assert [e["metric"] for e in report["errors"]] == ["ttft p50", "ttft p99", "e2e p50", "e2e p99"]
    assert all(e["measured_ms"] > 0 and e["predicted_ms"] > 0 for e in report["errors"])


def test_the_command_says_when_nothing_answers() -> None:
    (port,) = free_ports(1)
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "llmgw_twin.cli",
            "calibrate",
            "--url",
            f"http://127.0.0.1:{port}",
            "--model",
            "m",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert run.returncode == 1 and run.stderr.startswith("calibrate: ")
