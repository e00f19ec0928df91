"""Each node's recent instability: a decaying score placement breaks its last ties with.

A node that was lost, rebooted (registered again as a new agent process) or went unheard gains
weight (`WEIGHTS`); the score halves every `half_life_ms` (`Timings.node_history_half_life_ms`).
Placement reads `risk`: the nodes whose score is at least `FLOOR` now, each with its score; every
other node counts as stable (0). A placement that ties on every packing criterion (room lost,
spread, tightest fit) takes the least unstable node, then the first by name
(docs/placement.md). A node whose score decays below the floor is forgotten.

Scores are floats worked out from integer times alone (`score * 2 ** (-elapsed / half_life)`),
so the same events at the same times give the same choices. Decay never reorders two nodes
(both decay by the same factor); only falling below the floor changes the ranking, and that is
judged when the controller `advance`s the book (before each placement pass).

Invariant: `risk` holds exactly the remembered nodes whose score was at least `FLOOR` at the last
`advance` or mark; a node is remembered only while it is.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from llmgw_twin.control.model import NodeId

WEIGHTS: dict[str, float] = {"lost": 1.0, "rebooted": 1.0, "unheard": 0.5}
"""What each kind of event adds to a node's instability."""

FLOOR = 0.05
"""Below this a node's history no longer counts: one loss is remembered a little over four
half-lives."""

_NOUNS = {"lost": "loss(es)", "rebooted": "reboot(s)", "unheard": "unheard spell(s)"}


@dataclass(slots=True)
class _History:
    score: float
    at_ms: int
    last: tuple[str, int]
    counts: dict[str, int] = field(default_factory=dict)


class Stability:
    def __init__(self, half_life_ms: int = 600_000) -> None:
        self.half_life_ms = half_life_ms
        self._nodes: dict[NodeId, _History] = {}
        self.risk: dict[NodeId, float] = {}
        """The nodes placement passes over when the packing ties: node -> instability."""

    def _decayed(self, h: _History, now_ms: int) -> float:
        elapsed = max(now_ms - h.at_ms, 0)
        return h.score * float(2.0 ** (-elapsed / self.half_life_ms))

    def mark(self, node: NodeId, kind: str, now_ms: int) -> None:
        """`node` was lost, rebooted or went unheard (a key of `WEIGHTS`) at `now_ms`."""
        h = self._nodes.get(node)
        score = WEIGHTS[kind] + (self._decayed(h, now_ms) if h is not None else 0.0)
        if h is None:
            h = self._nodes[node] = _History(score, now_ms, (kind, now_ms))
        h.score, h.at_ms, h.last = score, max(now_ms, h.at_ms), (kind, now_ms)
        h.counts[kind] = h.counts.get(kind, 0) + 1
        self.risk[node] = score

    def advance(self, now_ms: int) -> None:
        """Decay every remembered node to `now_ms`; forget those below the floor."""
        for node in list(self._nodes):
            score = self._decayed(self._nodes[node], now_ms)
            if score < FLOOR:
                del self._nodes[node]
                self.risk.pop(node, None)
            else:
                self.risk[node] = score

    def score(self, node: NodeId, now_ms: int) -> float:
        h = self._nodes.get(node)
        if h is None:
            return 0.0
        score = self._decayed(h, now_ms)
        return score if score >= FLOOR else 0.0

    def forget(self, node: NodeId) -> None:
        self._nodes.pop(node, None)
        self.risk.pop(node, None)

    def remembered(self) -> list[NodeId]:
        return sorted(self._nodes)

    def describe(self, node: NodeId, now_ms: int) -> str | None:
        """`instability 1.46: 1 loss(es), 1 unheard spell(s); last lost at 182.0 s` (None:
        stable)."""
        h = self._nodes.get(node)
        score = self.score(node, now_ms)
        if h is None or score == 0.0:
            return None
        counts = ", ".join(f"{n} {_NOUNS[k]}" for k, n in sorted(h.counts.items()))
        kind, t_ms = h.last
        return f"instability {score:.2f}: {counts}; last {kind} at {t_ms / 1000:.1f} s"
