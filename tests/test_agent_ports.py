"""The ports an agent hands its shards: from the operator's range, never one its engines are
told to rendezvous on."""

from __future__ import annotations

from llmgw_twin.service.agent.processes import PortPool
from llmgw_twin.service.agent.shards import ENGINE_PEER_PORTS


def test_an_agent_never_hands_out_the_ports_its_engines_rendezvous_on() -> None:
    # the controller gives a replica's ranks 29500 plus their first GPU's index: a range that
    # runs into them leaves them to the engines, whatever the operator's range says
    first = ENGINE_PEER_PORTS.start - 2
    pool = PortPool(first, ENGINE_PEER_PORTS.stop, (), ENGINE_PEER_PORTS)  # no host: all bind
    taken = [pool.take() for _ in range(4)]
    assert taken == [first, first + 1, ENGINE_PEER_PORTS.stop, None]
