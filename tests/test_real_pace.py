"""A straggler done for real (`realmode/pace.py`): `slow_node` sets the node's pace in its pace
file, its sim worker loads that many times as long and is ready only then (its ready file), so
the replica is ready late while its leader served on time; later, the answers of the replica
with a shard there take the worker's pace, told to the leader as it changes. The same file runs
in the twin and on real processes, which must make the same control decisions;
`slow-node.yaml` and `nvlink-degraded.yaml` run in the real suite (`tests/test_real_suite.py`).
"""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path
from typing import Any

from llmgw_twin.programs.sim_pace import slowed_ms
from llmgw_twin.twin.scenario.loader import load_scenario_text
from llmgw_twin.twin.scenario.timescale import scale_scenario
from test_real_faults import SCALE, both, decisions, events
from test_real_mode import own_tmp

__all__ = ["own_tmp"]  # a fixture, used by name

SLOW_WORKER = """
name: real-slow-worker
duration: 1m30s
cluster:
  fabrics: {ib-a: [node01, node02]}
profiles:
  two: {engine: sim, nodes: 2, gpus_per_node: 8, load_time: 10s, model: /models/two}
deployments: [{model: big, profile: two, replicas: 1}]
engine_model:
  two: {base: vllm/llama-3-8b/h100, max_batch: 16}
traffic:
  - {model: big, rate: 1/s, input_tokens: 200, tokens: 8}
faults:
  - {id: slow, at: start, slow_node: {node: node02, factor: 3, for: 25s}}
  - {id: crawl, at: 40s, slow_node: {node: node02, factor: 100, for: 50s}}
expect:
  - {event: shard.serving, node: node01, within: [slow+10s, slow+13s]}
  - {event: replica.ready, model: big, within: [slow+30s, slow+33s]}
  - {event: node.suspect, within: [start, end], never: true}
  - {event: replica.failed, within: [start, end], never: true}
  - {at: end, ready_replicas: {big: 1}}
"""


def test_a_slow_worker_delays_its_replica_and_slows_the_answers_it_takes_part_in(
    own_tmp: Path,
) -> None:
    """node02 holds rank 1. Slowed 3 times from the start, its worker loads 30 s where its
    leader on node01 loads 10 s: the replica is ready only when both have. Slowed 100 times
    from 40 s on, every answer the replica gives after that has its prefill take 100 times as
    long: the TTFT of most of them is at least that (a wait never ends early), where at pace 1
    it is a hundredth of it."""
    twin, real = both(SLOW_WORKER)
    assert decisions(real.trace, real.scenario.duration_ms) == twin
    (placed,) = events(real, "replica.placed")
    assert placed.get("nodes") == ("node01", "node02")  # node02 the worker
    (ready,) = events(real, "replica.ready")
    # the worker's load counts from its process's start, after the placement
    assert ready.t_ms - placed.t_ms >= slowed_ms(int(10_000 * SCALE), Fraction(3))

    assert real.latency is not None
    big: dict[str, Any] = real.latency["big"]
    assert big["served"]
    # the engine model's times are scaled with the file's (`twin/scenario/timescale.py`)
    (model,) = scale_scenario(load_scenario_text(SLOW_WORKER, "t.yaml"), SCALE).engine_model
    prefill_ms = model.perf.iteration(200, 0, Fraction(100)) / 1000
    # most requests served arrived after 40 s (4 s scaled: 5 s of arrivals, against about
    # 1 s of them between the replica's readiness and then)
    assert big["ttft_ms"]["p50"] >= prefill_ms
