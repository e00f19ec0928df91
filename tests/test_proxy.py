"""The cuttable proxy: forwards, cuts (open and new connections), heals."""

from __future__ import annotations

import asyncio

import pytest

from llmgw_twin.realmode.proxy import CuttableProxy


async def echo_server() -> tuple[asyncio.Server, int]:
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(1024):
            writer.write(data)
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    return server, int(server.sockets[0].getsockname()[1])


async def read(reader: asyncio.StreamReader) -> bytes:
    """What arrives next; b"" when the link is closed, by a FIN or a reset."""
    try:
        return await asyncio.wait_for(reader.read(1024), timeout=5)
    except ConnectionResetError:
        return b""


async def roundtrip(port: int, payload: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(payload)
        await writer.drain()
    except ConnectionResetError:
        return b""
    data = await read(reader)
    writer.close()
    return data


def test_forwards_cuts_and_heals() -> None:
    async def scenario() -> None:
        server, port = await echo_server()
        proxy = CuttableProxy("127.0.0.1", port)
        pport = await proxy.start()
        assert await roundtrip(pport, b"hello") == b"hello"
        # an open connection dies when the link is cut
        reader, writer = await asyncio.open_connection("127.0.0.1", pport)
        writer.write(b"a")
        await writer.drain()
        assert await read(reader) == b"a"
        proxy.cut()
        assert await read(reader) == b""
        # new connections are closed at once while cut
        assert await roundtrip(pport, b"x") == b""
        proxy.heal()
        assert await roundtrip(pport, b"back") == b"back"
        await proxy.close()
        server.close()
        await server.wait_closed()

    asyncio.run(asyncio.wait_for(scenario(), timeout=30))


def test_an_unreachable_target_closes_the_client() -> None:
    async def scenario() -> None:
        server, port = await echo_server()
        server.close()
        await server.wait_closed()
        proxy = CuttableProxy("127.0.0.1", port)
        pport = await proxy.start()
        assert await roundtrip(pport, b"x") == b""
        await proxy.close()

    asyncio.run(asyncio.wait_for(scenario(), timeout=30))


@pytest.mark.parametrize("chunks", [1, 50])
def test_large_payloads_pass_whole(chunks: int) -> None:
    async def scenario() -> None:
        server, port = await echo_server()
        proxy = CuttableProxy("127.0.0.1", port)
        pport = await proxy.start()
        reader, writer = await asyncio.open_connection("127.0.0.1", pport)
        payload = bytes(range(256)) * 40 * chunks
        writer.write(payload)
        await writer.drain()
        got = await asyncio.wait_for(reader.readexactly(len(payload)), timeout=10)
        assert got == payload
        writer.close()
        await proxy.close()
        server.close()
        await server.wait_closed()

    asyncio.run(asyncio.wait_for(scenario(), timeout=30))
