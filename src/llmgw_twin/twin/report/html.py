"""One self-contained HTML page of a twin run (docs/reports.md).

`render_html(result)` returns the page as a string; the caller writes it (the twin does no file
I/O). The page needs nothing but itself: the CSS and the little JS it has are inline
(`twin/report/assets.py`) and the chart is HTML boxes positioned in percent of the run's virtual
duration. Every piece of text from the scenario or the trace is escaped, attributes included.
The page is a function of the run alone (no wall time, no date), so the same scenario and seed
give the same bytes.
"""

from __future__ import annotations

import html
import shlex
from collections.abc import Iterable

from llmgw_twin.control.model import TraceEvent
from llmgw_twin.twin.report import capacity
from llmgw_twin.twin.report.assets import LEGEND, PAGE_CSS, PAGE_JS
from llmgw_twin.twin.report.capacity import BARS, Series
from llmgw_twin.twin.report.lanes import Lane, Lanes, Mark, Seg, fault_id
from llmgw_twin.twin.report.text import describe
from llmgw_twin.twin.scenario.model import EventExpectation, Expectation, StateExpectation
from llmgw_twin.twin.world.expect import matches
from llmgw_twin.twin.world.faults import fault_subjects
from llmgw_twin.twin.world.runner import RunResult
from llmgw_twin.units import fmt_duration, fmt_ms

_TICK_STEPS_MS = (
    *(100, 200, 500),
    *(1_000, 2_000, 5_000, 10_000, 15_000, 30_000),
    *(60_000, 120_000, 300_000, 600_000, 900_000, 1_800_000),
    *(3_600_000, 7_200_000, 21_600_000, 43_200_000, 86_400_000),
)
_COUNT_ORDER = (
    "sent",
    "served",
    "failed",
    "failed_in_flight",
    "failed_no_replica",
    "retried",
    "ejections",
)


def esc(value: object) -> str:
    return html.escape(str(value), quote=True)


def tag(name: str, attrs: dict[str, str], inner: str = "") -> str:
    """`<name attrs>inner</name>`, every attribute value escaped (`inner` is already HTML)."""
    text = "".join(f' {k}="{esc(v)}"' for k, v in attrs.items())
    return f"<{name}{text}>{inner}</{name}>"


def _table(section: str, head: Iterable[str], rows: Iterable[str]) -> str:
    ths = "".join(f"<th>{esc(h)}</th>" for h in head)
    table = f"<table><tr>{ths}</tr>{''.join(rows)}</table>"
    return tag("section", {"id": section}, f"<h2>{esc(section)}</h2>{table}")


def _result(passed: bool) -> str:
    return "pass" if passed else "fail"


def _spark(figures: dict[str, object]) -> str:
    """The TTFT p99 of each span of the run as a bar, scaled to the highest, and that highest."""
    over = figures.get("over_time")
    values = over.get("ttft_p99_ms") if isinstance(over, dict) else None
    if not isinstance(values, list) or not values:
        return ""
    top = max(float(v) for v in values) or 1.0
    bars = "".join(BARS[round(float(v) * (len(BARS) - 1) / top)] for v in values)
    return f"{bars} (highest {top:g} ms)"


class _Page:
    def __init__(self, result: RunResult) -> None:
        self.result = result
        self.sc = result.scenario
        self.dur = max(1, result.scenario.duration_ms)
        self.judged = list(zip(self.sc.expectations, result.expectations, strict=True))

    def pct(self, t_ms: int) -> str:
        return f"{min(max(t_ms, 0), self.dur) * 100 / self.dur:.4f}%"

    def at(self, t_ms: int) -> str:
        return f"left:{self.pct(t_ms)}"

    def box(self, start_ms: int, end_ms: int) -> str:
        start, end = min(max(start_ms, 0), self.dur), min(max(end_ms, 0), self.dur)
        return f"left:{self.pct(start)};width:{self.pct(max(0, end - start))}"

    # --- the chart --------------------------------------------------------------------------

    def seg(self, seg: Seg, cls: str = "seg") -> str:
        shard = "data-shard" in seg.attrs
        attrs = {
            "class": f"{cls} s-{seg.state}" + (" shard" if shard else ""),
            "data-state": seg.state,
            "data-start-ms": str(seg.start_ms),
            "data-end-ms": str(seg.end_ms),
            **seg.attrs,
        }
        inner = ""
        if shard:
            ready = seg.end_ms if seg.ready_ms is None else min(seg.ready_ms, seg.end_ms)
            loading = (ready - seg.start_ms) * 100 / max(1, seg.end_ms - seg.start_ms)
            attrs["data-ready-ms"] = "" if seg.ready_ms is None else str(seg.ready_ms)
            inner = f'<i class="load" style="width:{loading:.4f}%"></i>'
        attrs |= {"style": self.box(seg.start_ms, seg.end_ms), "title": seg.tip}
        return tag("div", attrs, f"{inner}<span>{esc(seg.label)}</span>")

    def mark(self, mark: Mark) -> str:
        attrs = {
            "class": "fault" if mark.kind == "fault" else "mark",
            "data-kind": mark.kind,
            "data-t-ms": str(mark.t_ms),
            **mark.attrs,
            "style": self.at(mark.t_ms),
            "title": mark.tip,
        }
        return tag("div", attrs)

    def lane(self, lane: Lane, rows: Iterable[tuple[str, list[Seg]]], **extra: str) -> str:
        label = f"<b>{esc(lane.title)}</b><small>{esc(lane.subtitle)}</small>"
        parts = [tag("div", {"class": "label", "title": f"{lane.title} {lane.subtitle}"}, label)]
        if lane.spans:
            spans = "".join(self.seg(s, "seg fspan") for s in lane.spans)
            parts.append(tag("div", {"class": "row", "data-row": "faults"}, spans))
        for name, segs in rows:
            parts.append(
                tag("div", {"class": "row", "data-row": name}, "".join(map(self.seg, segs)))
            )
        parts.extend(self.mark(m) for m in lane.marks)
        track = tag("div", {"class": "track"}, "".join(parts[1:]))
        return tag("div", {"class": "lane", "data-lane": lane.key, **extra}, parts[0] + track)

    def axis(self) -> str:
        step = next((s for s in _TICK_STEPS_MS if self.dur / s <= 12), _TICK_STEPS_MS[-1])
        parts = [
            tag("div", {"class": "tick", "style": self.at(t)}, f"<span>{fmt_duration(t)}</span>")
            for t in range(0, self.dur + 1, step)
        ]
        for i, (exp, outcome) in enumerate(self.judged):
            start, end = window(exp, self.sc.duration_ms)
            result = _result(outcome.passed)
            attrs = {"class": f"xshade x-{result}", "data-expectation": str(i)}
            attrs |= {"data-result": result, "style": self.box(start, end)}
            parts.append(tag("div", attrs))
        for i, fault in enumerate(self.sc.faults):
            fid, action = fault_id(fault, i), str(fault_subjects(fault)["action"])
            tip = f"{fmt_ms(fault.at_ms)} fault {fid}: {action} (line {fault.line})"
            attrs = {"class": "fault axis-fault", "data-fault": fid, "data-action": action}
            attrs |= {"data-t-ms": str(fault.at_ms), "style": self.at(fault.at_ms), "title": tip}
            parts.append(tag("div", attrs, f"<span>{esc(fid)}</span>"))
        label = '<div class="label">virtual time</div>'
        track = tag("div", {"class": "track"}, "".join(parts))
        return tag("div", {"class": "lane axis", "id": "axis", "data-lane": "axis"}, label + track)

    def windows(self) -> str:
        lanes = []
        for i, (exp, outcome) in enumerate(self.judged):
            start, end = window(exp, self.sc.duration_ms)
            result = _result(outcome.passed)
            kind = "instant" if isinstance(exp, StateExpectation) else "window"
            style = self.box(start, end)
            if start == end:  # an instant: a mark 12 px wide (assets.py), kept inside the track
                kind = "instant" + (" at-end" if end >= self.dur else "")
                kind += " at-start" if start <= 0 else ""
                style = self.at(start)
            attrs = {"class": f"xwin x-{result} {kind}", "data-expectation": str(i)}
            attrs |= {"data-result": result, "data-start-ms": str(start), "data-end-ms": str(end)}
            attrs |= {"style": style, "title": f"{exp.text}\n{outcome.message}"}
            parts = [tag("div", attrs)]
            if isinstance(exp, EventExpectation):
                parts.extend(self.hit(ev, exp) for ev in self.result.trace if matches(ev, exp))
            label = f'<b class="r-{result}">{result.upper()}</b>'
            label += f"<small>line {exp.line}: {esc(shorten(exp.text))}</small>"
            tip = f"line {exp.line}: {exp.text}"
            inner = tag("div", {"class": "label", "title": tip}, label)
            inner += tag("div", {"class": "track"}, "".join(parts))
            attrs = {"class": "lane xlane", "data-lane": f"expectation:{i}"}
            lanes.append(
                tag("div", attrs | {"data-expectation": str(i), "data-result": result}, inner)
            )
        return tag("div", {"id": "windows"}, "".join(lanes))

    def hit(self, ev: TraceEvent, exp: EventExpectation) -> str:
        inside = "in" if exp.start_ms <= ev.t_ms <= exp.end_ms else "out"
        tip = f"{fmt_ms(ev.t_ms)} {ev.kind} {describe(ev)}"
        attrs = {"class": f"xhit {inside}", "data-t-ms": str(ev.t_ms), "style": self.at(ev.t_ms)}
        return tag("div", attrs | {"title": tip})

    def chart(self) -> str:
        lanes = Lanes(self.result)
        ctl = lanes.controller
        parts = [self.axis(), self.windows(), '<div class="group">controller</div>']
        parts.append(self.lane(ctl, [(k, v) for k, v in ctl.rows.items() if v or k == "state"]))
        parts.append('<div class="group">nodes</div>')
        for name, lane in lanes.nodes.items():
            rows = [(k, v) for k, v in lane.rows.items() if k != "shards" and (v or k == "health")]
            rows += [("shards", row) for row in lanes.node_shard_rows(name)]
            parts.append(self.lane(lane, rows, **{"data-fabric": lane.subtitle}))
        parts.append('<div class="group">replicas</div>')
        parts.extend(self.lane(lane, lane.rows.items()) for lane in lanes.replicas.values())
        lines = "".join(
            tag("div", {"class": "fline", "style": self.at(f.at_ms)}) for f in self.sc.faults
        )
        parts.append(
            tag("div", {"class": "overlay", "aria-hidden": "true"}, lines + '<div id="hl"></div>')
        )
        canvas = tag("div", {"class": "canvas", "id": "chart"}, "".join(parts))
        return tag("div", {"class": "scroll"}, canvas)

    # --- the rest of the page ---------------------------------------------------------------

    def header(self) -> str:
        r, verdict = self.result, _result(self.result.passed)
        fields = [
            ("file", self.sc.path),
            ("seed", str(r.seed)),
            ("verdict", verdict.upper()),
            ("virtual duration", fmt_ms(r.virtual_ms)),
            ("trace sha256", r.trace_sha256),
            ("events", str(len(r.trace))),
            ("engine starts", str(r.engine_starts)),
        ]
        dl = "".join(
            f"<dt>{esc(k)}</dt>" + tag("dd", {"data-field": k.replace(" ", "-")}, esc(v))
            for k, v in fields
        )
        title = tag("span", {"id": "verdict", "class": f"r-{verdict}"}, verdict.upper())
        title += " " + tag("span", {"id": "scenario-name"}, esc(self.sc.name))
        desc = tag("p", {"class": "desc"}, esc(self.sc.description))
        inner = f"<h1>{title}</h1>{desc}<dl>{dl}</dl>"
        return tag("header", {"id": "summary", "data-verdict": verdict}, inner)

    def expectations(self) -> str:
        rows = []
        for i, (exp, o) in enumerate(self.judged):
            start, end = window(exp, self.sc.duration_ms)
            result = _result(o.passed)
            when = fmt_ms(start) if start == end else f"{fmt_ms(start)} to {fmt_ms(end)}"
            cells = tag("td", {"class": f"r-{result}"}, result.upper())
            cells += f"<td>{exp.line}</td><td>{esc(when)}</td>"
            cells += f"<td><code>{esc(exp.text)}</code></td><td><pre>{esc(o.message)}</pre></td>"
            attrs = {"class": "xrow", "data-expectation": str(i), "data-result": result}
            rows.append(tag("tr", attrs | {"data-line": str(exp.line)}, cells))
        head = ("result", "line", "window", "expectation", "outcome")
        return _table("expectations", head, rows)

    def invariants(self) -> str:
        rows = []
        for inv in self.result.invariants:
            result = "off" if not inv.enabled else "violated" if inv.violations else "ok"
            text = {"off": f"off: {inv.off_reason}", "ok": "ok"}.get(
                result, f"violated ({len(inv.violations)})"
            )
            cells = tag("td", {"class": f"r-{result}"}, esc(text)) + f"<td>{esc(inv.name)}</td>"
            cells += tag("td", {"data-checks": str(inv.checks)}, str(inv.checks))
            cells += "<td><ul>" + "".join(f"<li>{esc(v)}</li>" for v in inv.violations)
            attrs = {"class": "invrow", "data-invariant": inv.name, "data-result": result}
            rows.append(tag("tr", attrs, cells + "</ul></td>"))
        return _table("invariants", ("result", "invariant", "checks", "violations"), rows)

    def requests(self) -> str:
        if not self.result.requests:
            return ""
        counts = self.result.requests.values()
        keys = [k for k in _COUNT_ORDER if any(k in c for c in counts)]
        keys += sorted({k for c in counts for k in c} - set(keys))
        rows = []
        for model, count in self.result.requests.items():
            cells = "".join(tag("td", {"data-count": k}, esc(count.get(k, ""))) for k in keys)
            rows.append(
                tag("tr", {"class": "reqrow", "data-model": model}, f"<td>{esc(model)}</td>{cells}")
            )
        return _table("requests", ("model", *(k.replace("_", " ") for k in keys)), rows)

    def latency(self) -> str:
        """Per model: TTFT, end-to-end and queueing percentiles (ms) and goodput
        (`world/latency.py`); only when the scenario uses the workload additions."""
        if not self.result.latency:
            return ""
        rows = []
        for model, figures in self.result.latency.items():
            cells = ""
            for metric in ("ttft_ms", "e2e_ms", "queued_ms"):
                values = figures.get(metric)
                for p in ("p50", "p99"):
                    v = values.get(p, "") if isinstance(values, dict) else ""
                    cells += tag("td", {"data-figure": f"{metric}.{p}"}, esc(v))
            good = figures.get("goodput_per_s", "")
            cells += tag("td", {"data-figure": "goodput_per_s"}, esc(good))
            cells += tag("td", {"data-figure": "ttft_over_time"}, esc(_spark(figures)))
            rows.append(
                tag("tr", {"class": "latrow", "data-model": model}, f"<td>{esc(model)}</td>{cells}")
            )
        head = (
            "model",
            "TTFT p50 ms",
            "TTFT p99 ms",
            "e2e p50 ms",
            "e2e p99 ms",
            "queued p50 ms",
            "queued p99 ms",
            "goodput /s",
            "TTFT p99 over the run",
        )
        return _table("latency", head, rows)

    def capacity(self) -> str:
        """Per model, a step line of the replicas serving (solid) and wanted (dashed)."""
        want = capacity.wanted(self.sc, self.result.trace)
        serve = capacity.serving(self.result.trace, list(want))
        rows = []
        for model in sorted(serve):
            s, w = serve[model], want.get(model, [(0, 0)])
            top = max(*(c for _, c in s), *(c for _, c in w), 1)
            line = capacity.shortfall(s, w, 0, self.dur, model)
            tip = (
                f"{model}: at least {line.least} serving (wanted {line.wanted_then}) at "
                f"{fmt_ms(line.least_at_ms)}; short of its count for {fmt_duration(line.short_ms)}"
            )
            svg = (
                f'<svg viewBox="0 0 1000 40" preserveAspectRatio="none" role="img" '
                f'aria-label="{esc(tip)}"><polyline class="want" points="{self._steps(w, top)}"/>'
                f'<polyline class="serve" points="{self._steps(s, top)}"/></svg>'
            )
            cells = f'<td>{esc(model)}</td><td>{esc(tip)}</td><td class="spark">{svg}</td>'
            rows.append(tag("tr", {"class": "caprow", "data-model": model}, cells))
        if not rows:
            return ""
        return _table("capacity", ("model", "serving replicas", "over the run"), rows)

    def _steps(self, series: Series, top: int) -> str:
        points, last = [], None
        for t, c in series:
            x = min(t, self.dur) * 1000 / self.dur
            y = 38 - c * 36 / top
            if last is not None:
                points.append(f"{x:.1f},{last:.1f}")
            points.append(f"{x:.1f},{y:.1f}")
            last = y
        points.append(f"1000,{last:.1f}")
        return " ".join(points)

    def trace(self) -> str:
        rows = []
        for ev in self.result.trace:
            argv = ev.get("argv")
            text = esc(describe(ev))
            if isinstance(argv, tuple):
                text += f"<code>$ {esc(shlex.join(str(a) for a in argv))}</code>"
            cells = f"<td>{esc(fmt_ms(ev.t_ms))}</td><td>{esc(ev.kind)}</td><td>{text}</td>"
            rows.append(tag("tr", {"data-kind": ev.kind, "data-t-ms": str(ev.t_ms)}, cells))
        summary = f"<summary>trace: {len(rows)} events</summary>"
        table = f"<details>{summary}<table>{''.join(rows)}</table></details>"
        return tag("section", {"id": "trace"}, table)


LABEL_CHARS = 72
"""The most characters of an expectation's text its lane's label shows (two lines of the label
column); the whole text is its hover text and its row in the expectations table."""


def shorten(text: str, most: int = LABEL_CHARS) -> str:
    """`text` on one line, cut at a word with an ellipsis when longer than `most`."""
    flat = " ".join(text.split())
    if len(flat) <= most:
        return flat
    cut = flat[: most - 1]
    if " " in cut[most // 2 :]:
        cut = cut[: cut.rindex(" ")]
    return cut.rstrip(" ,;:") + "\u2026"


def window(exp: Expectation, duration_ms: int) -> tuple[int, int]:
    """An expectation's window in the run, both ends inclusive; a state check's is its instant."""
    if isinstance(exp, StateExpectation):
        return exp.at_ms, exp.at_ms
    return exp.start_ms, min(exp.end_ms, duration_ms)


def render_html(result: RunResult) -> str:
    page = _Page(result)
    title = esc(f"{_result(result.passed).upper()} {result.scenario.name}")
    timeline = tag("section", {"id": "timeline"}, "<h2>timeline</h2>" + LEGEND + page.chart())
    body = (
        page.header()
        + timeline
        + page.expectations()
        + page.invariants()
        + page.capacity()
        + page.requests()
        + page.latency()
        + page.trace()
    )
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta name="viewport" content="width=device-width"><title>{title}</title>'
        f'<style>{PAGE_CSS}</style></head><body>{body}<div id="tip" role="tooltip"></div>'
        f"<script>{PAGE_JS}</script></body></html>\n"
    )
