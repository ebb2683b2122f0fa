"""A tiny HTTP/1.1 client over raw asyncio streams, for requests no real client would send.

aiohttp's client normalises what it sends (dot segments, header values,
framing), which is exactly what hostile-input tests must get past. This one
writes the bytes it is given and reads one response back, every read bounded
by a timeout. A connection the server closes without answering is a
`RawResponse` with `status=None`, not an error: refusing to parse by hanging
up is an acceptable answer to malformed input.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from urllib.parse import urlsplit

__all__ = ["READ_TIMEOUT", "RawResponse", "address_of", "exchange", "read_response", "request"]

READ_TIMEOUT = 5.0
"""Upper bound, in seconds, for every single read from a socket."""

_MAX_HEAD = 64 * 1024
_MAX_BODY = 4 * 1024 * 1024


@dataclass(frozen=True)
class RawResponse:
    """One parsed response; `status` is None when the server hung up without one.

    >>> RawResponse(status=400, headers=(("content-type", "text/plain"),), body=b"").header(
    ...     "Content-Type"
    ... )
    'text/plain'
    """

    status: int | None
    headers: tuple[tuple[str, str], ...] = ()
    body: bytes = b""

    def header(self, name: str) -> str | None:
        """The first value of a header (names compared case-insensitively), or None."""
        lowered = name.lower()
        for header, value in self.headers:
            if header == lowered:
                return value
        return None


def address_of(url: str) -> tuple[str, int]:
    """The (host, port) of a server's base URL such as ``http://127.0.0.1:41234``."""
    parts = urlsplit(url)
    assert parts.hostname is not None
    assert parts.port is not None
    return parts.hostname, parts.port


def request(
    method: str,
    target: str,
    headers: list[tuple[str, str]] | None = None,
    body: bytes = b"",
    *,
    host: str | None = "gateway.test",
    content_length: bool = True,
    close: bool = True,
) -> bytes:
    """Serialise a request exactly as given (latin-1 for names and values, no checks).

    >>> request("GET", "/healthz", host="h")
    b'GET /healthz HTTP/1.1\\r\\nHost: h\\r\\nConnection: close\\r\\n\\r\\n'
    """
    lines = [f"{method} {target} HTTP/1.1"]
    if host is not None:
        lines.append(f"Host: {host}")
    lines.extend(f"{name}: {value}" for name, value in headers or ())
    if content_length and body:
        lines.append(f"Content-Length: {len(body)}")
    if close:
        lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


async def read_response(
    reader: asyncio.StreamReader, *, seconds: float = READ_TIMEOUT, head_request: bool = False
) -> RawResponse:
    """Read one response; `status=None` if the connection ends (or resets) before its head.

    The response to a `HEAD` request (`head_request`) has no body, whatever it announces.
    """
    try:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), seconds)
    except (asyncio.IncompleteReadError, ConnectionError):
        return RawResponse(status=None)
    except asyncio.LimitOverrunError as exc:
        raise AssertionError(f"response head longer than {_MAX_HEAD} bytes") from exc
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    version, _, rest = status_line.partition(" ")
    assert version.startswith("HTTP/"), f"not an HTTP response: {status_line!r}"
    status = int(rest[:3])
    if 100 <= status < 200 and status != 101:
        # An interim response (100 Continue): the final one follows.
        return await read_response(reader, seconds=seconds, head_request=head_request)
    headers = tuple(
        (name.strip().lower(), value.strip())
        for name, _, value in (line.partition(":") for line in header_lines if line)
    )
    response = RawResponse(status=status, headers=headers)
    if head_request or status in (101, 204, 304):
        return response
    body = await _read_body(reader, response, seconds)
    return RawResponse(status=status, headers=headers, body=body)


async def _read_body(reader: asyncio.StreamReader, head: RawResponse, seconds: float) -> bytes:
    length = head.header("content-length")
    try:
        if length is not None:
            size = int(length)
            assert size <= _MAX_BODY, f"response body of {size} bytes"
            return await asyncio.wait_for(reader.readexactly(size), seconds)
        if (head.header("transfer-encoding") or "").lower() == "chunked":
            return await _read_chunked(reader, seconds)
        return await _read_to_end(reader, seconds)
    except (asyncio.IncompleteReadError, ConnectionError) as exc:
        raise AssertionError(f"the response to a {head.status} ended mid-body") from exc


async def _read_to_end(reader: asyncio.StreamReader, seconds: float) -> bytes:
    chunks: list[bytes] = []
    while chunk := await asyncio.wait_for(reader.read(64 * 1024), seconds):
        chunks.append(chunk)
        assert sum(map(len, chunks)) <= _MAX_BODY, "response body too long"
    return b"".join(chunks)


async def _read_chunked(reader: asyncio.StreamReader, seconds: float) -> bytes:
    chunks: list[bytes] = []
    while True:
        size_line = await asyncio.wait_for(reader.readuntil(b"\r\n"), seconds)
        size = int(size_line.split(b";", 1)[0].strip(), 16)
        if size == 0:
            await asyncio.wait_for(reader.readuntil(b"\r\n"), seconds)
            return b"".join(chunks)
        chunks.append(await asyncio.wait_for(reader.readexactly(size + 2), seconds))
        chunks[-1] = chunks[-1][:-2]


async def exchange(
    address: tuple[str, int], data: bytes, *, seconds: float = READ_TIMEOUT
) -> RawResponse:
    """Open a connection, write `data`, read one response, close."""
    reader, writer = await asyncio.wait_for(asyncio.open_connection(*address), seconds)
    try:
        writer.write(data)
        with contextlib.suppress(ConnectionError):
            await asyncio.wait_for(writer.drain(), seconds)
        return await read_response(reader, seconds=seconds, head_request=data.startswith(b"HEAD "))
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError, TimeoutError):
            await asyncio.wait_for(writer.wait_closed(), seconds)
