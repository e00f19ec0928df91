"""Every config value bounded as the API bounds it, and every config mistake an exit 2 naming
the file and the key (docs/services.md): deep nesting and alias bombs, a `replicas` the API
refuses, a bad secret key file, a missing or bad TLS certificate, a store path that is a folder,
an engine "binary" that is a command line; and a failed store write that names the database's
own error (a full disk, a read-only database), not the rollback's.

The exit statuses are the real commands' (`llmgw-twin controller|agent|router --config FILE`),
each run until it exits on its config (it never gets to listen).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import trustme

from llmgw_twin.control.model import TraceEvent
from llmgw_twin.service.agent.config import load_agent_config
from llmgw_twin.service.agent.fakesysfs import fabric_prefix_for, write_sysfs_root
from llmgw_twin.service.common.auth import new_token, token_hash
from llmgw_twin.service.common.config import MAX_DEPTH, ConfigError
from llmgw_twin.service.common.limits import MAX_REPLICAS
from llmgw_twin.service.controller.config import load_controller_config
from llmgw_twin.service.router.config import load_router_config
from llmgw_twin.store.sqlite import Store, StoreError

HASH = token_hash(new_token())
CONTROLLER = "listen: {host: 127.0.0.1, port: 9}\nstore: c.db\n"
AGENT = (
    "node: n1\ncontroller: http://127.0.0.1:9\nlisten: {host: 127.0.0.1, port: 9}\n"
    "root: n1\nfabric: ib-a\nports: {first: 40000, last: 40001}\n"
)
ROUTER = "listen: {host: 127.0.0.1, port: 9}\ncontroller: http://127.0.0.1:9\n"


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def exit_of(tmp_path: Path, service: str, config: Path) -> tuple[int, str]:
    """`llmgw-twin SERVICE --config FILE`: its exit status and what it said."""
    done = subprocess.run(
        [sys.executable, "-m", "llmgw_twin.cli", service, "--config", str(config)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return done.returncode, done.stderr


def refused(load: object, path: Path, *fragments: str) -> str:
    with pytest.raises(ConfigError) as e:
        load(path)  # type: ignore[operator]
    message = str(e.value)
    assert message.startswith(f"{path}: "), message
    for fragment in fragments:
        assert fragment in message, message
    return message


# --- the values ------------------------------------------------------------------------------


def test_replicas_are_bounded_as_the_api_bounds_them(tmp_path: Path) -> None:
    profile = "profiles: {p: {engine: sim, gpus_per_node: 1, model: /m}}\n"
    for replicas, ok in ((MAX_REPLICAS, True), (MAX_REPLICAS + 1, False), (100_000_000_000, False)):
        path = write(
            tmp_path,
            "c.yaml",
            CONTROLLER + profile + f"deployments: [{{model: m, profile: p, "
            f"replicas: {replicas}}}]\n",
        )
        if ok:
            assert load_controller_config(path).deployments[0].replicas == replicas
        else:
            refused(load_controller_config, path, "deployments.0.replicas", str(MAX_REPLICAS))


@pytest.mark.parametrize(
    ("extra", "key"),
    [
        ("events_kept: 100000000000\n", "events_kept"),
        ("timings: {heartbeat_interval: 100000h}\n", "timings.heartbeat_interval"),
        ("timings: {defrag_max_moves: 100000000000}\n", "timings.defrag_max_moves"),
        (
            "profiles: {p: {engine: sim, gpus_per_node: 1, model: /m, start_timeout: 99999h}}\n",
            "profiles.p.start_timeout",
        ),
        ("listen: {host: 127.0.0.1, port: 9, max_connections: 0}\n", "listen.max_connections"),
        ("listen: {host: 127.0.0.1, port: 9, head_timeout: 1h}\n", "listen.head_timeout"),
        ("listen: {host: 127.0.0.1, port: 9, idle_timeout: 10ms}\n", "listen.idle_timeout"),
        ("listen: {host: 127.0.0.1, port: 9, max_head_bytes: 10}\n", "listen.max_head_bytes"),
    ],
)
def test_each_controller_value_has_a_bound_that_names_its_key(
    tmp_path: Path, extra: str, key: str
) -> None:
    base = CONTROLLER if extra.startswith("listen") is False else "store: c.db\n"
    refused(load_controller_config, write(tmp_path, "c.yaml", base + extra), key)


def test_the_timing_keys_exist_as_written_in_the_cases() -> None:
    from llmgw_twin.service.controller.config import TIMING_KEYS

    keys = {k.key for k in TIMING_KEYS}
    assert {"heartbeat_interval", "defrag_max_moves"} <= keys, sorted(keys)


# --- the file's shape ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        (CONTROLLER + "timings: " + "[" * 100_000 + "]" * 100_000 + "\n", "timings[0][0]"),
        (CONTROLLER + "profiles: " + "{a: " * 40 + "1" + "}" * 40 + "\n", "profiles.a.a"),
        (
            CONTROLLER
            + "x1: &a [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]\n"
            + "".join(
                f"x{i + 1}: &{'abcdefgh'[i]} [{', '.join(['*' + 'abcdefgh'[i - 1]] * 10)}]\n"
                for i in range(1, 8)
            ),
            "values (aliases counted)",
        ),
    ],
    ids=["deep-list", "deep-mapping", "alias-bomb"],
)
def test_deep_nesting_and_alias_bombs_are_refused_before_they_are_built(
    tmp_path: Path, text: str, fragment: str
) -> None:
    path = write(tmp_path, "c.yaml", text)
    refused(load_controller_config, path, fragment)
    code, said = exit_of(tmp_path, "controller", path)
    assert code == 2 and "Traceback" not in said and str(path) in said, said
    assert re.search(f"nested deeper than {MAX_DEPTH}|aliases counted", said), said


# --- files a config names --------------------------------------------------------------------


def test_a_bad_secret_file_is_exit_2_naming_the_key(tmp_path: Path) -> None:
    (tmp_path / "bad.key").write_text("not hex\n")
    (tmp_path / "adir.key").mkdir()
    for name, problem in (("bad.key", "not a secret key"), ("adir.key", "is a directory")):
        path = write(
            tmp_path,
            "c.yaml",
            CONTROLLER + f"auth: {{admin_tokens: ['{HASH}'], secret_file: {name}}}\n",
        )
        refused(load_controller_config, path, "auth.secret_file", name, problem)
        code, said = exit_of(tmp_path, "controller", path)
        assert code == 2 and "Traceback" not in said and "auth.secret_file" in said, said


def test_a_missing_or_bad_tls_certificate_is_exit_2_naming_the_key(tmp_path: Path) -> None:
    ca = trustme.CA()
    ca.issue_cert("127.0.0.1").private_key_and_cert_chain_pem.write_to_path(tmp_path / "s.pem")
    ca.cert_pem.write_to_path(tmp_path / "ca.pem")
    (tmp_path / "junk.pem").write_text("junk\n")
    listen = "listen: {{host: 127.0.0.1, port: 9, tls: {{cert: {cert}, key: s.pem{ca}}}}}\n"
    good = write(tmp_path, "c.yaml", "store: c.db\n" + listen.format(cert="s.pem", ca=""))
    assert load_controller_config(good).tls is not None
    cases = [
        ("gone.pem", "", "listen.tls.cert", "no such file"),
        ("junk.pem", "", "listen.tls.cert", "junk.pem"),
        ("s.pem", ", client_ca: gone.pem", "listen.tls.client_ca", "no such file"),
        ("s.pem", ", client_ca: junk.pem", "listen.tls", "not a CA certificate"),
    ]
    for cert, client_ca, key, problem in cases:
        path = write(tmp_path, "c.yaml", "store: c.db\n" + listen.format(cert=cert, ca=client_ca))
        refused(load_controller_config, path, key, problem)
    code, said = exit_of(tmp_path, "controller", path)
    assert code == 2 and "Traceback" not in said and "listen.tls" in said, said
    client = write(tmp_path, "c.yaml", CONTROLLER + "agents_tls: {ca: gone.pem}\n")
    refused(load_controller_config, client, "agents_tls.ca", "no such file")
    router = write(tmp_path, "r.yaml", ROUTER + "controller_tls: {ca: junk.pem}\n")
    refused(load_router_config, router, "controller_tls", "not a CA certificate")


def test_a_store_path_that_is_a_folder_names_the_file_and_the_key(tmp_path: Path) -> None:
    (tmp_path / "db").mkdir()
    path = write(tmp_path, "c.yaml", "listen: {host: 127.0.0.1, port: 9}\nstore: db\n")
    refused(load_controller_config, path, "store", "is a directory")
    code, said = exit_of(tmp_path, "controller", path)
    assert code == 2 and "Traceback" not in said and f"{path}: store:" in said, said
    with pytest.raises(StoreError, match=r"no/such/c\.db: cannot open the store"):
        Store(str(tmp_path / "no" / "such" / "c.db"))  # SQLite's own words name no file


def test_an_engine_binary_is_an_absolute_path_to_an_executable(tmp_path: Path) -> None:
    write_sysfs_root(tmp_path / "n1", gpus=1, fabric_prefix=fabric_prefix_for("ib-a"), node="n1")
    (tmp_path / "plain.txt").write_text("not a program\n")
    cases = [
        ("{vllm: rm -rf /}", "engines.vllm", "not an absolute path"),
        ("{vllm: '/bin/rm -rf /'}", "engines.vllm", "not an absolute path"),
        ("{vllm: vllm}", "engines.vllm", "not an absolute path"),
        (f"{{vllm: {tmp_path / 'plain.txt'}}}", "engines.vllm", "not an executable file"),
        (f"{{vllm: {tmp_path}}}", "engines.vllm", "not an executable file"),
        (
            "{llamacpp: {binary: /opt/llama/llama-server, worker_binary: rpc-server}}",
            "engines.llamacpp.worker_binary",
            "not an absolute path",
        ),
    ]
    for engines, key, problem in cases:
        path = write(tmp_path, "a.yaml", AGENT + f"engines: {engines}\n")
        refused(load_agent_config, path, key, problem)
    code, said = exit_of(tmp_path, "agent", path)
    assert code == 2 and "Traceback" not in said and "engines.llamacpp" in said, said
    ok = write(tmp_path, "a.yaml", AGENT + f"engines: {{vllm: {sys.executable}}}\n")
    assert load_agent_config(ok).engines[0][1].binary == sys.executable


# --- the store's own error -------------------------------------------------------------------


def test_a_full_disk_is_reported_as_the_database_says_it(tmp_path: Path) -> None:
    store = Store(str(tmp_path / "c.db"))
    pages = store._db.execute("PRAGMA page_count").fetchone()[0]
    store._db.execute(f"PRAGMA max_page_count = {pages + 2}")  # as full as a disk can be
    events = [TraceEvent(i, "filler", (("text", "x" * 2000),)) for i in range(200)]
    with pytest.raises(Exception, match="disk is full") as e:
        store.commit([], events)
    assert "no transaction is active" not in str(e.value)
    store.close()


def test_a_read_only_database_is_reported_as_the_database_says_it(tmp_path: Path) -> None:
    store = Store(str(tmp_path / "c.db"))
    store._db.execute("PRAGMA query_only = 1")
    with pytest.raises(Exception, match="readonly database") as e:
        store.commit([], [TraceEvent(1, "x", ())])
    assert "no transaction is active" not in str(e.value)
    store.close()


def test_a_postgresql_store_with_credentials_needs_a_named_secret_file(tmp_path: Path) -> None:
    """A key derived from a URL would be a stray folder named after the URL, and one key per
    controller would make agents refuse a successor's tokens: the file must be named."""
    from llmgw_twin.service.common.config import ConfigError
    from llmgw_twin.service.controller.config import load_controller_config

    config = tmp_path / "c.yaml"
    config.write_text(
        "listen: {host: 127.0.0.1, port: 8080}\n"
        "store: postgresql://postgres@127.0.0.1:5432/postgres\n"
        f"auth: {{admin_tokens: ['sha256:{'0' * 64}']}}\n"
    )
    with pytest.raises(ConfigError, match=r"c\.yaml: auth\.secret_file: needed with a PostgreSQL"):
        load_controller_config(config)
    assert not (Path.cwd() / "postgresql:").exists()
