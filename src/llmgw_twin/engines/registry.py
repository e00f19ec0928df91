"""Adapter lookup by engine name."""

from __future__ import annotations

from llmgw_twin.engines.base import EngineAdapter
from llmgw_twin.engines.sim import SimAdapter

_ADAPTERS: dict[str, EngineAdapter] = {"sim": SimAdapter()}


def adapter_for(engine: str) -> EngineAdapter:
    try:
        return _ADAPTERS[engine]
    except KeyError:
        known = ", ".join(sorted(_ADAPTERS))
        raise KeyError(f"no adapter for engine {engine!r} (have: {known})") from None
