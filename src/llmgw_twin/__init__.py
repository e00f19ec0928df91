"""llmgw-twin: a control plane for LLM replicas on GPU fabrics, and its deterministic twin."""

from __future__ import annotations

DISTRIBUTION = "llmgw-twin"
"""The distribution whose installed metadata holds the version (`pyproject.toml`'s)."""


def __getattr__(name: str) -> str:
    # `__version__` is read from the installed distribution's metadata, so it cannot drift from
    # pyproject.toml; looked up only when asked for, since importlib.metadata costs tens of ms
    # at start-up and most processes of the project (engines, sidecars) never ask.
    if name == "__version__":
        from importlib.metadata import PackageNotFoundError, version

        try:
            return version(DISTRIBUTION)
        except PackageNotFoundError:  # a source tree on sys.path, never installed
            return "0+unknown"
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
