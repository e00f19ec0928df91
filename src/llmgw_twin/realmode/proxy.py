"""A TCP proxy that a real-mode run can cut: the network between a node and the controller.

Every byte between a node's agent and the controller goes through one of these, one per
direction, so `partition` is a real network cut: while cut, the proxy closes every connection it
carries and every new one the moment it is accepted, so both sides see the connection errors a
dead link gives; healed, it forwards again. Listens on loopback only.

With `refuse_when_cut`, a cut also stops listening, so a new connection is refused (a peer
dialling in retries, as it would over a link that is down) instead of accepted and closed; the
heal listens again on the same address and port. The fabric between nodes' engines is cut that
way (`cluster.py`): a worker started during the outage keeps dialling its leader and joins once
the links are back.

With `admit`, a proxy asks it of each connection's source address as it is accepted, and
`enforce` closes the open ones it no longer admits: the fabric proxies refuse a peer whose own
link is down, or one across a spine's split (`fabric.py`), telling the dialling node by the
address its traffic leaves from.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

CHUNK = 65536


class CuttableProxy:
    def __init__(
        self,
        target_host: str,
        target_port: int,
        *,
        refuse_when_cut: bool = False,
        admit: Callable[[str], bool] | None = None,
    ) -> None:
        self.target = (target_host, target_port)
        self.refuse_when_cut = refuse_when_cut
        self.admit = admit
        self._sources: dict[asyncio.StreamWriter, tuple[str, asyncio.StreamWriter]] = {}
        """Each open connection's client side: its source address and its upstream side."""
        self.cut_now = False
        self._server: asyncio.Server | None = None
        self._servers: list[asyncio.Server] = []
        self._listening: asyncio.Task[None] | None = None
        self._open: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self.host = "127.0.0.1"
        self.port = 0

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        self.host = host
        self._server = await asyncio.start_server(self._serve, host, port)
        self._servers.append(self._server)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self.port

    async def close(self) -> None:
        self.cut()
        if self._listening is not None:
            await asyncio.gather(self._listening, return_exceptions=True)
        for server in self._servers:
            server.close()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for server in self._servers:
            await server.wait_closed()

    def cut(self) -> None:
        self.cut_now = True
        for writer in list(self._open):
            writer.close()
        self._open.clear()
        if self.refuse_when_cut and self._server is not None:
            self._server.close()  # nothing listens: a new connection is refused
            self._server = None

    def heal(self) -> None:
        """Forward again; a refusing proxy listens again (at once, in a task of its own: see
        `listening`)."""
        self.cut_now = False
        if self.refuse_when_cut and self._server is None and self.port:
            self._listening = asyncio.get_running_loop().create_task(self._listen_again())

    async def listening(self) -> None:
        """Return once a healed refusing proxy listens again."""
        if self._listening is not None:
            await self._listening

    async def _listen_again(self) -> None:
        if not self.cut_now and self._server is None:
            server = await asyncio.start_server(self._serve, self.host, self.port)
            self._servers.append(server)
            if self.cut_now:  # cut again while it bound
                server.close()
            else:
                self._server = server

    def enforce(self) -> None:
        """Close every open connection whose source `admit` no longer admits."""
        if self.admit is None:
            return
        for writer, (source, up_writer) in list(self._sources.items()):
            if not self.admit(source):
                writer.close()
                up_writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        source = str(peer[0]) if isinstance(peer, tuple) and peer else ""
        if self.cut_now or (self.admit is not None and not self.admit(source)):
            writer.close()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        if self.cut_now or (self.admit is not None and not self.admit(source)):
            writer.close()  # cut, or refused, while it dialled upstream
            up_writer.close()
            return
        self._open.update((writer, up_writer))
        self._sources[writer] = (source, up_writer)
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        try:
            await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))
        except asyncio.CancelledError:
            pass  # the proxy is closing: the connection ends with it
        finally:
            if task is not None:
                self._tasks.discard(task)
            self._sources.pop(writer, None)
            for w in (writer, up_writer):
                self._open.discard(w)
                w.close()

    async def _pipe(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, OSError, asyncio.CancelledError):
            while not self.cut_now:
                data = await src.read(CHUNK)
                if not data:
                    break
                dst.write(data)
                await dst.drain()
        dst.close()
