"""Reading a request body whole, within a limit: shared by the proxy and the operator API.

`StreamReader.read(n)` returns what has arrived so far, not `n` bytes, so the
body is read to its end in chunks; a declared or actual size past the limit is
`413 payload-too-large` before more is buffered.
"""

from __future__ import annotations

from aiohttp import web

from gateway.errors import PayloadTooLarge

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
