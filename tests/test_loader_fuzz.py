"""A fuzz of the scenario loader: random YAML documents with scenario-like keys, and mutations of
every file in scenarios/ (numbers made huge, negative, fractional or thousands of digits long;
keys replaced, deleted or repeated; truncation; a BOM, CR, NUL or odd unicode inserted; deep
nesting; anchors, aliases and alias bombs).

Property: `load_scenario_text` returns a `Scenario` inside every documented bound
(docs/scenarios.md, "Limits", checked here independently of the loader), or raises
`ScenarioError` whose text is `file:line:column: message` -- never anything else; and
`llmgw-twin run` exits 0, 1 or 2, its errors one `file:line:column` line each, never a
traceback. Every run draws the same cases (derandomized, no example database)."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import re
import tempfile
from pathlib import Path

import yaml
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from llmgw_twin import cli
from llmgw_twin.control.model import Timings
from llmgw_twin.twin.scenario import limits as lim
from llmgw_twin.twin.scenario.expect import EVENT_KEYS, STATE_KEYS
from llmgw_twin.twin.scenario.fleet import DEPLOYMENT_KEYS, NODE_KEYS, PROFILE_KEYS
from llmgw_twin.twin.scenario.loader import TIMING_KEYS, TOP_KEYS, ScenarioError, load_scenario_text
from llmgw_twin.twin.scenario.model import (
    EVENT_KINDS,
    EVENT_SUBJECTS,
    FAULT_KEYS,
    EventExpectation,
    FabricDown,
    Partition,
    RequestsExpectation,
    RestartController,
    Scenario,
    SetReplicas,
)
from llmgw_twin.twin.scenario.workload import request_bound
from llmgw_twin.twin.scenario.workload_model import SloExpectation
from llmgw_twin.twin.scenario.yamlnodes import NAME_RE

ROOT = Path(__file__).resolve().parent.parent
FILES = sorted([*ROOT.glob("scenarios/*.yaml"), *ROOT.glob("scenarios/regressions/*.yaml")])
TEXTS = [p.read_text(encoding="utf-8") for p in FILES]

LOADER_EXAMPLES = 800
DOC_EXAMPLES = 500
CLI_EXAMPLES = 60
CLI_MAX_STEPS = 30_000
"""The CLI fuzz runs what loads; it skips cases whose runs would be long (not what it tests)."""

FUZZ = settings(
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

KEYS = sorted(
    {
        *TOP_KEYS,
        *(k.key for k in TIMING_KEYS),
        "fabrics",
        "nodes",
        "default",
        *NODE_KEYS,
        *PROFILE_KEYS,
        *DEPLOYMENT_KEYS,
        "at",
        "id",
        *FAULT_KEYS,
        "for",
        "down_for",
        "replica_of",
        "gpu",
        *EVENT_KEYS,
        *STATE_KEYS,
        "off",
        *EVENT_SUBJECTS,
    }
)
WORDS = [
    "10s",
    "1h30m",
    "0",
    "720h",
    "721h",
    "1500ms",
    "99999999999999999999h",
    "80GiB",
    "4TiB",
    "5TiB",
    "1.5GiB",
    "50%",
    "0.5",
    "kill",
    "kill+5s",
    "end",
    "end-10s",
    "end+1000h",
    "start",
    "node01",
    "node02",
    "ib-a",
    "ib-b",
    "sim",
    "vllm",
    "llama-70b",
    "llama-70b-2n",
    "p",
    "alive",
    "lost",
    "/models/m",
    *EVENT_KINDS[:6],
    "x" * 129,
    "x" * 5000,
]
HUGE = ["9" * 19, "9" * 400, "1" * 4400, "1" * 5000, "100000000000", "1000000000"]


# --- the independent check of a loaded scenario ---------------------------------------------


def assert_within_bounds(s: Scenario) -> None:
    assert NAME_RE.fullmatch(s.name) and len(s.name) <= lim.MAX_NAME_LEN
    assert len(s.description) <= lim.MAX_STRING_LEN
    assert abs(s.seed) < 10**lim.MAX_DIGITS
    assert 0 < s.duration_ms <= lim.MAX_DURATION_MS
    for f in dataclasses.fields(Timings):
        value = getattr(s.timings, f.name)
        assert 0 <= value <= (lim.MAX_DURATION_MS if f.name.endswith("_ms") else lim.MAX_COUNT)
    assert s.timings.heartbeat_interval_ms < s.timings.node_lost_after_ms
    assert 1 <= len(s.nodes) <= lim.MAX_NODES
    assert all(0 <= n.gpus <= lim.MAX_GPUS_PER_NODE for n in s.nodes)
    assert all(0 <= n.gpu_memory_mib <= lim.MAX_GPU_MEMORY_MIB for n in s.nodes)
    assert all(len(n.node) <= lim.MAX_NAME_LEN for n in s.nodes)
    assert sum(n.gpus for n in s.nodes) <= lim.MAX_FLEET_GPUS
    assert len(s.profiles) <= lim.MAX_PROFILES
    for p in s.profiles:
        assert 1 <= p.nodes <= lim.MAX_SHARDS_PER_REPLICA
        assert 1 <= p.gpus_per_node <= lim.MAX_GPUS_PER_NODE
        assert len(p.args) <= lim.MAX_ARGS
        assert all(len(a) <= lim.MAX_STRING_LEN for a in (*p.args, p.model))
        assert 0 <= p.load_time_ms <= lim.MAX_DURATION_MS
        assert 0 <= p.start_timeout_ms <= lim.MAX_DURATION_MS
    assert len(s.deployments) <= lim.MAX_DEPLOYMENTS
    most = {d.model: d.replicas for d in s.deployments}
    assert len(s.faults) <= lim.MAX_FAULTS
    for fault in s.faults:
        assert 0 <= fault.at_ms <= s.duration_ms
        action = fault.action
        if isinstance(action, SetReplicas):
            most[action.model] = max(most[action.model], action.replicas)
        if isinstance(action, Partition | FabricDown):
            assert 0 < action.for_ms <= lim.MAX_DURATION_MS
        if isinstance(action, RestartController):
            assert 0 <= action.down_for_ms <= lim.MAX_DURATION_MS
    assert all(r <= lim.MAX_REPLICAS for r in most.values())
    assert sum(most.values()) <= lim.MAX_REPLICAS
    shards = {p.name: p.nodes for p in s.profiles}
    assert sum(most[d.model] * shards[d.profile] for d in s.deployments) <= lim.MAX_SHARDS
    assert len(s.expectations) <= lim.MAX_EXPECTATIONS
    for e in s.expectations:
        if isinstance(e, EventExpectation):
            assert 0 <= e.start_ms <= e.end_ms <= s.duration_ms
            assert e.count is None or 0 <= e.count <= lim.MAX_COUNT
        elif isinstance(e, RequestsExpectation):
            assert 0 <= e.start_ms <= e.end_ms <= s.duration_ms
            assert e.model in {t.model for t in s.traffic}
            assert 0 <= e.failed_max <= lim.MAX_REQUESTS
        elif isinstance(e, SloExpectation):
            assert 0 <= e.start_ms <= e.end_ms <= s.duration_ms
            assert e.model in {t.model for t in s.traffic}
        else:
            assert 0 <= e.at_ms <= s.duration_ms
    assert len({t.model for t in s.traffic}) == len(s.traffic)
    assert sum(request_bound(t, s.duration_ms) for t in s.traffic) <= lim.MAX_REQUESTS
    for t in s.traffic:
        assert t.count >= 1 and t.every_ms >= 1 and 1 <= t.tokens <= lim.MAX_TOKENS
        assert t.count * 1_000 <= t.every_ms * lim.MAX_RATE_PER_S
    assert lim.run_steps(s) <= lim.MAX_STEPS
    assert lim.event_steps(s) <= lim.MAX_EVENT_STEPS


def check_load(text: str, path: str = "fuzz.yaml") -> Scenario | None:
    """The property: a Scenario within bounds, or a ScenarioError placed in the file (`path`
    names it, and is where a trace it replays is looked for)."""
    try:
        s = load_scenario_text(text, path)
    except ScenarioError as err:
        assert err.line >= 1 and err.column >= 1 and err.message
        assert str(err) == f"{path}:{err.line}:{err.column}: {err.message}"
        assert len(str(err)) < 1000  # never the offending value whole
        return None
    assert isinstance(s, Scenario)
    assert_within_bounds(s)
    return s


# --- random documents with scenario-like keys -----------------------------------------------

_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats()
    | st.sampled_from(WORDS)
    | st.text(max_size=12)
)
_trees = st.recursive(
    _scalars,
    lambda kids: (
        st.lists(kids, max_size=5)
        | st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=8), kids, max_size=6)
    ),
    max_leaves=40,
)


def _mostly(valid: st.SearchStrategy[object]) -> st.SearchStrategy[object]:
    """Usually a value of the right kind, sometimes anything."""
    return st.one_of(valid, valid, valid, _trees)


_INTS = st.integers(min_value=-2, max_value=12) | st.sampled_from([1024, 1025, 10**5, 10**30])
_DURATIONS = st.sampled_from(["0", "500ms", "5s", "1m", "2m30s", "6m", "720h", "721h"])
_TIMES = st.sampled_from(["start", "end", "1m", "kill", "kill+30s", "end-5s", "end+1h", "9h"])
_NODES = st.sampled_from(["node01", "node02", "node03"])
_MODELS = st.sampled_from(["m", "llama-70b"])
_ACTIONS = st.one_of(
    st.fixed_dictionaries({"kill_node": _NODES}),
    st.fixed_dictionaries({"crash_node": _NODES}),
    st.fixed_dictionaries({"restart_node": _NODES}),
    st.fixed_dictionaries(
        {"partition": st.fixed_dictionaries({"nodes": st.lists(_NODES), "for": _DURATIONS})}
    ),
    st.fixed_dictionaries(
        {"kill_engine": st.fixed_dictionaries({"node": _NODES, "replica_of": _MODELS})}
    ),
    st.fixed_dictionaries({"restart_controller": st.fixed_dictionaries({"down_for": _DURATIONS})}),
    st.fixed_dictionaries({"fail_gpu": st.fixed_dictionaries({"node": _NODES, "gpu": _INTS})}),
    st.fixed_dictionaries(
        {"set_replicas": st.fixed_dictionaries({"model": _MODELS, "replicas": _INTS})}
    ),
)
_SECTIONS: dict[str, st.SearchStrategy[object]] = {
    "description": st.text(max_size=20),
    "seed": _INTS,
    "timings": st.dictionaries(
        st.sampled_from([k.key for k in TIMING_KEYS]),
        _mostly(_DURATIONS | _INTS | st.sampled_from(["50%", "0.5"])),
        max_size=4,
    ),
    "profiles": st.dictionaries(
        st.sampled_from(["p", "q"]),
        _mostly(
            st.fixed_dictionaries(
                {"engine": st.sampled_from(["sim", "vllm", "gpu"]), "gpus_per_node": _INTS},
                optional={"nodes": _INTS, "model": st.just("/m"), "load_time": _DURATIONS},
            )
        ),
        max_size=2,
    ),
    "deployments": st.lists(
        _mostly(
            st.fixed_dictionaries(
                {"model": _MODELS, "profile": st.sampled_from(["p", "q"]), "replicas": _INTS}
            )
        ),
        max_size=3,
    ),
    "faults": st.lists(
        _mostly(
            st.tuples(
                st.fixed_dictionaries({"at": _TIMES}, optional={"id": st.just("kill")}), _ACTIONS
            ).map(lambda pair: {**pair[0], **pair[1]})
        ),
        max_size=3,
    ),
    "expect": st.lists(
        _mostly(
            st.fixed_dictionaries(
                {"event": st.sampled_from(EVENT_KINDS), "within": st.lists(_TIMES, max_size=3)},
                optional={"node": _NODES, "count": _INTS, "never": st.booleans()},
            )
            | st.fixed_dictionaries(
                {"at": _TIMES},
                optional={
                    "ready_replicas": st.dictionaries(_MODELS, _INTS, max_size=2),
                    "idle_nodes": st.lists(_NODES, max_size=3),
                    "node_state": st.dictionaries(
                        _NODES, st.sampled_from(["alive", "suspect", "lost", "gone"])
                    ),
                },
            )
        ),
        max_size=3,
    ),
    "invariants": st.fixed_dictionaries(
        {"off": st.dictionaries(st.sampled_from(["no_orphans", "nope"]), st.text(max_size=5))}
    ),
}


@st.composite
def documents(draw: st.DrawFn) -> str:
    """A YAML document: a random tree, or one shaped like a scenario with random parts."""
    if draw(st.integers(min_value=0, max_value=3)) == 0:
        doc: object = draw(_trees)
    else:
        fabrics = draw(
            st.just({"ib-a": ["node01", "node02"], "ib-b": ["node03"]})
            | st.dictionaries(
                st.sampled_from(["ib-a", "ib-b"]),
                st.lists(_NODES, min_size=1, max_size=3, unique=True),
                min_size=1,
                max_size=2,
            )
        )
        rare = draw(st.integers(min_value=0, max_value=9)) == 0  # an odd name or duration
        shaped: dict[str, object] = {
            "name": draw(st.sampled_from(["x" * 129, 7, "a b"])) if rare else "s",
            "duration": draw(st.sampled_from(["720h", "721h", 0])) if rare else "6m",
            "cluster": {
                "fabrics": fabrics,
                "nodes": {"default": {"gpus": draw(_mostly(_INTS)) if rare else 8}},
            },
        }
        for key in draw(st.lists(st.sampled_from(sorted(_SECTIONS)), max_size=6, unique=True)):
            shaped[key] = draw(_SECTIONS[key])
        doc = shaped
    return yaml.safe_dump(
        doc,
        default_flow_style=draw(st.sampled_from([None, True, False])),
        allow_unicode=draw(st.booleans()),
        sort_keys=False,
    )


# --- mutations of the real files --------------------------------------------------------------


def _number(draw: st.DrawFn, text: str) -> str:
    spots = list(re.finditer(r"[0-9]+", text))
    if not spots:
        return text
    m = draw(st.sampled_from(spots))
    new = draw(
        st.sampled_from([*HUGE, "-1", "-" + m.group(), "1.5", "0", "1e9", "0x10", "1_000"])
        | st.integers(min_value=-(10**6), max_value=10**20).map(str)
    )
    return text[: m.start()] + new + text[m.end() :]


def _key(draw: st.DrawFn, text: str) -> str:
    spots = list(re.finditer(r"(?m)^[ -]*([A-Za-z_]+):", text))
    if not spots:
        return text
    m = draw(st.sampled_from(spots))
    new = draw(st.sampled_from([*KEYS, "<<", "", "bogus"]))
    return text[: m.start(1)] + new + text[m.end(1) :]


def _lines(draw: st.DrawFn, text: str) -> str:
    lines = text.splitlines(keepends=True) or [""]
    i = draw(st.integers(min_value=0, max_value=len(lines) - 1))
    op = draw(st.sampled_from(["delete", "duplicate", "swap"]))
    if op == "delete":
        del lines[i]
    elif op == "duplicate":  # a repeated key, or a repeated list item
        lines.insert(i, lines[i])
    else:
        j = draw(st.integers(min_value=0, max_value=len(lines) - 1))
        lines[i], lines[j] = lines[j], lines[i]
    return "".join(lines)


def _truncate(draw: st.DrawFn, text: str) -> str:
    return text[: draw(st.integers(min_value=0, max_value=len(text)))]


_PIECES = [
    "\ufeff",
    "\r",
    "\r\n",
    "\x00",
    "\x07",
    "\u2028",
    "\x85",
    "\u00e9",
    "\U0001f600",
    "\t",
    "&a ",
    "*a",
    "!!binary ",
    "!!python/object/apply:os.system ",
    "<<: *a\n",
    "? ",
    "--- \n",
    "...\n",
    "%YAML 1.1\n",
    "{",
    "[",
    "'",
    '"',
    "#",
]


def _insert(draw: st.DrawFn, text: str) -> str:
    at = draw(st.integers(min_value=0, max_value=len(text)))
    piece = draw(st.sampled_from(_PIECES) | st.text(max_size=3))
    return text[:at] + piece + text[at:]


def _line_ends(draw: st.DrawFn, text: str) -> str:
    end = draw(st.sampled_from(["\r\n", "\r"]))
    bom = draw(st.sampled_from(["", "\ufeff"]))
    return bom + text.replace("\n", end)


def _value(draw: st.DrawFn, text: str) -> str:
    """A value replaced by deep nesting, a long string, or an anchor and an alias to it."""
    spots = list(re.finditer(r"(?m): (\S[^\n]*)$", text))
    if not spots:
        return text
    m = draw(st.sampled_from(spots))
    depth = draw(st.sampled_from([31, 32, 33, 200, 3000]))
    new = draw(
        st.sampled_from(
            [
                "[" * depth + "]" * depth,
                "{a: " * depth + "1" + "}" * depth,
                "x" * 129,
                "x" * 5000,
                "&anchor " + m.group(1),
                "*anchor",
                "&loop [*loop]",
                "&self {a: *self}",
            ]
        )
    )
    out = text[: m.start(1)] + new + text[m.end(1) :]
    if new.startswith("&anchor") and draw(st.booleans()):
        other = draw(st.sampled_from(spots))
        if other.start() > m.end():  # an alias after its anchor, elsewhere in the file
            shift = len(new) - len(m.group(1))
            out = out[: other.start(1) + shift] + "*anchor" + out[other.end(1) + shift :]
    return out


def _bomb(draw: st.DrawFn, text: str) -> str:
    """A value replaced by an alias bomb: anchors, each a list of aliases of the one before."""
    spots = list(re.finditer(r"(?m): (\S[^\n]*)$", text))
    if not spots:
        return text
    m = draw(st.sampled_from(spots))
    width = draw(st.sampled_from([2, 10]))
    levels = draw(st.sampled_from([2, 7, 21]))
    parts = ["&b0 [" + ", ".join(["x"] * width) + "]"]
    for i in range(1, levels):
        parts.append(f"&b{i} [" + ", ".join([f"*b{i - 1}"] * width) + "]")
    return text[: m.start(1)] + "[" + ", ".join(parts) + "]" + text[m.end(1) :]


_OPS = [_number, _number, _key, _lines, _truncate, _insert, _line_ends, _value, _bomb]


@st.composite
def mutated(draw: st.DrawFn) -> str:
    text = draw(st.sampled_from(TEXTS))
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        text = draw(st.sampled_from(_OPS))(draw, text)
    return text


# --- the properties ---------------------------------------------------------------------------


@settings(FUZZ, max_examples=LOADER_EXAMPLES)
@given(mutated())
def test_mutated_scenarios_load_within_bounds_or_fail_in_place(text: str) -> None:
    check_load(text)


@settings(FUZZ, max_examples=DOC_EXAMPLES)
@given(documents())
def test_random_documents_load_within_bounds_or_fail_in_place(text: str) -> None:
    check_load(text)


def test_every_file_in_scenarios_is_within_bounds() -> None:
    for path, text in zip(FILES, TEXTS, strict=True):
        assert check_load(text, str(path)) is not None


_ERROR_LINE = re.compile(r"error: .+\.yaml:[0-9]+:[0-9]+: .+")


@settings(FUZZ, max_examples=CLI_EXAMPLES)
@given(mutated())
def test_the_cli_exits_0_1_or_2_and_never_with_a_traceback(text: str) -> None:
    try:
        s = load_scenario_text(text, "pre.yaml")
    except ScenarioError:
        pass
    else:
        assume(lim.run_steps(s) + lim.event_steps(s) <= CLI_MAX_STEPS)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "fuzz.yaml"
        path.write_bytes(text.encode("utf-8", "surrogatepass"))
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = cli.main(["run", "-q", str(path)])
    assert code in (0, 1, 2)
    assert "Traceback" not in err.getvalue() + out.getvalue()
    if code == 2:
        lines = err.getvalue().splitlines()
        assert len(lines) == 1 and _ERROR_LINE.fullmatch(lines[0]), lines
        assert "internal error" not in lines[0]
    else:
        assert out.getvalue().startswith(("PASS ", "FAIL "))
