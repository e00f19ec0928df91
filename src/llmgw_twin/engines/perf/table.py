"""The engine performance model's coefficients, as data: one `EnginePerf` per engine, model and
GPU kind, named `ENGINE/MODEL/GPU`.

Each entry says where its numbers come from. `assumed` entries are estimates from the model's
size and the GPU's published throughput (weights and KV cache per token from the architecture,
prefill at about half the GPU's dense fp16 rate, a decode step bound by reading the weights);
`calibrated` entries were fitted by `llmgw-twin calibrate` against the engine itself
(`docs/engine-model.md`). A scenario names an entry under `engine_model`, and may override any
coefficient there.

Invariants: names are unique and of the form `ENGINE/MODEL/GPU`; every entry is a valid
`EnginePerf` (checked when this module is imported).
"""

from __future__ import annotations

from fractions import Fraction

from llmgw_twin.engines.perf.model import EnginePerf


def _entry(
    name: str, a_us: str, b_us: str, c_us: str, batch: int, kv: int, source: str
) -> EnginePerf:
    return EnginePerf(name, Fraction(a_us), Fraction(b_us), Fraction(c_us), batch, kv, source)


ENTRIES: tuple[EnginePerf, ...] = (
    _entry(
        "sim/any/any",
        "1800",
        "1125",
        "200",
        64,
        65_536,
        "assumed: at a batch of one, a 16-token prompt's first token in 20 ms and 2 ms a token "
        "after it, the twin's fixed answer time without a model",
    ),
    _entry(
        "vllm/llama-3-8b/h100",
        "6500",
        "60",
        "30",
        256,
        420_000,
        "assumed: 16 GB of fp16 weights read per decode step at ~2.5 TB/s; 128 KiB of KV cache "
        "a token in ~54 GB left free",
    ),
    _entry(
        "vllm/llama-3-70b/h100x8",
        "25000",
        "300",
        "100",
        256,
        1_400_000,
        "assumed: 140 GB of fp16 weights over 8 GPUs; 320 KiB of KV cache a token in ~450 GB",
    ),
    _entry(
        "sglang/llama-3-8b/h100",
        "6000",
        "55",
        "28",
        256,
        430_000,
        "assumed: as vllm/llama-3-8b/h100, slightly faster scheduling",
    ),
    _entry(
        "llamacpp/tiny/cpu",
        "2000",
        "20",
        "300",
        4,
        4_096,
        "assumed: the project's tiny random-weight model on this machine's CPU, 4 slots of "
        "llama-server's default context; run `llmgw-twin calibrate` for measured figures",
    ),
)

TABLE: dict[str, EnginePerf] = {e.name: e for e in ENTRIES}
assert len(TABLE) == len(ENTRIES), "engine performance entries must have unique names"


FIELDS = ("iteration_us", "prefill_us_per_token", "decode_us_per_token", "max_batch", "kv_tokens")


def perf_arg(perf: EnginePerf) -> str:
    """`perf` as one command-line value: `iteration_us=1800,...,kv_tokens=65536` (exact)."""
    return ",".join(f"{name}={getattr(perf, name)}" for name in FIELDS)


def perf_from_arg(text: str) -> EnginePerf:
    """An entry's name, or `perf_arg`'s form (every field; numbers may be decimals or
    fractions); ValueError saying what is wrong otherwise."""
    if "=" not in text:
        try:
            return perf_named(text)
        except KeyError as err:
            raise ValueError(err.args[0]) from None
    values: dict[str, str] = {}
    for part in text.split(","):
        name, _, value = part.partition("=")
        if name.strip() not in FIELDS:
            raise ValueError(f"unknown field '{name.strip()}' (expected {', '.join(FIELDS)})")
        values[name.strip()] = value.strip()
    missing = [f for f in FIELDS if f not in values]
    if missing:
        raise ValueError(f"missing {', '.join(missing)}")
    try:
        a, b, c = (Fraction(values[f]) for f in FIELDS[:3])
        batch, kv = int(values["max_batch"]), int(values["kv_tokens"])
    except (ValueError, ZeroDivisionError):
        raise ValueError(f"'{text}' has a field that is not a number") from None
    return EnginePerf("command line", a, b, c, batch, kv, "the command line")


def perf_named(name: str) -> EnginePerf:
    """The entry called `name`; KeyError naming the known ones otherwise."""
    try:
        return TABLE[name]
    except KeyError:
        raise KeyError(
            f"no engine performance entry '{name}' (known: {', '.join(TABLE)})"
        ) from None
