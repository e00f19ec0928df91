"""Several controllers in real mode (`realmode/controllers.py`): what is refused and why, the
configs every process gets, and how the event log's events are credited to the controller that
recorded them, and the run's PostgreSQL server cut per controller. Quick (the runs are
`test_real_suite.py`'s)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import yaml

from llmgw_twin.control.model import TraceEvent
from llmgw_twin.realmode import ports, refusals
from llmgw_twin.realmode.cluster import RealCluster
from llmgw_twin.realmode.pgstore import RealPostgres, have_postgres
from llmgw_twin.realmode.refusals import check_real_supported
from llmgw_twin.service.agent.config import load_agent_config
from llmgw_twin.service.controller.config import load_controller_config
from llmgw_twin.twin.scenario.loader import load_scenario, load_scenario_text

ROOT = Path(__file__).resolve().parents[1]

TEXT = """
name: t
duration: 4m
cluster:
  controllers: {k}
  fabrics:
    ib-a: [node01, node02]
  nodes:
    default: {{gpus: 8, engines: [sim]}}
profiles:
  p: {{engine: sim, nodes: 1, gpus_per_node: 4, load_time: 20s, model: /models/m}}
deployments:
  - {{model: m, profile: p, replicas: 1}}
faults:
{faults}
"""


def scenario(faults: str, k: int = 2):  # type: ignore[no-untyped-def]
    return load_scenario_text(TEXT.format(k=k, faults=faults), "t.yaml")


def test_a_skewed_controller_clock_is_refused_with_its_reason() -> None:
    name = "controller-clock-skew"
    with pytest.raises(ValueError, match="not supported in real mode yet: ") as got:
        check_real_supported(load_scenario(ROOT / "scenarios" / f"{name}.yaml"))
    assert f"{name}.yaml:" in str(got.value)
    assert "without a per-process clock (faketime)" in str(got.value)


@pytest.mark.parametrize("name", ["controller-cut-from-store", "controller-store-down"])
def test_the_store_is_taken_away_on_a_postgresql_server_and_refused_without_one(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = load_scenario(ROOT / "scenarios" / f"{name}.yaml")
    assert have_postgres(), "Debian's PostgreSQL binaries are missing: make postgresql"
    check_real_supported(s)
    monkeypatch.setattr(refusals, "have_postgres", lambda: False)
    with pytest.raises(ValueError, match="not supported in real mode yet: ") as got:
        check_real_supported(s)
    assert "PostgreSQL binaries are not installed (make postgresql)" in str(got.value)


def test_a_controller_cut_from_its_agents_is_refused_it_cannot_be_cut_alone() -> None:
    s = scenario("  - {at: 1m, partition_controller: {controller: c1, from: agents, for: 30s}}")
    with pytest.raises(ValueError, match="shared by every controller"):
        check_real_supported(s)


@pytest.mark.parametrize(
    "name",
    ["controller-kill-leader", "controller-stall-failover"],
)
def test_the_controllers_killed_stalled_and_restarted_run_for_real(name: str) -> None:
    check_real_supported(load_scenario(ROOT / "scenarios" / f"{name}.yaml"))


def test_every_controller_fault_that_runs_for_real_is_taken() -> None:
    check_real_supported(
        scenario(
            "  - {at: 10s, kill_controller: c2}\n"
            "  - {at: 1m, stall_controller: {controller: leader, for: 20s}}\n"
            "  - {at: 2m, restart_controller: {controller: c2, down_for: 0s}}\n",
            k=3,
        )
    )


def test_a_controller_of_its_own_needs_a_second_for_its_faults_in_real_mode() -> None:
    with pytest.raises(ValueError, match=r"needs cluster\.controllers of 2 or more"):
        check_real_supported(scenario("  - {at: 10s, kill_controller: leader}", k=1))


async def prepared(cluster: RealCluster) -> RealCluster:
    """The cluster's roots, proxies and configs, nothing started."""
    await cluster.prepare_nodes({})
    return cluster


async def close(cluster: RealCluster) -> None:
    for n in cluster.nodes.values():
        for proxy in (n.to_controller, n.to_agent, *n.to_others):
            await proxy.close()
    if cluster.fabrics is not None:
        await cluster.fabrics.close()
    cluster.ports.close()


def test_each_controller_agent_and_router_is_given_every_controller(tmp_path: Path) -> None:
    s = scenario("  - {at: 10s, kill_controller: c1}", k=3)
    cluster = asyncio.run(prepared(RealCluster(s, tmp_path, 1)))
    try:
        assert cluster.multi is not None
        cluster.write_controller_config()
        configs = [load_controller_config(c.config) for c in cluster.multi.procs.values()]
        assert [c.name for c in configs] == ["c1", "c2", "c3"]
        assert len({c.port for c in configs}) == 3
        assert {str(c.store) for c in configs} == {str(tmp_path / "controller.db")}
        for node, n in cluster.nodes.items():
            agent = load_agent_config(n.config)
            # each controller through a proxy of the node's own: a partition cuts them all
            targets = [n.to_controller.target[1], *(p.target[1] for p in n.to_others)]
            assert targets == [c.port for c in configs], node
            assert len(agent.controller_urls) == 3
        router = cluster.workdir / "router.yaml"
        cluster._spawn = lambda *_a, **_k: None  # type: ignore[method-assign,assignment]
        cluster.start_router()
        listed = yaml.safe_load(router.read_text())
        assert [listed["controller"], *listed["controllers"]] == cluster.multi.urls
    finally:
        asyncio.run(close(cluster))


def test_every_port_of_a_run_is_its_own_below_the_ephemeral_range(tmp_path: Path) -> None:
    # controllers, router and agents bind their ports after the run chose them: a port the
    # kernel handed out for port 0 could be any outgoing connection's by then
    s = scenario("  - {at: 10s, kill_controller: c1}", k=3)
    cluster = asyncio.run(prepared(RealCluster(s, tmp_path)))
    try:
        assert cluster.multi is not None
        cluster.write_controller_config()
        controllers = [load_controller_config(c.config).port for c in cluster.multi.procs.values()]
        cluster._spawn = lambda *_a, **_k: None  # type: ignore[method-assign,assignment]
        cluster.start_router()
        router = yaml.safe_load((cluster.workdir / "router.yaml").read_text())["listen"]["port"]
        agents, shard_ports = [], set()
        for n in cluster.nodes.values():
            agent = load_agent_config(n.config)
            agents.append(agent.port)
            shard_ports |= set(range(agent.port_first, agent.port_last + 1))
        own = [*controllers, router, *agents]
        assert len(set(own)) == len(own) and not set(own) & shard_ports
        first = cluster.ports.range_of(0)[0]
        last = cluster.ports.range_of(len(cluster.nodes))[1]
        assert all(first <= p <= last < ports.PORTS_TO for p in (*own, *shard_ports))
    finally:
        asyncio.run(close(cluster))


def test_the_log_is_credited_to_the_controller_that_recorded_it(tmp_path: Path) -> None:
    """Read from c2 after a takeover: c1's last events, then c2's start step (its judgements
    at its start come before its `controller.started`, at the same instant), then c2's own."""
    s = scenario("  - {at: 10s, kill_controller: c1}")
    cluster = RealCluster(s, tmp_path, 1)
    assert cluster.multi is not None
    page = [
        TraceEvent.of(100, "replica.ready", replica="m-r1"),
        TraceEvent.of(900, "node.lost", node="node01"),
        TraceEvent.of(900, "controller.started", adopted=0, restored=1),
        TraceEvent.of(950, "replica.placed", replica="m-r2"),
    ]
    tagged = cluster.multi.tag(page, "c2")
    assert [ev.get("controller") for ev in tagged] == ["c1", "c2", "c2", "c2"]
    later = cluster.multi.tag([TraceEvent.of(990, "replica.ready", replica="m-r2")], "c2")
    assert later[0].get("controller") == "c2"
    cluster.ports.close()


def test_the_runs_postgresql_server_is_cut_per_controller_and_healed() -> None:
    """The store of a run that takes it away: one controller's proxy cut refuses it alone, the
    others still reach the server; healed, it reaches it again; the server and its folder are
    gone after."""
    import psycopg

    async def main() -> None:
        pg = RealPostgres(["c1", "c2"])
        await pg.start()
        try:

            def ask(name: str) -> object:
                with psycopg.connect(pg.url(name), connect_timeout=5) as conn:
                    row = conn.execute("SELECT 1").fetchone()
                    return row[0] if row else None

            assert await asyncio.to_thread(ask, "c1") == 1
            pg.cut(["c1"])
            with pytest.raises(psycopg.OperationalError):
                await asyncio.to_thread(ask, "c1")
            assert await asyncio.to_thread(ask, "c2") == 1
            pg.heal(["c1"])
            await pg.proxies["c1"].listening()
            assert await asyncio.to_thread(ask, "c1") == 1
        finally:
            await pg.close()
        assert not pg.top.exists()
        assert pg.proc is not None and pg.proc.poll() is not None

    asyncio.run(main())
