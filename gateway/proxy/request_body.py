"""Reading a request body whole, within a size and a time limit: shared by the proxy and
the operator API.

`StreamReader.read(n)` returns what has arrived so far, not `n` bytes, so the
body is read to its end in chunks; a declared or actual size past the limit is
`413 payload-too-large` before more is buffered. A body that does not arrive
within `[server] client_timeout` is `408 request-timeout`: a caller that
announces a body and never sends it must not hold a connection forever.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from aiohttp import web

from gateway.engine.errors import PayloadTooLarge, RequestTimeout


async def read_in_time(
    request: web.Request, read: Callable[[], Awaitable[bytes]], within: float
) -> bytes:
    """`read()` the body, or `RequestTimeout` if it does not arrive within `within` s.

    A body that has already arrived whole (most small POSTs come in the same
    packets as their headers) cannot be late: it is read without a timer.
    """
    if request.content.is_eof():
        return await read()
    try:
        async with asyncio.timeout(within):
            return await read()
    except TimeoutError as exc:
        raise RequestTimeout(f"the request body did not arrive within {within:g}s") from exc


_CHUNK = 64 * 1024


async def read_limited(request: web.Request, limit: int) -> bytes:
    """The whole body, or `PayloadTooLarge` once it is known to exceed `limit` bytes."""
    declared = request.content_length
    if declared is not None and declared > limit:
        raise PayloadTooLarge(f"the request body is {declared} bytes; the limit is {limit}")
    chunks: list[bytes] = []
    size = 0
    while chunk := await request.content.read(_CHUNK):
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"the request body exceeds the limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)
