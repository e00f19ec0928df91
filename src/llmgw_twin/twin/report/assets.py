"""The inline CSS, JS and legend of a run's HTML page (`twin/report/html.py`).

The JS only adds what a static page cannot do: a tooltip for every `title` (moved into
`data-tip`, so a page without scripts still shows the browser's own), zoom buttons that widen
the chart, and the highlight of an expectation's window across every lane while the pointer is
on it. It reads the page and nothing else: no request, no storage.
"""

from __future__ import annotations

_STATES = (
    ("alive", "node alive"),
    ("suspect", "node suspect"),
    ("lost", "node lost"),
    ("down", "link down / controller down"),
    ("gpu-failed", "GPU failed"),
    ("quarantined", "quarantined"),
    ("unplaceable", "unplaceable"),
    ("backoff", "back-off"),
    ("placed", "placed"),
    ("loading", "loading"),
    ("ready", "ready"),
    ("degraded", "degraded"),
    ("unroutable", "unroutable"),
    ("moving", "moving"),
    ("adopting", "adopting"),
    ("restoring", "restoring"),
    ("shard", "shard (loading, up)"),
)

LEGEND = (
    '<ul class="legend">'
    + "".join(f'<li><i class="seg s-{state}"></i>{text}</li>' for state, text in _STATES)
    + '<li><i class="seg fspan"></i>fault span</li>'
    + '<li><i class="fault legend-mark"></i>fault</li>'
    + '<li><i class="xshade x-pass"></i>expectation window</li>'
    + '<li class="zoom">zoom <button type="button" data-zoom="1">1x</button>'
    + '<button type="button" data-zoom="2">2x</button>'
    + '<button type="button" data-zoom="4">4x</button>'
    + '<button type="button" data-zoom="8">8x</button></li></ul>'
)

PAGE_CSS = """
:root { --label: 260px; --ok: #2e7d32; --bad: #c62828; --off: #757575; }
* { box-sizing: border-box; }
body { font: 13px/1.4 system-ui, sans-serif; margin: 0 16px 32px; color: #212121; }
h1 { font-size: 20px; margin: 12px 0 4px; }
h2 { font-size: 15px; margin: 20px 0 6px; }
td.spark { width: 60%; } td.spark svg { width: 100%; height: 40px; display: block; }
polyline { fill: none; stroke-width: 2; vector-effect: non-scaling-stroke; }
polyline.serve { stroke: #2a7; } polyline.want { stroke: #999; stroke-dasharray: 4 3; }
header dl { display: grid; grid-template-columns: max-content 1fr; gap: 2px 12px; margin: 8px 0; }
header dt { color: #616161; }
header dd { margin: 0; font-family: ui-monospace, monospace; }
.desc { margin: 0; color: #424242; max-width: 110ch; }
.r-pass, .r-ok { color: var(--ok); font-weight: 600; }
.r-fail, .r-violated { color: var(--bad); font-weight: 600; }
.r-off { color: var(--off); }
#verdict { padding: 0 6px; border-radius: 3px; color: #fff; }
#verdict.r-pass { background: var(--ok); }
#verdict.r-fail { background: var(--bad); }
.legend { list-style: none; padding: 0; margin: 0 0 6px; display: flex; flex-wrap: wrap;
  gap: 4px 12px; }
.legend li { display: flex; align-items: center; gap: 4px; }
.legend i { position: static; display: inline-block; width: 18px; height: 10px; }
.legend .legend-mark { width: 2px; height: 12px; }
.legend .zoom { margin-left: auto; }
.legend button { font: inherit; padding: 0 6px; margin-left: 2px; cursor: pointer; }
.legend button.on { background: #424242; color: #fff; }
.scroll { overflow-x: auto; border: 1px solid #e0e0e0; }
.canvas { position: relative;
  min-width: calc(var(--label) + (100% - var(--label)) * var(--zoom, 1)); }
.lane { display: flex; border-bottom: 1px solid #eeeeee; min-height: 20px; }
.label { flex: none; width: var(--label); padding: 2px 6px; position: sticky; left: 0; z-index: 3;
  background: #fafafa; border-right: 1px solid #e0e0e0; overflow: hidden; white-space: nowrap;
  text-overflow: ellipsis; }
.label small { display: block; color: #757575; font-size: 11px; white-space: normal;
  overflow-wrap: anywhere; line-height: 13px; }
.track { position: relative; flex: 1; padding: 2px 0; }
.row { position: relative; height: 16px; margin: 1px 0; }
.group { padding: 2px 6px; background: #eceff1; font-weight: 600; position: sticky; left: 0;
  width: var(--label); border-bottom: 1px solid #e0e0e0; }
.seg { position: absolute; top: 0; height: 100%; min-width: 1px; overflow: hidden;
  white-space: nowrap;
  font-size: 10px; line-height: 16px; color: #fff; padding-left: 2px;
  border-right: 1px solid #fff; }
.seg span { position: relative; }
.seg .load { position: absolute; left: 0; top: 0; bottom: 0; background: #90caf9; }
.s-unregistered, .s-starting { background: #e0e0e0; color: #616161; }
.s-alive, .s-up { background: #66bb6a; }
.s-suspect, .s-restoring, .s-degraded { background: #ffb300; color: #212121; }
.s-lost { background: #e53935; }
.s-forgotten { background: #616161; }
.s-down { background: repeating-linear-gradient(45deg, #9e9e9e 0 4px, #bdbdbd 4px 8px);
  color: #212121; }
.row[data-row="link"] .s-down { background: #8e24aa; color: #fff; }
.s-gpu-failed { background: #d81b60; }
.s-quarantined { background: repeating-linear-gradient(45deg, #6d4c41 0 4px, #8d6e63 4px 8px); }
.s-hold { background: #fb8c00; }
.s-unplaceable { background: repeating-linear-gradient(45deg, #9e9e9e 0 4px, #e0e0e0 4px 8px);
  color: #212121; }
.s-backoff { background: #bdbdbd; color: #212121; }
.s-placed { background: #90caf9; color: #212121; }
.s-loading { background: #42a5f5; }
.s-ready { background: #2e7d32; }
.s-unroutable { background: #ff7043; }
.s-moving { background: #26a69a; }
.s-adopting { background: #7e57c2; }
.s-shard, .shard { background: #1565c0; }
.shard { cursor: help; }
.seg.fspan { color: #b71c1c; font-weight: 600;
  background: repeating-linear-gradient(135deg, #ffcdd2 0 5px, #ffebee 5px 10px); }
.legend .fspan { border: 1px solid #e57373; }
.fault { position: absolute; top: 0; bottom: 0; width: 3px; margin-left: -1px;
  background: #d32f2f; z-index: 2; cursor: help; }
.mark { position: absolute; top: 0; width: 7px; height: 7px; margin-left: -3px; background: #212121;
  transform: rotate(45deg); z-index: 2; cursor: help; }
.mark[data-kind="replica.failed"], .mark[data-kind="replica.reaped"] { background: #c62828; }
.mark[data-kind="gpu.failed"] { background: #d81b60; }
.axis { background: #fafafa; min-height: 34px; }
.tick { position: absolute; top: 0; bottom: 0; border-left: 1px solid #bdbdbd; }
.tick span { position: absolute; left: 3px; top: 1px; font-size: 10px; color: #616161;
  white-space: nowrap; }
.axis-fault span { position: absolute; top: 15px; left: 4px; font-size: 10px; color: #b71c1c;
  font-weight: 600; white-space: nowrap; }
.xshade { position: absolute; bottom: 0; height: 8px; min-width: 2px; opacity: .5; }
.xshade.x-pass, .xwin.x-pass { background: #81c784; }
.xshade.x-fail, .xwin.x-fail { background: #e57373; }
.legend .xshade { opacity: .7; }
.xlane { min-height: 16px; }
.xlane .label { white-space: normal; font-size: 11px; line-height: 13px; }
.xlane .label b { font-size: 10px; margin-right: 6px; }
.xlane .label small { display: inline; }
.xwin { position: absolute; top: 2px; bottom: 2px; min-width: 3px; opacity: .55; cursor: help; }
.xwin.instant { width: 12px; margin-left: -6px; opacity: .8; }
.xwin.instant.at-end { margin-left: -12px; }
.xwin.instant.at-start { margin-left: 0; }
.xwin.instant.x-fail { opacity: 1; background: repeating-linear-gradient(45deg, #c62828 0 3px,
  #ef9a9a 3px 6px); outline: 1px solid #b71c1c; }
.xhit { position: absolute; top: 3px; bottom: 3px; width: 2px; background: #1b5e20; cursor: help; }
.xhit.out { background: #9e9e9e; }
.xwin.x-fail ~ .xhit.in { background: #b71c1c; }
.hot { outline: 2px solid #1565c0; opacity: .9; }
tr.hot { outline: none; background: #e3f2fd; }
.overlay { position: absolute; top: 0; bottom: 0; left: var(--label); right: 0;
  pointer-events: none; z-index: 1; }
.fline { position: absolute; top: 0; bottom: 0; border-left: 1px dashed rgba(211,47,47,.5); }
#hl { position: absolute; top: 0; bottom: 0; display: none; background: rgba(21,101,192,.10);
  border-left: 1px solid #1565c0; border-right: 1px solid #1565c0; min-width: 2px; }
table { border-collapse: collapse; }
td, th { border-bottom: 1px solid #eeeeee; padding: 2px 8px; text-align: left;
  vertical-align: top; }
th { background: #fafafa; }
td pre { margin: 0; white-space: pre-wrap; font: 12px ui-monospace, monospace; }
td ul { margin: 0; padding-left: 16px; }
#trace td code { display: block; color: #455a64; word-break: break-all; }
#tip { position: fixed; z-index: 10; display: none; max-width: 720px; padding: 4px 8px;
  pointer-events: none;
  background: #263238; color: #fff; font: 12px/1.4 ui-monospace, monospace; white-space: pre-wrap;
  border-radius: 3px; box-shadow: 0 2px 6px rgba(0,0,0,.3); }
"""

PAGE_JS = """
(function () {
  "use strict";
  var tip = document.getElementById("tip");
  document.querySelectorAll("[title]").forEach(function (el) {
    el.setAttribute("data-tip", el.getAttribute("title"));
    el.removeAttribute("title");
  });
  function place(e) {
    var x = e.clientX + 14, y = e.clientY + 14, r = tip.getBoundingClientRect();
    if (x + r.width > window.innerWidth) { x = Math.max(0, e.clientX - r.width - 8); }
    if (y + r.height > window.innerHeight) { y = Math.max(0, e.clientY - r.height - 8); }
    tip.style.left = x + "px";
    tip.style.top = y + "px";
  }
  document.addEventListener("mouseover", function (e) {
    var el = e.target.closest ? e.target.closest("[data-tip]") : null;
    if (!el) { tip.style.display = "none"; return; }
    tip.textContent = el.getAttribute("data-tip");
    tip.style.display = "block";
    place(e);
  });
  document.addEventListener("mousemove", function (e) {
    if (tip.style.display === "block") { place(e); }
  });
  var chart = document.getElementById("chart");
  var buttons = document.querySelectorAll("button[data-zoom]");
  buttons.forEach(function (b) {
    b.addEventListener("click", function () {
      chart.style.setProperty("--zoom", b.getAttribute("data-zoom"));
      buttons.forEach(function (o) { o.classList.toggle("on", o === b); });
    });
    b.classList.toggle("on", b.getAttribute("data-zoom") === "1");
  });
  var hl = document.getElementById("hl");
  function light(i, on) {
    document.querySelectorAll('[data-expectation="' + i + '"]').forEach(function (el) {
      el.classList.toggle("hot", on);
    });
    var w = document.querySelector('.xwin[data-expectation="' + i + '"]');
    if (on && w) {
      hl.style.left = w.style.left;
      hl.style.width = w.style.width;
      hl.style.display = "block";
    } else {
      hl.style.display = "none";
    }
  }
  document.querySelectorAll(".xrow, .xlane").forEach(function (el) {
    var i = el.getAttribute("data-expectation");
    el.addEventListener("mouseenter", function () { light(i, true); });
    el.addEventListener("mouseleave", function () { light(i, false); });
  });
})();
"""
