"""The sim engine's rendezvous: how the workers of one replica join their leader over TCP.

Protocol (newline-delimited JSON, one object a line, each under `MAX_LINE_BYTES`):

    worker -> leader   {"hello": "llmgw-sim/2", "rank": K, "nnodes": N, "model": NAME,
                        "pace": FACTOR}                   (`pace` only with a pace file)
    leader -> worker   {"ok": true}                       joined; the connection stays open
                       {"ok": false, "error": TEXT}       refused; the leader closes it
    worker -> leader   {"event": "pace", "factor": F}     its node's pace changed (`sim_pace`)
    leader -> worker   {"event": "serving"}               (informational) the replica serves
                       {"event": "shutdown"}              the leader is stopping cleanly

Invariants:
- Only the leader listens. A worker dials out and never opens a listening socket.
- A worker is joined from the leader's `{"ok": true}` until its connection closes. A join is
  refused for a wrong protocol, replica size or model name, a rank outside 1..N-1, or a rank
  already joined; a refused worker exits (it is misconfigured, and retrying would not help).
- Joined connections carry nothing but the leader's events and the workers' paces, so the end
  of one is the end of that peer (as is a line that is not the protocol's): the leader learns
  of a lost worker by EOF (`LeaderRendezvous.lost` is set, once, with the first lost rank), a
  worker of a lost leader by EOF without a prior `shutdown`. Either acts on it
  `PEER_LOSS_NOTICE_S` later, as a real engine's collective notices a dead peer at its next
  step, not at the instant: the dead peer's own agent, which sees its process end, reports
  first, as in the twin (where a killed engine's peers notice nothing; a crashed node's, at once).
- The replica runs at its slowest node's pace, as a collective steps at its slowest rank's: the
  leader keeps each joined worker's latest pace (`slowest`), which its answers take on.
- Every wait is bounded: a worker dials with exponential backoff until its deadline, and a
  connection that does not say hello within `HELLO_TIMEOUT_S` is dropped.
- A connection that ends before the leader answered the hello (no leader behind a proxy or a
  cut link yet, a leader that died as it answered) is dialled again, like a refused one, until
  the deadline: only the leader's own `{"ok": false}` is final.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

PROTOCOL = "llmgw-sim/2"
"""/2: a worker may send its pace after the hello (/1's leader took any line for its end)."""
MAX_LINE_BYTES = 4096
HELLO_TIMEOUT_S = 5.0
BACKOFF_FIRST_S = 0.05
BACKOFF_MAX_S = 0.2
"""A worker dials a leader not yet listening at most this long apart: a leader that opens its
port just after a dial is joined that much later at most (it was up to 1 s, most of a scaled
load time in real mode)."""
PEER_LOSS_NOTICE_S = 0.5
"""How long after a peer's connection ends its loss is acted on (see the module's text)."""

log = logging.getLogger("llmgw_twin.sim_engine")


class RendezvousError(Exception):
    """The leader refused this worker, or spoke something other than the protocol."""


class RendezvousTimeout(Exception):
    """The leader could not be reached before the deadline."""


def parse_endpoint(text: str) -> tuple[str, int]:
    """`HOST:PORT` (or `[V6]:PORT`) -> (host, port)."""
    host, sep, port_text = text.rpartition(":")
    if not sep or not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(f"expected HOST:PORT, got {text!r}")
    return host.removeprefix("[").removesuffix("]"), int(port_text)


def parse_pace(value: object) -> Fraction | None:
    """A pace as the protocol writes it (`"3"`, `"5/2"`): a fraction of at least 1, else None."""
    if not isinstance(value, str) or len(value) > 40:
        return None
    try:
        factor = Fraction(value)
    except (ValueError, ZeroDivisionError):
        return None
    return factor if factor >= 1 else None


def encode(message: dict[str, Any]) -> bytes:
    return json.dumps(message, sort_keys=True).encode() + b"\n"


async def read_message(reader: asyncio.StreamReader) -> dict[str, Any] | None:
    """The next message, or None at EOF. Raises RendezvousError on anything malformed."""
    try:
        line = await reader.readline()
    except (ValueError, asyncio.LimitOverrunError) as e:  # a line over the reader's limit
        raise RendezvousError("message too long") from e
    if not line:
        return None
    if not line.endswith(b"\n"):
        return None  # EOF inside a line: the peer went away mid-message
    try:
        message = json.loads(line)
    except ValueError as e:
        raise RendezvousError(f"not JSON: {line[:80]!r}") from e
    if not isinstance(message, dict):
        raise RendezvousError(f"not a JSON object: {line[:80]!r}")
    return message


@dataclass
class LeaderRendezvous:
    """The leader's side: a listening socket and the workers joined to it."""

    nnodes: int
    model: str
    joined: dict[int, asyncio.StreamWriter] = field(default_factory=dict)
    all_joined: asyncio.Event = field(default_factory=asyncio.Event)
    lost: asyncio.Event = field(default_factory=asyncio.Event)
    lost_rank: int | None = None
    paces: dict[int, Fraction] = field(default_factory=dict)
    """Each joined worker's latest pace (a worker without a pace file says none: 1)."""
    slowest: Fraction = Fraction(1)
    """The slowest joined worker's pace."""
    _server: asyncio.Server | None = None
    _closing: bool = False

    async def start(self, host: str, port: int) -> None:
        self._server = await asyncio.start_server(
            self._on_connection, host, port, limit=MAX_LINE_BYTES, reuse_address=True
        )
        if self.nnodes == 1:
            self.all_joined.set()

    @property
    def waiting_for(self) -> list[int]:
        return [r for r in range(1, self.nnodes) if r not in self.joined]

    def _check_hello(self, hello: dict[str, Any]) -> str | None:
        rank = hello.get("rank")
        if hello.get("hello") != PROTOCOL:
            return f"expected protocol {PROTOCOL!r}, got {hello.get('hello')!r}"
        if hello.get("nnodes") != self.nnodes:
            return f"this replica has {self.nnodes} nodes, the worker says {hello.get('nnodes')!r}"
        if hello.get("model") != self.model:
            return f"this replica serves {self.model!r}, the worker {hello.get('model')!r}"
        if not isinstance(rank, int) or isinstance(rank, bool) or not 0 < rank < self.nnodes:
            return f"rank must be 1..{self.nnodes - 1}, got {rank!r}"
        if rank in self.joined:
            return f"rank {rank} has already joined"
        if "pace" in hello and parse_pace(hello["pace"]) is None:
            return f"not a pace: {hello['pace']!r}"
        return None

    def _set_pace(self, rank: int, factor: Fraction | None) -> None:
        if factor is None:
            self.paces.pop(rank, None)
        else:
            self.paces[rank] = factor
        self.slowest = max(self.paces.values(), default=Fraction(1))

    async def _on_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        peer = writer.get_extra_info("peername")
        try:
            async with asyncio.timeout(HELLO_TIMEOUT_S):
                hello = await read_message(reader)
        except (TimeoutError, RendezvousError, ConnectionError) as e:
            log.warning("rendezvous: dropped %s before hello: %s", peer, e or "timeout")
            writer.close()
            return
        if hello is None:
            writer.close()
            return
        refusal = "the leader is stopping" if self._closing else self._check_hello(hello)
        if refusal is not None:
            log.warning("rendezvous: refused %s: %s", peer, refusal)
            with contextlib.suppress(ConnectionError):
                writer.write(encode({"ok": False, "error": refusal}))
                await writer.drain()
            writer.close()
            return
        rank: int = hello["rank"]
        self.joined[rank] = writer
        if "pace" in hello:
            self._set_pace(rank, parse_pace(hello["pace"]))
        writer.write(encode({"ok": True}))
        log.info(
            "rendezvous: rank %d joined from %s (%d/%d workers)%s",
            rank, peer, len(self.joined), self.nnodes - 1,
            f", at pace {self.paces[rank]}" if rank in self.paces else "",
        )  # fmt: skip
        if not self.waiting_for:
            self.all_joined.set()
        await self._follow(rank, reader)
        del self.joined[rank]
        self._set_pace(rank, None)
        writer.close()
        try:
            await asyncio.sleep(PEER_LOSS_NOTICE_S)
        except asyncio.CancelledError:
            # the leader is exiting: end quietly (asyncio logs a connection handler that ends
            # cancelled as an error, with its traceback, in every stopped leader's log)
            return
        if not self._closing and not self.lost.is_set():
            self.lost_rank = rank
            self.lost.set()

    async def _follow(self, rank: int, reader: asyncio.StreamReader) -> None:
        """Take a joined worker's paces until its connection ends (EOF, or a line that is not
        the protocol's: the peer is then taken for gone)."""
        while True:
            try:
                message = await read_message(reader)
            except (RendezvousError, ConnectionError) as e:
                log.warning("rendezvous: rank %d: %s", rank, e)
                return
            if message is None:
                return
            factor = parse_pace(message.get("factor"))
            if message.get("event") != "pace" or factor is None:
                log.warning("rendezvous: rank %d sent %s", rank, json.dumps(message)[:80])
                return
            if factor != self.paces.get(rank, Fraction(1)):
                log.info("rendezvous: rank %d runs at pace %s", rank, factor)
            self._set_pace(rank, factor)

    def broadcast(self, event: str) -> None:
        for writer in self.joined.values():
            with contextlib.suppress(ConnectionError):
                writer.write(encode({"event": event}))

    async def close(self, *, clean: bool) -> None:
        """Stop listening and let go of every worker; `clean` tells them it is a shutdown."""
        self._closing = True
        if clean:
            self.broadcast("shutdown")
        writers = list(self.joined.values())
        for writer in writers:
            with contextlib.suppress(ConnectionError):
                await writer.drain()
            writer.close()
        if self._server is not None:
            self._server.close()
            # wait_closed() would also wait for every handler; they end as their sockets close.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(HELLO_TIMEOUT_S):
                    await self._server.wait_closed()


@dataclass
class WorkerLink:
    """A worker's open connection to its leader."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter

    async def wait_end(self) -> bool:
        """Wait until the leader goes; True when it said `shutdown` first (a clean stop)."""
        while True:
            try:
                message = await read_message(self.reader)
            except (RendezvousError, ConnectionError):
                return False
            if message is None:
                return False
            event = message.get("event")
            if event == "shutdown":
                return True
            log.info("leader: %s", event)

    def send_pace(self, factor: Fraction) -> None:
        """Tell the leader this worker's node now runs at `factor` (`sim_pace`)."""
        with contextlib.suppress(ConnectionError):
            self.writer.write(encode({"event": "pace", "factor": str(factor)}))

    def close(self) -> None:
        self.writer.close()


async def join(
    host: str,
    port: int,
    *,
    rank: int,
    nnodes: int,
    model: str,
    deadline_s: float,
    source_host: str | None = None,
    pace: Fraction | None = None,
) -> WorkerLink:
    """Dial the leader and say hello until it answers or `deadline_s` (loop time) passes; from
    `source_host` when given (the node's own address, as its traffic leaves a real node: on one
    machine's loopback it would leave from 127.0.0.1 whatever the node); `pace`: its node's, said
    in the hello (a worker with a pace file), so the leader has it from the join on."""
    local = None if source_host is None else (source_host, 0)
    loop = asyncio.get_running_loop()
    delay = BACKOFF_FIRST_S
    attempts = 0
    said: dict[str, Any] = {"hello": PROTOCOL, "rank": rank, "nnodes": nnodes, "model": model}
    if pace is not None:
        said["pace"] = str(pace)
    hello = encode(said)
    while True:
        attempts += 1
        why: object = "it closed the connection before answering"
        answer: dict[str, Any] | None = None
        writer: asyncio.StreamWriter | None = None
        try:
            reader, writer = await asyncio.open_connection(
                host, port, limit=MAX_LINE_BYTES, local_addr=local
            )
            writer.write(hello)
            async with asyncio.timeout(max(HELLO_TIMEOUT_S, deadline_s - loop.time())):
                await writer.drain()
                answer = await read_message(reader)
        except TimeoutError as e:
            if writer is not None:
                writer.close()
            raise RendezvousError(f"leader {host}:{port} did not answer the hello") from e
        except OSError as e:  # refused, or ended before an answer: dial again
            why = e
        if answer is not None and writer is not None:
            if answer.get("ok") is not True:
                writer.close()
                error = answer.get("error", answer)
                raise RendezvousError(f"leader {host}:{port} refused rank {rank}: {error}")
            return WorkerLink(reader, writer)
        if writer is not None:
            writer.close()
        remaining = deadline_s - loop.time()
        if remaining <= 0:
            raise RendezvousTimeout(
                f"leader {host}:{port} unreachable after {attempts} attempts: {why}"
            )
        # Nothing announces that a remote port has opened: dialling again is the only probe.
        await asyncio.sleep(min(delay, remaining))
        delay = min(delay * 2, BACKOFF_MAX_S)
