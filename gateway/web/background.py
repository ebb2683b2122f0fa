"""Work that outlives the request that started it: held, logged if it fails, awaited at
shutdown (`app[BACKGROUND]`, drained with the upstream calls)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any, TypeVar

from aiohttp import web

from gateway.engine.errors import GatewayError
from gateway.web.appkeys import BACKGROUND

__all__ = ["in_background", "keep_until_done"]

log = logging.getLogger("gateway.web")

T = TypeVar("T")


def keep_until_done(app: web.Application, task: asyncio.Task[T]) -> asyncio.Task[T]:
    """Hold a reference (and let shutdown wait) while the caller may have gone; a failure
    other than the gateway's own refusals is logged."""
    background = app[BACKGROUND]
    background.add(task)

    def done(finished: asyncio.Task[T]) -> None:
        background.discard(finished)
        error = None if finished.cancelled() else finished.exception()
        if error is not None and not isinstance(error, GatewayError):
            log.error("background task failed", exc_info=error)

    task.add_done_callback(done)
    return task


def in_background(app: web.Application, work: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
    """Run `work` beside the requests, kept as `keep_until_done` keeps a task."""
    return keep_until_done(app, asyncio.create_task(work))
