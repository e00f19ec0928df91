"""Mutual TLS and credentials on real processes: a controller and an agent on loopback, each
with a certificate from a throwaway CA made here, the node onboarded with `ctl onboard`, a sim
replica served over it all; a client without a certificate, or with one and no token, is
turned away."""

from __future__ import annotations

import os
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trustme

from helpers.services import free_ports, free_range, wait_sync
from llmgw_twin.service.agent.fakesysfs import fabric_prefix_for, write_sysfs_root
from llmgw_twin.service.common.auth import new_token, token_hash
from test_services_e2e import Fleet

CONTROLLER_YAML = """\
listen:
  host: 127.0.0.1
  port: {port}
  tls: {{cert: controller.pem, key: controller.pem, client_ca: ca.pem}}
store: controller.db
auth:
  admin_tokens: ["{admin_hash}"]
agents_tls: {{ca: ca.pem, cert: controller.pem, key: controller.pem}}
timings: {{heartbeat_interval: 300ms, node_lost_after: 10s, reconcile_interval: 100ms}}
profiles:
  tiny: {{engine: sim, nodes: 1, gpus_per_node: 1, load_time: 300ms, model: /models/tiny}}
"""

AGENT_YAML = """\
node: node01
controller: https://127.0.0.1:{controller_port}
controller_tls: {{ca: ca.pem, cert: agent.pem, key: agent.pem}}
credential: node01.cred
listen:
  host: 127.0.0.1
  port: {port}
  tls: {{cert: agent.pem, key: agent.pem, client_ca: ca.pem}}
root: node01
ports: {{first: {first}, last: {last}}}
heartbeat_interval: 300ms
stop_grace: 3s
worker_settle: 300ms
"""


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    f = Fleet(tmp_path)
    try:
        yield f
    finally:
        f.close()


def test_a_replica_served_over_mutual_tls_with_an_onboarded_node(
    tmp_path: Path, fleet: Fleet
) -> None:
    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    for name in ("controller", "agent", "operator"):
        leaf = ca.issue_cert("127.0.0.1", "localhost", common_name=name)
        leaf.private_key_and_cert_chain_pem.write_to_path(str(tmp_path / f"{name}.pem"))
    admin = new_token()
    controller_port, agent_port = free_ports(2)
    base = f"https://127.0.0.1:{controller_port}"
    (tmp_path / "controller.yaml").write_text(
        CONTROLLER_YAML.format(port=controller_port, admin_hash=token_hash(admin))
    )
    write_sysfs_root(tmp_path / "node01", gpus=1, fabric_prefix=fabric_prefix_for("ib-a"))
    first, last = free_range(4)
    (tmp_path / "agent.yaml").write_text(
        AGENT_YAML.format(controller_port=controller_port, port=agent_port, first=first, last=last)
    )
    operator = ssl.create_default_context(cafile=str(tmp_path / "ca.pem"))
    operator.load_cert_chain(str(tmp_path / "operator.pem"))
    headers = {"authorization": f"Bearer {admin}"}

    def get(client: httpx.Client, url: str) -> dict[str, Any] | None:
        try:
            r = client.get(url, headers=headers)
        except httpx.HTTPError:
            return None
        return dict(r.json()) if r.status_code == 200 else None

    with httpx.Client(trust_env=False, timeout=10, verify=operator) as client:
        fleet.start("controller", "controller", "--config", "controller.yaml")
        wait_sync(lambda: get(client, base + "/health"), 30, "the controller's /health")

        # onboarding, as an operator does it: the admin token from the environment
        onboard = subprocess.run(
            [
                *(sys.executable, "-m", "llmgw_twin.cli", "ctl", "onboard", "node01"),
                *("--agent-url", f"https://127.0.0.1:{agent_port}", "--out", "node01.cred"),
                *("--controller", base, "--ca", "ca.pem", "--cert", "operator.pem"),
            ],
            cwd=tmp_path,
            env={**os.environ, "LLMGW_TWIN_TOKEN": admin},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert onboard.returncode == 0, onboard.stderr
        cred = tmp_path / "node01.cred"
        assert oct(cred.stat().st_mode & 0o777) == "0o600"
        fleet.start("node01", "agent", "--config", "agent.yaml")

        def alive() -> dict[str, Any] | None:
            state = get(client, base + "/v1/admin/state")
            nodes = state["nodes"] if state else []
            return nodes[0] if nodes and nodes[0]["state"] == "alive" else None

        node = wait_sync(alive, 30, "the agent registered over mutual TLS")
        assert node["agent_url"] == f"https://127.0.0.1:{agent_port}"
        r = client.put(
            base + "/v1/admin/deployments/tiny",
            json={"profile": "tiny", "replicas": 1},
            headers=headers,
        )
        assert r.status_code == 200, r.text

        def ready() -> dict[str, Any] | None:
            state = get(client, base + "/v1/admin/state")
            replicas = state["replicas"] if state else []
            return replicas[0] if replicas and replicas[0]["state"] == "ready" else None

        try:
            wait_sync(ready, 60, "the replica ready: the controller's commands reached the agent")
        except AssertionError:
            logs = "\n".join(f"--- {n}\n{fleet.log(n)}" for n in fleet.procs)
            raise AssertionError(f"replica never ready; logs:\n{logs}") from None

        # the agent's own API, over its mutual TLS: the operator's certificate gets through the
        # handshake, but without the controller's token for this node nothing is answered
        r = client.get(f"https://127.0.0.1:{agent_port}/v1/state", headers=headers)
        assert r.status_code == 401
        agent_state = client.get(f"https://127.0.0.1:{agent_port}/health")
        assert agent_state.status_code == 200
        r = client.get(base + "/v1/admin/state")
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"

    # a client that trusts the CA but shows no certificate does not get past the handshake
    anonymous = ssl.create_default_context(cafile=str(tmp_path / "ca.pem"))
    for url in (base, f"https://127.0.0.1:{agent_port}"):
        with (
            httpx.Client(trust_env=False, timeout=10, verify=anonymous) as client,
            pytest.raises(httpx.HTTPError),
        ):
            client.get(url + "/health").raise_for_status()
    # and plain HTTP to a TLS listener gets no answer
    with httpx.Client(trust_env=False, timeout=10) as client, pytest.raises(httpx.HTTPError):
        client.get(f"http://127.0.0.1:{controller_port}/health").raise_for_status()
    for name in ("node01", "controller"):
        fleet.stop(name, 30)
    assert admin not in fleet.log("controller") + fleet.log("node01")
