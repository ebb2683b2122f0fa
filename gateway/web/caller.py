"""Noticing that a caller closed its connection while the gateway waits on the upstream.

The server runs with `handler_cancellation=False`: a handler that records an outcome
must not be cut short by a caller that leaves. Work that records nothing (an answer
passed through) should stop when its caller leaves, or the upstream goes on working
for nobody. aiohttp says so only by cancelling the handler, so the transport is
looked at while such work waits: often at first, then once a second.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Final, TypeVar

from aiohttp import web

__all__ = ["CallerLeft", "until_caller_leaves"]

LOOK_FIRST: Final = 0.05
LOOK_AT_MOST: Final = 1.0
"""Seconds between two looks at the caller's connection: from `LOOK_FIRST`, doubling to
`LOOK_AT_MOST`, so a call is stopped soon after its caller leaves and a stream open for
hours costs a wakeup a second."""

T = TypeVar("T")


class CallerLeft(Exception):
    """The caller's connection closed before the work ended (the work was cancelled)."""


async def until_caller_leaves(request: web.Request, work: Awaitable[T]) -> T:
    """`work`'s result; `CallerLeft` once the caller's connection is closed first, the
    work cancelled (its own cleanup, such as closing an upstream answer, runs then)."""
    task = asyncio.ensure_future(work)
    every = LOOK_FIRST
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=every)
            if done:
                return task.result()
            transport = request.transport
            if transport is None or transport.is_closing():
                break
            every = min(every * 2, LOOK_AT_MOST)
    finally:
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    raise CallerLeft
