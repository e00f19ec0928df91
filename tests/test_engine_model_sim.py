"""The sim engine with `--perf-model`: the twin's engine model driven in real time
(`programs/sim_batcher.py`), behind the same OpenAI-compatible API."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from fractions import Fraction
from pathlib import Path
from typing import Any

import httpx
import pytest

from llmgw_twin.engines.perf.model import BatchEngine, EnginePerf, Served
from llmgw_twin.engines.perf.table import perf_arg, perf_from_arg, perf_named
from llmgw_twin.programs.sim_api import SimModel, create_app
from llmgw_twin.programs.sim_batcher import Batcher, TooLarge

PERF = EnginePerf("t", Fraction(400), Fraction(2), Fraction(50), max_batch=2, kv_tokens=600)


def _fast_clock(speed: int) -> Any:
    """Microseconds of model time, `speed` times as fast as the loop's clock: the model's
    seconds pass in milliseconds of the test."""

    def now_us() -> int:
        return int(asyncio.get_running_loop().time() * 1_000_000 * speed)

    return now_us


def test_the_batcher_answers_as_the_pure_model_does() -> None:
    jobs = [(100, 5), (50, 3), (200, 4), (10, 1)]

    async def go() -> tuple[list[Served], list[int]]:
        batcher = Batcher(PERF, _fast_clock(1))
        tickets = [batcher.submit(p, o) for p, o in jobs]  # all at once: one instant each
        served = [await t.done for t in tickets]
        assert all(t.first.done() for t in tickets)
        assert batcher.engine.running == batcher.engine.queued == batcher.engine.kv_used == 0
        return served, [s.arrived_us for s in served]

    served, arrived = asyncio.run(go())
    engine = BatchEngine(PERF)
    for key, ((p, o), at) in enumerate(zip(jobs, arrived, strict=True), start=1):
        assert engine.submit(key, at, p, o)
    want: dict[int, Served] = {}
    while (nxt := engine.next_done_us()) is not None:
        want.update((s.key, s) for s in engine.advance(nxt))
    assert {s.key: s for s in served} == want


def test_a_request_larger_than_the_cache_is_refused_and_a_cancelled_one_leaves() -> None:
    async def go() -> None:
        batcher = Batcher(PERF, _fast_clock(1))
        with pytest.raises(TooLarge, match="600 tokens of KV cache"):
            batcher.submit(500, 101)
        ticket = batcher.submit(100, 400)
        await ticket.first
        assert batcher.engine.kv_used == 500
        batcher.cancel(ticket)
        assert ticket.done.cancelled() and batcher.engine.running == 0
        assert batcher.engine.advance(10**12) == [] and batcher.engine.kv_used == 0

    asyncio.run(go())


def _app(perf: EnginePerf | None) -> Any:
    batcher = None if perf is None else Batcher(perf, _fast_clock(1000))
    return create_app(SimModel("m", "/models/m", clock=lambda: 0.0, batcher=batcher)), batcher


def _post(app: Any, bodies: list[dict[str, Any]], path: str = "/v1/chat/completions") -> list[Any]:
    async def go() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://sim") as c:
            return list(await asyncio.gather(*(c.post(path, json=b) for b in bodies)))

    return asyncio.run(go())


def _chat(i: int, stream: bool = False) -> dict[str, Any]:
    content = f"hello {i} " + "word " * (20 * i)
    return {
        "model": "m",
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 6,
        "stream": stream,
    }


def _text(r: httpx.Response) -> str:
    if r.headers["content-type"].startswith("text/event-stream"):
        return "".join(line for line in r.text.splitlines() if line.startswith("data: {")).replace(
            "chatcmpl", ""
        )
    body = r.json()
    return str(body["choices"][0]["message"]["content"])


def test_the_api_answers_the_same_text_through_the_batch() -> None:
    plain, _ = _app(None)
    batched, batcher = _app(PERF)
    bodies = [_chat(i) for i in range(5)]
    want = [r.json()["choices"] for r in _post(plain, bodies)]
    got = _post(batched, bodies)
    assert [r.status_code for r in got] == [200] * 5
    assert [r.json()["choices"] for r in got] == want
    streamed = _post(batched, [_chat(i, stream=True) for i in range(3)])
    assert all(r.status_code == 200 and r.text.endswith("data: [DONE]\n\n") for r in streamed)
    completions = _post(
        batched, [{"model": "m", "prompt": ["a", "b c"], "max_tokens": 3}], "/v1/completions"
    )
    assert completions[0].status_code == 200 and len(completions[0].json()["choices"]) == 2
    assert batcher is not None
    assert batcher.engine.running == batcher.engine.queued == batcher.engine.kv_used == 0


def test_the_api_refuses_a_prompt_larger_than_the_cache() -> None:
    app, batcher = _app(EnginePerf("s", Fraction(1), Fraction(0), Fraction(0), 4, kv_tokens=20))
    (r,) = _post(app, [_chat(3)])
    assert r.status_code == 400
    assert r.json()["error"]["code"] == "context_length_exceeded"
    assert batcher is not None and batcher.engine.kv_used == 0


def test_the_flag_takes_an_entry_or_every_field() -> None:
    entry = perf_named("vllm/llama-3-8b/h100")
    assert perf_from_arg(entry.name) == entry
    again = perf_from_arg(perf_arg(entry))
    assert (again.iteration_us, again.max_batch, again.kv_tokens) == (
        entry.iteration_us,
        entry.max_batch,
        entry.kv_tokens,
    )
    with pytest.raises(ValueError, match="missing kv_tokens"):
        perf_from_arg("iteration_us=1,prefill_us_per_token=1,decode_us_per_token=1,max_batch=1")
    with pytest.raises(ValueError, match="no engine performance entry"):
        perf_from_arg("nope")
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "llmgw_twin.cli",
            "sim-engine",
            "--model",
            "m",
            "--perf-model",
            "nope",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert bad.returncode == 2 and "no engine performance entry 'nope'" in bad.stderr


def test_a_sim_profile_with_an_engine_model_runs_the_sim_engine_with_it() -> None:
    import argparse

    from llmgw_twin.programs.sim_server import add_arguments
    from llmgw_twin.twin.scenario.loader import load_scenario
    from llmgw_twin.twin.world.runner import run_scenario

    scenario = load_scenario(Path(__file__).resolve().parents[1] / "scenarios/burst-queues.yaml")
    (model,) = scenario.engine_model
    argv = next(e.get("argv") for e in run_scenario(scenario).trace if e.kind == "shard.started")
    assert isinstance(argv, tuple) and argv[1] == "sim-engine"
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    perf = parser.parse_args([str(a) for a in argv[2:]]).perf_model
    fields = ("iteration_us", "prefill_us_per_token", "decode_us_per_token", "max_batch")
    assert [getattr(perf, f) for f in (*fields, "kv_tokens")] == [
        getattr(model.perf, f) for f in (*fields, "kv_tokens")
    ]


def test_ignore_eos_runs_the_answer_to_its_cap() -> None:
    from llmgw_twin.programs.sim_text import generate

    assert len(generate("m", "hi", 200).tokens) <= 40
    assert len(generate("m", "hi", 200, ignore_eos=True).tokens) == 200
    assert generate("m", "hi", 5, ignore_eos=True) == generate("m", "hi", 5)
    app, _ = _app(PERF)
    (r,) = _post(app, [{**_chat(1), "max_tokens": 90, "ignore_eos": True}])
    assert r.json()["usage"]["completion_tokens"] == 90
