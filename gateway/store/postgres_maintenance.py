"""The PostgreSQL store's upkeep of its partitions: days made ahead, days dropped, the backfill.

Kept apart from the store's verbs because it runs on its own schedule: at open
(today's partitions and the next days', and the backfill of migration 12 started
in the background if it is not done), then from the sweep, at most every
`interval` seconds (days made ahead, days past retention dropped, the backfill
started again if it stopped). A failure here is logged and tried again on the
next pass: the sweep's own work goes on.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import asyncpg

from gateway.engine.errors import StoreUnavailable
from gateway.store.background import BackgroundJob
from gateway.store.postgres_migration12 import backfill, backfilled
from gateway.store.postgres_partitions import ensure_days, retire_days

if TYPE_CHECKING:
    import asyncpg.pool

log = logging.getLogger("gateway.store.postgres")

INTERVAL = 60.0
"""Seconds between two passes of a store's partition upkeep (the sweep calls it more often)."""

BACKFILL_PAUSE = 0.02
"""Seconds between two backfill batches: room for the requests of the moment."""

_RETRY = 5.0
"""Seconds before a backfill that failed (or found another replica at it) tries again."""

_FAILURES = (asyncpg.PostgresError, asyncpg.InterfaceError, OSError, asyncio.TimeoutError)


class PartitionKeeper:
    """Partition upkeep for one store (`pool` gives its pool once open).

    >>> # keeper = PartitionKeeper(url, lambda: pool); await keeper.opened(); ...
    """

    def __init__(self, url: str, pool: Callable[[], asyncpg.Pool]) -> None:
        self._url = url
        self._pool = pool
        self.interval = INTERVAL
        self._last: float | None = None
        self._backfill = BackgroundJob(self._run_backfill, "postgres-backfill")

    async def opened(self) -> None:
        """At open: the days' partitions, and the backfill if it is not done."""
        async with self._pool().acquire() as connection:
            await ensure_days(connection)
            done = await backfilled(connection)
        if not done:
            self._backfill.start()

    async def ensure(self) -> None:
        """Today's partitions now (a claim found none: the database's clock moved on)."""
        async with self._pool().acquire() as connection:
            await ensure_days(connection)

    async def maintain(self, *, force: bool = False) -> list[str]:
        """A pass, if `interval` has passed since the last one (or `force`); the days dropped."""
        now = time.monotonic()
        if not force and self._last is not None and now - self._last < self.interval:
            return []
        self._last = now
        dropped: list[str] = []
        try:
            await self.ensure()
            own = await asyncpg.connect(self._url)
            try:
                dropped = await retire_days(own)
            finally:
                await own.close()
            if not self._backfill.running:
                async with self._pool().acquire() as connection:
                    if not await backfilled(connection):
                        self._backfill.start()
        except (*_FAILURES, StoreUnavailable) as exc:
            log.warning("postgres partition upkeep failed (the next pass tries again): %s", exc)
        return dropped

    async def wait_backfilled(self) -> None:
        """Until the backfill this store runs has finished (tests, operators' tools)."""
        await self._backfill.wait()

    async def close(self) -> None:
        await self._backfill.close()

    async def _run_backfill(self) -> None:
        """Batches until done; another replica's batch in progress, or a failure, waits."""
        while True:
            try:
                async with self._pool().acquire() as connection:
                    done = await backfill(connection)
            except (*_FAILURES, StoreUnavailable) as exc:
                log.warning("postgres backfill of the key table paused: %s", exc)
                done = None
            if done:
                return
            await asyncio.sleep(BACKFILL_PAUSE if done is False else _RETRY)
