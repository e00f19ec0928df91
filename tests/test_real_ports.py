"""Real-mode port ranges: each run leases its nodes' ranges, and no two live runs share a port.

The leases are file locks in a folder of the test's own (`lock_dir`), so these tests neither
see nor disturb the leases of real-mode runs going on beside them.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from llmgw_twin.realmode import ports
from llmgw_twin.realmode.ports import PortLeaseError, lease_ports


def _ports_of(lease: ports.PortLease, nodes: int) -> set[int]:
    return {p for i in range(nodes) for p in range(lease.range_of(i)[0], lease.range_of(i)[1] + 1)}


def test_two_leases_share_no_port_and_a_closed_one_is_free_again(tmp_path: Path) -> None:
    a = lease_ports(6, tmp_path)
    b = lease_ports(3, tmp_path)
    assert _ports_of(a, 6).isdisjoint(_ports_of(b, 3))
    assert len(_ports_of(a, 6)) == 6 * ports.PORTS_PER_NODE
    first_unit = a.first_unit
    a.close()
    b.close()
    again = lease_ports(6, tmp_path)  # the pid draws the same first unit, now free again
    assert again.first_unit == first_unit
    again.close()


def test_every_range_lies_below_the_ephemeral_ports(tmp_path: Path) -> None:
    lease = lease_ports(ports.UNITS, tmp_path)
    try:
        assert lease.range_of(0)[0] == ports.PORTS_FROM
        assert lease.range_of(ports.UNITS - 1)[1] < 32768  # Linux's default ip_local_port_range
    finally:
        lease.close()


def test_a_lease_another_process_holds_is_skipped_until_that_process_ends(
    tmp_path: Path,
) -> None:
    code = (
        "import sys; from pathlib import Path; from llmgw_twin.realmode.ports import lease_ports;"
        f"lease = lease_ports(4, Path({str(tmp_path)!r})); print(lease.first_unit, flush=True);"
        "sys.stdin.read()"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", code],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert child.stdout is not None
        held = int(child.stdout.readline())
        # every start but the child's block taken here, so only what the child holds is left
        mine = [lease_ports(1, tmp_path) for _ in range(ports.UNITS - 4)]
        assert held not in {m.first_unit for m in mine}
        with pytest.raises(PortLeaseError, match="other real-mode runs"):
            lease_ports(1, tmp_path)
        os.killpg(child.pid, signal.SIGKILL)  # a killed run's locks go with it
        child.wait(timeout=30)
        freed = lease_ports(4, tmp_path)
        assert freed.first_unit == held
        for lease in (*mine, freed):
            lease.close()
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait(timeout=30)


def test_more_nodes_than_ranges_is_refused_with_the_limit(tmp_path: Path) -> None:
    with pytest.raises(PortLeaseError, match=f"at most {ports.UNITS}"):
        lease_ports(ports.UNITS + 1, tmp_path)
