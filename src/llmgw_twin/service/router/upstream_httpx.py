"""The forwarding's client to the replicas through an httpx transport given to it.

Role: tests and in-process set-ups hand a `Forwarder` an httpx transport (a mock, an ASGI app)
in place of the network; `HttpxUpstream` sends through it and answers as `upstream.Upstream`
does, with the same errors: `UpstreamError` for a replica not reached or an answer broken,
`TimeoutError` for httpx's own bounds.
"""

from __future__ import annotations

import asyncio

import httpx

from llmgw_twin.service.router.upstream import UpstreamError

HEADERS = {"content-type": "application/json", "accept-encoding": "identity"}


class HttpxAnswer:
    __slots__ = ("_chunks", "_response", "content_type", "status")

    def __init__(self, response: httpx.Response) -> None:
        self._response = response
        self._chunks = response.aiter_raw()
        self.status = response.status_code
        self.content_type = response.headers.get("content-type")

    ended = False
    """Not known ahead: the end shows as a read that says None."""

    @property
    def is_success(self) -> bool:
        return 200 <= self.status < 300

    async def next_chunk(self, timeout_s: float | None = None) -> bytes | None:
        try:
            async with asyncio.timeout(timeout_s):
                while (chunk := await anext(self._chunks, None)) is not None:
                    if chunk:
                        return chunk
        except httpx.TimeoutException:
            raise TimeoutError from None
        except httpx.HTTPError as e:
            raise UpstreamError(f"{type(e).__name__}: {e}") from None
        return None

    async def aclose(self) -> None:
        await self._response.aclose()


class HttpxUpstream:
    def __init__(self, transport: httpx.AsyncBaseTransport, *, connect_s: float) -> None:
        self._client = httpx.AsyncClient(
            transport=transport, trust_env=False, timeout=httpx.Timeout(None, connect=connect_s)
        )

    async def post(self, endpoint: str, path: str, body: bytes, deadline: float) -> HttpxAnswer:
        """The answer once its head arrived, by the running loop's time `deadline`
        (`TimeoutError`)."""
        try:
            request = self._client.build_request(
                "POST", endpoint + path, content=body, headers=HEADERS
            )
            async with asyncio.timeout_at(deadline):
                return HttpxAnswer(await self._client.send(request, stream=True))
        except httpx.TimeoutException:
            raise TimeoutError from None
        except (httpx.HTTPError, httpx.InvalidURL) as e:
            raise UpstreamError(f"{type(e).__name__}: {e}") from None

    async def aclose(self) -> None:
        await self._client.aclose()
