"""One background job of a store's (an index build, a backfill), one task at a time.

Some upkeep takes minutes (an index built concurrently, rows moved in batches)
and must hold up neither the store's open nor its requests. It runs in a task
that is started again only once the last one has ended, that the store's close
cancels, and that tests and operators' tools can wait for.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine
from typing import Any


class BackgroundJob:
    """`run` in a task named `name`, at most one at a time."""

    def __init__(self, run: Callable[[], Coroutine[Any, Any, None]], name: str) -> None:
        self._run = run
        self._name = name
        self._task: asyncio.Task[None] | None = None

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def start(self) -> None:
        """Start the job, unless it is running already."""
        if not self.running:
            self._task = asyncio.get_running_loop().create_task(self._run(), name=self._name)

    async def wait(self) -> None:
        """Until the job started last has ended (at once if none was)."""
        if self._task is not None:
            await asyncio.shield(self._task)

    async def close(self) -> None:
        """Cancel the job and wait until it has ended."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
