"""Checkpoints of history heads, written at least once a minute while the gateway runs.

Why: an operation's row keeps the head of its history, so whoever edits the
store can cut the tail of a history and set the row's head back to match.
With a history key, a checkpoint writes the heads that changed, each signed,
in a table of their own, chained one checkpoint to the next
(`Store.write_checkpoint`): `verify` then finds a tail cut after any
checkpoint saw it, even if the row was rewritten. Each checkpoint is
logged, so when the newest was written is also known outside the store.
Without a key there is nothing to sign with, and nothing is written.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from gateway.engine.errors import StoreUnavailable
from gateway.engine.history import CHECKPOINT_SECONDS

if TYPE_CHECKING:
    from gateway.store.base import Store

log = logging.getLogger("gateway.history")

__all__ = ["Checkpointer"]


class Checkpointer:
    """Writes a checkpoint every `interval` seconds, and a last one when stopped.

    >>> # checkpointer = Checkpointer(store); await checkpointer.start()
    >>> # ...; await checkpointer.stop()
    """

    def __init__(self, store: Store, *, interval: float = CHECKPOINT_SECONDS) -> None:
        self._store = store
        self._interval = interval
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        if self._store.history_seal() is not None:
            self._task = asyncio.create_task(self._run(), name="history-checkpoints")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is None:
            return
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await self.write_once()

    async def write_once(self) -> int:
        try:
            written = await self._store.write_checkpoint()
        except StoreUnavailable as exc:  # the heads stay due: the next one covers them
            log.warning("history checkpoint failed: %s", exc, extra={"event": "checkpoint"})
            return 0
        if written:
            log.info(
                "history checkpoint: %d heads",
                written,
                extra={"event": "checkpoint", "heads": written},
            )
        return written

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            await self.write_once()
