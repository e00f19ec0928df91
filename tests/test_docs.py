"""The reference tables of docs/scenarios.md name exactly what the code defines."""

from __future__ import annotations

import re
from pathlib import Path

from llmgw_twin.control.model import CONTROL_EVENT_KINDS
from llmgw_twin.twin.scenario.loader import TIMING_KEYS

DOC = (Path(__file__).resolve().parents[1] / "docs" / "scenarios.md").read_text(encoding="utf-8")


def _first_cells(heading: str) -> set[str]:
    """The backquoted first cell of every row of the first table after `heading`."""
    after = DOC[DOC.index(heading) :]
    rows = re.findall(r"^\| `([a-z_.]+)`", after[: after.index("\n\n", after.index("| ---"))], re.M)
    return set(rows)


def test_every_timing_key_has_a_row_and_every_row_is_a_key() -> None:
    assert _first_cells("| key | meaning | default |") == {k.key for k in TIMING_KEYS}


def test_every_event_kind_has_a_row() -> None:
    firsts = re.findall(r"^\| (`[^|]*`) \|", DOC, re.M)
    rows = {kind for cell in firsts for kind in re.findall(r"`([a-z]+\.[a-z_]+)`", cell)}
    assert set(CONTROL_EVENT_KINDS) <= rows
