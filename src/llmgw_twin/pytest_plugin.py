"""pytest collects scenario files as tests: `pytest my-scenarios/` runs each in the twin.

Registered through the `pytest11` entry point, so installing the package is enough; `-p
no:llmgw_twin` turns it off for one run, `--llmgw-no-collect` or the ini option `llmgw_collect =
false` stops it collecting (docs/ci.md).

Which files: a `*.yaml` / `*.yml` file whose first document is a mapping holding at least two of
the scenario's three required keys (`name`, `duration`, `cluster`), with more than half of its
top-level keys scenario keys (`loader.TOP_KEYS`). So a scenario with a missing key or a misspelt
one is still collected (and fails with the loader's message), while a CI configuration, a
docker-compose file or a Helm values file is not. Only the top-level keys are read to decide
(PyYAML's event stream, nothing constructed); a file whose YAML breaks is judged on the keys
before the break.

Each file is one item, named by the scenario's `name` (by the file's stem when it cannot be
loaded). It fails with text, never a traceback: the loader's `FILE:LINE:COLUMN: message`, or the
run's verdict, the replay command (`llmgw-twin run FILE --seed N`), and each failed expectation
or invariant with the trace events around its window. Each item records `scenario`, `file`,
`seed`, `trace_sha256` and `replay` as properties (in `--junitxml` output).
"""

from __future__ import annotations

import os
import re
import shlex
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, assert_never

import pytest
import yaml

from llmgw_twin.control.model import TraceEvent
from llmgw_twin.twin.report.text import describe, verdict
from llmgw_twin.twin.scenario.limits import MAX_FILE_BYTES
from llmgw_twin.twin.scenario.loader import TOP_KEYS, ScenarioError, load_scenario
from llmgw_twin.twin.scenario.model import (
    EventExpectation,
    RequestsExpectation,
    Scenario,
    StateExpectation,
)
from llmgw_twin.twin.scenario.workload_model import SloExpectation
from llmgw_twin.twin.world.expect import matches
from llmgw_twin.twin.world.runner import RunResult, UnsupportedScenario, run_scenario
from llmgw_twin.units import fmt_ms

if TYPE_CHECKING:  # pytest's types for repr_failure, not exported under public names
    from _pytest._code.code import TerminalRepr, TracebackStyle

SUFFIXES = (".yaml", ".yml")
REQUIRED_KEYS = frozenset(("name", "duration", "cluster"))
TOP_KEYS_SET = frozenset(TOP_KEYS)
_PARSER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
"""libyaml's parser where PyYAML has it (about twenty times faster); only events are read."""
CONTEXT = 3
"""Trace events shown before and after a failed expectation's window."""
MAX_INSIDE = 16
"""A window holding more events than this shows its first and last few, and its matches."""
MAX_VIOLATIONS = 5
_VIOLATION_AT = re.compile(r"t=(\d+)ms")


class ScenarioInvalid(Exception):
    """The file looks like a scenario but the loader (or the twin) refuses it."""


class ScenarioFailed(Exception):
    """The scenario ran and an expectation or invariant failed; the text explains which."""


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("llmgw_twin", "llmgw-twin scenario files")
    group.addoption(
        "--llmgw-seed",
        type=int,
        default=None,
        metavar="N",
        help="run every collected scenario file with seed N instead of the file's own seed",
    )
    group.addoption(
        "--llmgw-no-collect",
        action="store_true",
        default=False,
        help="do not collect scenario files as tests (as the ini option llmgw_collect = false)",
    )
    parser.addini(
        "llmgw_collect",
        type="bool",
        default=True,
        help="collect llmgw-twin scenario files (*.yaml, *.yml) as tests (default true)",
    )


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> ScenarioFile | None:
    if file_path.suffix.lower() not in SUFFIXES:
        return None
    config = parent.config
    if config.getoption("llmgw_no_collect") or not config.getini("llmgw_collect"):
        return None
    if not is_scenario_file(file_path):
        return None
    return ScenarioFile.from_parent(parent, path=file_path)


def is_scenario_file(path: Path) -> bool:
    """The collection rule (module docstring), on the file's top-level keys."""
    keys = top_level_keys(path)
    known = len(TOP_KEYS_SET.intersection(keys))
    return len(REQUIRED_KEYS.intersection(keys)) >= 2 and 2 * known > len(keys)


def top_level_keys(path: Path) -> list[str]:
    """The plain scalar keys of the first document's top-level mapping (none when it is not a
    mapping), read from at most `MAX_FILE_BYTES` of the file; YAML that breaks ends the list.

    Cheap for the YAML a tree holds besides scenarios: a text naming fewer than two of the
    required keys is not parsed, and parsing stops once the unknown keys outnumber every
    scenario key there is (the rule can no longer hold)."""
    try:
        with path.open("rb") as file:
            data = file.read(MAX_FILE_BYTES)
    except OSError:
        return []
    text = data.decode("utf-8", "replace")
    if sum(1 for k in REQUIRED_KEYS if k in text) < 2:
        return []
    keys: list[str] = []
    unknown = 0
    stack: list[bool | None] = []  # per open collection: a mapping awaiting a key, or None
    try:
        for event in yaml.parse(text, Loader=_PARSER):
            if isinstance(event, yaml.DocumentEndEvent) or unknown >= len(TOP_KEYS):
                break
            if isinstance(event, yaml.CollectionEndEvent):
                stack.pop()
                if not stack:
                    break
                continue
            if not isinstance(event, yaml.NodeEvent):
                continue
            if not stack and not isinstance(event, yaml.MappingStartEvent):
                break  # the document is not a mapping
            if stack and stack[-1] is not None:
                awaiting_key = stack[-1]
                if awaiting_key and len(stack) == 1 and isinstance(event, yaml.ScalarEvent):
                    keys.append(event.value)
                    unknown += event.value not in TOP_KEYS_SET
                stack[-1] = not awaiting_key
            if isinstance(event, yaml.MappingStartEvent):
                stack.append(True)
            elif isinstance(event, yaml.SequenceStartEvent):
                stack.append(None)
    except (yaml.YAMLError, RecursionError):
        pass
    return keys


class ScenarioFile(pytest.File):
    """One scenario file: one item."""

    def collect(self) -> Iterator[ScenarioItem]:
        shown = shown_path(self.path, self.config)
        try:
            scenario = load_scenario(self.path)
        except ScenarioError as err:
            problem = ScenarioInvalid(f"{shown}:{err.line}:{err.column}: {err.message}")
            yield ScenarioItem.from_parent(self, name=self.path.stem, problem=problem)
            return
        except Exception as err:  # a loader bug: the item shows its traceback, the run goes on
            yield ScenarioItem.from_parent(self, name=self.path.stem, problem=err)
            return
        yield ScenarioItem.from_parent(self, name=scenario.name, scenario=scenario)


class ScenarioItem(pytest.Item):
    """Runs one scenario in the twin; fails with the scenario's own explanation."""

    def __init__(
        self,
        *,
        scenario: Scenario | None = None,
        problem: Exception | None = None,
        **kwargs: object,
    ) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]  # pytest's Node keywords
        self.scenario = scenario
        self.problem = problem
        self.shown = shown_path(self.path, self.config)
        self.user_properties.append(("file", self.shown))

    def runtest(self) -> None:
        if self.problem is not None:
            raise self.problem
        assert self.scenario is not None
        seed: int | None = self.config.getoption("llmgw_seed")
        run_seed = self.scenario.seed if seed is None else seed
        replay = replay_command(self.shown, run_seed)
        self.user_properties += [
            ("scenario", self.scenario.name),
            ("seed", run_seed),
            ("replay", replay),
        ]
        started = time.perf_counter()
        try:
            result = run_scenario(self.scenario, seed=run_seed)
        except UnsupportedScenario as err:
            raise ScenarioInvalid(
                f"{self.shown}: the twin cannot run this scenario: {err}"
            ) from None
        wall_ms = round((time.perf_counter() - started) * 1000)
        self.user_properties.append(("trace_sha256", result.trace_sha256))
        if not result.passed:
            raise ScenarioFailed(explain(result, wall_ms, replay))

    def repr_failure(
        self,
        excinfo: pytest.ExceptionInfo[BaseException],
        style: TracebackStyle | None = None,
    ) -> str | TerminalRepr:
        if isinstance(excinfo.value, ScenarioInvalid | ScenarioFailed):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style)

    def reportinfo(self) -> tuple[Path, int | None, str]:
        return self.path, None, f"scenario {self.name}"


def shown_path(path: Path, config: pytest.Config) -> str:
    """`path` as the person who ran pytest would type it: relative to where they ran it."""
    start = config.invocation_params.dir
    try:
        return str(path.relative_to(start))
    except ValueError:
        return os.path.relpath(path, start) if path.anchor == start.anchor else str(path)


def replay_command(shown: str, seed: int) -> str:
    return f"llmgw-twin run {shlex.quote(shown)} --seed {seed}"


def explain(result: RunResult, wall_ms: int, replay: str) -> str:
    """The verdict, the replay command, then each failure with the events around it."""
    lines = [verdict(result, wall_ms), f"replay: {replay}"]
    trace = result.trace
    for exp, outcome in zip(result.scenario.expectations, result.expectations, strict=True):
        if outcome.passed:
            continue
        lines += ["", f"expectation failed (line {outcome.line}): {outcome.text}"]
        lines.append(f"  {outcome.message}")
        match exp:
            case EventExpectation():
                start, end = exp.start_ms, exp.end_ms
                marked = {i for i, ev in enumerate(trace) if matches(ev, exp)}
            case StateExpectation():
                start, end, marked = exp.at_ms, exp.at_ms, set()
            case RequestsExpectation() | SloExpectation():
                start, end, marked = exp.start_ms, exp.end_ms, set()
            case _:
                assert_never(exp)
        lines += around(trace, start, end, marked)
    for inv in result.invariants:
        if not inv.enabled or not inv.violations:
            continue
        lines += ["", f"invariant failed: {inv.name} ({len(inv.violations)} violation(s))"]
        lines += [f"  {v}" for v in inv.violations[:MAX_VIOLATIONS]]
        if len(inv.violations) > MAX_VIOLATIONS:
            lines.append(f"  ... {len(inv.violations) - MAX_VIOLATIONS} more")
        if found := _VIOLATION_AT.match(inv.violations[0]):
            at = int(found.group(1))
            lines += around(trace, at, at, set())
    return "\n".join(lines)


def around(trace: Sequence[TraceEvent], start: int, end: int, marked: set[int]) -> list[str]:
    """Trace lines of the window [start, end] (`|`), `CONTEXT` events either side, and the
    nearest events the expectation counts outside it; `>` marks those it counts. A crowded
    window shows its first and last few events and the ones it counts."""
    window = f"[{fmt_ms(start)}, {fmt_ms(end)}]" if start != end else fmt_ms(start)
    if not trace:
        return [f"  events near {window}: none (the trace is empty)"]
    inside = [i for i, ev in enumerate(trace) if start <= ev.t_ms <= end]
    first = inside[0] if inside else sum(1 for ev in trace if ev.t_ms < start)
    last = inside[-1] if inside else first - 1
    shown = set(range(max(0, first - CONTEXT), first))
    shown.update(range(last + 1, min(len(trace), last + 1 + CONTEXT)))
    if len(inside) <= MAX_INSIDE:
        shown.update(inside)
    else:
        half = MAX_INSIDE // 4
        shown.update(inside[:half] + inside[-half:])
        shown.update(i for i in inside if i in marked)
    if before := [i for i in marked if i < first]:
        shown.add(max(before))
    if after := [i for i in marked if i > last]:
        shown.add(min(after))
    legend = "; > counted by the expectation" if marked else ""
    lines = [f"  events near {window} ({len(inside)} in the window, marked |{legend}):"]
    previous = -1
    for i in sorted(shown):
        if i > previous + 1:
            lines.append(f"     ... {i - previous - 1} event(s) ...")
        if not inside and i == first:
            lines.append(f"   | {'':>13}  (no events in the window)")
        ev = trace[i]
        mark = (">" if i in marked else " ") + ("|" if start <= ev.t_ms <= end else " ")
        lines.append(f"  {mark} {'+' + fmt_ms(ev.t_ms):>13}  {ev.kind:<20} {describe(ev)}")
        previous = i
    if not inside and first == len(trace):
        lines.append(f"   | {'':>13}  (no events in the window)")
    if previous < len(trace) - 1:
        lines.append(f"     ... {len(trace) - 1 - previous} event(s) ...")
    return lines
