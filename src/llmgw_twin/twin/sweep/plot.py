"""A sweep's table (text) and plot (one standalone SVG).

Role: `table` prints a row per grid point, each figure as its mean over the seeds with the
least and most beside it; `svg` draws a panel per figure, the first grid key along x (its
values in the order given), a line per combination of the other keys, each point the mean with
a bar from least to most. Pure text out: the caller writes it.
"""

from __future__ import annotations

from html import escape

from llmgw_twin.twin.sweep.grid import Point, label
from llmgw_twin.twin.sweep.measure import METRICS, Figure

COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#17becf", "#7f7f7f")


def _num(v: float | None, key: str) -> str:
    if v is None:
        return "-"
    if key in ("passed", "slo_met"):
        return f"{v:.0%}"
    return f"{v:,.0f}" if abs(v) >= 10 or v == int(v) else f"{v:.2f}"


def _cell(f: Figure, key: str) -> str:
    text = _num(f.mean, key)
    if f.least is not None and f.least != f.most and key not in ("passed", "slo_met"):
        text += f" [{_num(f.least, key)}-{_num(f.most, key)}]"
    if f.missing:
        text += f" ({f.missing} none)"
    return text


def shown(rows: list[tuple[Point, dict[str, Figure]]]) -> list[tuple[str, str]]:
    """The figures some point has a value for (no TTFT column for a file without latencies)."""
    return [(k, h) for k, h in METRICS if any(fig[k].mean is not None for _, fig in rows)]


def table(rows: list[tuple[Point, dict[str, Figure]]]) -> str:
    metrics = shown(rows)
    heads = ["point", *(h for _, h in metrics)]
    cells = [[label(p), *(_cell(fig[k], k) for k, _ in metrics)] for p, fig in rows]
    widths = [max(len(r[i]) for r in [heads, *cells]) for i in range(len(heads))]
    lines = ["  ".join(h.ljust(w) for h, w in zip(heads, widths, strict=True))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in cells]
    return "\n".join(line.rstrip() for line in lines)


PANEL_W, PANEL_H, PAD = 320, 180, 40


def svg(rows: list[tuple[Point, dict[str, Figure]]], title: str) -> str:
    """One panel per figure but `passed`, side by side in rows of three."""
    first_values: list[str] = []
    for point, _ in rows:
        if point[0][1] not in first_values:
            first_values.append(point[0][1])
    series: dict[str, list[tuple[int, Figure | None, dict[str, Figure]]]] = {}
    for point, fig in rows:
        rest = label(point[1:]) or "all"
        series.setdefault(rest, []).append((first_values.index(point[0][1]), None, fig))
    metrics = [(k, h) for k, h in shown(rows) if k != "passed"]
    cols = 3
    width = cols * (PANEL_W + PAD) + PAD
    legend_h = 18 * len(series) + 10
    height = ((len(metrics) + cols - 1) // cols) * (PANEL_H + 2 * PAD) + 40 + legend_h
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'font-family="sans-serif" font-size="11">',
        f'<text x="{PAD}" y="20" font-size="14">{escape(title)}</text>',
    ]
    x_key = rows[0][0][0][0]
    for i, (key, head) in enumerate(metrics):
        ox = PAD + (i % cols) * (PANEL_W + PAD)
        oy = 40 + (i // cols) * (PANEL_H + 2 * PAD)
        values = [
            v
            for pts in series.values()
            for _, _, fig in pts
            for v in (fig[key].least, fig[key].most, fig[key].mean)
            if v is not None
        ]
        most = max(values, default=0.0)
        top = most or 1.0

        def xy(
            ix: int, v: float, ox: int = ox, oy: int = oy, top: float = top
        ) -> tuple[float, float]:
            x = ox + (ix + 0.5) * PANEL_W / max(len(first_values), 1)
            return x, oy + PANEL_H - v * PANEL_H / top

        out.append(
            f'<rect x="{ox}" y="{oy}" width="{PANEL_W}" height="{PANEL_H}" fill="none" '
            'stroke="#ccc"/>'
        )
        out.append(f'<text x="{ox}" y="{oy - 6}">{escape(head)} (most {_num(most, key)})</text>')
        for ix, value in enumerate(first_values):
            x, _ = xy(ix, 0)
            out.append(
                f'<text x="{x:.1f}" y="{oy + PANEL_H + 14}" text-anchor="middle">'
                f"{escape(value)}</text>"
            )
        out.append(
            f'<text x="{ox + PANEL_W / 2:.1f}" y="{oy + PANEL_H + 28}" text-anchor="middle" '
            f'fill="#666">{escape(x_key)}</text>'
        )
        for n, pts in enumerate(series.values()):
            colour = COLOURS[n % len(COLOURS)]
            line = []
            for ix, _, fig in pts:
                f = fig[key]
                if f.mean is None:
                    continue
                x, y = xy(ix, f.mean)
                line.append(f"{x:.1f},{y:.1f}")
                if f.least is not None and f.most is not None and f.least != f.most:
                    _, y0 = xy(ix, f.least)
                    _, y1 = xy(ix, f.most)
                    out.append(
                        f'<line x1="{x:.1f}" y1="{y0:.1f}" x2="{x:.1f}" y2="{y1:.1f}" '
                        f'stroke="{colour}" stroke-opacity="0.5"/>'
                    )
                out.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2.5" fill="{colour}"/>')
            if len(line) > 1:
                out.append(
                    f'<polyline points="{" ".join(line)}" fill="none" stroke="{colour}" '
                    'stroke-width="1.5"/>'
                )
    ly = height - legend_h + 10
    for n, name in enumerate(series):
        colour = COLOURS[n % len(COLOURS)]
        y = ly + 18 * n
        out.append(f'<rect x="{PAD}" y="{y - 9}" width="10" height="10" fill="{colour}"/>')
        out.append(f'<text x="{PAD + 16}" y="{y}">{escape(name)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"
