"""The controller service's autoscaler (docs/autoscale.md): policies from its configuration,
routers' load pushed over HTTP (`POST /v1/router/load`), and the count changed by the control
core's rules, on a real controller on loopback with fake agents.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from fractions import Fraction
from pathlib import Path
from typing import Any

import httpx
import pytest

from helpers.fake_fleet import Fleet, running_fleet
from helpers.services import wait_sync
from llmgw_twin.control.autoscale import AutoscalePolicy
from llmgw_twin.control.model import ModelName
from llmgw_twin.service.common.config import ConfigError
from llmgw_twin.service.controller.autoscaling import STALE_S, RouterLoads
from llmgw_twin.service.controller.config import load_controller_config

POLICY = AutoscalePolicy(
    model=ModelName("small"),
    minimum=1,
    maximum=4,
    signal="outstanding",
    target=Fraction(2),
    up_window_ms=600,
    down_window_ms=1_500,
    interval_ms=200,
)


def _count(fleet: Fleet) -> int:
    return int({d["model"]: d["replicas"] for d in fleet.state()["deployments"]}["small"])


def _push(fleet: Fleet, outstanding: int) -> None:
    r = fleet.client.post(
        "/v1/router/load", json={"router": "r1", "outstanding": {"small": outstanding}}
    )
    assert r.status_code == 200, r.text


def _scaled(fleet: Fleet) -> list[dict[str, Any]]:
    return [e["subjects"] for e in fleet.events() if e["kind"] == "deployment.scaled"]


def test_the_count_follows_the_routers_load_up_at_once_and_down_one_at_a_time(
    tmp_path: Path,
) -> None:
    with running_fleet(tmp_path, autoscale=(POLICY,)) as fleet:
        for node in ("n1", "n2"):
            fleet.add_node(node, "ib-a", 8)
        fleet.put(
            "/v1/admin/profiles/small",
            {"engine": "sim", "gpus_per_node": 2, "model": "/m/small", "load_time_ms": 100},
        )
        fleet.put("/v1/admin/deployments/small", {"profile": "small", "replicas": 1})

        def up() -> bool | None:
            _push(fleet, 7)  # 7 outstanding at a target of 2 a replica: 4 needed
            # the state shows a decision as it is made, its event once it is committed
            return (_count(fleet) == 4 and bool(_scaled(fleet))) or None

        wait_sync(up, 30, "the deployment scaled up to 4, its event logged")
        first = _scaled(fleet)
        assert [(e["was"], e["replicas"]) for e in first] == [(1, 4)]

        def down() -> bool | None:
            _push(fleet, 0)
            return (_count(fleet) < 4 and len(_scaled(fleet)) > 1) or None

        wait_sync(down, 30, "the deployment scaled down, its event logged")
        steps = [(e["was"], e["replicas"]) for e in _scaled(fleet)]
        assert steps[:2] == [(1, 4), (4, 3)]  # one replica at a time
        assert _count(fleet) == 3


def test_a_bad_push_is_refused_and_a_router_credential_is_needed(tmp_path: Path) -> None:
    with running_fleet(tmp_path, autoscale=(POLICY,)) as fleet:
        bad = fleet.client.post("/v1/router/load", json={"router": "", "outstanding": {}})
        assert bad.status_code == 422
        negative = {"router": "r", "outstanding": {"small": -1}}
        assert fleet.client.post("/v1/router/load", json=negative).status_code == 422
        anonymous = httpx.post(
            f"{fleet.url}/v1/router/load", json={"router": "r", "outstanding": {}}
        )
        assert anonymous.status_code == 401


def test_a_router_that_stops_pushing_stops_counting() -> None:
    now = [0.0]
    loads = RouterLoads(lambda: now[0])
    loads.put("a", {"m": 3})
    loads.put("b", {"m": 4})
    assert loads.outstanding("m") == 7 and loads.routers() == 2
    now[0] = STALE_S / 2
    loads.put("b", {"m": 1})
    now[0] = STALE_S + 1  # a's push is stale, b's is not
    assert loads.outstanding("m") == 1 and loads.routers() == 1


@pytest.mark.parametrize(
    ("autoscale", "message"),
    [
        ("{min: 3, max: 2, target: 4}", "autoscale.small: autoscale small: minimum 3"),
        ("{min: 1, max: 2, target: 4, signal: ttft_p99}", "autoscale.small.signal"),
        ("{min: 1, max: 2, target: 0}", "autoscale.small.target"),
        ("{min: 1, max: 2, target: 4, up_window: soon}", "autoscale.small.up_window"),
    ],
)
def test_a_bad_policy_in_the_config_names_its_key(
    tmp_path: Path, autoscale: str, message: str
) -> None:
    path = tmp_path / "controller.yaml"
    path.write_text(
        f"listen: {{host: 127.0.0.1, port: 8080}}\nstore: c.db\nautoscale:\n  small: {autoscale}\n"
    )
    with pytest.raises(ConfigError) as err:
        load_controller_config(path)
    assert message in str(err.value) and str(path) in str(err.value)


def test_a_good_policy_is_read_from_the_config(tmp_path: Path) -> None:
    path = tmp_path / "controller.yaml"
    path.write_text(
        "listen: {host: 127.0.0.1, port: 8080}\nstore: c.db\n"
        "autoscale:\n  small: {min: 1, max: 6, target: 2.5, down_window: 10m}\n"
    )
    (policy,) = load_controller_config(path).autoscale
    assert policy.model == "small" and (policy.minimum, policy.maximum) == (1, 6)
    assert policy.target == Fraction(5, 2) and policy.down_window_ms == 600_000
    assert policy.up_window_ms == 30_000 and policy.interval_ms == 10_000
    assert not policy.scale_to_zero


def test_scale_to_zero_is_read_from_the_config_and_min_0_needs_it(tmp_path: Path) -> None:
    path = tmp_path / "controller.yaml"
    head = "listen: {host: 127.0.0.1, port: 8080}\nstore: c.db\nautoscale:\n"
    path.write_text(head + "  small: {min: 0, max: 2, target: 4, scale_to_zero: true}\n")
    (policy,) = load_controller_config(path).autoscale
    assert policy.scale_to_zero and policy.minimum == 0
    path.write_text(head + "  small: {min: 0, max: 2, target: 4}\n")
    with pytest.raises(ConfigError, match=r"autoscale\.small: .*minimum 0 needs scale_to_zero"):
        load_controller_config(path)


def test_a_request_for_a_model_at_zero_is_held_until_the_autoscaler_brings_a_replica(
    tmp_path: Path,
) -> None:
    """Scale to zero in the service: the controller's own forwarding holds the request, reports
    it to the autoscaler at once, the count goes 0 -> 1, and the held request is answered by
    the new replica."""
    policy = AutoscalePolicy(
        model=ModelName("small"),
        minimum=0,
        maximum=2,
        signal="outstanding",
        target=Fraction(4),
        up_window_ms=600,
        down_window_ms=600_000,
        interval_ms=3_600_000,  # no report but the one a held request makes at once
        scale_to_zero=True,
    )
    answered: list[str] = []

    async def engine(request: httpx.Request) -> httpx.Response:
        answered.append(request.url.host)

        async def body() -> AsyncIterator[bytes]:
            yield b'{"choices": [{"message": {"content": "hi"}}]}'

        return httpx.Response(200, headers={"content-type": "application/json"}, content=body())

    with running_fleet(tmp_path, autoscale=(policy,), engines=httpx.MockTransport(engine)) as fleet:
        fleet.add_node("n1", "ib-a", 8)
        fleet.put(
            "/v1/admin/profiles/small",
            {"engine": "sim", "gpus_per_node": 2, "model": "/m/small", "load_time_ms": 100},
        )
        fleet.put("/v1/admin/deployments/small", {"profile": "small", "replicas": 0})
        feed = fleet.client.get("/v1/router/feed").json()
        assert feed["holding"] == ["small"]
        body = {"model": "small", "messages": [{"role": "user", "content": "hi"}]}
        r = fleet.client.post("/v1/chat/completions", json=body, timeout=60)
        assert r.status_code == 200, r.text
        assert r.headers["x-llmgw-replica"] == "small-r1"
        assert answered == ["engine-small-r1"]
        assert [(e["was"], e["replicas"]) for e in _scaled(fleet)] == [(0, 1)]
