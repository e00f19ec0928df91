"""Adapter lookup by engine name: one adapter per engine the control plane knows.

Invariant: the registered names are exactly `control.model.ENGINES`, so an engine a profile can
name is an engine the agent can launch and `engine-check` can check.
"""

from __future__ import annotations

from llmgw_twin.control.model import ENGINES
from llmgw_twin.engines.base import EngineAdapter
from llmgw_twin.engines.llamacpp import LlamaCppAdapter
from llmgw_twin.engines.sglang import SglangAdapter
from llmgw_twin.engines.sim import SimAdapter
from llmgw_twin.engines.vllm import VllmAdapter

_ADAPTERS: dict[str, EngineAdapter] = {
    a.name: a for a in (SimAdapter(), LlamaCppAdapter(), VllmAdapter(), SglangAdapter())
}
assert tuple(sorted(_ADAPTERS)) == tuple(sorted(ENGINES)), "one adapter per known engine"


def adapter_for(engine: str) -> EngineAdapter:
    try:
        return _ADAPTERS[engine]
    except KeyError:
        known = ", ".join(sorted(_ADAPTERS))
        raise KeyError(f"no adapter for engine {engine!r} (have: {known})") from None


def engine_names() -> tuple[str, ...]:
    return tuple(sorted(_ADAPTERS))
