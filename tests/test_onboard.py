"""`llmgw-twin onboard`: the files one node needs, and a node that runs from them.

The end-to-end case starts a real controller with credentials on loopback, onboards a node
without GPUs through it (a credential issued by the admin API, a fake sysfs root), starts the
agent with the very command its systemd unit names, and sees the node register with its fake
GPUs and fabric and a sim replica become ready on it. The other cases run the command in this
process (PATH set by the test) and read what it wrote, or that it wrote nothing.
"""

from __future__ import annotations

import argparse
import configparser
import os
import shlex
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from helpers.services import free_ports, free_range, wait_sync
from llmgw_twin.cli import main
from llmgw_twin.control.model import TraceEvent
from llmgw_twin.control.topology import NodeTopology
from llmgw_twin.realmode.report import fidelity_table, timeline
from llmgw_twin.realmode.runner import RealResult
from llmgw_twin.service.agent.config import load_agent_config
from llmgw_twin.service.agent.processes import group_alive
from llmgw_twin.service.common.auth import CredentialFile, new_token, token_hash
from llmgw_twin.service.ops.onboard import add_arguments
from llmgw_twin.twin.scenario.loader import load_scenario
from llmgw_twin.units import fmt_offset
from test_services_e2e import Fleet

ROOT = Path(__file__).resolve().parents[1]

CONTROLLER_YAML = """\
listen: {{host: 127.0.0.1, port: {port}}}
store: controller.db
auth:
  admin_tokens: ["{admin_hash}"]
timings:
  heartbeat_interval: 300ms
  node_lost_after: 10s
  reconcile_interval: 100ms
profiles:
  tiny: {{engine: sim, nodes: 1, gpus_per_node: 2, load_time: 200ms, model: /models/tiny}}
"""


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    f = Fleet(tmp_path)
    try:
        yield f
    finally:
        f.close()


def unit(path: Path) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]  # keys as systemd spells
    parser.read_string(path.read_text(encoding="utf-8"))
    return parser


def exec_start(path: Path) -> list[str]:
    return shlex.split(unit(path)["Service"]["ExecStart"].replace("%%", "%").replace("$$", "$"))


def onboard(*args: str) -> int:
    return main(["onboard", *args])


def files_in(out: Path) -> list[str]:
    return sorted(p.name for p in out.iterdir()) if out.exists() else []


def test_an_onboarded_node_registers_its_fake_gpus_and_runs_a_sim_replica(
    tmp_path: Path, fleet: Fleet
) -> None:
    admin = new_token()
    controller_port, agent_port = free_ports(2)
    base = f"http://127.0.0.1:{controller_port}"
    (tmp_path / "controller.yaml").write_text(
        CONTROLLER_YAML.format(port=controller_port, admin_hash=token_hash(admin))
    )
    token_file = tmp_path / "admin.token"
    token_file.write_text(admin + "\n")
    first, last = free_range(6)
    out = tmp_path / "nodes" / "node01"
    command = [
        *(sys.executable, "-m", "llmgw_twin.cli", "onboard", "node01", "--out", str(out)),
        *("--controller", base, "--listen", f"127.0.0.1:{agent_port}"),
        *("--ports", f"{first}-{last}", "--fake-gpus", "2", "--fabric", "ib-x"),
    ]
    env = {k: v for k, v in os.environ.items() if k != "LLMGW_TWIN_TOKEN"}
    env["PATH"] = str(tmp_path / "no-engines")  # a machine with no engine installed
    headers = {"authorization": f"Bearer {admin}"}

    def get(client: httpx.Client, url: str, **kw: Any) -> dict[str, Any] | None:
        try:
            r = client.get(url, **kw)
        except httpx.HTTPError:
            return None
        return dict(r.json()) if r.status_code == 200 else None

    with httpx.Client(trust_env=False, timeout=10, headers=headers) as client:
        fleet.start("controller", "controller", "--config", "controller.yaml")
        wait_sync(lambda: get(client, base + "/health"), 30, "the controller's /health")

        (tmp_path / "wrong.token").write_text(new_token())
        refused = subprocess.run(
            [*command, "--token-file", str(tmp_path / "wrong.token")],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert refused.returncode == 1, refused.stderr
        assert "refused (401)" in refused.stderr
        assert files_in(out) == []  # a refused credential leaves nothing behind

        done = subprocess.run(
            [*command, "--token-file", str(token_file)],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        assert "only the sim engine" in done.stderr
        assert files_in(out) == [
            "llmgw-twin-agent.service",
            "llmgw-twin-controller.service",
            "node01-sysfs",
            "node01.cred",
            "node01.yaml",
        ]
        cred = out / "node01.cred"
        assert stat.S_IMODE(cred.stat().st_mode) == 0o600
        settings = load_agent_config(out / "node01.yaml")
        assert settings.credential == cred
        assert settings.engine_names == ("sim",)
        assert settings.root == out / "node01-sysfs"

        # the agent, started exactly as its unit says
        argv = exec_start(out / "llmgw-twin-agent.service")
        assert argv[1:] == ["agent", "--config", str(out / "node01.yaml")]
        log = (tmp_path / "node01.log").open("wb")
        fleet.procs["node01"] = subprocess.Popen(
            argv,
            cwd=tmp_path,
            start_new_session=True,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()

        def alive() -> dict[str, Any] | None:
            state = get(client, base + "/v1/admin/state")
            nodes = state["nodes"] if state else []
            return nodes[0] if nodes and nodes[0]["state"] == "alive" else None

        try:
            node = wait_sync(alive, 30, "the onboarded node registered and alive")
        except AssertionError:
            raise AssertionError(f"never registered; logs:\n{fleet.logs()}") from None
        assert (node["node"], node["fabric"], node["gpu_count"]) == ("node01", "ib-x", 2)
        assert node["engines"] == ["sim"]

        r = client.put(base + "/v1/admin/deployments/tiny", json={"profile": "tiny", "replicas": 1})
        assert r.status_code == 200, r.text

        def ready() -> dict[str, Any] | None:
            state = get(client, base + "/v1/admin/state")
            replicas = state["replicas"] if state else []
            return replicas[0] if replicas and replicas[0]["state"] == "ready" else None

        try:
            replica = wait_sync(ready, 60, "the sim replica ready on the onboarded node")
        except AssertionError:
            raise AssertionError(f"replica never ready; logs:\n{fleet.logs()}") from None
        assert replica["nodes"] == ["node01"]
        controller_token = CredentialFile.read(cred).controller_token
        state = get(
            client,
            f"http://127.0.0.1:{agent_port}/v1/state",
            headers={"authorization": f"Bearer {controller_token}"},
        )
        assert state is not None
        fleet.children += [p["pid"] for p in state["processes"]]
    assert len(fleet.children) == 2  # the replica's sidecar and its sim engine

    fleet.stop("node01", 30)
    fleet.stop("controller", 30)
    assert [g for g in fleet.children if group_alive(g)] == []


def test_existing_files_are_kept_unless_force(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "no-engines"))
    out = tmp_path / "out"
    args = ("node01", "--out", str(out), "--fake-gpus", "1", "--fabric", "ib-a")
    assert onboard(*args) == 0
    config = out / "node01.yaml"
    config.write_text("# the operator's own edits\n")
    capsys.readouterr()

    assert onboard(*args) == 2
    err = capsys.readouterr().err
    assert "node01.yaml" in err and "node01-sysfs" in err and "--force" in err
    assert config.read_text() == "# the operator's own edits\n"

    assert onboard(*args, "--fake-gpus", "3", "--force") == 0
    assert load_agent_config(config).node == "node01"
    gpus = [
        d
        for d in (out / "node01-sysfs" / "sys" / "bus" / "pci" / "devices").iterdir()
        if (d / "class").read_text().startswith("0x0302")
    ]
    assert len(gpus) == 3  # the old root replaced whole, not merged
    assert [p.name for p in out.iterdir() if p.name.startswith(".")] == []


def test_the_topology_named_goes_into_the_config_as_the_agent_reads_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "no-engines"))
    out = tmp_path / "out"
    base = ("node01", "--out", str(out), "--fake-gpus", "2", "--fabric", "ib-a")
    assert onboard(*base, "--leaf", "leaf-1", "--spine", "spine-1", "--nvlink-domain", "nvl-3") == 0
    settings = load_agent_config(out / "node01.yaml")
    assert settings.topology == NodeTopology("leaf-1", "spine-1", "nvl-3")  # type: ignore[arg-type]
    assert onboard(*base, "--leaf", "leaf-2", "--force") == 0
    settings = load_agent_config(out / "node01.yaml")
    assert settings.topology == NodeTopology(leaf="leaf-2")  # type: ignore[arg-type]
    assert onboard(*base, "--force") == 0
    assert load_agent_config(out / "node01.yaml").topology is None


def test_an_engine_on_path_is_found_and_advertised(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("llama-server", "vllm"):
        (bin_dir / name).write_text("#!/bin/sh\nexit 0\n")
        (bin_dir / name).chmod(0o755)
    (bin_dir / "sglang").write_text("not executable")
    monkeypatch.setenv("PATH", str(bin_dir))
    out = tmp_path / "out"
    assert onboard("node01", "--out", str(out), "--model-dir", str(tmp_path / "models")) == 0
    err = capsys.readouterr().err
    assert "only the sim engine" not in err
    assert "no ggml-rpc-server" in err  # llama.cpp without its worker program: said
    settings = load_agent_config(out / "node01.yaml")
    assert settings.engine_names == ("sim", "llamacpp", "vllm")
    llamacpp = settings.binary_for("llamacpp")
    assert llamacpp is not None and llamacpp.binary == str(bin_dir / "llama-server")
    assert llamacpp.worker_binary is None
    assert settings.policy.model_dirs == (str(tmp_path / "models"),)

    assert onboard("node02", "--out", str(tmp_path / "sim"), "--sim-only") == 0
    assert "node node02: --sim-only: it can run only the sim engine" in capsys.readouterr().err
    assert load_agent_config(tmp_path / "sim" / "node02.yaml").engine_names == ("sim",)


def test_no_engine_found_says_the_node_runs_only_the_sim_engine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "no-engines"))
    out = tmp_path / "out"
    assert onboard("node01", "--out", str(out), "--fake-gpus", "4", "--fabric", "ib-a") == 0
    err = capsys.readouterr().err
    assert "node node01: no engine binary found on PATH" in err
    assert "it can run only the sim engine" in err
    text = (out / "node01.yaml").read_text()
    comments = " ".join(line[2:] for line in text.splitlines() if line.startswith("# "))
    assert "it can run only the sim engine" in comments
    settings = load_agent_config(out / "node01.yaml")
    assert settings.engines == () and settings.engine_names == ("sim",)
    assert settings.fabric == "ib-a" and not settings.use_nvml


def test_the_units_parse_and_name_the_installed_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "no-engines"))
    out = tmp_path / "out"
    install = Path("/srv/llmgw twin/100%")  # a space and a specifier, as systemd must read them
    argv = ("node01", "--out", str(out), "--install-dir", str(install), "--user", "svc")
    assert onboard(*argv, "--controller-config", "/etc/llmgw-twin/controller.yaml") == 0

    agent = unit(out / "llmgw-twin-agent.service")
    words = exec_start(out / "llmgw-twin-agent.service")
    assert words[1:] == ["agent", "--config", str(install / "node01.yaml")]
    assert os.access(words[0], os.X_OK)
    version = subprocess.run(
        [words[0], "--version"], capture_output=True, text=True, timeout=60, check=False
    )
    assert version.returncode == 0 and version.stdout.startswith("llmgw-twin ")
    service = agent["Service"]
    assert (service["User"], service["Restart"], service["KillMode"]) == (
        "svc",
        "on-failure",
        "process",
    )
    for hides_devices in ("PrivateDevices", "DevicePolicy", "DeviceAllow", "ProtectClock"):
        assert hides_devices not in service
    assert agent["Install"]["WantedBy"] == "multi-user.target"

    controller = unit(out / "llmgw-twin-controller.service")["Service"]
    assert exec_start(out / "llmgw-twin-controller.service") == [
        words[0],
        "controller",
        "--config",
        "/etc/llmgw-twin/controller.yaml",
    ]
    assert controller["Restart"] == "on-failure"


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("--fake-gpus", "2"), "--fake-gpus needs --fabric"),
        (("--fake-gpus", "-1", "--fabric", "ib-a"), "no fewer than 0"),
        (("--listen", "nonsense"), "--listen 'nonsense'"),
        (("--listen", "0.0.0.0:8101"), "--advertise-url"),
        (("--ports", "9-3"), "--ports '9-3'"),
        (("--engine", "vllm=/nonexistent/vllm"), "not an executable file"),
        (("--engine", "nope=/bin/sh"), "ENGINE one of"),
        (("--sim-only", "--engine", "vllm=/bin/sh"), "--sim-only"),
        (("--token-file", "admin.token"), "name the --controller too"),
        (("--user", "no body"), "not a user name"),
        (("--spine", "s1"), "--spine needs --leaf"),
        (("--leaf", "leaf 1"), "--leaf 'leaf 1': letters, digits"),
        # the project's own config reader: an agent off loopback needs a credential
        (("--listen", "10.0.0.5:8101"), "listen.host: 10.0.0.5 is not a loopback address"),
    ],
)
def test_bad_input_exits_2_and_writes_nothing(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    args: tuple[str, ...],
    says: str,
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "no-engines"))
    out = tmp_path / "out"
    assert onboard("node01", "--out", str(out), *args) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and says in err, err
    assert files_in(out) == []


def test_an_unreachable_controller_exits_2_and_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "no-engines"))
    monkeypatch.setenv("LLMGW_TWIN_TOKEN", new_token())
    (port,) = free_ports(1)  # nothing listens there
    out = tmp_path / "out"
    assert onboard("node01", "--out", str(out), "--controller", f"http://127.0.0.1:{port}") == 2
    assert "cannot reach the controller" in capsys.readouterr().err
    assert files_in(out) == []


def test_negative_offsets_print_with_one_sign() -> None:
    assert [fmt_offset(ms) for ms in (-992, 0, 992, -61_500)] == [
        "-0.992s",
        "+0.000s",
        "+0.992s",
        "-1m01.500s",
    ]
    scenario = load_scenario(ROOT / "scenarios" / "node-loss.yaml")
    early = TraceEvent.of(-992, "node.joined", node="node01")  # before the run's own start
    result = RealResult(scenario, 0.1, 2000, [early], [], [], wall_ms=0)
    text = timeline(result)
    assert "-0.992s  node.joined" in text and "+-" not in text
    row = {"expectation": "x", "virtual_ms": 1000, "real_ms": 8, "difference_ms": -992}
    assert "-0.992s  x" in fidelity_table([row], True)


def test_the_services_doc_example_is_what_onboard_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "no-engines"))
    out = tmp_path / "nodes" / "node01"
    assert onboard("node01", "--out", str(out), "--fake-gpus", "8", "--fabric", "ib-a") == 0
    doc = (ROOT / "docs" / "services.md").read_text(encoding="utf-8")
    start = doc.index("```yaml\n# node01: the node agent's config") + len("```yaml\n")
    assert doc[start : doc.index("```", start)] == (out / "node01.yaml").read_text()


def test_node_onboarding_doc_names_only_real_flags() -> None:
    """Every `--flag` the onboarding page gives `llmgw-twin onboard` is one the command has."""
    doc = (ROOT / "docs" / "node-onboarding.md").read_text(encoding="utf-8")
    lines = [line for line in doc.replace("\\\n", " ").splitlines() if "llmgw-twin onboard" in line]
    assert lines
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    known = {s for a in parser._actions for s in a.option_strings}
    used = {w.split("=")[0] for line in lines for w in line.split() if w.startswith("--")}
    assert used <= known, used - known
