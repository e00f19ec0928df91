"""A TCP proxy that a real-mode run can cut: the network between a node and the controller.

Every byte between a node's agent and the controller goes through one of these, one per
direction, so `partition` is a real network cut: while cut, the proxy closes every connection it
carries and every new one the moment it is accepted, so both sides see the connection errors a
dead link gives; healed, it forwards again. Listens on loopback only.
"""

from __future__ import annotations

import asyncio
import contextlib

CHUNK = 65536


class CuttableProxy:
    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.cut_now = False
        self._server: asyncio.Server | None = None
        self._open: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self.port = 0

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        self._server = await asyncio.start_server(self._serve, host, port)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self.port

    async def close(self) -> None:
        self.cut()
        if self._server is not None:
            self._server.close()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    def cut(self) -> None:
        self.cut_now = True
        for writer in list(self._open):
            writer.close()
        self._open.clear()

    def heal(self) -> None:
        self.cut_now = False

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.cut_now:
            writer.close()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        self._open.update((writer, up_writer))
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
