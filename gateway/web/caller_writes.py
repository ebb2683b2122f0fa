"""Writing answers to callers that may read slowly, or stop reading.

Why: by the time an answer is written to its caller, its outcome is decided
and recorded (the upstream answer is read to its end whatever the caller
does: `gateway.upstream.spool`). A caller that stops reading must then hold
nothing the gateway needs: each write waits at most `[server] write_timeout`
for the caller to take bytes, and a whole relay lasts at most `max_relay`;
past either the connection is aborted (not closed: a close would wait to
flush what the caller does not read). The caller's retry or lookup finds the
outcome.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from aiohttp import web
from multidict import CIMultiDict

from gateway.web.appkeys import SETTINGS

__all__ = [
    "SMALL_BODY",
    "CallerStalled",
    "abort",
    "in_pieces",
    "respond",
    "stream_to_caller",
    "write_all",
    "write_within",
]

SMALL_BODY = 64 * 1024
"""Bodies up to this size are handed to the transport whole: below its high-water mark
a write never waits for the caller, so they need no write limit."""

_CHUNK = 64 * 1024


class CallerStalled(ConnectionResetError):
    """The caller took no bytes for `write_timeout`, or its relay passed `max_relay`."""


def abort(request: web.Request) -> None:
    """Drop the caller's connection at once, without flushing what it did not read."""
    if request.transport is not None:
        request.transport.abort()


async def write_within(
    request: web.Request, response: web.StreamResponse, data: bytes, seconds: float
) -> None:
    """Write `data`; abort the caller's connection if it takes none of it for `seconds`."""
    try:
        async with asyncio.timeout(seconds):
            await response.write(data)
    except TimeoutError:
        abort(request)
        raise CallerStalled(f"the caller read nothing for {seconds:g}s (write_timeout)") from None


async def write_all(
    request: web.Request,
    response: web.StreamResponse,
    chunks: AsyncIterator[bytes],
    *,
    write_timeout: float,
    max_relay: float,
) -> None:
    """Write every chunk, each within `write_timeout`, all within `max_relay`, then the end."""
    try:
        async with asyncio.timeout(max_relay):
            async for chunk in chunks:
                await write_within(request, response, chunk, write_timeout)
            try:
                async with asyncio.timeout(write_timeout):
                    await response.write_eof()
            except TimeoutError:
                abort(request)
                raise CallerStalled(f"the caller read nothing for {write_timeout:g}s") from None
    except TimeoutError:
        abort(request)
        raise CallerStalled(f"the relay passed max_relay ({max_relay:g}s)") from None


async def in_pieces(body: bytes) -> AsyncIterator[bytes]:
    """A body already in memory, in pieces a stalled caller is noticed between."""
    view = memoryview(body)
    for start in range(0, len(body), _CHUNK):
        yield bytes(view[start : start + _CHUNK])


async def respond(
    request: web.Request, status: int, headers: CIMultiDict[str], body: bytes
) -> web.StreamResponse:
    """An answer whose body is in memory: handed over whole when small, else written in
    pieces within `write_timeout` each (a caller that stops reading is cut)."""
    if len(body) <= SMALL_BODY:
        return web.Response(status=status, headers=headers, body=body)
    response = web.StreamResponse(status=status, headers=headers)
    response.content_length = len(body)
    # A caller that left or was cut: the outcome never waited for it.
    with contextlib.suppress(ConnectionError):
        await stream_to_caller(request, response, in_pieces(body))
    return response


async def stream_to_caller(
    request: web.Request, response: web.StreamResponse, chunks: AsyncIterator[bytes]
) -> None:
    """Send `response`'s head, then `chunks`, within the server's `write_timeout` (each
    write) and `max_relay` (all of it); raises `ConnectionError` when the caller left or
    was cut (its connection aborted)."""
    server = request.app[SETTINGS].server
    try:
        async with asyncio.timeout(server.write_timeout):
            await response.prepare(request)
    except TimeoutError:
        abort(request)
        raise CallerStalled("the caller took nothing of the answer's head") from None
    await write_all(
        request,
        response,
        chunks,
        write_timeout=server.write_timeout,
        max_relay=server.max_relay,
    )
