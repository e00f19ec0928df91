"""The services under hostile clients, as real processes on loopback: anonymous clients sending
large bodies pin no memory, dribbling connections are closed by the head timeout, a head too
large is refused, and the connection cap answers 503 beyond it (docs/security.md).

Each server is `llmgw-twin controller|router --config FILE`, started here in its own session
and killed by group at teardown. Memory is the server process's own resident set
(`/proc/PID/status`, VmRSS), read before the clients come and after they leave. Every loop is
bounded in count and in time; nothing is asserted about time, only about what was answered.
"""

from __future__ import annotations

import contextlib
import select
import socket
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from helpers.services import free_ports, wait_sync
from llmgw_twin.service.common.auth import new_token, token_hash
from test_services_e2e import Fleet, get

MiB = 1024 * 1024
CLIENTS = 32
"""Anonymous clients sending a large body at once."""
DRIBBLERS = 50
DEADLINE_S = 30.0
RSS_GROWTH_MIB = 48
"""The most the server's resident set may grow over the hostile clients' visit: they used to
pin every body they sent (8 MiB each to the controller, 16 MiB each to the router)."""

CONTROLLER_YAML = """\
listen: {{host: 127.0.0.1, port: {port}, head_timeout: {head_timeout}, idle_timeout: 1s, \
max_connections: {max_connections}, max_head_bytes: 16384}}
store: controller.db
auth: {{admin_tokens: ["{admin}"]}}
"""
ROUTER_YAML = """\
listen: {{host: 127.0.0.1, port: {port}, head_timeout: 1s}}
controller: http://127.0.0.1:{controller_port}
auth: {{api_keys: ["{key}"]}}
"""


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Fleet]:
    p = Fleet(tmp_path)
    try:
        yield p
    finally:
        p.close()


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for {pid}")


ADMIN = new_token()


def start_controller(
    tmp_path: Path, procs: Fleet, *, head_timeout: str = "1s", max_connections: int = 1000
) -> int:
    """A controller whose admin token is `ADMIN`, its idle timeout 1 s; its port, once it leads."""
    (port,) = free_ports(1)
    (tmp_path / "controller.yaml").write_text(
        CONTROLLER_YAML.format(
            port=port,
            head_timeout=head_timeout,
            max_connections=max_connections,
            admin=token_hash(ADMIN),
        )
    )
    procs.start("controller", "controller", "--config", "controller.yaml")
    with httpx.Client(trust_env=False, timeout=5) as client:
        wait_sync(lambda: get(client, f"http://127.0.0.1:{port}/health"), 30, "the controller")
        state = f"http://127.0.0.1:{port}/v1/admin/state"  # 401 once it leads (503 before)
        wait_sync(lambda: _refused(client, state), 30, "the controller to lead")
    return port


def _refused(client: httpx.Client, url: str) -> bool | None:
    try:
        return True if client.get(url).status_code == 401 else None
    except httpx.HTTPError:
        return None


def hostile_post(port: int, path: str, size: int, method: str = "POST") -> bytes:
    """An anonymous request announcing `size` bytes, sent in pieces until the server answers (or
    all of it is sent); what the server answered, if anything."""
    head = (
        f"{method} {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        f"content-length: {size}\r\n\r\n"
    ).encode()
    piece = b"7" * (64 * 1024)
    with socket.create_connection(("127.0.0.1", port), timeout=DEADLINE_S) as s:
        s.sendall(head)
        try:
            for _ in range(size // len(piece)):
                if select.select([s], [], [], 0)[0]:
                    break  # answered: the rest is not wanted
                s.sendall(piece)
        except OSError:
            pass  # the server closed the connection once it had answered
        return _answer(s)


def _answer(s: socket.socket) -> bytes:
    data = b""
    deadline = time.monotonic() + DEADLINE_S
    try:
        while time.monotonic() < deadline and b"\r\n\r\n" not in data:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    except OSError:
        pass
    return data


def _status(answer: bytes) -> int:
    parts = answer.split(b" ", 2)
    return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0


def _visit(
    pid: int, port: int, path: str, size: int, method: str
) -> tuple[float, float, list[int]]:
    """`CLIENTS` anonymous clients at once: the server's RSS before they come and after they
    left, and each client's status."""
    before = rss_mib(pid)
    with ThreadPoolExecutor(CLIENTS) as pool:
        statuses = list(
            pool.map(lambda _: _status(hostile_post(port, path, size, method)), range(CLIENTS))
        )
    return before, rss_mib(pid), statuses


@pytest.mark.parametrize("service", ["controller", "router"])
def test_anonymous_large_bodies_pin_no_memory(tmp_path: Path, procs: Fleet, service: str) -> None:
    if service == "controller":
        port = start_controller(tmp_path, procs)
        method, path, size = "PUT", "/v1/admin/profiles/p", 8 * MiB
    else:
        port, unreachable = free_ports(2)
        (tmp_path / "router.yaml").write_text(
            ROUTER_YAML.format(port=port, controller_port=unreachable, key=token_hash(new_token()))
        )
        procs.start("router", "router", "--config", "router.yaml")
        with httpx.Client(trust_env=False, timeout=5) as client:
            wait_sync(lambda: get(client, f"http://127.0.0.1:{port}/health"), 30, "the router")
        method, path, size = "POST", "/v1/chat/completions", 16 * MiB
    pid = procs.procs[service].pid
    # warm: the first refusals load what any refusal needs
    assert _status(hostile_post(port, path, 1024, method)) == 401
    started = time.monotonic()
    before, after, statuses = _visit(pid, port, path, size, method)
    took = time.monotonic() - started
    print(
        f"{service}: {CLIENTS} anonymous bodies of {size // MiB} MiB: RSS {before:.0f} -> "
        f"{after:.0f} MiB, {took:.1f} s"
    )
    assert statuses == [401] * CLIENTS, statuses
    assert after - before < RSS_GROWTH_MIB, (before, after)
    with httpx.Client(trust_env=False, timeout=5) as client:  # still serving
        assert get(client, f"http://127.0.0.1:{port}/health") is not None


def test_dribbling_connections_are_closed_by_the_head_timeout(tmp_path: Path, procs: Fleet) -> None:
    port = start_controller(tmp_path, procs, head_timeout="1s")
    socks = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(DRIBBLERS)]
    answers: dict[int, bytes] = {}
    drip = b"GET /health HTTP/1.1\r\nx-drip: " + b"a" * 10_000
    started = time.monotonic()
    try:
        for step in range(int(DEADLINE_S / 0.1)):  # a byte from each, every 0.1 s, until closed
            open_ = [s for i, s in enumerate(socks) if i not in answers]
            if not open_:
                break
            readable = select.select(open_, [], [], 0.1)[0]
            for i, s in enumerate(socks):
                if i in answers:
                    continue
                if s in readable:
                    answers[i] = _answer(s)
                    continue
                try:
                    s.sendall(drip[step : step + 1])
                except OSError:
                    answers[i] = _answer(s)
    finally:
        for s in socks:
            s.close()
    took = time.monotonic() - started
    print(f"{DRIBBLERS} dribbling connections closed after {took:.1f} s (head_timeout 1s)")
    assert len(answers) == DRIBBLERS, f"{DRIBBLERS - len(answers)} still open"
    assert all(a.startswith(b"HTTP/1.1 408 ") for a in answers.values()), set(answers.values())
    with httpx.Client(trust_env=False, timeout=5) as client:
        assert get(client, f"http://127.0.0.1:{port}/health") is not None


def test_a_body_that_stops_coming_is_closed_by_the_idle_timeout(
    tmp_path: Path, procs: Fleet
) -> None:
    """Even a caller with credentials holds no connection by announcing a body it never sends."""
    port = start_controller(tmp_path, procs)
    head = (
        f"PUT /v1/admin/profiles/p HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {ADMIN}\r\n"
        "content-type: application/json\r\ncontent-length: 1000\r\n\r\n{"
    ).encode()
    with socket.create_connection(("127.0.0.1", port), timeout=DEADLINE_S) as s:
        s.sendall(head)
        started = time.monotonic()
        try:
            answer = s.recv(65536)  # the server closes it (the app reads the client as gone)
        except TimeoutError:
            raise AssertionError(f"still open after {DEADLINE_S}s") from None
        took = time.monotonic() - started
    print(f"a stalled body closed after {took:.1f} s (idle_timeout 1s)")
    assert answer == b"" or answer.startswith(b"HTTP/1.1 4"), answer[:200]


def test_a_head_over_its_bound_is_431(tmp_path: Path, procs: Fleet) -> None:
    port = start_controller(tmp_path, procs)
    big = b"GET /health HTTP/1.1\r\nhost: x\r\nx-big: " + b"a" * 40_000 + b"\r\n\r\n"
    endless = b"GET /health HTTP/1.1\r\nhost: x\r\n" + b"x-more: aaaaaaaa\r\n" * 4000
    for head in (big, endless):
        with socket.create_connection(("127.0.0.1", port), timeout=DEADLINE_S) as s:
            with contextlib.suppress(OSError):  # the server may close before it read it all
                s.sendall(head)
            answer = _answer(s)
        assert answer.startswith(b"HTTP/1.1 431 "), answer[:200]


def test_connections_beyond_the_cap_are_answered_503(tmp_path: Path, procs: Fleet) -> None:
    port = start_controller(tmp_path, procs, head_timeout="60s", max_connections=4)
    idle = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(4)]
    url = f"http://127.0.0.1:{port}/health"
    try:
        with httpx.Client(trust_env=False, timeout=5) as client:
            assert client.get(url).status_code == 503
    finally:
        for s in idle:
            s.close()
    with httpx.Client(trust_env=False, timeout=5) as client:
        wait_sync(lambda: get(client, url), 30, "the controller to serve once they left")
