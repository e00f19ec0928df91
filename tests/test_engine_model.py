"""The engine performance model (`engines/perf/model.py`): continuous batching with a batch limit
and a KV cache that queues, in exact time; checked on literal cases and against a naive
iteration-by-iteration reference."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmgw_twin.engines.perf.model import BatchEngine, EnginePerf, Served
from llmgw_twin.engines.perf.table import ENTRIES, TABLE, perf_named

PERF = EnginePerf("t", Fraction(1000), Fraction(10), Fraction(100), max_batch=4, kv_tokens=1000)


def _run(perf: EnginePerf, reqs: list[tuple[int, int, int]], step_us: int = 0) -> list[Served]:
    """Submit (arrival, prompt, output) in order and run to the end; `step_us` > 0 also
    advances at every multiple of it (which must change nothing)."""
    engine = BatchEngine(perf)
    out: list[Served] = []
    t = 0
    for key, (at, prompt, output) in enumerate(reqs):
        if step_us:
            while t + step_us < at:
                t += step_us
                out += engine.advance(t)
        assert engine.submit(key, at, prompt, output)
    while (nxt := engine.next_done_us()) is not None:
        out += engine.advance(nxt)
    return out


def _reference(perf: EnginePerf, reqs: list[tuple[int, int, int]]) -> dict[int, tuple[int, ...]]:
    """One iteration at a time, as the docstring says: key -> (admitted, first token, done)."""
    pending = sorted(range(len(reqs)), key=lambda k: (reqs[k][0], k))
    queue: list[int] = []
    running: dict[int, int] = {}  # key -> tokens produced
    kv = 0
    t = 0
    times: dict[int, list[int]] = {}
    while pending or queue or running:
        if not queue and not running:
            t = max(t, reqs[pending[0]][0])
        while pending and reqs[pending[0]][0] <= t:
            queue.append(pending.pop(0))
        admitted: list[int] = []
        while queue and len(running) + len(admitted) < perf.max_batch:
            need = reqs[queue[0]][1] + reqs[queue[0]][2]
            if kv + need > perf.kv_tokens:
                break
            kv += need
            admitted.append(queue.pop(0))
        decoding = list(running)
        end = t + perf.iteration(sum(reqs[k][1] for k in admitted), len(decoding))
        for k in admitted:
            times[k] = [t, end]
            running[k] = 1
        for k in decoding:
            running[k] += 1
        for k in sorted(running, key=lambda k: (times[k][0], reqs[k][0], k)):
            if running[k] == reqs[k][2]:
                del running[k]
                kv -= reqs[k][1] + reqs[k][2]
                times[k].append(end)
        t = end
    return {k: tuple(v) for k, v in times.items()}


def test_one_request_alone() -> None:
    (s,) = _run(PERF, [(5_000, 50, 10)])
    assert s.admitted_us == 5_000 and s.queued_us == 0
    assert s.ttft_us == 1000 + 10 * 50
    assert s.e2e_us == 1500 + 9 * (1000 + 100)
    assert s.tbt_us == 1100


def test_a_single_token_ends_with_its_prefill() -> None:
    (s,) = _run(PERF, [(0, 7, 1)])
    assert s.done_us == s.first_token_us == 1070 and s.tbt_us == 0


def test_the_batch_limit_queues_the_fifth() -> None:
    served = {s.key: s for s in _run(PERF, [(0, 10, 3)] * 4 + [(0, 10, 3)])}
    assert [served[k].queued_us for k in range(4)] == [0, 0, 0, 0]
    first_four_done = served[0].done_us
    assert served[4].admitted_us == first_four_done  # admitted when a place came free
    assert served[4].ttft_us > served[0].ttft_us


def test_a_full_cache_queues_until_a_request_leaves() -> None:
    perf = EnginePerf("kv", Fraction(1000), Fraction(0), Fraction(0), max_batch=8, kv_tokens=100)
    served = {s.key: s for s in _run(perf, [(0, 30, 30), (0, 30, 30)])}
    assert served[0].queued_us == 0
    assert served[1].admitted_us == served[0].done_us == 30_000
    assert served[1].done_us == 60_000


def test_a_request_larger_than_the_cache_is_refused() -> None:
    engine = BatchEngine(PERF)
    assert not engine.submit(1, 0, 990, 11)
    assert engine.next_done_us() is None and engine.queued == 0
    assert engine.submit(2, 0, 990, 10)


def test_an_arrival_during_an_iteration_joins_the_next() -> None:
    served = {s.key: s for s in _run(PERF, [(0, 0, 5), (1, 0, 5)])}
    assert served[1].admitted_us == served[0].first_token_us == 1000


def test_cancel_frees_the_cache_and_the_batch() -> None:
    perf = EnginePerf("kv", Fraction(1000), Fraction(0), Fraction(0), max_batch=8, kv_tokens=100)
    engine = BatchEngine(perf)
    engine.submit(1, 0, 30, 30)
    engine.submit(2, 0, 30, 30)
    assert engine.queued == 2  # admitted when the iteration starts, not before
    assert engine.advance(1) == [] and engine.queued == 1 and engine.kv_used == 60
    engine.cancel(1, 5_500)
    assert engine.kv_used == 0 and engine.running == 0
    nxt = engine.next_done_us()
    assert nxt == 6_000 + 30_000  # admitted at the next iteration's start
    (s,) = engine.advance(nxt)
    assert s.key == 2 and s.admitted_us == 6_000


def test_a_straggler_slows_every_iteration() -> None:
    engine = BatchEngine(PERF)
    engine.slow = Fraction(3, 2)
    engine.submit(1, 0, 0, 2)
    (s,) = engine.advance(10_000)
    assert (s.first_token_us, s.done_us) == (1500, 1500 + 1650)


_REQS = st.lists(
    st.tuples(st.integers(0, 40_000), st.integers(0, 300), st.integers(1, 40)),
    min_size=1,
    max_size=25,
).map(lambda rs: sorted(rs, key=lambda r: r[0]))
_PERFS = st.builds(
    EnginePerf,
    st.just("p"),
    st.fractions(0, 3000, max_denominator=7),
    st.fractions(0, 40, max_denominator=3),
    st.fractions(1, 400, max_denominator=5),
    st.integers(1, 6),
    st.integers(341, 2000),
)


@settings(max_examples=150, deadline=None)
@given(_PERFS, _REQS, st.integers(1, 3000))
def test_the_model_is_the_naive_iteration_loop(
    perf: EnginePerf, reqs: list[tuple[int, int, int]], step: int
) -> None:
    want = _reference(perf, reqs)
    for got in (_run(perf, reqs), _run(perf, reqs, step)):
        assert {s.key: (s.admitted_us, s.first_token_us, s.done_us) for s in got} == want
        assert [s.done_us for s in got] == sorted(s.done_us for s in got)


@settings(max_examples=100, deadline=None)
@given(_PERFS, _REQS, st.tuples(st.integers(0, 300), st.integers(1, 40)))
def test_more_load_never_makes_a_request_faster(
    perf: EnginePerf, reqs: list[tuple[int, int, int]], extra: tuple[int, int]
) -> None:
    """Requests that arrive together, and one more after them: none of the first is served
    sooner. (With arrivals spread out it may be: a request that lengthens an iteration can move
    the iteration grid so that a later arrival catches an earlier iteration.)"""
    together = [(0, p, o) for _, p, o in reqs]
    before = {s.key: s for s in _run(perf, together)}
    after = {s.key: s for s in _run(perf, [*together, (0, *extra)])}
    for k, s in before.items():
        assert after[k].first_token_us >= s.first_token_us and after[k].done_us >= s.done_us


@settings(max_examples=50, deadline=None)
@given(_PERFS, st.integers(1, 30), st.integers(0, 200), st.integers(1, 30))
def test_the_slowest_of_a_burst_grows_with_the_burst(
    perf: EnginePerf, n: int, prompt: int, output: int
) -> None:
    def slowest(k: int) -> tuple[int, int]:
        served = _run(perf, [(0, prompt, output)] * k)
        return max(s.ttft_us for s in served), max(s.e2e_us for s in served)

    small, big = slowest(n), slowest(n + 1)
    assert big[0] >= small[0] and big[1] >= small[1]


def test_the_table_is_valid_data() -> None:
    assert len(TABLE) == len(ENTRIES) >= 4
    for entry in ENTRIES:
        assert entry.name.count("/") == 2 and entry.source
    assert perf_named("sim/any/any").max_batch == 64
    with pytest.raises(KeyError, match="known: sim/any/any"):
        perf_named("nope")


def test_the_sim_entry_answers_as_the_fixed_model_at_a_batch_of_one() -> None:
    (s,) = _run(perf_named("sim/any/any"), [(0, 16, 32)])
    assert s.ttft_us == 19_800 and s.tbt_us == 2_000
