"""A standby answers: two controller processes on one store, the second a standby that says
where the leader is (its health 200 "standby", every other call 503 naming the leader and its
address), the leader lists it among its standbys, and once the leader is killed the standby
leads and answers as a leader."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from helpers.services import free_ports, wait_sync

CONFIG = """\
name: {name}
listen: {{host: 127.0.0.1, port: {port}}}
store: {store}
timings:
  heartbeat_interval: 1s
  node_lost_after: 30s
  reconcile_interval: 100ms
  lease: 2s
"""
UP_WITHIN_S = 60.0


def _start(tmp: Path, name: str, port: int) -> subprocess.Popen[bytes]:
    config = tmp / f"{name}.yaml"
    config.write_text(CONFIG.format(name=name, port=port, store=tmp / "shared.db"))
    with (tmp / f"{name}.log").open("wb") as log:
        return subprocess.Popen(  # our own interpreter, a fixed argv
            [sys.executable, "-m", "llmgw_twin.cli", "controller", "--config", str(config)],
            start_new_session=True,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )


def _get(url: str) -> httpx.Response | None:
    try:
        return httpx.get(url, timeout=2)
    except httpx.HTTPError:
        return None


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[str, str, subprocess.Popen[bytes]]]:
    p1, p2 = free_ports(2)
    first = _start(tmp_path, "c1", p1)
    procs = [first]
    try:
        u1, u2 = f"http://127.0.0.1:{p1}", f"http://127.0.0.1:{p2}"

        def leads() -> bool | None:
            r = _get(u1 + "/v1/admin/state")
            return (r is not None and r.status_code == 200) or None

        wait_sync(leads, UP_WITHIN_S, "c1 leading")
        procs.append(_start(tmp_path, "c2", p2))
        yield u1, u2, first
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


def test_a_standby_answers_with_the_leader_and_leads_once_the_leader_is_gone(
    pair: tuple[str, str, subprocess.Popen[bytes]],
) -> None:
    u1, u2, first = pair

    def standing_by() -> httpx.Response | None:
        r = _get(u2 + "/health")  # its first claim tried: it knows who leads
        if r is None or r.json().get("status") != "standby" or r.json()["leader"] is None:
            return None
        return r

    health = wait_sync(standing_by, UP_WITHIN_S, "c2 answering as a standby")
    assert health.status_code == 200
    assert health.json()["leader"] == {"name": "c1", "epoch": 1, "url": u1}

    r = httpx.get(u2 + "/v1/admin/state", timeout=5)
    assert r.status_code == 503 and r.headers["retry-after"] == "1"
    assert r.json()["leader"]["url"] == u1
    assert r.json()["detail"] == f"controller c2 is a standby: c1 leads in epoch 1 at {u1}"

    def listed() -> list[dict[str, object]] | None:
        standbys = httpx.get(u1 + "/v1/admin/state", timeout=5).json()["leadership"]["standbys"]
        return standbys or None

    [peer] = wait_sync(listed, UP_WITHIN_S, "c1 listing c2 as a standby")
    assert peer["name"] == "c2" and peer["url"] == u2

    os.killpg(first.pid, signal.SIGKILL)
    first.wait()

    def leads() -> dict[str, object] | None:
        r = _get(u2 + "/v1/admin/state")
        return r.json()["leadership"] if r is not None and r.status_code == 200 else None

    leadership = wait_sync(leads, UP_WITHIN_S, "c2 leading after c1 was killed")
    assert leadership["name"] == "c2" and leadership["epoch"] == 2
    assert httpx.get(u2 + "/health", timeout=5).json()["status"] == "ok"


def test_ctl_given_every_address_reaches_the_leader_through_a_standby_and_past_a_dead_one(
    pair: tuple[str, str, subprocess.Popen[bytes]], capsys: pytest.CaptureFixture[str]
) -> None:
    from llmgw_twin.cli import main

    u1, u2, _first = pair
    (dead,) = free_ports(1)

    def standing_by() -> bool | None:
        r = _get(u2 + "/health")
        return (r is not None and r.json().get("leader") is not None) or None

    wait_sync(standing_by, UP_WITHIN_S, "c2 answering as a standby")
    # a dead address first, then the standby, which points at the leader
    addresses = f"http://127.0.0.1:{dead},{u2}"
    assert main(["ctl", "status", "--controller", addresses, "-o", "json"]) == 0
    state = json.loads(capsys.readouterr().out)
    assert state["leadership"]["name"] == "c1"
    # the standby alone: it names the leader, ctl follows it
    assert main(["ctl", "status", "--controller", u2, "-o", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["leadership"]["url"] == u1


def test_a_standby_that_takes_over_goes_on_from_the_event_log_its_predecessor_left(
    pair: tuple[str, str, subprocess.Popen[bytes]],
) -> None:
    """The log it read when it started is stale by then: what the leader recorded while it
    stood by is in its log once it leads, its own numbered on after it."""
    u1, u2, first = pair

    def standing_by() -> bool | None:
        r = _get(u2 + "/health")
        return (r is not None and r.json().get("status") == "standby") or None

    wait_sync(standing_by, UP_WITHIN_S, "c2 standing by")
    profile = {"engine": "sim", "nodes": 1, "gpus_per_node": 1, "model": "/models/m"}
    httpx.put(u1 + "/v1/admin/profiles/p", json=profile, timeout=5).raise_for_status()
    r = httpx.put(u1 + "/v1/admin/deployments/m", json={"profile": "p", "replicas": 1}, timeout=5)
    r.raise_for_status()

    def recorded() -> list[dict[str, object]] | None:
        events = httpx.get(u1 + "/v1/admin/events", timeout=5).json()["events"]
        return events if len(events) > 1 else None  # its start, then the deployment's

    before = wait_sync(recorded, UP_WITHIN_S, "c1 recording the deployment's events")
    os.killpg(first.pid, signal.SIGKILL)
    first.wait()

    def taken_over() -> list[dict[str, object]] | None:
        r = _get(u2 + "/v1/admin/events")
        events = r.json()["events"] if r is not None and r.status_code == 200 else []
        return events if len(events) > len(before) else None  # its own start recorded

    after = wait_sync(taken_over, UP_WITHIN_S, "c2 leading, its start recorded")
    assert after[: len(before)] == before
    assert "controller.started" in [e["kind"] for e in after[len(before) :]]
