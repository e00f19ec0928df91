"""The event log `replay` reads: a file, or a live controller's `GET /v1/admin/events`.

Role: `read_log(path)` and `fetch_log(args)` return the whole log as `TraceEvent`s, in time
order, from the controller's first event; anything that shows the log is not whole or not of
this version is a `ReplayError`, one line (docs/live-twin.md, "Replay", "The log").

A file is either one JSON document -- a `llmgw-twin run --json` report (its `events`, checked
against its `trace_sha256`), or one page of `/v1/admin/events` -- or JSON lines, each one of:
a header `{"llmgw_twin_event_log": 1, "first": 0, "next": N}` (first line only; `replay
--save-log` writes it), a page `{"events": [...], "next": N, "dropped": D}`, or one event,
either as the admin API writes it (`{"t_ms", "kind", "subjects": {...}}`) or flat, as a report
does (`{"t_ms", "kind", "node": ..., ...}`).
"""

from __future__ import annotations

import argparse
import itertools
import json
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

from llmgw_twin.control.model import CONTROL_EVENT_KINDS, TraceEvent
from llmgw_twin.twin.world.runner import trace_sha256
from llmgw_twin.units import parse_duration

LOG_VERSION = 1
HEADER_KEY = "llmgw_twin_event_log"
PAGE = 5_000
MAX_PAGES = 2_000
"""At most this many pages (10 million events) are read from a live controller."""
KINDS = frozenset((*CONTROL_EVENT_KINDS, "controller.lagged", "fault.injected"))
"""The core's kinds, its lag report, and the twin's faults (a report's; replay ignores them)."""
OPENING = frozenset(("controller.leader", "controller.started", "node.joined"))
"""The kinds a controller's history starts with (its first event is one of them)."""


class ReplayError(Exception):
    """One line saying why no replay was written."""


@dataclass(frozen=True, slots=True)
class EventLog:
    events: tuple[TraceEvent, ...]
    source: str


def event_of(raw: object, where: str) -> TraceEvent:
    """One event, nested (`subjects`) or flat; its kind must be one this version knows."""
    if not isinstance(raw, dict) or not isinstance(raw.get("t_ms"), int):
        raise ReplayError(f"{where}: not an event (no integer t_ms)")
    kind = raw.get("kind")
    if not isinstance(kind, str):
        raise ReplayError(f"{where}: not an event (no kind)")
    if kind not in KINDS:
        raise ReplayError(
            f"{where}: event kind '{kind}' is not one this llmgw-twin knows (a log from "
            "another version?)"
        )
    nested = raw.get("subjects")
    if isinstance(nested, dict) and set(raw) <= {"t_ms", "kind", "subjects"}:
        fields: dict[str, Any] = nested
    else:
        fields = {k: v for k, v in raw.items() if k not in ("t_ms", "kind")}
    pairs = tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in fields.items()))
    return TraceEvent(int(raw["t_ms"]), kind, pairs)


def _page(raw: dict[str, Any], where: str, expected_first: int) -> list[TraceEvent]:
    """A page of `/v1/admin/events`: none dropped, numbered on from the one before."""
    events = raw.get("events")
    nxt = raw.get("next")
    if not isinstance(events, list) or not isinstance(nxt, int):
        raise ReplayError(f"{where}: not a page of /v1/admin/events (no events or next)")
    dropped = raw.get("dropped", 0)
    if isinstance(dropped, int) and dropped > 0:
        raise ReplayError(
            f"{where}: the page says {dropped} event(s) were dropped before it (the "
            "controller keeps events_kept): replay needs the log from the controller's first "
            "event"
        )
    first = nxt - len(events)
    if first != expected_first:
        what = "its start" if expected_first == 0 else f"event {expected_first}"
        raise ReplayError(
            f"{where}: the page starts at event {first}, not at {what}: the log has a gap"
        )
    return [event_of(e, f"{where}, event {i + 1}") for i, e in enumerate(events)]


def read_log(path: Path) -> EventLog:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ReplayError(f"cannot read {path}: {e}") from None
    if not text.strip():
        raise ReplayError(f"{path}: the log is empty")
    try:
        whole = json.loads(text)
    except ValueError:
        whole = None
    if isinstance(whole, dict) and "trace_sha256" in whole and "events" in whole:
        events = _report(whole, str(path))
    elif isinstance(whole, dict) and "next" in whole and "events" in whole:
        events = _page(whole, str(path), 0)
    else:
        events = _lines(text, str(path))
    return EventLog(tuple(_checked(events, str(path))), str(path))


def _report(raw: dict[str, Any], where: str) -> list[TraceEvent]:
    if not isinstance(raw["events"], list):
        raise ReplayError(f"{where}: the report's events are not a list")
    events = [event_of(e, f"{where}, event {i + 1}") for i, e in enumerate(raw["events"])]
    if trace_sha256(events) != raw["trace_sha256"]:
        raise ReplayError(
            f"{where}: the report's events do not match its trace_sha256 (edited or cut, or "
            "written by another version)"
        )
    return events


def _lines(text: str, where: str) -> list[TraceEvent]:
    lines = text.split("\n")
    out: list[TraceEvent] = []
    header: dict[str, Any] | None = None
    expected = 0
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        at = f"{where}:{number}"
        try:
            raw = json.loads(line)
        except ValueError:
            if number == len(lines):  # no newline after it: the writer stopped mid-line
                raise ReplayError(f"{at}: the log's last line is cut off") from None
            raise ReplayError(f"{at}: not a JSON line") from None
        if isinstance(raw, dict) and HEADER_KEY in raw:
            if out or header is not None:
                raise ReplayError(f"{at}: a log header after the first line")
            header = raw
            if raw[HEADER_KEY] != LOG_VERSION:
                raise ReplayError(
                    f"{at}: a log of version {raw[HEADER_KEY]!r}; this llmgw-twin reads "
                    f"version {LOG_VERSION}"
                )
            if raw.get("first", 0) != 0:
                raise ReplayError(
                    f"{at}: the log starts at event {raw.get('first')}, not at the controller's "
                    "first: its history before is missing"
                )
        elif isinstance(raw, dict) and "events" in raw and "next" in raw:
            out.extend(_page(raw, at, expected))
            expected = raw["next"]
        else:
            out.append(event_of(raw, at))
            expected += 1
    if header is not None and isinstance(header.get("next"), int) and header["next"] != len(out):
        raise ReplayError(
            f"{where}: the log holds {len(out)} event(s), its header says {header['next']}: "
            "it was cut"
        )
    return out


def _checked(events: list[TraceEvent], where: str) -> list[TraceEvent]:
    if not events:
        raise ReplayError(f"{where}: the log holds no event")
    if events[0].kind not in OPENING:
        raise ReplayError(
            f"{where}: the log does not start at the controller's first event (its first is "
            f"{events[0].kind} at t_ms {events[0].t_ms}): its history before is missing"
        )
    for before, ev in itertools.pairwise(events):
        if ev.t_ms < before.t_ms:
            raise ReplayError(f"{where}: events out of time order at t_ms {ev.t_ms}")
    return events


def fetch_log(args: argparse.Namespace) -> EventLog:
    """The leading controller's whole event log, page by page (`next`), at most `MAX_PAGES`."""
    from llmgw_twin.service.common.tls import ClientTls
    from llmgw_twin.service.ops.ctl import TIMEOUT_S, CtlError, _headers, _to_leader

    bases = [u.strip().rstrip("/") for u in str(args.controller).split(",") if u.strip()]
    if not bases:
        raise ReplayError("--controller names no controller")
    where = f"the controller at {args.controller}"
    out: list[TraceEvent] = []
    after = 0
    try:
        verify = ClientTls(args.ca, args.cert, args.key or args.cert).context()
        headers = _headers(args)
        with httpx.Client(timeout=TIMEOUT_S, trust_env=False, verify=verify) as client:
            for _ in range(MAX_PAGES):
                params = {"after": str(after), "limit": str(PAGE)}
                reply = _to_leader(client, bases, "GET", "/v1/admin/events", params, None, headers)
                if reply.status_code in (401, 403):
                    raise ReplayError(
                        f"{where} refused the credential ({reply.status_code}): replay needs an "
                        "admin or reader token, in $LLMGW_TWIN_TOKEN or --token-file"
                    )
                if not reply.is_success:
                    raise ReplayError(f"{where} answered {reply.status_code}: {reply.text[:200]}")
                page = reply.json()
                got = _page(page, f"{where}, events after {after}", after)
                out.extend(got)
                if not got or page["next"] == after:
                    break
                after = page["next"]
            else:
                raise ReplayError(f"{where}: the log is longer than {MAX_PAGES * PAGE} events")
    except (CtlError, OSError) as e:
        raise ReplayError(str(e)) from None
    except httpx.HTTPError as e:
        raise ReplayError(f"cannot reach the controller at {args.controller}: {e}") from None
    except ValueError as e:
        raise ReplayError(f"{where} sent a page that is not JSON: {e}") from None
    return EventLog(tuple(_checked(out, where)), where)


def save_log(log: EventLog) -> str:
    """The log as JSON lines with its header, as `read_log` reads it."""
    header = {HEADER_KEY: LOG_VERSION, "first": 0, "next": len(log.events), "source": log.source}
    lines = [json.dumps(header)]
    for ev in log.events:
        subjects = {k: list(v) if isinstance(v, tuple) else v for k, v in ev.subjects}
        lines.append(json.dumps({"t_ms": ev.t_ms, "kind": ev.kind, "subjects": subjects}))
    return "\n".join(lines) + "\n"


def parse_time(text: str, origin_ms: int) -> int:
    """A window end in the log's t_ms: a whole number is a t_ms as the log writes it, an ISO
    8601 time (`2026-12-06T07:00:00Z`) a wall-clock time (a live controller's t_ms are
    wall-clock ms), anything else a duration after the log's first event (`2m`, `1h5m`)."""
    if text.isdigit():
        return int(text)
    if "T" in text and text[:4].isdigit():
        try:
            when = datetime.fromisoformat(text)
        except ValueError as e:
            raise ReplayError(f"'{text}' is not an ISO 8601 time: {e}") from None
        if when.tzinfo is None:
            raise ReplayError(f"'{text}' names no time zone (add Z for UTC)")
        return int(when.timestamp() * 1000)
    try:
        return origin_ms + parse_duration(text)
    except ValueError as e:
        raise ReplayError(f"'{text}' is not a time: {e}") from None
