"""The controller's autoscaler reads the engines' own load (docs/autoscale.md): each engine's
exposition as it writes it, the sim engine's `/metrics`, the scraper against HTTP servers on
loopback (answering, slow, failing, too large, absent), and a controller whose `queue` policy
scales a deployment up when its engines report a queue.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from fractions import Fraction
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Response

from helpers.fake_fleet import TIMINGS, Agents, Fleet, bearer
from helpers.live import live_controller, live_server
from helpers.services import wait_sync
from llmgw_twin.control.autoscale import AutoscalePolicy
from llmgw_twin.control.model import ModelName, ReplicaId, ShardReport, ShardSpec, ShardState
from llmgw_twin.control.routing import Router
from llmgw_twin.control.routing_feed import SnapshotEntry, SnapshotState
from llmgw_twin.engines.perf.table import perf_from_arg
from llmgw_twin.engines.registry import adapter_for
from llmgw_twin.programs.sim_api import SimModel, create_app
from llmgw_twin.programs.sim_batcher import Batcher
from llmgw_twin.programs.sim_metrics import exposition
from llmgw_twin.service.common.auth import new_token, token_hash
from llmgw_twin.service.common.config import ConfigError
from llmgw_twin.service.controller.app import ControllerRuntime
from llmgw_twin.service.controller.config import (
    ControllerAuth,
    ControllerSettings,
    load_controller_config,
)
from llmgw_twin.service.controller.engine_loads import EngineLoads, ReplicaLoad, read_load
from llmgw_twin.service.controller.routes import create_controller_app

# --- each engine's exposition ------------------------------------------------------------------

VLLM = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="llama-70b"} 12.0
vllm:num_requests_running{engine="1",model_name="llama-70b"} 9.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="llama-70b"} 3.0
vllm:num_requests_waiting{engine="1",model_name="llama-70b"} 4.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="llama-70b"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="llama-70b"} 0.75
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",model_name="llama-70b"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="llama-70b"} 40.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="llama-70b"} 40.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="llama-70b"} 6.5
"""

VLLM_OLD = """\
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="llama-70b"} 0.0
# HELP vllm:gpu_cache_usage_perc GPU KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="llama-70b"} 0.5
"""

SGLANG = """\
# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{engine_type="unified",model_name="llama-70b",pp_rank="0",tp_rank="0"} 8.0
# HELP sglang:num_queue_reqs The number of requests in the waiting queue.
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{engine_type="unified",model_name="llama-70b",pp_rank="0",tp_rank="0"} 5.0
sglang:num_queue_reqs{engine_type="unified",model_name="llama-70b",pp_rank="0",tp_rank="1"} 1.0
# HELP sglang:token_usage The token usage.
# TYPE sglang:token_usage gauge
sglang:token_usage{engine_type="unified",model_name="llama-70b",pp_rank="0",tp_rank="0"} 0.4
sglang:token_usage{engine_type="unified",model_name="llama-70b",pp_rank="0",tp_rank="1"} 0.6
"""

LLAMACPP = """\
# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 1234
# HELP llamacpp:requests_processing Number of requests processing.
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 4
# HELP llamacpp:requests_deferred Number of requests deferred.
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 2
"""


@pytest.mark.parametrize(
    ("engine", "text", "load"),
    [
        ("vllm", VLLM, ReplicaLoad(7.0, 0.75)),  # queues summed, the fuller cache
        ("vllm", VLLM_OLD, ReplicaLoad(0.0, 0.5)),  # the older KV-cache name
        ("sglang", SGLANG, ReplicaLoad(6.0, 0.6)),  # per tp rank
        ("llamacpp", LLAMACPP, ReplicaLoad(2.0, None)),  # no KV-cache use exported
    ],
)
def test_each_engines_exposition_gives_its_queue_and_cache_use(
    engine: str, text: str, load: ReplicaLoad
) -> None:
    assert read_load(text, adapter_for(engine).load_metrics) == load


def test_an_exposition_without_the_metrics_or_out_of_range_gives_nothing() -> None:
    metrics = adapter_for("vllm").load_metrics
    assert read_load(LLAMACPP, metrics) == ReplicaLoad(None, None)
    percent = "vllm:kv_cache_usage_perc 75\nvllm:num_requests_waiting -1\n"
    assert read_load(percent, metrics) == ReplicaLoad(None, None)
    with pytest.raises(ValueError):
        read_load("vllm:num_requests_waiting{model_name=} three\n", metrics)


def test_llamacpp_exports_no_kv_cache_use_and_the_flags_are_on() -> None:
    assert adapter_for("llamacpp").load_metrics.kv_cache == ()
    for engine, flag in (("llamacpp", "--metrics"), ("sglang", "--enable-metrics")):
        leader, *workers = adapter_for(engine).widest()
        assert flag in leader.argv
        assert all(flag not in w.argv for w in workers)


PERF = perf_from_arg(
    "iteration_us=1000,prefill_us_per_token=1,decode_us_per_token=10,max_batch=2,kv_tokens=1000"
)


def test_the_sim_engine_says_its_engine_models_queue_and_cache_use() -> None:
    now = [0]
    batcher = Batcher(PERF, clock_us=lambda: now[0])
    for key in range(5):  # 150 tokens each, 2 at a time
        assert batcher.engine.submit(key, 0, 100, 50)
    now[0] = 5_000  # the first iteration ran: 2 in the batch, 3 waiting
    metrics = adapter_for("sim").load_metrics
    assert read_load(exposition("small", batcher).decode(), metrics) == ReplicaLoad(3.0, 0.3)
    now[0] = 10**9  # all done
    assert read_load(exposition("small", batcher).decode(), metrics) == ReplicaLoad(0.0, 0.0)


def test_the_sim_engine_serves_metrics_without_a_perf_model() -> None:
    async def scrape() -> httpx.Response:
        app = create_app(SimModel("small", "/m/small", 1, 16))
        transport = httpx.ASGITransport(app)
        async with httpx.AsyncClient(transport=transport, base_url="http://sim") as client:
            return await client.get("/metrics")

    r = asyncio.run(scrape())
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    assert read_load(r.text, adapter_for("sim").load_metrics) == ReplicaLoad(0.0, 0.0)


# --- the scraper, against servers on loopback --------------------------------------------------


def _sim_text(waiting: int, usage: float) -> str:
    return (
        f'llmgw_sim:requests_waiting{{model_name="small"}} {waiting}\n'
        f'llmgw_sim:kv_cache_usage_ratio{{model_name="small"}} {usage}\n'
    )


@asynccontextmanager
async def engines(answers: dict[str, str]) -> AsyncIterator[str]:
    """An HTTP server on loopback: GET /NAME/metrics answers `answers[NAME]`, or, for the
    names `slow` (never), `broken` (500) and `huge` (2 MiB)."""
    done = asyncio.Event()
    handlers: set[asyncio.Task[Any]] = set()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        handlers.add(task)
        head = await reader.readuntil(b"\r\n\r\n")
        name = head.split(b" ")[1].decode().strip("/").split("/")[0]
        if name == "slow":
            await done.wait()
            writer.close()
            return
        status, body = "200 OK", answers.get(name, "").encode()
        if name == "broken":
            status = "500 Internal Server Error"
        elif name == "huge":
            body = b"# " + b"x" * (2 << 20) + b"\n"
        writer.write(
            f"HTTP/1.1 {status}\r\ncontent-length: {len(body)}\r\n"
            f"content-type: text/plain\r\nconnection: close\r\n\r\n".encode()
            + body
        )
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        done.set()
        server.close()
        await server.wait_closed()
        await asyncio.gather(*handlers, return_exceptions=True)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _policy(signal: str, target: str | None = None) -> AutoscalePolicy:
    target = target or ("0.5" if signal == "kv_cache" else "2")
    return AutoscalePolicy(
        model=ModelName("small"),
        minimum=1,
        maximum=8,
        signal=signal,  # type: ignore[arg-type]
        target=Fraction(target),
        interval_ms=200,
    )


def _router(endpoints: dict[str, str]) -> Router:
    router = Router()
    router.resync(
        SnapshotEntry(ModelName("small"), ReplicaId(rid), SnapshotState.READY, url)
        for rid, url in endpoints.items()
    )
    return router


def _scrape(
    endpoints: dict[str, str],
    signal: str,
    engine: str = "sim",
    deadline_s: float | None = None,
    **kwargs: Any,
) -> tuple[Any, ...]:
    loads = EngineLoads(_router(endpoints), lambda rid: engine, timeout_s=0.5, **kwargs)

    async def go() -> tuple[Any, ...]:
        try:
            return await loads.samples([_policy(signal)], deadline_s)
        finally:
            await loads.aclose()

    return asyncio.run(go())


def test_queues_are_summed_and_cache_use_averaged_over_the_replicas_that_answered() -> None:
    async def go() -> None:
        answers = {"a": _sim_text(3, 0.2), "b": _sim_text(4, 0.6), "c": "# nothing here\n"}
        async with engines(answers) as url:
            endpoints = {
                "small-r1": f"{url}/a",
                "small-r2": f"{url}/b",
                "small-r3": f"{url}/c",  # lacks the metrics
                "small-r4": f"{url}/slow",  # past its timeout
                "small-r5": f"{url}/broken",
                "small-r6": f"{url}/huge",  # past the body bound
                "small-r7": f"http://127.0.0.1:{_closed_port()}",  # refused
            }
            loads = EngineLoads(_router(endpoints), lambda rid: "sim", timeout_s=0.5)
            try:
                (queue,) = await loads.samples([_policy("queue")])
                (kv,) = await loads.samples([_policy("kv_cache", "0.5")])
            finally:
                await loads.aclose()
        assert (queue.model, queue.value, queue.serving) == (ModelName("small"), Fraction(7), 7)
        # the mean of those that answered, taken for every routable replica
        assert (kv.value, kv.serving) == (Fraction(2, 5), 7)

    asyncio.run(go())


def test_no_replica_answering_gives_no_sample_and_one_warning_a_minute(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [0.0]

    async def go() -> list[tuple[Any, ...]]:
        async with engines({}) as url:
            endpoints = {"small-r1": f"{url}/broken", "small-r2": f"{url}/c"}
            loads = EngineLoads(_router(endpoints), lambda rid: "sim", clock=lambda: now[0])
            try:
                out = [await loads.samples([_policy("queue")])]
                now[0] = 30.0
                out.append(await loads.samples([_policy("queue")]))
                now[0] = 61.0
                out.append(await loads.samples([_policy("queue")]))
            finally:
                await loads.aclose()
            return out

    with caplog.at_level(logging.WARNING, "llmgw_twin.service.controller.engine_loads"):
        assert asyncio.run(go()) == [(), (), ()]
    warned = [r for r in caplog.records if "no replica of 2 said its queue" in r.getMessage()]
    assert len(warned) == 2  # at 0 and at 61 s, not at 30 s


def test_a_round_ends_by_its_deadline() -> None:
    async def go() -> tuple[Any, ...]:
        async with engines({"a": _sim_text(5, 0.5)}) as url:
            endpoints = {"small-r1": f"{url}/a", "small-r2": f"{url}/slow"}
            loads = EngineLoads(_router(endpoints), lambda rid: "sim", timeout_s=30)
            try:
                return await loads.samples([_policy("queue")], deadline_s=0.5)
            finally:
                await loads.aclose()

    (sample,) = asyncio.run(go())
    assert sample.value == 5  # the slow replica was left out, the round did not wait for it


def test_an_engine_without_the_metric_is_not_asked(caplog: pytest.LogCaptureFixture) -> None:
    asked: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        asked.append(str(request.url))
        return httpx.Response(200, text=LLAMACPP)

    transport = httpx.MockTransport(handler)
    endpoints = {"small-r1": "http://e1:8000", "small-r2": "http://e2:8000"}
    with caplog.at_level(logging.WARNING, "llmgw_twin.service.controller.engine_loads"):
        assert _scrape(endpoints, "kv_cache", "llamacpp", transport=transport) == ()
        (queue,) = _scrape(endpoints, "queue", "llamacpp", transport=transport)
    assert queue.value == 4
    assert asked == ["http://e1:8000/metrics", "http://e2:8000/metrics"]  # the queue's only
    assert any("engine llamacpp exports no kv_cache" in r.getMessage() for r in caplog.records)


def test_outstanding_policies_are_not_scraped() -> None:
    assert _scrape({"small-r1": "http://127.0.0.1:9"}, "outstanding") == ()


# --- the config --------------------------------------------------------------------------------

CONFIG = """\
listen: {host: 127.0.0.1, port: 8080}
store: c.db
profiles:
  small: {engine: ENGINE, gpus_per_node: 1, model: /m/small}
deployments:
  - {model: small, profile: small, replicas: 1}
autoscale:
  small: {min: 1, max: 4, target: TARGET, signal: SIGNAL}
"""


def _config(tmp_path: Path, engine: str, signal: str, target: str) -> Path:
    path = tmp_path / "controller.yaml"
    text = CONFIG.replace("ENGINE", engine).replace("SIGNAL", signal)
    path.write_text(text.replace("TARGET", target))
    return path


@pytest.mark.parametrize(
    ("engine", "signal", "target"),
    [("sim", "queue", "4"), ("vllm", "kv_cache", "0.8"), ("llamacpp", "queue", "4")],
)
def test_a_policy_on_an_engine_signal_is_read(
    tmp_path: Path, engine: str, signal: str, target: str
) -> None:
    (policy,) = load_controller_config(_config(tmp_path, engine, signal, target)).autoscale
    assert policy.signal == signal and policy.target == Fraction(target)


def test_a_kv_cache_policy_on_llamacpp_is_refused(tmp_path: Path) -> None:
    path = _config(tmp_path, "llamacpp", "kv_cache", "0.8")
    with pytest.raises(ConfigError) as err:
        load_controller_config(path)
    assert "autoscale.small.signal: engine llamacpp (profile small) exports no kv_cache" in str(
        err.value
    )


# --- a controller ------------------------------------------------------------------------------


class MetricsAgents(Agents):
    """Fake agents whose leaders serve at `engines/REPLICA`: the replica's `/metrics` is there."""

    engines_url: str = ""

    def _report(self, spec: ShardSpec, exits: dict[str, str]) -> ShardReport:
        if spec.rank == 0:
            endpoint = f"{self.engines_url}/{spec.replica}"
            return ShardReport(spec, ShardState.SERVING, endpoint)
        return super()._report(spec, exits)


@contextmanager
def fleet_with_engines(
    tmp_path: Path, policy: AutoscalePolicy, waiting: dict[str, int]
) -> Iterator[Fleet]:
    """A controller with fake agents whose replicas' leaders say the queue `waiting` holds for
    them (0 for one not named) in the sim engine's exposition."""
    engine_app = FastAPI()

    @engine_app.get("/{replica}/metrics")
    async def metrics(replica: str) -> Response:
        return Response(_sim_text(waiting.get(replica, 0), 0.1), media_type="text/plain")

    admin = new_token()
    auth = ControllerAuth((token_hash(admin),), (), tmp_path / "secret.key")
    settings = ControllerSettings(
        "127.0.0.1", 0, str(tmp_path / "c.db"), TIMINGS, (), (), auth=auth, autoscale=(policy,)
    )
    agents = MetricsAgents()
    transport = httpx.MockTransport(agents.command)

    def build() -> Any:
        return create_controller_app(ControllerRuntime(settings, agent_transport=transport))

    with (
        live_server(lambda: engine_app) as engines_url,
        live_controller(build) as url,
        httpx.Client(base_url=url, trust_env=False, timeout=10, headers=bearer(admin)) as client,
    ):
        agents.base, agents.engines_url = url, engines_url
        thread = threading.Thread(target=agents.run, name="fake-agents", daemon=True)
        thread.start()
        try:
            yield Fleet(url, admin, client, agents)
        finally:
            agents.stopped.set()
            thread.join(10)


def test_a_queue_policy_scales_up_when_the_engines_report_a_queue(tmp_path: Path) -> None:
    policy = AutoscalePolicy(
        model=ModelName("small"),
        minimum=1,
        maximum=4,
        signal="queue",
        target=Fraction(2),
        up_window_ms=600,
        down_window_ms=60_000,
        interval_ms=200,
    )
    waiting: dict[str, int] = {}
    with fleet_with_engines(tmp_path, policy, waiting) as fleet:
        fleet.add_node("n1", "ib-a", 8)
        fleet.put(
            "/v1/admin/profiles/small",
            {"engine": "sim", "gpus_per_node": 2, "model": "/m/small", "load_time_ms": 100},
        )
        fleet.put("/v1/admin/deployments/small", {"profile": "small", "replicas": 1})
        wait_sync(lambda: fleet.replicas("ready") or None, 30, "the first replica serving")
        assert not _scaled(fleet)  # an empty queue needs 1 replica: nothing moves
        (first,) = fleet.replicas("ready")
        waiting[first["replica"]] = 7  # 7 waiting at a target of 2 a replica: 4 needed

        wait_sync(lambda: _scaled(fleet) or None, 30, "the deployment scaled up")
        assert [(e["was"], e["replicas"]) for e in _scaled(fleet)] == [(1, 4)]


def _scaled(fleet: Fleet) -> list[dict[str, Any]]:
    return [e["subjects"] for e in fleet.events() if e["kind"] == "deployment.scaled"]
