"""A protected MCP call's answer as an event stream, written to the caller as it reads.

Why: the server's events (progress, then the response) must be read at the
server's pace whatever the caller does, or a caller that stops reading
stops the gateway from reading the response, and the call turns `unknown`
at `max_call` although the tool answered. So `send` never waits for the
caller: events queue here and a writer task of their own passes them on,
each write within `[server] write_timeout`. A caller that takes nothing for
that long, or falls `MAX_PENDING` bytes behind, is cut; the call reads on
and its outcome is recorded for the retry. A caller that leaves cancels
nothing either.
"""

from __future__ import annotations

import asyncio
from collections import deque

from aiohttp import web

from gateway.mcp.answers import EVENT_STREAM
from gateway.web.caller_writes import abort, write_within

__all__ = ["MAX_PENDING", "LiveAnswer"]

MAX_PENDING = 4 << 20
"""Bytes of events a caller may fall behind before it is cut."""


class LiveAnswer:
    """The event stream of one call, started by its first event (or by `finish`)."""

    def __init__(self, request: web.Request, *, write_timeout: float) -> None:
        self._request = request
        self._write_timeout = write_timeout
        self._response: web.StreamResponse | None = None
        self._headers: dict[str, str] = {}
        self._pending: deque[bytes] = deque()
        self._pending_bytes = 0
        self._more = asyncio.Event()
        self._finishing = False
        self._gone = False
        self._writer: asyncio.Task[None] | None = None

    @property
    def started(self) -> bool:
        return self._writer is not None

    async def send(self, event: bytes) -> None:
        """Queue `event` for the caller; never waits for it to be read."""
        if self._gone:
            return
        if self._pending_bytes + len(event) > MAX_PENDING:
            self._cut()  # so far behind that it would only ever read stale events
            return
        self._queue(event)

    async def finish(self, event: bytes, headers: dict[str, str]) -> web.StreamResponse:
        """The last event, then the end of the stream; `headers` go out if the stream
        has not started yet. Returns once the caller has it, or was cut."""
        if self._writer is None:
            self._headers = headers
        self._finishing = True
        if not self._gone:
            self._queue(event)
        self._more.set()
        if self._writer is not None:
            await asyncio.shield(self._writer)
        return self._response if self._response is not None else web.StreamResponse()

    def close(self) -> None:
        """The call is over: a writer still waiting for events ends."""
        if self._writer is not None and not self._writer.done() and not self._finishing:
            self._writer.cancel()

    def _queue(self, event: bytes) -> None:
        self._pending.append(event)
        self._pending_bytes += len(event)
        self._more.set()
        if self._writer is None:
            self._writer = asyncio.ensure_future(self._write())

    async def _write(self) -> None:
        try:
            response = web.StreamResponse(
                status=200,
                headers={
                    "Content-Type": EVENT_STREAM,
                    "Cache-Control": "no-cache",
                    **self._headers,
                },
            )
            self._response = response
            async with asyncio.timeout(self._write_timeout):
                await response.prepare(self._request)
            while not self._gone:
                while self._pending:
                    event = self._pending.popleft()
                    self._pending_bytes -= len(event)
                    await write_within(self._request, response, event, self._write_timeout)
                if self._gone:  # cut while a write was under way
                    return
                if self._finishing:
                    async with asyncio.timeout(self._write_timeout):
                        await response.write_eof()
                    return
                self._more.clear()
                await self._more.wait()
        except (ConnectionError, TimeoutError):
            self._cut()

    def _cut(self) -> None:
        self._gone = True
        self._pending.clear()
        self._pending_bytes = 0
        abort(self._request)
        self._more.set()  # a writer waiting for events ends
