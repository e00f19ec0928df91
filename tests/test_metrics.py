"""`GET /metrics` of the controller and the router service, scraped over loopback and read with
Prometheus's own parser: the fleet's gauges agree with `/v1/admin/state`, the counters with the
event log; a failure and a reap show in the counters by reason; inference requests through the
controller and through a router show in the request counts and the latency histograms; with
credentials on, a scrape needs an admin token (the controller) or an API key (the router); and
every expression of docs/grafana-dashboard.json names only metrics the services export.

The stack is one sim engine process, a controller (fake agents: its commands are recorded, the
nodes' reports are sent by the test) and a router following the controller's feed. Its timings
keep nodes alive and a placed replica unjudged for longer than the module runs, so nothing
changes between a scrape and the view it is compared with, and each test leaves the replicas as
it found them (the tests do not depend on their order).
"""

from __future__ import annotations

import asyncio
import json
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import REGISTRY, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from helpers.controller import CHAT_MODEL, Sent, assigned_specs, runtime_of, two_ready_replicas
from helpers.live import live_controller, live_server
from helpers.router import settings as router_settings
from helpers.router import sim_engine
from helpers.services import FAST, node_info, wait_sync
from llmgw_twin.control.controller import Controller
from llmgw_twin.control.model import (
    Deployment,
    EngineName,
    FabricId,
    ModelName,
    NodeInfo,
    Profile,
    ProfileName,
    ReplicaState,
    ShardReport,
    ShardSpec,
    ShardState,
)
from llmgw_twin.control.protocol import (
    ApplyDeployment,
    ApplyProfile,
    AssignShards,
    Heartbeat,
    NodeRegistered,
)
from llmgw_twin.service.common.auth import new_token, token_hash
from llmgw_twin.service.common.wire import HeartbeatW, ShardSpecW
from llmgw_twin.service.controller.app import ControllerRuntime
from llmgw_twin.service.controller.config import ControllerAuth, ControllerSettings
from llmgw_twin.service.controller.metrics import reason_class
from llmgw_twin.service.controller.routes import create_controller_app
from llmgw_twin.service.router.app import RouterRuntime, create_router_app
from llmgw_twin.twin.scenario.loader import load_scenario
from llmgw_twin.twin.world.runner import run_scenario

ROOT = Path(__file__).resolve().parents[1]
DASHBOARD = ROOT / "docs" / "grafana-dashboard.json"
STEADY = replace(
    FAST,
    node_suspect_after_ms=600_000,
    node_lost_after_ms=1_200_000,
    start_grace_ms=600_000,
)
"""While the module runs, nodes never turn suspect and a placed replica is never failed for not
being ready (the fake agents report only what a test sends)."""
DEADLINE_S = 30.0

Labels = frozenset[tuple[str, str]]


class Scrape:
    """One scrape's samples: (sample name, labels) -> value."""

    def __init__(self, text: str) -> None:
        self.samples: dict[tuple[str, Labels], float] = {}
        self.families: dict[str, str] = {}
        for family in text_string_to_metric_families(text):
            self.families[family.name] = family.type
            for s in family.samples:
                self.samples[s.name, frozenset(s.labels.items())] = s.value

    def get(self, name: str, **labels: str) -> float:
        """The sample's value; 0 when the scrape has none (a labelled series not yet seen)."""
        return self.samples.get((name, frozenset(labels.items())), 0.0)

    def series(self, name: str) -> dict[Labels, float]:
        return {labels: v for (n, labels), v in self.samples.items() if n == name}

    def names(self) -> set[str]:
        return {n for n, _ in self.samples}

    def label_names(self, name: str) -> set[str]:
        return {k for labels in self.series(name) for k, _ in labels}


def delta(before: Scrape, after: Scrape, name: str, **labels: str) -> float:
    return after.get(name, **labels) - before.get(name, **labels)


def scrape(base: str, token: str | None = None) -> Scrape:
    headers = {"authorization": f"Bearer {token}"} if token is not None else {}
    r = httpx.get(base + "/metrics", headers=headers, trust_env=False, timeout=10)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
    return Scrape(r.text)


@dataclass
class Stack:
    controller: str
    router: str
    engine: str
    sent: Sent

    def get(self, path: str) -> Any:
        r = httpx.get(self.controller + path, trust_env=False, timeout=10)
        assert r.status_code == 200, r.text
        return r.json()

    def events(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        after = 0
        while True:
            page = self.get(f"/v1/admin/events?after={after}")
            out += page["events"]
            if page["next"] == after:
                return out
            after = page["next"]

    def chat(self, base: str, model: str = CHAT_MODEL, stream: bool = False) -> httpx.Response:
        body = {
            "model": model,
            "messages": [{"role": "user", "content": "hello"}],
            "max_tokens": 4,
            "stream": stream,
        }
        return httpx.post(base + "/v1/chat/completions", json=body, trust_env=False, timeout=30)

    def set_replicas(self, n: int) -> None:
        r = httpx.put(
            self.controller + f"/v1/admin/deployments/{CHAT_MODEL}",
            json={"profile": "tiny", "replicas": n},
            trust_env=False,
            timeout=10,
        )
        assert r.status_code == 200, r.text

    def heartbeat(self, beat: Heartbeat) -> None:
        body = HeartbeatW.from_core(beat).model_dump(mode="json")
        r = httpx.post(
            self.controller + "/v1/agents/heartbeat", json=body, trust_env=False, timeout=10
        )
        assert r.status_code == 200, r.text


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("metrics")
    sent: Sent = []
    engine, engine_url = sim_engine(model=CHAT_MODEL)
    try:
        with live_controller(
            lambda: create_controller_app(runtime_of(tmp, sent, timings=STEADY))
        ) as controller:

            async def ready() -> list[str]:
                async with httpx.AsyncClient(base_url=controller, trust_env=False) as client:
                    return await two_ready_replicas(client, sent, endpoint=engine_url)

            assert len(asyncio.run(ready())) == 2
            s = router_settings(controller_url=controller, feed_wait_ms=500)
            with live_server(lambda: create_router_app(RouterRuntime(s))) as router:
                yield Stack(controller, router, engine_url, sent)
    finally:
        engine.close()


def test_the_fleet_gauges_and_the_counters_agree_with_the_state_and_the_event_log(
    stack: Stack,
) -> None:
    m = scrape(stack.controller)
    state = stack.get("/v1/admin/state")
    nodes = Counter(n["state"] for n in state["nodes"])
    assert {dict(k)["state"]: v for k, v in m.series("llmgw_nodes").items()} == {
        "alive": nodes["alive"],
        "suspect": nodes["suspect"],
        "lost": nodes["lost"],
    }
    assert nodes["alive"] == 2
    replicas = Counter((r["model"], r["state"]) for r in state["replicas"])
    scraped = {
        (dict(k)["model"], dict(k)["state"]): v
        for k, v in m.series("llmgw_replicas").items()
        if v > 0
    }
    assert scraped == replicas and replicas[CHAT_MODEL, "ready"] >= 1
    # every live state of a deployed model is a series, at 0 when no replica is in it
    assert len(m.series("llmgw_replicas")) == len([s for s in ReplicaState if s.live])
    assert m.get("llmgw_gpus") == sum(n["gpu_count"] for n in state["nodes"]) == 16
    held = sum(g["replica"] is not None for n in state["nodes"] for g in n["gpus"])
    assert m.get("llmgw_gpus_in_use") == held >= 1
    assert m.get("llmgw_gpus_failed") == sum(len(n["failed_gpus"]) for n in state["nodes"])
    for dep in state["deployments"]:
        assert m.get("llmgw_replicas_desired", model=dep["model"]) == dep["replicas"]
    routable = sum(r["routable"] for r in state["replicas"])
    assert m.get("llmgw_routable_replicas", model=CHAT_MODEL) == routable
    pending = [r for r in state["replicas"] if r["state"] == "pending"]
    assert m.get("llmgw_replicas_unplaceable", model=CHAT_MODEL) <= len(pending)
    assert m.get("llmgw_mass_loss_hold") == int(state["mass_loss_hold"])
    assert m.get("llmgw_quarantines") == len(state["quarantines"])

    # one series per node: its health, GPUs in use and failed, its link while it is heard from
    for n in state["nodes"]:
        at = {"node": n["node"], "fabric": n["fabric"]}
        used = sum(g["replica"] is not None for g in n["gpus"])
        assert m.get("llmgw_node_alive", **at) == int(n["state"] == "alive")
        assert m.get("llmgw_node_gpus_in_use", **at) == used
        assert m.get("llmgw_node_gpus_failed", **at) == len(n["failed_gpus"])
        assert m.get("llmgw_node_fabric_link_up", **at) == int(n["fabric_link_up"])
    assert len(m.series("llmgw_node_alive")) == len(state["nodes"])
    assert m.get("llmgw_node_series_omitted") == 0

    kinds = Counter(ev["kind"] for ev in stack.events())
    events = {dict(k)["kind"]: v for k, v in m.series("llmgw_events_total").items()}
    assert {k: v for k, v in events.items() if v > 0} == kinds
    placed = Counter(
        ev["subjects"]["model"] for ev in stack.events() if ev["kind"] == "replica.placed"
    )
    assert m.get("llmgw_replica_placements_total", model=CHAT_MODEL) == placed[CHAT_MODEL] >= 2

    c = state["controller"]
    for metric, key in [
        ("llmgw_deliveries_failed_total", "send_failures"),
        ("llmgw_deliveries_given_up_total", "sends_given_up"),
        ("llmgw_controller_lag_episodes_total", "lag_episodes"),
    ]:
        assert m.get(metric) == c[key], metric
    assert m.get("llmgw_store_commits_total") >= 1

    def delivered() -> bool | None:
        return (
            True
            if scrape(stack.controller).get("llmgw_deliveries_sent_total") == len(stack.sent)
            else None
        )

    wait_sync(delivered, DEADLINE_S, "every command the agents got counted as sent")


def test_a_failure_and_a_reap_show_in_the_counters_by_reason(stack: Stack) -> None:
    fail_a_new_replica(stack)


def fail_a_new_replica(stack: Stack) -> None:
    """One replica more is placed; its engine exits at once (failed and reaped in the heartbeat's
    own step: `shard_exited`); the deployment is scaled back (its replacement, never ready, is
    reaped: `scaled_down`). Each counter moves by one, and the replicas are as they were."""
    before = scrape(stack.controller)
    desired = int(before.get("llmgw_replicas_desired", model=CHAT_MODEL))
    known = {s.replica for s in assigned_specs(stack.sent)}
    stack.set_replicas(desired + 1)
    placed = wait_moved(
        stack.controller, before, "llmgw_replica_placements_total", model=CHAT_MODEL
    )
    assert delta(before, placed, "llmgw_replica_placements_total", model=CHAT_MODEL) == 1
    assert delta(before, placed, "llmgw_replicas", model=CHAT_MODEL, state="placed") == 1

    def new_spec() -> ShardSpec | None:
        return next((s for s in assigned_specs(stack.sent) if s.replica not in known), None)

    spec = wait_sync(new_spec, DEADLINE_S, "the new replica's assignment")
    ready = {
        r["replica"] for r in stack.get("/v1/admin/state")["replicas"] if r["state"] == "ready"
    }
    others = [
        ShardReport(s, ShardState.SERVING, stack.engine, None, ())
        for s in latest_assignment(stack.sent, spec.node)
        if s.replica in ready
    ]
    # the node's heartbeat: the new shard exited, its other shards serving as they were
    stack.heartbeat(
        Heartbeat(spec.node, (ShardReport(spec, ShardState.EXITED, None, 1, ()), *others))
    )
    failed = scrape(stack.controller)
    assert delta(placed, failed, "llmgw_heartbeats_total") == 1
    for name in ("llmgw_replica_failures_total", "llmgw_replica_reaps_total"):
        assert delta(placed, failed, name, model=CHAT_MODEL, reason="shard_exited") == 1, name
    assert delta(placed, failed, "llmgw_events_total", kind="replica.failed") == 1
    assert delta(placed, failed, "llmgw_events_total", kind="replica.reaped") == 1
    assert delta(placed, failed, "llmgw_store_commits_total") >= 1

    def replaced() -> Scrape | None:  # at the next reconcile: placed, or pending its back-off
        m = scrape(stack.controller)
        waiting = [
            m.get("llmgw_replicas", model=CHAT_MODEL, state=s) for s in ("placed", "pending")
        ]
        return m if sum(waiting) == 1 else None

    replacement = wait_sync(replaced, DEADLINE_S, "a replacement")
    stack.set_replicas(desired)
    scaled_down = {"model": CHAT_MODEL, "reason": "scaled_down"}
    last = wait_moved(stack.controller, replacement, "llmgw_replica_reaps_total", **scaled_down)
    assert delta(replacement, last, "llmgw_replica_reaps_total", **scaled_down) == 1
    assert last.get("llmgw_replicas_desired", model=CHAT_MODEL) == desired
    for state in ReplicaState:
        if state.live:
            assert delta(before, last, "llmgw_replicas", model=CHAT_MODEL, state=state.value) == 0
    # no reason fell outside its classes
    assert all(dict(k)["reason"] != "other" for k in last.series("llmgw_replica_reaps_total"))


def test_heartbeats_and_the_event_loop_show_in_the_controllers_own_histograms(
    stack: Stack,
) -> None:
    """Each heartbeat answered is one observation of its handling time; the lag monitor's
    probes are observed whether late or not (what the load benchmark reads to say whose side a
    latency tail is on)."""
    spec = next(s for s in assigned_specs(stack.sent))
    ready = {
        r["replica"] for r in stack.get("/v1/admin/state")["replicas"] if r["state"] == "ready"
    }
    reports = tuple(
        ShardReport(s, ShardState.SERVING, stack.engine, None, ())
        for s in latest_assignment(stack.sent, spec.node)
        if s.replica in ready
    )
    before = scrape(stack.controller)
    for _ in range(3):
        stack.heartbeat(Heartbeat(spec.node, reports))
    after = scrape(stack.controller)
    name = "llmgw_heartbeat_handling_seconds"
    assert after.families[name] == "histogram"
    assert delta(before, after, "llmgw_heartbeats_total") == 3
    assert delta(before, after, name + "_count") == 3
    assert delta(before, after, name + "_sum") > 0
    buckets = sorted((float(dict(k)["le"]), v) for k, v in after.series(name + "_bucket").items())
    assert [v for _, v in buckets] == sorted(v for _, v in buckets)  # cumulative
    assert buckets[-1] == (float("inf"), after.get(name + "_count"))
    lateness = "llmgw_controller_loop_lateness_seconds_count"
    moved = wait_moved(stack.controller, after, lateness)
    assert delta(after, moved, lateness) >= 1


def wait_moved(base: str, before: Scrape, name: str, **labels: str) -> Scrape:
    """The first scrape of `base` in which `name{labels}` moved since `before` (a counter moves
    once its step is durable and published)."""

    def moved() -> Scrape | None:
        m = scrape(base)
        return m if delta(before, m, name, **labels) else None

    return wait_sync(moved, DEADLINE_S, f"{name} {labels} to move")


def latest_assignment(sent: Sent, node: str) -> list[ShardSpec]:
    """The shards the controller's latest assignment to `node` named."""
    for path, body in reversed(sent):
        if path == "/v1/assign" and body["node"] == node:
            return [ShardSpecW.model_validate(raw).to_core() for raw in body["shards"]]
    return []


def test_inference_requests_show_in_counts_and_histograms_of_both_services(stack: Stack) -> None:
    def routable() -> bool | None:
        models = httpx.get(stack.router + "/v1/models", trust_env=False).json()["data"]
        return True if any(m["ready_replicas"] >= 1 for m in models) else None

    wait_sync(routable, DEADLINE_S, "a routable replica at the router")
    c0, r0 = scrape(stack.controller), scrape(stack.router)

    assert stack.chat(stack.controller).status_code == 200
    with httpx.stream(
        "POST",
        stack.router + "/v1/chat/completions",
        json={
            "model": CHAT_MODEL,
            "messages": [{"role": "user", "content": "hello"}],
            "max_tokens": 4,
            "stream": True,
        },
        trust_env=False,
        timeout=30,
    ) as streamed:
        assert streamed.status_code == 200
        assert b"[DONE]" in streamed.read()
    assert stack.chat(stack.router, model="no-such-model").status_code == 404

    c1 = scrape(stack.controller)
    answered = {"model": CHAT_MODEL, "code": "200", "outcome": "answered"}
    assert delta(c0, c1, "llmgw_requests_total", **answered) == 1
    _histograms_moved_by_one(c0, c1)
    assert c1.get("llmgw_requests_in_flight") == 0

    def stream_ended() -> Scrape | None:
        m = scrape(stack.router)
        ended = delta(r0, m, "llmgw_requests_total", **answered)
        return m if ended == 1 and m.get("llmgw_requests_in_flight") == 0 else None

    r1 = wait_sync(stream_ended, DEADLINE_S, "the router to count the stream once it ended")
    _histograms_moved_by_one(r0, r1)
    # a model no one deployed is counted, without its name becoming a series
    refused = {"model": "", "code": "404", "outcome": "model_not_found"}
    assert delta(r0, r1, "llmgw_requests_total", **refused) == 1
    assert all(dict(k)["model"] in ("", CHAT_MODEL) for k in r1.series("llmgw_requests_total"))
    assert r1.get("llmgw_router_feed_connected") == 1
    assert r1.get("llmgw_routable_replicas", model=CHAT_MODEL) >= 1


def _histograms_moved_by_one(before: Scrape, after: Scrape) -> None:
    """One request to a replica: each latency histogram counted it once, in one bucket and in
    every bucket above it, with a time of its own."""
    for name in ("llmgw_request_first_byte_seconds", "llmgw_request_duration_seconds"):
        assert after.families[name] == "histogram"

        assert delta(before, after, name + "_count", model=CHAT_MODEL) == 1, name
        assert delta(before, after, name + "_sum", model=CHAT_MODEL) > 0, name
        buckets = sorted(
            (float(dict(k)["le"]), v)
            for k, v in after.series(name + "_bucket").items()
            if dict(k)["model"] == CHAT_MODEL
        )
        assert buckets[-1][0] == float("inf")
        bucket = name + "_bucket"
        deltas = [delta(before, after, bucket, model=CHAT_MODEL, le=_le(le)) for le, _ in buckets]
        assert deltas == sorted(deltas) and deltas[-1] == 1 and set(deltas) <= {0, 1}, deltas
        counts = [v for _, v in buckets]
        assert counts == sorted(counts)
        assert counts[-1] == after.get(name + "_count", model=CHAT_MODEL)


def _le(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(bound)


def test_a_scrape_needs_an_admin_token_or_the_routers_api_key_once_credentials_are_asked(
    tmp_path: Path,
) -> None:
    admin, api, router_token, reader = new_token(), new_token(), new_token(), new_token()
    auth = ControllerAuth(
        (token_hash(admin),),
        (token_hash(api),),
        tmp_path / "secret.key",
        (token_hash(router_token),),
        (token_hash(reader),),
    )
    settings = ControllerSettings("127.0.0.1", 0, str(tmp_path / "c.db"), FAST, (), (), auth=auth)
    with live_controller(lambda: create_controller_app(ControllerRuntime(settings))) as controller:
        for token, status in [
            (None, 401),
            (new_token(), 401),
            (api, 403),
            (router_token, 403),
        ]:
            headers = {"authorization": f"Bearer {token}"} if token is not None else {}
            r = httpx.get(controller + "/metrics", headers=headers, trust_env=False)
            assert r.status_code == status, (token, r.text)
            assert "llmgw_" not in r.text
        assert scrape(controller, admin).get("llmgw_nodes", state="alive") == 0
        # a reader token scrapes and reads the state, and changes nothing
        assert scrape(controller, reader).get("llmgw_nodes", state="alive") == 0
        as_reader = {"authorization": f"Bearer {reader}"}
        r = httpx.get(controller + "/v1/admin/state", headers=as_reader, trust_env=False)
        assert r.status_code == 200, r.text
        body = {"profile": "tiny", "replicas": 1}
        url = controller + "/v1/admin/deployments/tiny"
        r = httpx.put(url, json=body, headers=as_reader, trust_env=False)
        assert r.status_code == 403 and "reader token" in r.text, r.text
        assert httpx.get(controller + "/health", trust_env=False).json() == {"status": "ok"}

    s = router_settings(controller_url="http://127.0.0.1:9", api_key_hashes=(token_hash(api),))
    with live_server(lambda: create_router_app(RouterRuntime(s))) as router:
        r = httpx.get(router + "/metrics", trust_env=False)
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
        assert scrape(router, api).get("llmgw_router_feed_connected") == 0
    # each runtime has a registry of its own: nothing lands in the process's default one
    assert b"llmgw_" not in generate_latest(REGISTRY)


def test_every_failure_and_reap_reason_has_a_class() -> None:
    """The classes follow the core's wording: every reason the scenarios give, and those the
    core gives a GPU failure, a node back in another fabric, a launch the agent refused and a
    ready replica's shard that went back to starting."""
    seen: set[str] = set()
    for path in sorted((ROOT / "scenarios").glob("*.yaml")):
        for ev in run_scenario(load_scenario(path)).trace:
            if ev.kind in ("replica.failed", "replica.reaped"):
                cls = reason_class(ev.get("reason"))
                assert cls != "other", (path.name, ev.get("reason"))
                seen.add(cls)
    assert {"node_lost", "shard_exited", "scaled_down", "moved", "start_timeout"} <= seen

    for what, cls in [
        ("gpu", "gpu_failed"),
        ("fabric", "node_changed"),
        ("refused", "launch_refused"),
        ("starting", "shard_down"),
    ]:
        reasons = [str(ev.get("reason")) for ev in _fail_one(what) if ev.kind == "replica.failed"]
        assert [reason_class(r) for r in reasons] == [cls], (what, reasons)


def _fail_one(what: str) -> list[Any]:
    """The events of a one-node replica made ready on the core, then failed by `what`."""
    core = Controller(FAST)
    info = node_info("n1")
    now = 0
    core.handle(NodeRegistered(info, (), incarnation=1), now)
    core.handle(ApplyProfile(Profile(ProfileName("p"), EngineName("sim"), 1, 1, "/m")), now)
    core.handle(ApplyDeployment(Deployment(ModelName("m"), ProfileName("p"), 1)), now)
    now += 50
    (spec,) = next(c.shards for c in core.tick(now).commands if isinstance(c, AssignShards))
    serving = ShardReport(spec, ShardState.SERVING, "http://e:8000", None, ())
    core.handle(Heartbeat(info.node, (serving,)), now := now + 50)
    core.tick(now := now + 50)
    rec = core.replica(spec.replica)
    assert rec is not None and rec.state is ReplicaState.READY
    if what == "gpu":
        event: Any = Heartbeat(info.node, (serving,), failed_gpus=spec.gpus)
    elif what == "fabric":
        moved = NodeInfo(info.node, FabricId("ib-b"), info.gpus, info.gpu_memory_mib, info.engines)
        event = NodeRegistered(moved, (serving,), incarnation=2)
    elif what == "refused":
        refused = "refused by the launch policy: flag --x is not one the engine defines"
        report = ShardReport(spec, ShardState.EXITED, None, 1001, (), refused)
        event = Heartbeat(info.node, (report,))
    else:
        event = Heartbeat(info.node, (ShardReport(spec, ShardState.STARTING, None, None, ()),))
    step = core.handle(event, now := now + 50)
    return [*step.events, *core.tick(now + 50).events]


def test_every_dashboard_expression_names_only_metrics_the_services_export(stack: Stack) -> None:
    # a failure, a reap, a request through each service: every labelled metric has series
    fail_a_new_replica(stack)
    assert stack.chat(stack.controller).status_code == 200
    assert stack.chat(stack.router).status_code == 200
    exported = [scrape(stack.controller), scrape(stack.router)]
    names = set().union(*(m.names() for m in exported))

    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    assert dashboard["title"] and dashboard["uid"] and dashboard["schemaVersion"] >= 36
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])
    used: set[str] = set()
    for panel in panels:
        assert panel["targets"], panel["title"]
        assert all(k in panel["gridPos"] for k in ("x", "y", "w", "h")), panel["title"]
        for target in panel["targets"]:
            expr = target["expr"]
            metrics = set(re.findall(r"\bllmgw_[a-z0-9_]+", expr))
            assert metrics, (panel["title"], expr)
            assert metrics <= names, (panel["title"], sorted(metrics - names))
            used |= metrics
            # every label the expression groups or filters by is one its metrics carry
            labels = {
                *(
                    label.strip()
                    for group in re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", expr)
                    for label in group.split(",")
                    if label.strip()
                ),
                *re.findall(r"[{,]\s*([a-z_]+)\s*(?:=~|!~|!=|=)", expr),
            } - {"le"}
            carried = {
                label for m in exported for metric in metrics for label in m.label_names(metric)
            }
            assert labels <= carried, (panel["title"], sorted(labels - carried))
    for wanted in [
        "llmgw_nodes",
        "llmgw_replicas",
        "llmgw_replica_placements_total",
        "llmgw_replica_failures_total",
        "llmgw_replica_reaps_total",
        "llmgw_replicas_unplaceable",
        "llmgw_requests_total",
        "llmgw_request_duration_seconds_bucket",
        "llmgw_request_first_byte_seconds_bucket",
        "llmgw_controller_lag_forgiven_seconds_total",
    ]:
        assert wanted in used, wanted


def test_per_node_series_are_bounded_and_the_nodes_to_look_at_come_first() -> None:
    """Past the cap, the nodes not alive, with a failed GPU or a link down keep their series;
    the omitted count says how many nodes have none."""
    from llmgw_twin.control.model import NodeState
    from llmgw_twin.service.controller.node_metrics import chosen

    class Core:
        def nodes(self) -> list[str]:
            return [f"n{i:02}" for i in range(20)]

        def node_state(self, node: str) -> NodeState:
            return NodeState.LOST if node == "n17" else NodeState.ALIVE

        def failed_gpus(self, node: str) -> tuple[int, ...]:
            return (3,) if node == "n12" else ()

        def link_up(self, node: str) -> bool:
            return node != "n19"

    kept, omitted = chosen(Core(), limit=5)  # type: ignore[arg-type]
    assert kept == ["n00", "n01", "n12", "n17", "n19"] and omitted == 15
    assert chosen(Core(), limit=20) == (Core().nodes(), 0)  # type: ignore[arg-type]
